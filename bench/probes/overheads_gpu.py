"""Where the host time of small and stacked GPU calls goes: cProfile of repeated calls
(mpqr.lstsq 1000 x 20 on the fast path, mpqr.qr of a stack taking cuSOLVER per member,
mpqr.lstsq on a stack of small problems), each beside the library call, device-synced.

    python bench/probes/overheads_gpu.py      (prints; $OUT/overheads.txt)
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import time

import cupy as cp

import mpqr


def timed(fn, reps=20):
    fn()
    cp.cuda.Device().synchronize()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        cp.cuda.Device().synchronize()
        ts.append(time.perf_counter() - t)
    return sorted(ts)[len(ts) // 2] * 1e3


def profile(label, fn, reps, out):
    fn()
    cp.cuda.Device().synchronize()
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(reps):
        fn()
    cp.cuda.Device().synchronize()
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(22)
    out.write(f"\n==== {label} ({reps} calls) ====\n" + s.getvalue())


def main():
    out = io.StringIO()
    rng = cp.random.default_rng(0)
    a = rng.standard_normal((1000, 20))
    b = rng.standard_normal(1000)
    from cupyx import lapack

    cases = [
        ("lstsq 1000x20", lambda: mpqr.lstsq(a, b), lambda: lapack.gels(a, b[:, None])),
        ("qr 1000x20", lambda: mpqr.qr(a), lambda: cp.linalg.qr(a)),
    ]
    s = rng.standard_normal((8, 512, 512))
    cases.append(("qr 8x(512x512) f64", lambda: mpqr.qr(s), lambda: cp.linalg.qr(s)))
    t = rng.standard_normal((64, 512, 128), dtype=cp.float32)
    cases.append(("qr 64x(512x128) f32", lambda: mpqr.qr(t), lambda: cp.linalg.qr(t)))
    la = rng.standard_normal((8192, 64, 32), dtype=cp.float32)
    lb = rng.standard_normal((8192, 64, 1), dtype=cp.float32)
    cases.append(("lstsq 8192x(64x32) f32", lambda: mpqr.lstsq(la, lb), None))
    la2 = rng.standard_normal((512, 128, 64))
    lb2 = rng.standard_normal((512, 128, 4))
    cases.append(("lstsq 512x(128x64) f64", lambda: mpqr.lstsq(la2, lb2), None))
    for label, fn, lib in cases:
        try:
            tm = timed(fn, 10)
            tl = timed(lib, 10) if lib else float("nan")
            out.write(f"{label}: mpqr {tm:.3f} ms, library {tl:.3f} ms\n")
            with mpqr.explain() as tr:
                fn()
            out.write("   " + "\n   ".join(tr.summary().splitlines()[:8]) + "\n")
            profile(label, fn, 10 if "8192" in label or "512x" in label else 50, out)
        except Exception as exc:
            out.write(f"{label}: ERROR {type(exc).__name__}: {exc}\n")
    text = out.getvalue()
    print(text)
    d = os.environ.get("OUT", "/tmp")
    with open(os.path.join(d, "overheads.txt"), "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
