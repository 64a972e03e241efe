"""Device memory of mpqr.qr: the lean plan's pool high-water beside cuSOLVER at the memory
targets' rows, where the fp16 high-water sits, the lean complete route against its
estimate, device inputs that do not fit (DeviceMemoryError, never CuPy's own error), host
inputs out of core by themselves, speed with the plan on and off, the largest n.

``python bench/probes/memory_gpu.py`` (writes ``$OUT/memory.json``, ``OUT`` default /tmp;
under 90 s on an H200: each part after the first is skipped past its time guard):

1. rows: pool high-water and live peak beyond the input (multiples of its bytes) of
   16384^2 float32 fp16 and fp32-emulated, float64 fp64-emulated, 65536 x 8192 float32
   fp32-emulated (the lean plan forced) and 2^24 x 64 float64 auto (the default plan),
   each beside ``cupy.linalg.qr`` in the same process, the pool's cached blocks handed
   back before each measurement; PASS/FAIL: targets (fp16, fp32-emulated, tall <= 2.5x;
   fp64-emulated <= 3x), the estimate, backward error and orthogonality (float64 on the
   device) against bounds from the precision;
2. complete: lean ``mode="complete"`` (route forced: ``method="auto"`` takes cuSOLVER
   there) at 8192 x 2048 and 4096 x 1024 float32 and 4096^2 fp16 lean, within their
   estimates (the GPU tests' shapes, the route forced);
3. alloc: the allocation log of 16384^2 float32 fp16 lean (the live blocks at the pool's
   high-water and where each was asked for, the cached bytes beside them, the new blocks);
4. oom: device inputs under a pool limit -> DeviceMemoryError (bytes needed, free, what
   would fit) on the square, tall, wide and library routes (8192^2, 16384 x 4096 float32
   among them); with the check off, the device's own error from inside -> DeviceMemoryError
   (CuPy's OutOfMemoryError its cause, or translated), never CuPy's raw error;
5. host: a host input with ``device="cuda"`` under a pool limit its in-core plan does not
   fit -> out of core by itself, accurate; with room -> in core;
6. timings: median of 5 after a warm-up, default plan / off (target <= 1.05) at the
   square rows and 65536 x 8192, lean beside them at fp16;
7. largest: the largest n x n under a 4 GiB pool limit, mpqr (float32 fp32-emulated,
   float64 fp64-emulated) against cupy.linalg.qr (target >= 0.85);
8. tests: ``pytest -q -n 0 tests/test_memory_plan.py -k gpu`` where time is left (else
   named for the lead).
Parts run in the order rows, timings, oom, complete, host, largest, alloc, tests. Each
part is caught on its own; a failure prints its traceback and the script goes on.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
import traceback

import cupy as cp
import numpy as np

import mpqr
from mpqr.bench._timing import environment
from mpqr.bench.memory import _hook, allocation_log, largest_n, measure_call

OUT = os.environ.get("OUT", "/tmp")
T0 = time.perf_counter()
BUDGET = 82.0  # seconds from the imports on: the probe within its 90
res: dict = {"environment": environment(cp), "rows": [], "complete": [], "alloc": {},
             "oom": [], "host": [], "timings": [], "largest": [], "tests": {}, "checks": {}}
pool = cp.get_default_memory_pool()
U = {"fp16": 2.0**-11, "fp32-emulated": 2.0**-24, "fp64-emulated": 2.0**-53,
     "auto": 2.0**-53, "fp64": 2.0**-53, "fp32": 2.0**-24}
# (m, n, dtype, precision, plan forced)
ROWS = [(16384, 16384, "float32", "fp16", "lean"),
        (1 << 24, 64, "float64", "auto", "1"),
        (16384, 16384, "float32", "fp32-emulated", "lean"),
        (16384, 16384, "float64", "fp64-emulated", "lean"),
        (65536, 8192, "float32", "fp32-emulated", "lean")]
TARGET = {"fp16": 2.5, "fp32-emulated": 2.5, "fp64-emulated": 3.0, "auto": 2.5}
TESTS = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider",
         "tests/test_memory_plan.py", "-k", "gpu"]


def left() -> float:
    return BUDGET - (time.perf_counter() - T0)


def sync():
    cp.cuda.Device().synchronize()


def check(name, ok):
    res["checks"][name] = "PASS" if ok else "FAIL"


def plan(setting: str) -> None:
    os.environ["MPQR_MEMORY_PLAN"] = setting


def errors(a, q, r):
    """(backward, orthogonality ||Q^T Q - I||_F / sqrt(n)) in float64 on the device."""
    a64, q64, r64 = (x.astype(cp.float64) for x in (a, q, r))
    be = float(cp.linalg.norm(q64 @ r64 - a64) / cp.linalg.norm(a64))
    del a64, r64
    n = q.shape[1]
    orth = float(cp.linalg.norm(q64.T @ q64 - cp.eye(n)) / n**0.5)
    return be, orth


def bounds(prec, n):
    # fp16: the TC-QR table (backward 1e-3; orthogonality 2e-4 as ||.||_F / n, here
    # / sqrt(n)); else 32 sqrt(n) u (Householder, normwise)
    if prec == "fp16":
        return 1e-3, 2e-4 * n**0.5
    return 32 * n**0.5 * U[prec], 32 * n**0.5 * U[prec]


def part(name, fn, need=0.0):
    t0 = time.perf_counter()
    if left() < need:
        print(f"-- {name}: skipped ({left():.0f} s left, needs ~{need:.0f})", flush=True)
        res["checks"][f"{name}: run"] = "SKIPPED (time)"
        return
    try:
        fn()
    except Exception:
        traceback.print_exc()
        res["checks"][f"{name}: ran"] = "FAIL (exception)"
    print(f"-- {name}: {time.perf_counter() - t0:.1f} s (at {time.perf_counter() - T0:.0f} s)",
          flush=True)
    pool.set_limit(size=0)
    pool.free_all_blocks()
    plan("1")


def draw(m, n, dt, seed=0):
    a = cp.random.default_rng(seed).standard_normal((m, n), dtype=cp.float64).astype(dt)
    pool.free_all_blocks()
    return a


def measured(fn, a):
    """Errors of a warm-up call, then the pool's growth and live peak beyond the input of
    one call (cached blocks handed back first), multiples of the input's bytes."""
    q, r = fn(a)
    be, orth = errors(a, q, r)
    del q, r
    sync()
    pool.free_all_blocks()
    base = pool.total_bytes()
    hook = _hook(cp)
    t0 = time.perf_counter()
    with hook:
        out = fn(a)
        sync()
    dt = time.perf_counter() - t0
    high = max(pool.total_bytes(), hook.pool_peak)
    del out
    pool.free_all_blocks()
    return {"pool_multiple": (high - base) / a.nbytes, "peak_live_multiple": hook.peak / a.nbytes,
            "seconds": dt, "backward": be, "orth": orth}


