"""Profile mpqr.qr on the GPU: where does the time go? (device diagnostics)"""
import cProfile
import pstats
import sys
import time

import cupy as cp

import mpqr

shape = tuple(int(v) for v in sys.argv[1].split("x"))
prec = sys.argv[2]
dt = cp.float64 if prec.startswith("fp64") else cp.float32
a = cp.random.standard_normal(shape).astype(dt)
mpqr.qr(a, precision=prec)  # warm-up / compile
cp.cuda.Device().synchronize()
t0 = time.perf_counter()
with mpqr.explain() as tr:
    pr = cProfile.Profile()
    pr.enable()
    q, r = mpqr.qr(a, precision=prec)
    cp.cuda.Device().synchronize()
    pr.disable()
print(f"== {shape} {prec}: {time.perf_counter() - t0:.3f} s; gemms={len(tr.gemms)} "
      f"engines={tr.engines()}")
print("\n".join(str(e) for e in tr.events[:5]))
st = pstats.Stats(pr)
st.sort_stats("tottime").print_stats(18)
st.sort_stats("cumulative").print_stats(40)
