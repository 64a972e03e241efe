"""Where the GPU time of one mpqr call goes: cProfile with CUDA_LAUNCH_BLOCKING=1.

With blocking launches every kernel finishes before its Python call returns, so
each function's ``tottime`` includes the GPU work it launched (plus launch cost).
Usage: ``CUDA_LAUNCH_BLOCKING=1 python3 bench/profile_call.py qr 16777216x32 fp64``
or ``... matmul 16384x16384x16384 fp64-emulated``.
"""
import cProfile
import os
import pstats
import sys
import time

import cupy as cp

import mpqr

assert os.environ.get("CUDA_LAUNCH_BLOCKING") == "1", "set CUDA_LAUNCH_BLOCKING=1"
what, shape, prec = sys.argv[1], tuple(int(v) for v in sys.argv[2].split("x")), sys.argv[3]
dt = cp.float64 if prec.startswith(("fp64", "auto")) else cp.float32
if what == "qr":
    a = cp.random.standard_normal(shape).astype(dt)
    def call():
        return mpqr.qr(a, precision=prec)
elif what == "lstsq":
    a = cp.random.standard_normal(shape).astype(dt)
    rhs = cp.random.standard_normal(shape[0]).astype(dt)
    def call():
        return mpqr.lstsq(a, rhs, precision=prec)
else:
    m, k, n = shape
    a = cp.random.standard_normal((m, k)).astype(dt)
    b = cp.random.standard_normal((k, n)).astype(dt)
    def call():
        opts = {"engine": "ozaki-int8"} if prec == "fp64-emulated" else None
        return mpqr.matmul(a, b, precision=prec, options=opts)
call()
cp.cuda.Device().synchronize()
t0 = time.perf_counter()
pr = cProfile.Profile()
pr.enable()
call()
cp.cuda.Device().synchronize()
pr.disable()
print(f"== {what} {shape} {prec}: {1e3 * (time.perf_counter() - t0):.1f} ms (blocking launches)")
pstats.Stats(pr).sort_stats("tottime").print_stats(16)