def rows():
    from mpqr.qr.memory_plan import estimate_bytes
    print(f"{'call':<40} {'pool':>6} {'live':>6} {'cupy':>6} {'est':>6}  backward  orth",
          flush=True)
    for m, n, dt, prec, setting in ROWS:
        if res["rows"] and left() < 40:
            print(f"{m} x {n} {dt} {prec}: skipped (time)", flush=True)
            continue
        a = draw(m, n, dt)
        plan(setting)
        got = measured(lambda x, pr=prec: mpqr.qr(x, precision=pr), a)
        plan("1")
        lib = measure_call(cp, cp.linalg.qr, a)
        method = "cholqr2" if n <= 256 else "householder-recursive"
        est = estimate_bytes(method, prec, (m, n), a.itemsize,
                             "lean" if setting == "lean" else "fast") / a.nbytes
        del a
        pool.free_all_blocks()
        tag = f"{m} x {n} {dt} {prec} ({'lean' if setting == 'lean' else 'default'})"
        res["rows"].append(dict(m=m, n=n, dtype=dt, precision=prec, plan=setting, mpqr=got,
                                cupy=lib, estimate=est))
        pm, lv = got["pool_multiple"], got["peak_live_multiple"]
        print(f"{tag:<40} {pm:>5.2f}x {lv:>5.2f}x {lib['pool_multiple']:>5.2f}x {est:>5.2f}x"
              f"  {got['backward']:.1e}  {got['orth']:.1e}  ({got['seconds'] * 1e3:.0f} ms)",
              flush=True)
        bb, bo = bounds(prec, n)
        check(f"{tag}: backward {got['backward']:.1e} <= {bb:.1e}, orth {got['orth']:.1e} "
              f"<= {bo:.1e}", got["backward"] <= bb and got["orth"] <= bo)
        check(f"{tag}: pool {pm:.3f}x <= target {TARGET[prec]}x", pm <= TARGET[prec])
        # plus the pool's fixed per-call blocks (kernel scratch, scalars), as the GPU test
        check(f"{tag}: pool {pm:.3f}x <= estimate {est:.3f}x (+4 MiB)",
              pm <= est + (4 << 20) / (m * n * np.dtype(dt).itemsize))


