"""Device memory of mpqr.qr: the lean and fast plans' high-water marks, accuracy, speed, and
the largest n that fits a pool limit.

``python bench/probes/memory_gpu.py`` (writes ``$OUT/memory.json``, ``OUT`` default /tmp):

1. rows: the pool high-water and live-bytes peak (multiples of the input) of the rows of
   the memory targets with the plan forced lean (``MPQR_MEMORY_PLAN=lean``) and forced
   fast (``fast``), ``cupy.linalg.qr`` beside them, the plans' estimates, and PASS/FAIL
   of the lean route's backward error ``||QR - A|| / ||A||`` and orthogonality
   ``||Q^T Q - I||_F / n`` (float64 on the device) against bounds from the precision and
   against the fast route's (at most 4x it, or within the bound);
2. the largest n x n that mpqr.qr (fp32-emulated float32, fp64-emulated float64; the
   default plan, which goes lean when the fast route would not fit) and cupy.linalg.qr
   factor under a CuPy pool limit of 4 GiB, by bisection on n (multiples of 512): the
   ratio mpqr / cupy (target >= 0.85);
3. an oversize device input -> DeviceMemoryError;
4. seconds per call, median of 5 after a warm-up: lean / fast / the plan off at 8192^2 and
   16384^2 (fp32-emulated float32, fp64-emulated float64), and the default plan (which
   takes the fast route when it fits) against the plan off at the bench shapes (target
   <= 1.05); rows left once 70 s have passed are skipped.
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
from mpqr.bench.memory import largest_n, measure_call

OUT = os.environ.get("OUT", "/tmp")
T0 = time.perf_counter()
res: dict = {"environment": environment(cp), "rows": [], "timings": [], "largest": [],
             "oom": {}, "checks": {}}
pool = cp.get_default_memory_pool()
U = {"fp16": 2.0**-11, "fp32-emulated": 2.0**-24, "fp64-emulated": 2.0**-53,
     "auto": 2.0**-53}
ROWS = [(16384, 16384, "float32", "fp32-emulated"), (16384, 16384, "float64", "fp64-emulated"),
        (65536, 8192, "float32", "fp32-emulated"), (16384, 16384, "float32", "fp16")]


def sync():
    cp.cuda.Device().synchronize()


def errors(a, q, r):
    """(backward, orthogonality) in float64 on the device."""
    a64, q64, r64 = (x.astype(cp.float64) for x in (a, q, r))
    be = float(cp.linalg.norm(q64 @ r64 - a64) / cp.linalg.norm(a64))
    n = q.shape[1]
    orth = float(cp.linalg.norm(q64.T @ q64 - cp.eye(n)) / n)
    return be, orth


def bounds(prec, m, n):
    # fp16: the TC-QR table (1e-3, 2e-4); else 32 sqrt(n) u (normwise, Householder)
    if prec == "fp16":
        return 1e-3, 2e-4
    u = U[prec]
    return 32 * n**0.5 * u, 32 * n**0.5 * u


def plan(setting: str) -> None:
    os.environ["MPQR_MEMORY_PLAN"] = setting


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
    plan("1")


def rows():
    from mpqr.qr.memory_plan import estimate_bytes
    print(f"{'call':<36} {'lean pool':>9} {'fast pool':>9} {'lean live':>9} {'cupy':>6} "
          f"{'est lean':>8} {'est fast':>8}  backward lean/fast   orth lean/fast")
    for m, n, dt, prec in ROWS:
        a = cp.random.default_rng(0).standard_normal((m, n), dtype=cp.float64).astype(dt)
        r = dict(m=m, n=n, dtype=dt, precision=prec)
        err = {}
        for setting in ("lean", "fast"):
            plan(setting)
            r[setting], (q, rr) = measure_call(
                cp, lambda x, pr=prec: mpqr.qr(x, precision=pr), a, keep=True)
            q, rr = cp.asarray(q), cp.asarray(rr)
            err[setting] = errors(a, q, rr)
            del q, rr
            pool.free_all_blocks()
        plan("1")
        r["cupy"] = measure_call(cp, cp.linalg.qr, a)
        meth = "cholqr2" if n <= 64 else "householder-recursive"
        for p in ("lean", "fast"):
            r[f"estimate_{p}"] = estimate_bytes(meth, prec, (m, n), a.itemsize, p) / a.nbytes
        bl = bf = ol = of = float("nan")
        if err:
            (bl, ol), (bf, of) = err["lean"], err["fast"]
            bb, bo = bounds(prec, m, n)
            r.update(backward_lean=bl, orth_lean=ol, backward_fast=bf, orth_fast=of)
            res["checks"][f"{m} x {n} {dt} {prec} lean: backward {bl:.1e} <= {bb:.1e}, "
                          f"orth {ol:.1e} <= {bo:.1e}"] = \
                "PASS" if bl <= bb and ol <= bo else "FAIL"
            res["checks"][f"{m} x {n} {dt} {prec} lean vs fast: backward {bl:.1e} vs "
                          f"{bf:.1e}, orth {ol:.1e} vs {of:.1e} (<= 4x or within bound/8)"] = \
                "PASS" if (bl <= max(4 * bf, bb / 8) and ol <= max(4 * of, bo / 8)) else "FAIL"
        del a
        pool.free_all_blocks()
        res["rows"].append(r)
        print(f"{m} x {n} {dt} {prec:<14} {r['lean']['pool_multiple']:>8.2f}x "
              f"{r['fast']['pool_multiple']:>8.2f}x {r['lean']['peak_live_multiple']:>8.2f}x "
              f"{r['cupy']['pool_multiple']:>5.2f}x {r['estimate_lean']:>7.2f}x "
              f"{r['estimate_fast']:>7.2f}x  {bl:.1e}/{bf:.1e}  {ol:.1e}/{of:.1e}", flush=True)
        target = {"fp16": 2.5, "fp32-emulated": 2.5, "fp64-emulated": 3.0, "auto": 2.5}[prec]
        got = r["lean"]["pool_multiple"]
        res["checks"][f"{m} x {n} {dt} {prec} lean pool {got:.2f}x <= {target}x"] = \
            "PASS" if got <= target else "FAIL"
        est = r["estimate_lean"]
        res["checks"][f"{m} x {n} {dt} {prec} lean pool {got:.2f}x <= estimate {est:.2f}x"] = \
            "PASS" if got <= est else "FAIL"


def _time(a, prec, settings, reps=5):
    samples = {s: [] for s in settings}
    for s in settings:  # warm-up
        plan(s)
        mpqr.qr(a, precision=prec)
    sync()
    for _ in range(reps):
        for s in settings:
            plan(s)
            pool.free_all_blocks()
            sync()
            t0 = time.perf_counter()
            out = mpqr.qr(a, precision=prec)
            sync()
            samples[s].append(time.perf_counter() - t0)
            del out
    plan("1")
    return {s: statistics.median(v) for s, v in samples.items()}


def timings():
    for m, n, dt, prec in ((8192, 8192, "float32", "fp32-emulated"),
                           (8192, 8192, "float64", "fp64-emulated"),
                           (16384, 16384, "float32", "fp32-emulated"),
                           (16384, 16384, "float64", "fp64-emulated"),
                           (16384, 16384, "float32", "fp16"),
                           (65536, 8192, "float32", "fp32-emulated")):
        if time.perf_counter() - T0 > 70:  # keep the probe within its 90 s
            print(f"{m} x {n} {dt} {prec}: skipped (time)", flush=True)
            continue
        a = cp.random.default_rng(2).standard_normal((m, n), dtype=cp.float64).astype(dt)
        settings = ("lean", "fast", "1", "0") if m == n and prec != "fp16" else ("1", "0")
        t = _time(a, prec, settings)
        del a
        pool.free_all_blocks()
        row = dict(m=m, n=n, dtype=dt, precision=prec,
                   **{{"1": "default", "0": "off"}.get(s, s): v for s, v in t.items()})
        res["timings"].append(row)
        txt = ", ".join(f"{k} {row[k] * 1e3:.1f} ms" for k in ("lean", "fast", "default", "off")
                        if k in row)
        ratio = row["default"] / row["off"]
        print(f"{m} x {n} {dt} {prec}: {txt}; default/off {ratio:.3f}"
              + (f", lean/fast {row['lean'] / row['fast']:.3f}" if "lean" in row else ""),
              flush=True)
        if (m, n) != (8192, 8192):
            res["checks"][f"speed {m} x {n} {dt} {prec}: default plan/off {ratio:.3f} "
                          "<= 1.05"] = "PASS" if ratio <= 1.05 else "FAIL"


def largest():
    limit = 4 << 30
    ns = {}
    for dt, prec in (("float32", "fp32-emulated"), ("float64", "fp64-emulated")):
        for who in (prec, "cupy"):
            fn = cp.linalg.qr if who == "cupy" else (lambda x, pr=prec: mpqr.qr(x, precision=pr))
            t0 = time.perf_counter()
            n = largest_n(cp, fn, dt, limit, lo=4096, step=512)
            ns[who] = n
            res["largest"].append(dict(dtype=dt, who=who, limit=limit, n=n))
            print(f"{dt} {who}: largest n under {limit:,} bytes: {n} "
                  f"({time.perf_counter() - t0:.1f} s)", flush=True)
        ratio = ns[prec] / ns["cupy"] if ns["cupy"] else float("nan")
        res["checks"][f"largest n {dt} {prec} / cupy.linalg.qr = {ns[prec]} / {ns['cupy']} = "
                      f"{ratio:.3f} >= 0.85"] = "PASS" if ratio >= 0.85 else "FAIL"


def oom():
    a = cp.random.default_rng(3).standard_normal((8192, 8192))
    pool.free_all_blocks()
    pool.set_limit(size=pool.total_bytes() + a.nbytes)
    try:
        mpqr.qr(a, precision="fp64-emulated")
        got, ok = ("no error", ""), False
    except Exception as exc:
        got = (type(exc).__name__, str(exc))
        ok = (isinstance(exc, mpqr.DeviceMemoryError) and "are free" in str(exc)
              and exc.needed > exc.free)
    finally:
        pool.set_limit(size=0)
    del a
    res["oom"] = got
    print(f"{got[0]}: {got[1]}", flush=True)
    res["checks"]["oversize device input -> DeviceMemoryError"] = "PASS" if ok else "FAIL"


if __name__ == "__main__":
    for name, fn in (("rows", rows), ("largest", largest), ("oom", oom),
                     ("timings", timings)):
        part(name, fn)
    for k, v in res["checks"].items():
        print(f"{v}: {k}")
    path = os.path.join(OUT, "memory.json")
    with open(path, "w") as f:
        json.dump(res, f, indent=1, default=str)
    print("wrote", path)
    sys.exit(0)
