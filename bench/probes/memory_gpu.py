"""Device memory of mpqr.qr: high-water marks, speed with the plan on/off, the largest n.

``python bench/probes/memory_gpu.py`` (writes ``$OUT/memory.json``, ``OUT`` default /tmp):

1. rows: the pool high-water and live-bytes peak (multiples of the input) of the five rows
   of the memory targets, the plan on (``MPQR_MEMORY_PLAN=1``: the check, the engines'
   scratch caps and tiled products) and off (``0``), ``cupy.linalg.qr`` beside each, the
   plan's estimate, and PASS/FAIL of the backward error ``||QR - A|| / ||A||`` and the
   orthogonality ``||Q^T Q - I||_F / n`` (float64 on the device) against bounds from
   the precision; whether plan on/off give the same bits;
2. seconds per call, plan on/off, median of 5 alternating after a warm-up, at the bench
   shapes (16384^2 fp16 / fp32-emulated / fp64-emulated, 65536 x 8192 fp32-emulated);
3. sweep: the fp16 engines' cap (``SPLIT_FRACTION``) and the Ozaki cap
   (``OZAKI_FRACTION``): peak and seconds at 16384^2;
4. an oversize device input (pool capped with ``set_limit``) -> ``DeviceMemoryError``;
5. the largest n: from the measured pool multiples M (plan on), the largest n x n that
   fits L bytes is ``n = sqrt(L / (b (1 + M)))``; confirmed under a pool limit of 8 GiB
   (mpqr fp32-emulated / fp64-emulated and cupy.linalg.qr at float32 / float64: the
   model's n must run, 1.08 x it must not), then scaled to an 80 GB card
   (``n80 = n sqrt(80e9 / L)``) and the ratio mpqr / cuSOLVER (target >= 0.85).
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
from mpqr.bench.memory import ROWS, measure_call

OUT = os.environ.get("OUT", "/tmp")
res: dict = {"environment": environment(cp), "rows": [], "timings": [], "sweep": [],
             "oom": {}, "largest": [], "checks": {}}
pool = cp.get_default_memory_pool()
U = {"fp16": 2.0**-11, "fp32-emulated": 2.0**-24, "fp64-emulated": 2.0**-53,
     "auto": 2.0**-53}
#: pool multiples, plan on, from the rows (for the largest-n model)
MULT: dict = {}


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
    from mpqr.qr.memory_plan import estimate_bytes
    print(f"{'call':<38} {'on pool':>8} {'off pool':>8} {'on live':>8} {'cupy':>6} "
          f"{'plan est':>8}  backward  orth  bits")
    for m, n, dt, prec in ROWS:
        a = cp.random.default_rng(0).standard_normal((m, n), dtype=cp.float64).astype(dt)
        r = dict(m=m, n=n, dtype=dt, precision=prec)
        for on in (True, False):
            plan(on)
            r["on" if on else "off"] = measure_call(
                cp, lambda x, pr=prec: mpqr.qr(x, precision=pr), a)
        plan(True)
        r["cupy"] = measure_call(cp, cp.linalg.qr, a)
        meth = "cholqr2" if n <= 64 else "householder-recursive"
        r["estimate"] = estimate_bytes(meth, prec, (m, n), a.itemsize) / a.nbytes
        q, rr = mpqr.qr(a, precision=prec)
        plan(False)
        q0, r0 = mpqr.qr(a, precision=prec)
        plan(True)
        r["bitwise_on_off"] = bool(cp.array_equal(q, q0) and cp.array_equal(rr, r0))
        del q0, r0
        if n * n * 8 * 3 < 20e9:
            be, orth = errors(a, q, rr)
            bb, bo = bounds(prec, m, n)
            r.update(backward=be, orth=orth)
            res["checks"][f"{m} x {n} {dt} {prec} plan on: backward {be:.1e} <= {bb:.1e}, "
                          f"orth {orth:.1e} <= {bo:.1e}"] = \
                "PASS" if be <= bb and orth <= bo else "FAIL"
        else:
            be = orth = float("nan")
        del q, rr, a
        pool.free_all_blocks()
        if m == n:  # the model of the largest n x n reads the square rows
            MULT[(dt, prec)] = r["on"]["pool_multiple"]
            MULT[(dt, "cupy")] = r["cupy"]["pool_multiple"]
        res["rows"].append(r)
        print(f"{m} x {n} {dt} {prec:<14} {r['on']['pool_multiple']:>7.2f}x "
              f"{r['off']['pool_multiple']:>7.2f}x {r['on']['peak_live_multiple']:>7.2f}x "
              f"{r['cupy']['pool_multiple']:>5.2f}x {r['estimate']:>7.2f}x  {be:.1e} "
              f"{orth:.1e} {r['bitwise_on_off']}", flush=True)


def _time(a, prec, reps=5):
    samples = {True: [], False: []}
    for on in (True, False):  # warm-up
        plan(on)
        mpqr.qr(a, precision=prec)
    for _ in range(reps):
        for on in (True, False):
            plan(on)
            sync()
            t0 = time.perf_counter()
            mpqr.qr(a, precision=prec)
            sync()
            samples[on].append(time.perf_counter() - t0)
    plan(True)
    return statistics.median(samples[True]), statistics.median(samples[False])


def timings():
    for m, n, dt, prec in [(16384, 16384, "float32", "fp16"),
                           (16384, 16384, "float32", "fp32-emulated"),
                           (16384, 16384, "float64", "fp64-emulated"),
                           (65536, 8192, "float32", "fp32-emulated")]:
        a = cp.random.default_rng(1).standard_normal((m, n), dtype=cp.float64).astype(dt)
        on_s, off_s = _time(a, prec)
        res["timings"].append(dict(m=m, n=n, dtype=dt, precision=prec, on_s=on_s,
                                   off_s=off_s, ratio=on_s / off_s))
        res["checks"][f"speed {m} x {n} {dt} {prec}: plan on/off {on_s / off_s:.3f} <= 1.05"] \
            = "PASS" if on_s <= 1.05 * off_s else "FAIL"
        print(f"{m} x {n} {dt} {prec}: on {on_s * 1e3:.1f} ms, off {off_s * 1e3:.1f} ms, "
              f"on/off {on_s / off_s:.3f}", flush=True)
        del a
        pool.free_all_blocks()


def sweep():
    from mpqr.qr import memory_plan as mp
    n = 16384
    for dt, prec, attr, values in (("float32", "fp32-emulated", "SPLIT_FRACTION", (0.25, 1.0)),
                                   ("float32", "fp16", "SPLIT_FRACTION", (0.25,)),
                                   ("float64", "fp64-emulated", "OZAKI_FRACTION", (0.5,))):
        a = cp.random.default_rng(3).standard_normal((n, n), dtype=cp.float64).astype(dt)
        keep = getattr(mp, attr)
        for v in values:
            setattr(mp, attr, v)
            try:
                got = measure_call(cp, lambda x, pr=prec: mpqr.qr(x, precision=pr), a)
                on_s, off_s = _time(a, prec, reps=3)
            finally:
                setattr(mp, attr, keep)
            res["sweep"].append(dict(n=n, dtype=dt, precision=prec, knob=attr, value=v,
                                     pool_multiple=got["pool_multiple"], on_s=on_s,
                                     off_s=off_s))
            print(f"{n}^2 {dt} {prec} {attr}={v}: pool {got['pool_multiple']:.2f}x, on "
                  f"{on_s * 1e3:.1f} ms, off {off_s * 1e3:.1f} ms ({on_s / off_s:.3f})",
                  flush=True)
        del a
        pool.free_all_blocks()


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


def _runs(fn, dt, n, limit):
    pool.free_all_blocks()
    pool.set_limit(size=limit)
    try:
        a = cp.random.default_rng(4).standard_normal((n, n), dtype=cp.float32).astype(dt)
        out = fn(a)
        sync()
        del out, a
        return "ok"
    except Exception as exc:
        return type(exc).__name__
    finally:
        pool.set_limit(size=0)
        pool.free_all_blocks()


def largest():
    limit = 8 << 30
    ns = {}
    for dt, prec in (("float32", "fp32-emulated"), ("float64", "fp64-emulated")):
        b = 4 if dt == "float32" else 8
        for who in (prec, "cupy"):
            mult = MULT.get((dt, who))
            if mult is None:
                continue
            n = int((limit / (b * (1 + mult))) ** 0.5) // 256 * 256
            fn = cp.linalg.qr if who == "cupy" else (lambda x, pr=prec: mpqr.qr(x, precision=pr))
            t0 = time.perf_counter()
            at = _runs(fn, dt, n, limit)
            over = _runs(fn, dt, int(n * 1.08) // 256 * 256, limit)
            n80 = int(n * (80e9 / limit) ** 0.5)
            ns[(dt, who)] = n80
            res["largest"].append(dict(dtype=dt, who=who, multiple=mult, limit=limit, n=n,
                                       at_n=at, at_1_08n=over, n_80gb=n80))
            print(f"{dt} {who}: pool multiple {mult:.2f} -> n {n} under {limit:,} bytes: "
                  f"{at}; at 1.08 n: {over}; 80 GB card: n ~ {n80} "
                  f"({time.perf_counter() - t0:.1f} s)", flush=True)
            res["checks"][f"largest-n model {dt} {who}: n runs"] = "PASS" if at == "ok" else "FAIL"
        if (dt, prec) in ns and (dt, "cupy") in ns:
            ratio = ns[(dt, prec)] / ns[(dt, "cupy")]
            res["checks"][f"largest n {dt} {prec} / cupy.linalg.qr = {ratio:.3f} >= 0.85"] = \
                "PASS" if ratio >= 0.85 else "FAIL"


if __name__ == "__main__":
    for name, fn in (("rows", rows), ("timings", timings), ("sweep", sweep), ("oom", oom),
                     ("largest", largest)):
        part(name, fn)
    for k, v in res["checks"].items():
        print(f"{v}: {k}")
    path = os.path.join(OUT, "memory.json")
    with open(path, "w") as f:
        json.dump(res, f, indent=1, default=str)
    print("wrote", path)
    sys.exit(0)