def complete():
    from mpqr.qr.memory_plan import estimate_bytes
    for m, n, mode, dt, prec, setting in (
            (8192, 2048, "complete", "float32", "fp32-emulated", "lean"),
            (4096, 1024, "complete", "float32", "fp32-emulated", "lean"),
            (4096, 4096, "reduced", "float32", "fp16", "lean")):
        a = draw(m, n, dt, 3)
        plan(setting)
        got = measured(lambda x, md=mode, pr=prec: mpqr.qr(
            x, mode=md, precision=pr, method="householder-recursive"), a)
        plan("1")
        est = estimate_bytes("householder-recursive", prec, (m, n), a.itemsize, setting,
                             complete=mode == "complete") / a.nbytes
        fixed = (4 << 20) / a.nbytes  # the pool's fixed per-call blocks (the GPU test's)
        del a
        tag = f"{m} x {n} {dt} {prec} mode={mode} {setting}"
        res["complete"].append(dict(m=m, n=n, dtype=dt, precision=prec, mode=mode,
                                    plan=setting, mpqr=got, estimate=est))
        print(f"{tag}: pool {got['pool_multiple']:.2f}x, live {got['peak_live_multiple']:.2f}x,"
              f" estimate {est:.2f}x; backward {got['backward']:.1e}, orth {got['orth']:.1e}",
              flush=True)
        bb, bo = bounds(prec, min(m, n))
        check(f"{tag}: backward, orth within {bb:.1e}",
              got["backward"] <= bb and got["orth"] <= bo * (m / min(m, n)) ** 0.5)
        check(f"{tag}: pool {got['pool_multiple']:.2f}x <= estimate {est:.2f}x (+4 MiB)",
              got["pool_multiple"] <= est + fixed)


def alloc():
    a = draw(16384, 16384, "float32")
    plan("lean")
    log = allocation_log(cp, lambda x: mpqr.qr(x, precision="fp16"), a)
    plan("1")
    del a
    res["alloc"] = log
    at = log["at_high"]
    print(f"16384^2 fp16 lean: pool high-water {log['pool_multiple']:.3f}x, live peak "
          f"{log['live_peak_multiple']:.3f}x; at the high-water: used {at.get('used', 0):.3f}x, "
          f"cached {at.get('cached', 0):.3f}x in {at.get('free_blocks')} free blocks; request "
          f"{at.get('request')}", flush=True)
    for sz, org in at.get("live", [])[:12]:
        print(f"   live {sz:.4f}x  {org}")
    big = sorted(log["new_blocks"], key=lambda b: -b[0])[:10]
    print(f"   {len(log['new_blocks'])} new blocks; the largest:")
    for sz, tot, org in big:
        print(f"   new {sz:.4f}x (pool {tot:.3f}x)  {org}")


def _is_device_error(exc):
    return (isinstance(exc, mpqr.DeviceMemoryError) and exc.needed is not None
            and exc.free is not None and exc.needed > exc.free
            and f"{exc.needed:,} bytes" in str(exc) and f"{exc.free:,} are free" in str(exc)
            and "memory_budget=" in str(exc))


