"""Device memory of mpqr.qr: high-water marks, the check before a call, the largest n.

``python bench/probes/memory_gpu.py`` (writes ``$OUT/memory.json``, ``OUT`` default /tmp):

1. the pool high-water and live-bytes peak (multiples of the input) of the five rows of
   the memory targets, the check before a call on (``MPQR_MEMORY_PLAN=1``) and off (``0``),
   ``cupy.linalg.qr`` beside each;
2. seconds per call, check on/off, median of 5 after a warm-up (8192^2 fp32-emulated and
   fp64-emulated, 2^22 x 64 float64 auto), alternating;
3. an oversize device input (pool capped with ``set_limit``): the error type and message,
   check on (raised before the work) and off (the out-of-memory error from inside,
   translated); PASS when both are ``mpqr.DeviceMemoryError`` and the first names the
   bytes needed and free;
4. the largest n each of mpqr (fp32-emulated, fp64-emulated) and cupy.linalg.qr factors
   under a 512 MiB pool limit, by bisection.
Each part is caught on its own; a failure prints its traceback and the script goes on.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
import traceback

import cupy as cp

import mpqr
from mpqr.bench._timing import environment
from mpqr.bench.memory import ROWS, largest_n, measure_call

OUT = os.environ.get("OUT", "/tmp")
res: dict = {"environment": environment(cp), "rows": [], "timings": [], "oom": {},
             "largest": [], "checks": {}}
pool = cp.get_default_memory_pool()


def plan(on: bool) -> None:
    os.environ["MPQR_MEMORY_PLAN"] = "1" if on else "0"


def part(name, fn):
    t0 = time.perf_counter()
    try:
        fn()
    except Exception:
        traceback.print_exc()
        res["checks"][name] = "FAIL (exception)"
    print(f"-- {name}: {time.perf_counter() - t0:.1f} s", flush=True)
    pool.set_limit(size=0)
    pool.free_all_blocks()


def rows():
    print(f"{'call':<40} {'on pool':>8} {'off pool':>8} {'on peak':>8} {'cupy pool':>9}")
    for m, n, dt, prec in ROWS:
        a = cp.random.default_rng(0).standard_normal((m, n), dtype=cp.float64).astype(dt)
        r = dict(m=m, n=n, dtype=dt, precision=prec)
        for on in (True, False):
            plan(on)
            r["on" if on else "off"] = measure_call(
                cp, lambda x, pr=prec: mpqr.qr(x, precision=pr), a)
        plan(True)
        r["cupy"] = measure_call(cp, cp.linalg.qr, a)
        del a
        res["rows"].append(r)
        print(f"{m} x {n} {dt} {prec:<18} {r['on']['pool_multiple']:>7.2f}x "
              f"{r['off']['pool_multiple']:>7.2f}x {r['on']['peak_live_multiple']:>7.2f}x "
              f"{r['cupy']['pool_multiple']:>8.2f}x", flush=True)


def timings():
    for m, n, dt, prec in [(8192, 8192, "float32", "fp32-emulated"),
                           (8192, 8192, "float64", "fp64-emulated"),
                           (1 << 22, 64, "float64", "auto")]:
        a = cp.random.default_rng(1).standard_normal((m, n), dtype=cp.float64).astype(dt)
        samples = {True: [], False: []}
        for on in (True, False):  # warm-up
            plan(on)
            mpqr.qr(a, precision=prec)
        for _ in range(5):
            for on in (True, False):
                plan(on)
                cp.cuda.Device().synchronize()
                t0 = time.perf_counter()
                mpqr.qr(a, precision=prec)
                cp.cuda.Device().synchronize()
                samples[on].append(time.perf_counter() - t0)
        plan(True)
        on_s, off_s = statistics.median(samples[True]), statistics.median(samples[False])
        res["timings"].append(dict(m=m, n=n, dtype=dt, precision=prec, on_s=on_s,
                                   off_s=off_s, ratio=on_s / off_s))
        print(f"{m} x {n} {dt} {prec}: on {on_s * 1e3:.1f} ms, off {off_s * 1e3:.1f} ms, "
              f"on/off {on_s / off_s:.3f}", flush=True)
        del a


def oom():
    n = 8192
    a = cp.random.default_rng(2).standard_normal((n, n), dtype=cp.float64)
    pool.free_all_blocks()
    pool.set_limit(size=3 * a.nbytes)
    ok = True
    for on in (True, False):
        plan(on)
        try:
            mpqr.qr(a, precision="fp64-emulated")
            got = ("no error", "")
        except Exception as exc:
            got = (type(exc).__name__, str(exc))
            good = isinstance(exc, mpqr.DeviceMemoryError)
            if on:
                good = good and "are free" in str(exc) and exc.needed and exc.free is not None
            ok = ok and good
        else:
            ok = False
        res["oom"]["on" if on else "off"] = got
        print(f"plan {'on' if on else 'off'}: {got[0]}: {got[1]}", flush=True)
    plan(True)
    pool.set_limit(size=0)
    del a
    res["checks"]["oversize device input -> DeviceMemoryError"] = "PASS" if ok else "FAIL"


def largest():
    budget = 512 << 20
    for dt, prec in (("float32", "fp32-emulated"), ("float64", "fp64-emulated")):
        for on in (True, False):
            plan(on)
            mine = largest_n(cp, lambda x, pr=prec: mpqr.qr(x, precision=pr), dt, budget)
            res["largest"].append(dict(dtype=dt, precision=prec, plan=on, budget=budget,
                                       mpqr=mine))
            print(f"largest n, {budget:,} bytes, {dt} {prec} plan {'on' if on else 'off'}: "
                  f"{mine}", flush=True)
        plan(True)
        lib = largest_n(cp, cp.linalg.qr, dt, budget)
        res["largest"].append(dict(dtype=dt, precision="cupy.linalg.qr", budget=budget,
                                   mpqr=lib))
        print(f"largest n, {budget:,} bytes, {dt} cupy.linalg.qr: {lib}", flush=True)


if __name__ == "__main__":
    for name, fn in (("rows", rows), ("timings", timings), ("oom", oom), ("largest", largest)):
        part(name, fn)
    for k, v in res["checks"].items():
        print(f"{v}: {k}")
    path = os.path.join(OUT, "memory.json")
    with open(path, "w") as f:
        json.dump(res, f, indent=1, default=str)
    print("wrote", path)
    sys.exit(0)
