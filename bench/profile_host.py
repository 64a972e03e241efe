"""Host-side cost of one small (host-bound) call: cProfile over 20 calls, no blocking.

Usage: ``python3 bench/profile_host.py {qr|lstsq} 16384x32``.
"""
import cProfile
import pstats
import sys

import cupy as cp

import mpqr

what, shape = sys.argv[1], tuple(int(v) for v in sys.argv[2].split("x"))
a = cp.random.standard_normal(shape)
b = cp.random.standard_normal(shape[0])
call = (lambda: mpqr.qr(a, precision="fp64")) if what == "qr" else (lambda: mpqr.lstsq(a, b))
for _ in range(3):
    call()
cp.cuda.Device().synchronize()
pr = cProfile.Profile()
pr.enable()
for _ in range(20):
    call()
cp.cuda.Device().synchronize()
pr.disable()
st = pstats.Stats(pr)
print(f"== {what} {shape}: {st.total_tt / 20 * 1e3:.2f} ms per call (profiled)")
st.sort_stats("tottime").print_stats(22)