def oom():
    # device inputs that no plan fits under a pool limit: mpqr's error before any work,
    # naming the bytes needed and free and what would fit
    for m, n, dt, prec in ((8192, 8192, "float32", "fp32-emulated"),
                           (16384, 4096, "float32", "fp32-emulated"),
                           (8192, 8192, "float64", "fp64-emulated"),
                           (1 << 20, 256, "float64", "fp64"),
                           (4096, 16384, "float32", "fp32-emulated"),
                           (8192, 8192, "float32", "fp16")):
        a = draw(m, n, dt, 3)
        pool.set_limit(size=pool.total_bytes() + a.nbytes)
        try:
            mpqr.qr(a, precision=prec)
            got, ok = ("no error", ""), False
        except Exception as exc:
            got = (type(exc).__name__, str(exc))
            ok = _is_device_error(exc)
        finally:
            pool.set_limit(size=0)
        del a
        pool.free_all_blocks()
        res["oom"].append(dict(m=m, n=n, dtype=dt, precision=prec, error=got))
        print(f"{m} x {n} {dt} {prec}: {got[0]}: {got[1][:240]}", flush=True)
        check(f"oversize device input {m} x {n} {dt} {prec} -> DeviceMemoryError (needed, "
              "free, what fits)", ok)
    # the check off: the device's own out-of-memory error from inside the call, as
    # DeviceMemoryError with CuPy's error as its cause (never raw)
    for m, n, dt, prec, method in ((8192, 8192, "float32", "fp32-emulated", "auto"),
                                   (8192, 8192, "float32", "fp16", "householder-recursive")):
        a = draw(m, n, dt, 4)
        plan("0")
        pool.set_limit(size=pool.total_bytes() + a.nbytes)
        try:
            mpqr.qr(a, precision=prec, method=method)
            got, ok = ("no error", ""), False
        except Exception as exc:
            got = (type(exc).__name__, f"{exc} (cause: {type(exc.__cause__).__name__})")
            # mpqr's error (the device's as its cause, or translated into a subclass of
            # both), never CuPy's OutOfMemoryError alone
            oom_cls = cp.cuda.memory.OutOfMemoryError
            ok = (isinstance(exc, mpqr.DeviceMemoryError)
                  and (isinstance(exc, oom_cls) or isinstance(exc.__cause__, oom_cls)))
        finally:
            pool.set_limit(size=0)
            plan("1")
        del a
        pool.free_all_blocks()
        res["oom"].append(dict(m=m, n=n, dtype=dt, precision=prec, method=method,
                               plan="off", error=got))
        print(f"{m} x {n} {dt} {prec} {method}, check off: {got[0]}: {got[1][-200:]}",
              flush=True)
        check(f"device out of memory inside {m} x {n} {dt} {prec} {method} (check off) -> "
              "DeviceMemoryError, not CuPy's raw error", ok)


