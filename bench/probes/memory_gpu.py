"""Device memory of mpqr.qr: the lean plan's high-water marks beside cuSOLVER, where the
fp32-emulated peak sits, host inputs that go out of core by themselves, the device-input
error on every route, the largest n under a pool limit, speed.

``python bench/probes/memory_gpu.py`` (writes ``$OUT/memory.json``, ``OUT`` default /tmp):

1. rows: pool high-water and live peak (multiples of the input) of the memory targets'
   rows with the plan forced lean (``MPQR_MEMORY_PLAN=lean``), ``cupy.linalg.qr`` beside
   them, the estimates, and PASS/FAIL of the lean route's backward error and
   orthogonality (float64 on the device) against bounds from the precision and against
   the fast route's (one fast call each); lean ``mode="complete"`` of a tall input and
   the wide route within their estimates;
2. alloc: the allocation log of 16384^2 float32 fp32-emulated lean at the pool's
   high-water (the live blocks and where they were asked for, the cached bytes beside
   them, the new blocks in order);
3. host: a host (NumPy) input with ``device="cuda"`` under a pool limit its in-core plan
   would not fit -> out of core by itself (route in the trace), accurate; one that fits
   -> in core;
4. oom: device inputs (square, tall, wide) under a pool limit -> DeviceMemoryError naming
   the bytes needed, the bytes free and a precision or ``memory_budget`` that fits;
5. timings: median of 5 after a warm-up, lean / default / off at 16384^2
   fp32-emulated, default / off at the other bench rows (target default/off <= 1.05);
   rows after the first left past 66 s are skipped;
6. largest: the largest n x n under a 4 GiB pool limit, mpqr (fp32-emulated float32,
   fp64-emulated float64) and cupy.linalg.qr (target ratio >= 0.85);
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
import numpy as np

import mpqr
from mpqr.bench._timing import environment
from mpqr.bench.memory import allocation_log, largest_n, measure_call

OUT = os.environ.get("OUT", "/tmp")
T0 = time.perf_counter()
res: dict = {"environment": environment(cp), "rows": [], "timings": [], "largest": [],
             "alloc": {}, "host": [], "oom": [], "checks": {}}
pool = cp.get_default_memory_pool()
U = {"fp16": 2.0**-11, "fp32-emulated": 2.0**-24, "fp64-emulated": 2.0**-53,
     "auto": 2.0**-53, "fp64": 2.0**-53, "fp32": 2.0**-24}
ROWS = [(16384, 16384, "float32", "fp32-emulated"), (16384, 16384, "float32", "fp16"),
        (16384, 16384, "float64", "fp64-emulated"), (65536, 8192, "float32", "fp32-emulated")]
TARGET = {"fp16": 2.5, "fp32-emulated": 2.5, "fp64-emulated": 3.0, "auto": 2.5}


def sync():
    cp.cuda.Device().synchronize()


def check(name, ok):
    res["checks"][name] = "PASS" if ok else "FAIL"


def errors(a, q, r):
    """(backward, orthogonality ||Q^T Q - I||_F / n) in float64 on the device."""
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
    print(f"-- {name}: {time.perf_counter() - t0:.1f} s (at {time.perf_counter() - T0:.0f} s)",
          flush=True)
    pool.set_limit(size=0)
    pool.free_all_blocks()
    plan("1")


def draw(m, n, dt, seed=0):
    a = cp.random.default_rng(seed).standard_normal((m, n), dtype=cp.float64).astype(dt)
    pool.free_all_blocks()
    return a


def rows():
    from mpqr.qr.memory_plan import estimate_bytes
    print(f"{'call':<36} {'lean pool':>9} {'lean live':>9} {'cupy':>6} {'est lean':>8}"
          "  backward lean/fast   orth lean/fast")
    for m, n, dt, prec in ROWS:
        a = draw(m, n, dt)
        r = dict(m=m, n=n, dtype=dt, precision=prec)
        plan("lean")
        r["lean"], (q, rr) = measure_call(
            cp, lambda x, pr=prec: mpqr.qr(x, precision=pr), a, keep=True)
        q, rr = cp.asarray(q), cp.asarray(rr)
        bl, ol = errors(a, q, rr)
        del q, rr
        pool.free_all_blocks()
        plan("fast")
        q, rr = mpqr.qr(a, precision=prec)
        bf, of = errors(a, q, rr)
        del q, rr
        pool.free_all_blocks()
        plan("1")
        r["cupy"] = measure_call(cp, cp.linalg.qr, a)
        r["estimate_lean"] = estimate_bytes("householder-recursive", prec, (m, n), a.itemsize,
                                            "lean") / a.nbytes
        bb, bo = bounds(prec, m, n)
        r.update(backward_lean=bl, orth_lean=ol, backward_fast=bf, orth_fast=of)
        tag = f"{m} x {n} {dt} {prec}"
        check(f"{tag} lean: backward {bl:.1e} <= {bb:.1e}, orth {ol:.1e} <= {bo:.1e}",
              bl <= bb and ol <= bo)
        check(f"{tag} lean vs fast: backward {bl:.1e} vs {bf:.1e}, orth {ol:.1e} vs {of:.1e} "
              "(<= 4x or within bound/8)",
              bl <= max(4 * bf, bb / 8) and ol <= max(4 * of, bo / 8))
        del a
        pool.free_all_blocks()
        res["rows"].append(r)
        got, live, est = (r["lean"]["pool_multiple"], r["lean"]["peak_live_multiple"],
                          r["estimate_lean"])
        print(f"{tag:<36} {got:>8.2f}x {live:>8.2f}x {r['cupy']['pool_multiple']:>5.2f}x "
              f"{est:>7.2f}x  {bl:.1e}/{bf:.1e}  {ol:.1e}/{of:.1e} "
              f"({r['lean']['seconds'] * 1e3:.0f} ms lean)", flush=True)
        check(f"{tag} lean pool {got:.2f}x <= target {TARGET[prec]}x", got <= TARGET[prec])
        check(f"{tag} lean pool {got:.2f}x <= estimate {est:.2f}x", got <= est)
    # lean mode="complete" of a tall input, and the wide route (default plan), against
    # their estimates
    for m, n, dt, prec, mode, setting in ((8192, 2048, "float32", "fp32-emulated", "complete",
                                           "lean"),
                                          (4096, 16384, "float32", "fp32-emulated", "reduced",
                                           "lean"),
                                          (4096, 16384, "float32", "fp32-emulated", "reduced",
                                           "1")):
        a = draw(m, n, dt, 1)
        plan(setting)
        got, (q, rr) = measure_call(
            cp, lambda x, pr=prec, md=mode: mpqr.qr(x, mode=md, precision=pr), a, keep=True)
        q, rr = cp.asarray(q), cp.asarray(rr)
        be, orth = errors(a, q, rr)
        del q, rr
        plan("1")
        est = estimate_bytes("householder-recursive", prec, (m, n), a.itemsize,
                             "lean" if setting == "lean" else "fast",
                             complete=mode == "complete") / a.nbytes
        tag = f"{m} x {n} {dt} {prec} mode={mode} plan={setting}"
        res["rows"].append(dict(m=m, n=n, dtype=dt, precision=prec, mode=mode, plan=setting,
                                mpqr=got, estimate=est, backward=be, orth=orth))
        print(f"{tag}: pool {got['pool_multiple']:.2f}x, live {got['peak_live_multiple']:.2f}x, "
              f"estimate {est:.2f}x; backward {be:.1e}, orth {orth:.1e}", flush=True)
        bb, bo = bounds(prec, m, min(m, n))
        check(f"{tag}: backward {be:.1e}, orth {orth:.1e} within bounds", be <= bb and orth <= bo)
        check(f"{tag}: pool {got['pool_multiple']:.2f}x <= estimate {est:.2f}x",
              got["pool_multiple"] <= est)
        del a
        pool.free_all_blocks()


def alloc():
    a = draw(16384, 16384, "float32")
    plan("lean")
    log = allocation_log(cp, lambda x: mpqr.qr(x, precision="fp32-emulated"), a)
    plan("1")
    del a
    res["alloc"] = log
    at = log["at_high"]
    print(f"16384^2 fp32-emulated lean: pool high-water {log['pool_multiple']:.3f}x, live peak "
          f"{log['live_peak_multiple']:.3f}x; at the high-water: used {at.get('used', 0):.3f}x, "
          f"cached {at.get('cached', 0):.3f}x in {at.get('free_blocks')} free blocks; request "
          f"{at.get('request')}", flush=True)
    for sz, org in at.get("live", [])[:14]:
        print(f"   live {sz:.4f}x  {org}")
    big = sorted(log["new_blocks"], key=lambda b: -b[0])[:12]
    print(f"   {len(log['new_blocks'])} new blocks; the largest:")
    for sz, tot, org in big:
        print(f"   new {sz:.4f}x (pool {tot:.3f}x)  {org}")


def host():
    # 8192^2 float32 (256 MiB) on the host; under a 760 MiB pool limit the in-core lean
    # plan (1 + 2.4x) does not fit the default budget (80% of what is free): out of core
    n = 8192
    a = np.random.default_rng(5).standard_normal((n, n)).astype(np.float32)
    for limit, want in ((760 << 20, "out-of-core"), (6 << 30, "in-core")):
        pool.free_all_blocks()
        pool.set_limit(size=limit)
        try:
            t0 = time.perf_counter()
            with mpqr.explain() as tr:
                q, r = mpqr.qr(a, device="cuda", precision="fp32-emulated")
            dt = time.perf_counter() - t0
            high = pool.total_bytes()
        finally:
            pool.set_limit(size=0)
            pool.free_all_blocks()
        routes = [e.data.get("route") for e in tr.events if e.kind == "out-of-core"]
        q64 = cp.asarray(q, dtype=cp.float64)
        be = float(cp.linalg.norm(q64 @ cp.asarray(r, dtype=cp.float64) - cp.asarray(a))
                   / cp.linalg.norm(cp.asarray(a)))
        # ||Q^T Q - I||_F / sqrt(n): out of core Gram-Schmidt's orthogonality grows with
        # cond(A) u (docs/out-of-core.md: 1.0-2.5e-4 at 65536^2 fp32-emulated)
        orth = float(cp.linalg.norm(q64.T @ q64 - cp.eye(n)) / n**0.5)
        del q64, q, r
        pool.free_all_blocks()
        res["host"].append(dict(n=n, limit=limit, routes=routes, seconds=dt, backward=be,
                                orth=orth, pool_after=high))
        print(f"host {n}^2 float32 fp32-emulated, pool limit {limit:,}: routes {routes}, "
              f"{dt:.2f} s, backward {be:.1e}, orth {orth:.1e}", flush=True)
        check(f"host input, pool limit {limit:,}: {want} ({routes})", routes[-1:] == [want])
        check(f"host input, pool limit {limit:,}: backward {be:.1e} <= 1e-5, orth "
              f"(F / sqrt(n)) {orth:.1e} <= 1e-3", be <= 1e-5 and orth <= 1e-3)


def oom():
    # device inputs that no plan fits under a pool limit: mpqr's error before any work,
    # naming the bytes needed and free and what would fit
    for m, n, dt, prec in ((8192, 8192, "float64", "fp64-emulated"),
                           (8192, 8192, "float32", "fp32-emulated"),
                           (1 << 20, 256, "float64", "fp64"),
                           (4096, 16384, "float32", "fp32-emulated"),
                           (16384, 4096, "float32", "fp32-emulated")):
        a = draw(m, n, dt, 3)
        pool.set_limit(size=pool.total_bytes() + a.nbytes)
        try:
            mpqr.qr(a, precision=prec)
            got, ok = ("no error", ""), False
        except Exception as exc:
            got = (type(exc).__name__, str(exc))
            ok = (isinstance(exc, mpqr.DeviceMemoryError) and exc.needed is not None
                  and exc.free is not None and exc.needed > exc.free
                  and f"{exc.needed:,} bytes" in str(exc) and f"{exc.free:,} are free" in str(exc)
                  and "memory_budget=" in str(exc))
        finally:
            pool.set_limit(size=0)
        del a
        pool.free_all_blocks()
        res["oom"].append(dict(m=m, n=n, dtype=dt, precision=prec, error=got))
        print(f"{m} x {n} {dt} {prec}: {got[0]}: {got[1][:300]}", flush=True)
        check(f"oversize device input {m} x {n} {dt} {prec} -> DeviceMemoryError (needed, "
              "free, what fits)", ok)


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
    for m, n, dt, prec in ((16384, 16384, "float32", "fp32-emulated"),
                           (16384, 16384, "float32", "fp16"),
                           (16384, 16384, "float64", "fp64-emulated"),
                           (65536, 8192, "float32", "fp32-emulated")):
        if res["timings"] and time.perf_counter() - T0 > 66:  # the probe within its 90 s
            print(f"{m} x {n} {dt} {prec}: skipped (time)", flush=True)
            continue
        a = draw(m, n, dt, 2)
        # the default plan takes the fast route where it fits (these shapes): lean beside
        # it at one row
        settings = ("lean", "1", "0") if prec == "fp32-emulated" and m == n else ("1", "0")
        t = _time(a, prec, settings)
        del a
        pool.free_all_blocks()
        row = dict(m=m, n=n, dtype=dt, precision=prec,
                   **{{"1": "default", "0": "off"}.get(s, s): v for s, v in t.items()})
        res["timings"].append(row)
        txt = ", ".join(f"{k} {row[k] * 1e3:.1f} ms" for k in ("lean", "default", "off")
                        if k in row)
        ratio = row["default"] / row["off"]
        print(f"{m} x {n} {dt} {prec}: {txt}; default/off {ratio:.3f}"
              + (f", lean/default {row['lean'] / row['default']:.3f}" if "lean" in row else ""),
              flush=True)
        check(f"speed {m} x {n} {dt} {prec}: default plan/off {ratio:.3f} <= 1.05",
              ratio <= 1.05)


def largest():
    limit = 4 << 30
    ns = {}
    for dt, prec in (("float32", "fp32-emulated"), ("float64", "fp64-emulated")):
        if time.perf_counter() - T0 > 82:  # the probe within its 90 s
            print(f"largest n {dt}: skipped (time)", flush=True)
            continue
        for who in (prec, "cupy"):
            fn = cp.linalg.qr if who == "cupy" else (lambda x, pr=prec: mpqr.qr(x, precision=pr))
            t0 = time.perf_counter()
            n = largest_n(cp, fn, dt, limit, lo=4096, step=512)
            ns[who] = n
            res["largest"].append(dict(dtype=dt, who=who, limit=limit, n=n))
            print(f"{dt} {who}: largest n under {limit:,} bytes: {n} "
                  f"({time.perf_counter() - t0:.1f} s)", flush=True)
        ratio = ns[prec] / ns["cupy"] if ns["cupy"] else float("nan")
        check(f"largest n {dt} {prec} / cupy.linalg.qr = {ns[prec]} / {ns['cupy']} = "
              f"{ratio:.3f} >= 0.85", ratio >= 0.85)


if __name__ == "__main__":
    for name, fn in (("rows", rows), ("alloc", alloc), ("host", host), ("oom", oom),
                     ("timings", timings), ("largest", largest)):
        part(name, fn)
    for k, v in res["checks"].items():
        print(f"{v}: {k}")
    path = os.path.join(OUT, "memory.json")
    with open(path, "w") as f:
        json.dump(res, f, indent=1, default=str)
    print("wrote", path)
    sys.exit(0)
