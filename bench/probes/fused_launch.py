"""Host cost of the fused fp16 epilogue's launches: the fp16 QR's wall time and enqueue
time with the Triton-compiled kernel on and off, the host time per launch, and the first
call of a fresh process (``--first``: one QR, timed, then the modules this process
imported that the kernel might pull in).

``python3 bench/probes/fused_launch.py [--import-profiler]`` (prints; ``--import-profiler``
imports ``torch.profiler`` first, as ``bench/probes/kernel_time.py`` does);
``python3 bench/probes/fused_launch.py --first on|off``.
"""

from __future__ import annotations

import sys
import time

if "--import-profiler" in sys.argv:
    import torch.profiler  # noqa: F401

import cupy as cp
from mpqr.backends.cupy import triton_gemm as tg

import mpqr
from mpqr.policy import gemm_sub


def sync():
    cp.cuda.Device().synchronize()


def timed(fn, n=3):
    out = []
    for _ in range(n):
        sync()
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        sync()
        out.append((time.perf_counter() - t0, t1 - t0))
    return min(out)


def first(on):
    """The first fp16 QR of this process (8192^2), with the kernel on or off."""
    tg.ENABLED = on
    a = cp.random.default_rng(0).standard_normal((8192, 8192), dtype=cp.float32)
    sync()
    for i in range(2):
        t0 = time.perf_counter()
        mpqr.qr(a, precision="fp16", method="householder-recursive")
        sync()
        print(f"fused={on} call {i}: {time.perf_counter() - t0:.3f} s", flush=True)
    print("imported:", sorted(m for m in ("torch", "triton") if m in sys.modules), flush=True)


def main():
    if "--first" in sys.argv:
        first(sys.argv[-1] == "on")
        return
    a = cp.random.default_rng(0).standard_normal((16384, 16384), dtype=cp.float32)

    def qr():
        return mpqr.qr(a, precision="fp16", method="householder-recursive")
    for on in (True, False):
        tg.ENABLED = on
        qr()
    for on in (True, False, True, False):
        tg.ENABLED = on
        total, enqueue = timed(qr)
        print(f"qr 16384^2 fp16 fused={on}: {total * 1e3:.1f} ms, enqueue {enqueue * 1e3:.1f} ms",
              flush=True)
    tg.ENABLED = True
    rng = cp.random.default_rng(1)
    x = rng.standard_normal((2048, 512), dtype=cp.float32)
    y = rng.standard_normal((512, 2048), dtype=cp.float32)
    c = cp.zeros((2048, 2048), dtype=cp.float32)
    for on in (True, False):
        tg.ENABLED = on
        for _ in range(5):
            gemm_sub(c, x, y, precision="fp16", options={"engine": "tc-fp16"})
        total, enqueue = timed(lambda: [gemm_sub(c, x, y, precision="fp16",
                                                 options={"engine": "tc-fp16"})
                                        for _ in range(200)], n=2)
        print(f"gemm_sub 2048x2048x512 x200 fused={on}: {total / 200 * 1e6:.0f} us per call, "
              f"enqueue {enqueue / 200 * 1e6:.0f} us", flush=True)


if __name__ == "__main__":
    main()
