"""Wide tall CholQR2 on the GPU (65536 x 4096 float32 ``fp32-emulated``): PASS/FAIL, levers, phases.

``python bench/probes/sketch_gpu.py`` (JSON to ``$OUT/sketch.json``, ``OUT`` default /tmp;
``--rows-div N``: every row count divided by N, a dry run on small shapes)

* 65536 x 4096 float32 ``fp32-emulated`` and float64 ``auto``, round-robin in one process
  beside ``cupy.linalg.qr`` of the same dtype: ``new`` (this tree), ``no_keep`` (CholQR2's
  second pass always solves: ``KEEP_Q1_MAX = None``), ``old`` (every lever of the wide
  route off); float32 also mode ``r`` with the keep on and off. PASS/FAIL: orthogonality
  ``||I - Q^T Q||_F / n`` and backward error ``||A - QR||_F / ||A||_F`` in float64 against
  1e-15 / 2e-15 (float64) and 9 u / 18 u (float32); the distance the keep test read.
* 65536 x 4096 float32 ``fp32-emulated`` at cond 1e2 / 1e3: Q1 not kept, targets met.
* The bench's own timing (``mpqr.bench.qr._shape_rows``: CUDA events, back-to-back calls
  after one warm-up) of the float32 row in this process, beside the round-robin's.
* Rechecks, ``auto`` float64 beside cuSOLVER: 2^20 x 256 at cond 1, 1e8, 1e12, 1e15; 2^22 x
  64 at cond 1e12, 1e15 (targets 3x / 8x).
* Phases of the float32 row (each alone): Gram on tc-sgemm, potrf, the first pass's
  substitution, the keep test, the certified pass's ``Q1 X2`` (recursive, tc-sgemm).
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

import cupy as cp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import mpqr
from mpqr.bench._timing import release_pool, time_it

ROWS: list[dict] = []
T0 = time.perf_counter()
#: rows divided by this (``--rows-div N``: a dry run of the script on small shapes)
DIV = int(sys.argv[sys.argv.index("--rows-div") + 1]) if "--rows-div" in sys.argv else 1
BUDGET_S = 82.0  # the optional parts run only while the script is within this
#: targets (float64; float32 the same multiples of its unit roundoff: 9 u and 18 u)
TARGETS = {"float64": (1e-15, 2e-15), "float32": (9 * 2.0**-24, 18 * 2.0**-24)}


def say(row: dict) -> None:
    ROWS.append(row)
    print({k: (f"{v:.3g}" if isinstance(v, float) else v) for k, v in row.items()},
          flush=True)


def guarded(fn):
    def run(*args, **kw):
        try:
            return fn(*args, **kw)
        except Exception:  # one failing part does not stop the others
            traceback.print_exc()
            say({"what": fn.__name__, "args": repr(args), "status": "ERROR"})
            return None
    return run


def backend():
    from mpqr.backends import get_backend

    from mpqr._array_api import array_namespace

    return get_backend(array_namespace(cp.empty(1)))


def errors(a, q, r):
    """Orthogonality ``||I - Q^T Q||_F / n`` and backward error, in float64."""
    a, q, r = (x.astype(cp.float64) for x in (a, q, r))
    n = q.shape[1]
    orth = float(cp.linalg.norm(q.T @ q - cp.eye(n)) / n)
    back = float(cp.linalg.norm(a - q @ r) / cp.linalg.norm(a))
    return orth, back


def ab(fns, repeat=5, max_seconds=6.0):
    """Median ms per call of each of ``fns``, round-robin, each call between syncs."""
    dev = cp.cuda.Device()
    for f in fns.values():
        f()
    dev.synchronize()
    release_pool(cp)
    times = {k: [] for k in fns}
    t0 = time.perf_counter()
    for i in range(repeat):
        for k, f in fns.items():
            dev.synchronize()
            t = time.perf_counter()
            f()
            dev.synchronize()
            times[k].append(time.perf_counter() - t)
        if i >= 2 and time.perf_counter() - t0 > max_seconds:
            break
    return {k: statistics.median(v) * 1e3 for k, v in times.items()}


def _off(variant: str) -> tuple[str, ...]:
    """The levers a variant name turns off: ``new`` none, ``old`` all, ``no_X`` lever X."""
    return () if variant == "new" else ("old",) if variant == "old" else (variant[3:],)


@contextlib.contextmanager
def levers(*off):
    """This tree with the named levers off: ``keep`` (CholQR2's second pass always
    solves), ``right`` (left-looking substitution), ``trmm`` (A X by one split), ``lower``
    (the diagonal-only bound before an inverse), ``tall`` (float32's products native),
    ``low`` (float64's first Gram native); ``old``: all of them."""
    from mpqr.qr import cholqr, driver

    if "old" in off:
        off = ("keep", "right", "trmm", "lower", "tall", "low")
    saved = (cholqr.KEEP_Q1_MAX, cholqr.RIGHT_LOOKING_MIN_N, cholqr.TRIANGULAR_RECURSE_MIN_N,
             cholqr._cond1_lower, driver.tall_products_precision, cholqr.LOW_FIRST_GRAM)
    if "keep" in off:
        cholqr.KEEP_Q1_MAX = None
    if "right" in off:
        cholqr.RIGHT_LOOKING_MIN_N = None
    if "trmm" in off:
        cholqr.TRIANGULAR_RECURSE_MIN_N = None
    if "lower" in off:
        cholqr._cond1_lower = cholqr._diag_ratio
    if "tall" in off:
        driver.tall_products_precision = lambda *_a, **_k: None
    if "low" in off:
        cholqr.LOW_FIRST_GRAM = None
    try:
        yield
    finally:
        (cholqr.KEEP_Q1_MAX, cholqr.RIGHT_LOOKING_MIN_N, cholqr.TRIANGULAR_RECURSE_MIN_N,
         cholqr._cond1_lower, driver.tall_products_precision, cholqr.LOW_FIRST_GRAM) = saved


def _route(tr):
    return {"engines": tr.engines(),
            "events": [e.message[:110] for e in tr.events
                       if e.kind in ("route", "fallback", "apply-inverse", "precision",
                                     "keep-q1")][:6]}


@guarded
def bench_wide(dtype, precision, variants, r_too=False):
    m, n = 65536 // DIV, 4096 // DIV
    a = cp.random.default_rng(0).standard_normal((m, n), dtype=cp.float64).astype(dtype)
    name = cp.dtype(dtype).name
    orth_max, back_max = TARGETS[name]
    row = {"what": "qr wide", "shape": f"{m}x{n}", "dtype": name, "precision": precision}
    fns = {"cusolver": lambda: cp.linalg.qr(a)}
    for var in variants:
        with levers(*_off(var)), mpqr.explain() as tr:
            q, r = mpqr.qr(a, precision=precision)
        orth, back = errors(a, q, r)
        del q, r
        ok = orth <= orth_max and back <= back_max
        row.update({f"{var}_orth": orth, f"{var}_backward": back,
                    f"{var}_status": "PASS" if ok else "FAIL", f"{var}_route": _route(tr),
                    f"{var}_kept": any(e.kind == "keep-q1" for e in tr.events)})
        if var == "new":
            row["new_keep_events"] = [e.message for e in tr.events if e.kind == "keep-q1"]

        def call(var=var):
            with levers(*_off(var)):
                mpqr.qr(a, precision=precision)
        fns[var] = call
        release_pool(cp)
    if r_too:  # mode "r" with the keep on and off
        for var in ("new", "no_keep"):
            def call_r(var=var):
                with levers(*_off(var)):
                    mpqr.qr(a, mode="r", precision=precision)
            fns[f"{var}_r"] = call_r
    for key, ms in ab(fns, repeat=5, max_seconds=8.0).items():
        row[f"{key}_ms"] = ms
    for var in [*variants, *(("new_r", "no_keep_r") if r_too else ())]:
        row[f"{var}_speedup"] = row["cusolver_ms"] / row[f"{var}_ms"]
    say(row)
    release_pool(cp)


@guarded
def wide_cond(cond):
    """65536 x 4096 float32 ``fp32-emulated`` at ``cond``: whether Q1 was kept, targets."""
    from ill_conditioned import matrix

    a = matrix(65536 // DIV, 4096 // DIV, cond, seed=4).astype(cp.float32)
    with mpqr.explain() as tr:
        q, r = mpqr.qr(a, precision="fp32-emulated")
    orth, back = errors(a, q, r)
    del q, r
    t = ab({"cusolver": lambda: cp.linalg.qr(a),
            "new": lambda: mpqr.qr(a, precision="fp32-emulated")}, repeat=5)
    orth_max, back_max = TARGETS["float32"]
    say({"what": "qr wide cond", "cond": cond, "orth": orth, "backward": back,
         "kept": [e.message[:90] for e in tr.events if e.kind == "keep-q1"],
         "cusolver_ms": t["cusolver"], "new_ms": t["new"],
         "speedup": t["cusolver"] / t["new"], "route": _route(tr)["events"][:4],
         "status": "PASS" if orth <= orth_max and back <= back_max else "FAIL"})
    release_pool(cp)


@guarded
def bench_process(precision):
    """The bench's own timing of one 65536 x 4096 row (``_shape_rows``) in this process."""
    from mpqr.bench import qr as bq

    release_pool(cp)
    rows = bq._shape_rows(cp, np.random.default_rng(1), 65536 // DIV, 4096 // DIV, 1, 1.0,
                          [precision], ["reduced"], 4e12, {precision: 1e14}, repeat=5,
                          max_seconds=8.0)
    out = {"what": "bench row", "precision": precision}
    for r in rows:
        out[f"{r['precision']}_ms"] = r.get("time_ms")
        if "speedup_vs_cusolver" in r:
            out["speedup"] = r["speedup_vs_cusolver"]
            out["orth"], out["backward"] = r.get("orthogonality"), r.get("backward_error")
    say(out)
    release_pool(cp)
    bench_state(precision)


@guarded
def bench_state(precision):
    """Why the bench's timing differs: the same call timed in the bench's state (after its
    explain call and float64 error checks, pool not released) by CUDA events and by wall
    clock, the engines and event kinds of a call in that state, the pool's and device's
    bytes; then the same after releasing the pool."""
    from mpqr.bench import qr as bq

    a = cp.asarray(np.random.default_rng(1).standard_normal((65536 // DIV, 4096 // DIV))
                   .astype(np.float32))
    with mpqr.explain():
        out = mpqr.qr(a, precision=precision)
    bq._errors(cp, a, out.Q, out.R)
    del out
    pool = cp.get_default_memory_pool()
    free, _total = cp.cuda.runtime.memGetInfo()
    row = {"what": "bench state", "pool_total_gb": pool.total_bytes() / 2**30,
           "pool_used_gb": pool.used_bytes() / 2**30, "device_free_gb": free / 2**30}
    fn = lambda: mpqr.qr(a, precision=precision)  # noqa: E731
    row["events_ms_bench_state"] = time_it(cp, fn, repeat=5, max_seconds=8.0) * 1e3
    with mpqr.explain() as tr:
        fn()
    row["engines_bench_state"] = tr.engines()
    row["kinds_bench_state"] = sorted({e.kind for e in tr.events})
    row["wall_ms_bench_state"] = ab({"x": fn}, repeat=5)["x"]
    release_pool(cp)
    row["events_ms_released"] = time_it(cp, fn, repeat=5, max_seconds=8.0) * 1e3
    release_pool(cp)
    with mpqr.explain() as tr:
        fn()
    row["engines_released"] = tr.engines()
    row["kinds_released"] = sorted({e.kind for e in tr.events})
    say(row)
    release_pool(cp)


@guarded
def phases():
    """Each phase of the float32 ``fp32-emulated`` row alone (ms)."""
    from mpqr.qr import cholqr
    from mpqr.qr.gram_blocked import gram

    be = backend()
    m, n = 65536 // DIV, 4096 // DIV
    a = cp.random.default_rng(1).standard_normal((m, n), dtype=cp.float64).astype(cp.float32)
    ms = {"what": "phases", "shape": f"{m}x{n}", "dtype": "float32"}

    def t(name, fn, repeat=3):
        ms[name] = time_it(cp, fn, repeat=repeat, max_seconds=1.5) * 1e3

    t("gram_tc_sgemm", lambda: gram(be, a, "fp32-emulated", "g"))
    g = gram(be, a, "fp32-emulated", "g")
    t("chol_potrf", lambda: be.cholesky(g, upper=True))
    r = be.cholesky(g, upper=True)
    t("cond1_lower", lambda: cholqr._cond1_lower(be, r, True))
    t("solve_right_native", lambda: cholqr.right_solve_upper(be, a, r, "fp32"), repeat=2)
    t("solve_right_tc", lambda: cholqr.right_solve_upper(be, a, r, "fp32",
                                                         tall="fp32-emulated"), repeat=2)
    t("inverse_trsm", lambda: be.right_inverse_upper(r))
    q1 = cholqr.right_solve_upper(be, a, r, "fp32")
    a = None  # the input's memory back before the second pass's operands
    release_pool(cp)
    g2 = gram(be, q1, "fp32-emulated", "g")
    t("gram2_tc_sgemm", lambda: gram(be, q1, "fp32-emulated", "g"))
    saved = cholqr.KEEP_Q1_MAX
    try:
        cholqr.KEEP_Q1_MAX = 3.0
        t("keep_test", lambda: cholqr._keeps_q1(be, g2, "probe"))
    finally:
        cholqr.KEEP_Q1_MAX = saved
    r2 = be.cholesky(g2, upper=True)
    x2 = be.right_inverse_upper(r2)
    t("AX_recursive_tc", lambda: cholqr._times_upper(be, q1, x2, "q", "fp32-emulated"))
    t("R2R1", lambda: cholqr._rr(be, r2, r, "fp32"))
    ms["q1_orth_fp64"] = errors(q1, q1, cp.eye(n, dtype=cp.float32))[0]
    q1 = None
    release_pool(cp)
    say(ms)


@guarded
def recheck(m, n, cond):
    from ill_conditioned import matrix

    a = matrix(m, n, cond) if cond != 1 else cp.random.default_rng(5).standard_normal((m, n))
    with mpqr.explain() as tr:
        q, r = mpqr.qr(a)
    orth, back = errors(a, q, r)
    del q, r
    t = ab({"cusolver": lambda: cp.linalg.qr(a), "auto": lambda: mpqr.qr(a)}, repeat=5)
    ok = orth <= 1e-15 and back <= 2e-15
    say({"what": "qr recheck", "shape": f"{m}x{n}", "cond": cond, "orth": orth,
         "backward": back, "cusolver_ms": t["cusolver"], "auto_ms": t["auto"],
         "speedup": t["cusolver"] / t["auto"], "route": _route(tr)["events"][:3],
         "status": "PASS" if ok else "FAIL"})
    release_pool(cp)


def table():
    print("\n65536 x 4096        cuSOLVER   new (x)        no_keep (x)    old (x)"
          "        orth / backward (new)  kept")
    for r in ROWS:
        if r.get("what") != "qr wide":
            continue
        g = r.get
        print(f"{g('dtype'):<8} {g('precision'):<13} {g('cusolver_ms', 0):6.1f}  "
              + "  ".join(f"{g(k + '_ms', 0):6.1f} ({g(k + '_speedup', 0):4.2f})"
                          for k in ("new", "no_keep", "old"))
              + f"   {g('new_orth', 0):.2e} / {g('new_backward', 0):.2e}  {g('new_kept')}")
        if g("new_r_ms"):
            print(f"{'':<23}mode r: new {g('new_r_ms'):6.1f} ({g('new_r_speedup'):4.2f}) "
                  f"no_keep {g('no_keep_r_ms'):6.1f} ({g('no_keep_r_speedup'):4.2f})")
    for r in ROWS:
        if r.get("what") in ("phases", "bench row", "bench state", "qr wide cond"):
            print({k: (f"{v:.3g}" if isinstance(v, float) else v) for k, v in r.items()})
        if r.get("what") == "qr recheck":
            print(f"recheck {r['shape']} cond {r['cond']:.0e}: cuSOLVER {r['cusolver_ms']:.1f}"
                  f" auto {r['auto_ms']:.1f} ms ({r['speedup']:.2f}x) {r['status']}")
    bad = [r["what"] for r in ROWS if str(r.get("status", "")).startswith(("FAIL", "ERROR"))
           or any(k.endswith("_status") and v == "FAIL" for k, v in r.items())]
    print("checks:", "all PASS" if not bad else f"FAIL/ERROR in {bad}")


def main() -> int:
    bench_wide(cp.float32, "fp32-emulated", ("new", "no_keep", "old"), r_too=True)
    bench_wide(cp.float64, "auto", ("new", "no_keep"))
    for m, n, cond in ((2**20, 256, 1), (2**20, 256, 1e8), (2**20, 256, 1e12),
                       (2**20, 256, 1e15), (2**22, 64, 1e12), (2**22, 64, 1e15)):
        if time.perf_counter() - T0 < BUDGET_S - 30:
            recheck(m // DIV, n, cond)
    if time.perf_counter() - T0 < BUDGET_S - 22:
        bench_process("fp32-emulated")
    for cond in (1e2, 1e3):
        if time.perf_counter() - T0 < BUDGET_S - 12:
            wide_cond(cond)
    if time.perf_counter() - T0 < BUDGET_S - 8:
        phases()
    try:
        table()
    except Exception:
        traceback.print_exc()
    out = Path(os.environ.get("OUT", "/tmp")) / "sketch.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"device": cp.cuda.runtime.getDeviceProperties(0)["name"]
                               .decode(), "seconds": time.perf_counter() - T0,
                               "rows": ROWS}, indent=1, default=str))
    print(f"wrote {out} ({time.perf_counter() - T0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
