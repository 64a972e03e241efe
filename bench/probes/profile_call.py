"""Where the time of one mpqr call goes on a GPU: cProfile of qr, lstsq or matmul.

``python3 bench/probes/profile_call.py device qr 16777216x32 fp64`` runs with
``CUDA_LAUNCH_BLOCKING=1`` (set here before CuPy loads): every kernel finishes before
its Python call returns, so each function's ``tottime`` includes the GPU work it
launched. ``python3 bench/probes/profile_call.py host lstsq 16384x32 auto`` profiles 20
calls without blocking: the host-side cost of a small, host-bound call. Shapes are
``MxN`` for qr and lstsq, ``MxKxN`` for matmul.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("where", choices=["device", "host"])
    p.add_argument("what", choices=["qr", "lstsq", "matmul"])
    p.add_argument("shape", help="MxN (qr, lstsq) or MxKxN (matmul)")
    p.add_argument("precision", nargs="?", default="auto")
    p.add_argument("--calls", type=int, default=20, help="profiled calls (host mode)")
    args = p.parse_args()
    if args.where == "device":
        os.environ["CUDA_LAUNCH_BLOCKING"] = "1"
    import cupy as cp

    import mpqr

    shape = tuple(int(v) for v in args.shape.split("x"))
    prec = args.precision
    dt = cp.float32 if prec in ("fp32", "fp32-emulated", "fp16") else cp.float64
    rng = cp.random.default_rng(0)
    if args.what == "matmul":
        m, k, n = shape
        a, b = rng.standard_normal((m, k), dtype=dt), rng.standard_normal((k, n), dtype=dt)

        def call():
            return mpqr.matmul(a, b, precision=prec)
    else:
        a, b = rng.standard_normal(shape, dtype=dt), rng.standard_normal(shape[0], dtype=dt)
        fn = mpqr.qr if args.what == "qr" else mpqr.lstsq

        def call():
            return fn(a, precision=prec) if args.what == "qr" else fn(a, b, precision=prec)

    for _ in range(3):  # warm-up: kernels compiled, pools filled
        call()
    cp.cuda.Device().synchronize()
    calls = 1 if args.where == "device" else args.calls
    pr = cProfile.Profile()
    t0 = time.perf_counter()
    pr.enable()
    for _ in range(calls):
        call()
    cp.cuda.Device().synchronize()
    pr.disable()
    ms = (time.perf_counter() - t0) / calls * 1e3
    print(f"== {args.what} {args.shape} {prec} ({args.where}): {ms:.2f} ms per call, profiled")
    pstats.Stats(pr).sort_stats("tottime").print_stats(20)


if __name__ == "__main__":
    main()