def host():
    # 8192^2 float32 (256 MiB) on the host; under a 760 MiB pool limit the in-core plan
    # does not fit the default budget (80% of what is free): out of core; with room, in
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
        finally:
            pool.set_limit(size=0)
            pool.free_all_blocks()
        routes = [e.data.get("route") for e in tr.events if e.kind == "out-of-core"]
        be, orth = errors(cp.asarray(a), cp.asarray(q), cp.asarray(r))
        del q, r
        pool.free_all_blocks()
        res["host"].append(dict(n=n, limit=limit, routes=routes, seconds=dt, backward=be,
                                orth=orth))
        print(f"host {n}^2 float32 fp32-emulated, pool limit {limit:,}: routes {routes}, "
              f"{dt:.2f} s, backward {be:.1e}, orth {orth:.1e}", flush=True)
        check(f"host input, pool limit {limit:,}: {want} ({routes})", routes[-1:] == [want])
        # out of core Gram-Schmidt's orthogonality grows with cond(A) u
        # (docs/out-of-core.md: 1.0-2.5e-4 at 65536^2 fp32-emulated)
        check(f"host input, pool limit {limit:,}: backward {be:.1e} <= 1e-5, orth "
              f"(F / sqrt(n)) {orth:.1e} <= 1e-3", be <= 1e-5 and orth <= 1e-3)


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
    for m, n, dt, prec in ((16384, 16384, "float32", "fp16"),
                           (16384, 16384, "float32", "fp32-emulated"),
                           (16384, 16384, "float64", "fp64-emulated"),
                           (65536, 8192, "float32", "fp32-emulated")):
        if res["timings"] and left() < 26:
            print(f"{m} x {n} {dt} {prec}: skipped (time)", flush=True)
            continue
        a = draw(m, n, dt, 2)
        settings = ("1", "0", "lean") if prec == "fp16" else ("1", "0")
        t = _time(a, prec, settings)
        del a
        pool.free_all_blocks()
        row = dict(m=m, n=n, dtype=dt, precision=prec,
                   **{{"1": "default", "0": "off"}.get(s, s): v for s, v in t.items()})
        res["timings"].append(row)
        txt = ", ".join(f"{k} {row[k] * 1e3:.1f} ms" for k in ("default", "off", "lean")
                        if k in row)
        ratio = row["default"] / row["off"]
        print(f"{m} x {n} {dt} {prec}: {txt}; default/off {ratio:.3f}", flush=True)
        check(f"speed {m} x {n} {dt} {prec}: default plan/off {ratio:.3f} <= 1.05",
              ratio <= 1.05)


def largest():
    limit = 4 << 30
    for dt, prec in (("float32", "fp32-emulated"), ("float64", "fp64-emulated")):
        if left() < 12:
            print(f"largest n {dt}: skipped (time)", flush=True)
            continue
        ns = {}
        for who in (prec, "cupy"):
            fn = cp.linalg.qr if who == "cupy" else (lambda x, pr=prec: mpqr.qr(x, precision=pr))
            t0 = time.perf_counter()
            ns[who] = largest_n(cp, fn, dt, limit, lo=4096, step=512)
            res["largest"].append(dict(dtype=dt, who=who, limit=limit, n=ns[who]))
            print(f"{dt} {who}: largest n under {limit:,} bytes: {ns[who]} "
                  f"({time.perf_counter() - t0:.1f} s)", flush=True)
        ratio = ns[prec] / ns["cupy"] if ns["cupy"] else float("nan")
        check(f"largest n {dt} {prec} / cupy.linalg.qr = {ns[prec]} / {ns['cupy']} = "
              f"{ratio:.3f} >= 0.85", ratio >= 0.85)


def tests():
    budget = left() - 2
    if budget < 25:
        print(f"GPU tests: not run here ({left():.0f} s left); run: {' '.join(TESTS[2:])}",
              flush=True)
        res["tests"] = {"run": False, "command": " ".join(TESTS)}
        return
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        p = subprocess.run(TESTS, cwd=root, capture_output=True, text=True, timeout=budget)
        tail = (p.stdout + p.stderr).strip().splitlines()[-25:]
        res["tests"] = {"run": True, "rc": p.returncode, "tail": tail}
        print("\n".join(tail), flush=True)
        check("GPU tests (pytest tests/test_memory_plan.py -k gpu)", p.returncode == 0)
    except subprocess.TimeoutExpired:
        res["tests"] = {"run": True, "rc": None, "timeout": budget}
        print(f"GPU tests: stopped after {budget:.0f} s", flush=True)
        res["checks"]["GPU tests: run"] = "SKIPPED (time)"


if __name__ == "__main__":
    # the first row pays the kernels' first use (~30 s on a fresh kernel cache)
    for name, fn, need in (("rows", rows, 0), ("timings", timings, 8), ("oom", oom, 2),
                           ("complete", complete, 5), ("host", host, 9),
                           ("largest", largest, 12), ("alloc", alloc, 6), ("tests", tests, 25)):
        part(name, fn, need)
    for k, v in res["checks"].items():
        print(f"{v}: {k}")
    path = os.path.join(OUT, "memory.json")
    with open(path, "w") as f:
        json.dump(res, f, indent=1, default=str)
    print(f"wrote {path} ({time.perf_counter() - T0:.0f} s)")
    sys.exit(0)
