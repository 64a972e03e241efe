"""Wide tall CholQR2 on the GPU (65536 x 4096): PASS/FAIL, each lever on/off, phases.

``python bench/probes/sketch_gpu.py`` (JSON to ``$OUT/sketch.json``, ``OUT`` default /tmp;
``--rows-div N``: every row count divided by N, a dry run on small shapes)

* PASS/FAIL: the blocked Cholesky and right inverse (``backends/cupy/chol_blocked.py``)
  against ``R^T R = G`` / ``X R = I`` within ``c n u`` at 1500 and 2048 columns, float32
  and float64; the right-looking blocked substitution at 65536 x 1024 cond 1e12 within
  substitution's row-wise bound (and the left-looking one beside it); 65536 x 4096
  float64 ``auto`` and float32 ``fp32-emulated`` against the targets (orthogonality
  ``||I - Q^T Q||_F / n``: 1e-15 / 2^29 u32 ~ 1.1e-6 ... the float32 analogue of 1e-15
  is ``9 u``: 5.4e-7; backward ``||A - QR||_F / ||A||_F``: 2e-15 / 1.1e-6); 2^20 x 256
  and 2^22 x 64 cond 1e12 ``auto`` against the same targets.
* Timings, one process, round-robin (each call between ``Device().synchronize()``,
  median of >= 5 after a warm-up), against cuSOLVER ``cupy.linalg.qr`` of the same
  dtype: 65536 x 4096 float64 ``auto`` and float32 ``fp32-emulated``, ``new`` (this tree),
  each lever off alone (``no_right``: left-looking substitution; ``no_trmm``: the one
  split of A X; ``no_chol``: cuSOLVER potrf / trsm; ``no_lower``: the diagonal-only
  bound, so a refused inverse is made first; ``no_tall``: float32's products native;
  ``no_low``: float64's first, preconditioning Gram native instead of on tc-sgemm;
  ``cond2``: the first pass's ``A R1^-1`` by GEMM where the estimated ``cond_2(R1) <= 4``
  instead of the substitution, off by default)
  and ``old`` (all off); a recheck of 2^20 x 256 and 2^22 x 64 cond 1e12.
* Phases at 65536 x 4096 (each alone): Gram (native; float32 also tc-sgemm), Cholesky
  (potrf / by halves), R^-1 (trsm / by halves), the substitution (left-looking /
  right-looking; float32 also tc-sgemm updates), A X (one split / recursive; float32
  also tc-sgemm), R2 R1, the column-sum bound.
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
    """The levers a variant name turns off: ``new`` none, ``old`` all, ``no_X`` lever X;
    ``cond2``: the (default off) estimated-cond_2 inverse of the first pass turned on."""
    if variant == "chol":  # the blocked Cholesky on (off by default)
        return ("+chol",)
    if variant == "cond2":
        return ("+cond2",)
    return () if variant == "new" else ("old",) if variant == "old" else (variant[3:],)


@contextlib.contextmanager
def levers(*off):
    """This tree with the named levers off: ``right`` (left-looking substitution at every
    width), ``trmm`` (A X by one split), ``chol`` (cuSOLVER potrf, trsm on I), ``lower``
    (the diagonal-only bound before an inverse), ``tall`` (fp32-emulated float32 CholQR2
    with native products), ``low`` (float64's first Gram native, not on tc-sgemm);
    ``old``: all of them."""
    from mpqr.qr import cholqr, driver

    cls = type(backend())
    if "old" in off:
        off = ("right", "trmm", "chol", "lower", "tall", "low")
    saved = (cholqr.RIGHT_LOOKING_MIN_N, cholqr.TRIANGULAR_RECURSE_MIN_N,
             getattr(cls, "blocked_chol_min_n", None), cholqr._cond1_lower,
             driver.tall_products_precision, cholqr.LOW_FIRST_GRAM,
             cholqr.FIRST_PASS_COND2_MAX)
    if "right" in off:
        cholqr.RIGHT_LOOKING_MIN_N = None
    if "trmm" in off:
        cholqr.TRIANGULAR_RECURSE_MIN_N = None
    if "chol" in off and hasattr(cls, "blocked_chol_min_n"):
        cls.blocked_chol_min_n = None
    if "+chol" in off and hasattr(cls, "blocked_chol_min_n"):
        cls.blocked_chol_min_n = 1024
    if "lower" in off:
        cholqr._cond1_lower = cholqr._diag_ratio
    if "tall" in off:
        driver.tall_products_precision = lambda *_a, **_k: None
    if "low" in off:
        cholqr.LOW_FIRST_GRAM = None
    if "+cond2" in off:
        cholqr.FIRST_PASS_COND2_MAX = 4.0
    try:
        yield
    finally:
        (cholqr.RIGHT_LOOKING_MIN_N, cholqr.TRIANGULAR_RECURSE_MIN_N, chol,
         cholqr._cond1_lower, driver.tall_products_precision, cholqr.LOW_FIRST_GRAM,
         cholqr.FIRST_PASS_COND2_MAX) = saved
        if hasattr(cls, "blocked_chol_min_n"):
            cls.blocked_chol_min_n = chol


@guarded
def blocked_kernels_check():
    """Blocked Cholesky / right inverse against their residual bounds."""
    from mpqr.backends.cupy import chol_blocked

    rng = cp.random.default_rng(3)
    for dt in (cp.float64, cp.float32):
        u = 2.0**-53 if dt == cp.float64 else 2.0**-24
        for n in (1500, 2048):
            a = rng.standard_normal((4 * n, n), dtype=cp.float64) * cp.logspace(0, -2, n)
            g = (a.T @ a).astype(dt)
            r = chol_blocked.cholesky_upper(g, 512)
            ref = cp.linalg.cholesky(g).T
            res = float(cp.max(cp.abs(r.T @ r - g) / (cp.abs(r.T) @ cp.abs(r))))
            lower_zero = bool(cp.all(cp.tril(r, -1) == 0))
            x = chol_blocked.inverse_upper(r, 512)
            # the bound's zeros below the diagonal (0 / 0) are left out
            xres = float(cp.nanmax(cp.abs(x @ r - cp.eye(n, dtype=dt))
                                   / (cp.abs(x) @ cp.abs(r))))
            xref = backend().right_solve_upper(cp.eye(n, dtype=dt), r)
            ok = (res <= 4 * n * u and xres <= 4 * n * u and lower_zero
                  and bool(cp.all(cp.tril(x, -1) == 0)))
            say({"what": f"blocked cholesky/inverse {cp.dtype(dt).name} n={n}",
                 "chol_res_over_u": res / u, "inv_res_over_u": xres / u,
                 "chol_vs_potrf": float(cp.max(cp.abs(r - ref)) / cp.max(cp.abs(ref))),
                 "inv_vs_trsm": float(cp.max(cp.abs(x - xref)) / cp.max(cp.abs(xref))),
                 "status": "PASS" if ok else "FAIL"})
    g = cp.eye(1500)
    g[700, 700] = -1.0  # not positive definite: the blocked factor is not finite
    try:
        backend().cholesky(g, upper=True)
        raised = "nothing"
    except Exception as exc:  # mpqr.LinAlgError expected
        raised = type(exc).__name__
    say({"what": "blocked cholesky of an indefinite matrix raises", "raised": raised,
         "status": "PASS" if raised == "LinAlgError" else "FAIL"})


@guarded
def solve_check():
    """Right-looking against left-looking blocked substitution: both within the row-wise
    bound of substitution."""
    from ill_conditioned import matrix

    from mpqr.qr import cholqr

    be = backend()
    m, n = 65536 // DIV, 1024
    a = matrix(m, n, 1e12, seed=3)
    r = cp.linalg.qr(a[: 4 * n], mode="r")
    r = r * cp.sign(cp.diagonal(r))[:, None]
    out = {}
    for name, lim in (("right", 512), ("left", None)):
        saved = cholqr.RIGHT_LOOKING_MIN_N
        cholqr.RIGHT_LOOKING_MIN_N = lim
        try:
            w = cholqr.right_solve_upper(be, a, r)
        finally:
            cholqr.RIGHT_LOOKING_MIN_N = saved
        res = cp.abs(w @ r - a)
        bound = 4 * n * 2.0**-53 * (cp.abs(w) @ cp.abs(r))
        out[name] = (bool(cp.all(res <= bound)), float(cp.max(res / (bound + 1e-300))))
        del w, res, bound
    say({"what": f"right-looking substitution {m}x{n} cond 1e12",
         "right_within_bound": out["right"][0], "right_max_res_over_bound": out["right"][1],
         "left_within_bound": out["left"][0], "left_max_res_over_bound": out["left"][1],
         "status": "PASS" if out["right"][0] and out["left"][0] else "FAIL"})
    release_pool(cp)


def _route(tr):
    return {"engines": tr.engines(),
            "events": [e.message[:110] for e in tr.events
                       if e.kind in ("route", "fallback", "apply-inverse", "precision")][:6]}


@guarded
def bench_wide(dtype, precision, variants):
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
                    f"{var}_status": "PASS" if ok else "FAIL", f"{var}_route": _route(tr)})

        def call(var=var):
            with levers(*_off(var)):
                mpqr.qr(a, precision=precision)
        fns[var] = call
        release_pool(cp)
    for key, ms in ab(fns, repeat=5, max_seconds=8.0).items():
        row[f"{key}_ms"] = ms
    for var in variants:
        row[f"{var}_speedup"] = row["cusolver_ms"] / row[f"{var}_ms"]
    say(row)
    release_pool(cp)


def syrk(a):
    """``a^T a``'s upper triangle by cuBLAS syrk (row-major ``a`` is column-major ``a^T``)."""
    from cupy_backends.cuda.libs import cublas

    m, n = a.shape
    c = cp.empty((n, n), dtype=a.dtype)
    one, zero = np.ones((), a.dtype), np.zeros((), a.dtype)
    fn = cublas.dsyrk if a.dtype == cp.float64 else cublas.ssyrk
    fn(cp.cuda.device.get_cublas_handle(), cublas.CUBLAS_FILL_MODE_UPPER, cublas.CUBLAS_OP_N,
       n, m, one.ctypes.data, a.data.ptr, n, zero.ctypes.data, c.data.ptr, n)
    return c


@guarded
def phases(dtype, precision):
    """Each phase of a wide CholQR2 pass alone (ms)."""
    from mpqr.qr import cholqr
    from mpqr.qr.gram_blocked import gram

    be = backend()
    cls = type(be)
    m, n = 65536 // DIV, 4096 // DIV
    a = cp.random.default_rng(1).standard_normal((m, n), dtype=cp.float64).astype(dtype)
    own = "auto" if dtype == cp.float64 else "fp32"
    ms = {"what": "phases", "shape": f"{m}x{n}", "dtype": cp.dtype(dtype).name}

    def t(name, fn, repeat=3):
        ms[name] = time_it(cp, fn, repeat=repeat, max_seconds=1.5) * 1e3

    t("gram_native", lambda: gram(be, a, own, "g"))
    t("gram_tc_sgemm", lambda: gram(be, a, "fp32-emulated", "g"))
    try:
        t("gram_syrk_cublas", lambda: syrk(a))
    except Exception as exc:
        ms["gram_syrk_cublas_error"] = repr(exc)[:120]
    blk = cls.gram_block
    try:
        cls.gram_block = 512
        t("gram_native_blk512", lambda: gram(be, a, own, "g"))
    finally:
        cls.gram_block = blk
    g = gram(be, a, own, "g")
    saved = getattr(cls, "blocked_chol_min_n", None)
    try:
        cls.blocked_chol_min_n = None
        t("chol_potrf", lambda: be.cholesky(g, upper=True))
        r = be.cholesky(g, upper=True)
        t("inverse_trsm", lambda: be.right_inverse_upper(r))
        cls.blocked_chol_min_n = saved
        t("chol_halves", lambda: be.cholesky(g, upper=True))
        t("inverse_halves", lambda: be.right_inverse_upper(r))
    finally:
        cls.blocked_chol_min_n = saved
    x = be.right_inverse_upper(r)
    t("cond1_lower", lambda: cholqr._cond1_lower(be, r, True))
    t("cond1_with_x", lambda: cholqr._cond1(be, r, x, True))
    t("cond2_estimate", lambda: cholqr._cond2_estimate(be, r, x, True, 4.0))
    ms["cond2_estimated"] = cholqr._cond2_estimate(be, r, x, True, 4.0)
    tall = precision if dtype == cp.float32 else None
    for key, lim, tl in (("solve_left", None, None), ("solve_right", 512, None),
                         ("solve_right_tc", 512, tall)):
        if key.endswith("_tc") and tl is None:
            continue
        s = cholqr.RIGHT_LOOKING_MIN_N
        cholqr.RIGHT_LOOKING_MIN_N = lim
        try:
            t(key, lambda tl=tl: cholqr.right_solve_upper(be, a, r, own, tall=tl), repeat=2)
        finally:
            cholqr.RIGHT_LOOKING_MIN_N = s
    release_pool(cp)
    w = cholqr.right_solve_upper(be, a, r, own)
    prec = "auto" if dtype == cp.float64 else "fp32"
    for key, lim, p in (("AX_one_split", None, prec), ("AX_recursive", 1024, prec),
                        ("AX_recursive_tc", 1024, tall)):
        if p is None:
            continue
        s = cholqr.TRIANGULAR_RECURSE_MIN_N
        cholqr.TRIANGULAR_RECURSE_MIN_N = lim
        try:
            t(key, lambda p=p, w=w: cholqr._times_upper(be, w, x, "q", p))
        finally:
            cholqr.TRIANGULAR_RECURSE_MIN_N = s
    t("R2R1", lambda: cholqr._rr(be, r, r, own))
    del w
    release_pool(cp)
    say(ms)


@guarded
def recheck(m, n, cond):
    from ill_conditioned import matrix

    a = matrix(m, n, cond)
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
    print("\n65536 x 4096        cuSOLVER   new (x)        old (x)        no_right no_trmm "
          "chol    no_lower no_tall  no_low  cond2   orth / backward (new)")
    for r in ROWS:
        if r.get("what") != "qr wide":
            continue
        g = r.get
        print(f"{g('dtype'):<8} {g('precision'):<13} {g('cusolver_ms', 0):6.1f}  "
              f"{g('new_ms', 0):6.1f} ({g('new_speedup', 0):4.2f})  "
              f"{g('old_ms', 0):6.1f} ({g('old_speedup', 0):4.2f})  "
              + "  ".join(f"{g(('' if k == 'chol' else 'no_') + k + '_ms', 0):6.1f}"
                          for k in ("right", "trmm", "chol", "lower", "tall", "low"))
              + f"  {g('cond2_ms', 0):6.1f}"
              + f"   {g('new_orth', 0):.2e} / {g('new_backward', 0):.2e}")
    for r in ROWS:
        if r.get("what") == "phases":
            print({k: (f"{v:.2f}" if isinstance(v, float) else v) for k, v in r.items()})
        if r.get("what") == "qr recheck":
            print(f"recheck {r['shape']} cond {r['cond']:.0e}: cuSOLVER {r['cusolver_ms']:.1f}"
                  f" auto {r['auto_ms']:.1f} ms ({r['speedup']:.2f}x) {r['status']}")
    bad = [r["what"] for r in ROWS if str(r.get("status", "")).startswith(("FAIL", "ERROR"))
           or any(k.endswith("_status") and v == "FAIL" for k, v in r.items())]
    print("checks:", "all PASS" if not bad else f"FAIL/ERROR in {bad}")


def main() -> int:
    blocked_kernels_check()
    solve_check()
    bench_wide(cp.float64, "auto", ("new", "old", "no_low", "no_right", "no_trmm",
                                    "chol", "no_lower", "cond2"))
    bench_wide(cp.float32, "fp32-emulated", ("new", "old", "no_tall", "no_right",
                                             "chol", "cond2"))
    if time.perf_counter() - T0 < BUDGET_S - 30:
        recheck(2**20 // DIV, 256, 1e12)
    if time.perf_counter() - T0 < BUDGET_S - 22:
        recheck(2**22 // DIV, 64, 1e12)
    if time.perf_counter() - T0 < BUDGET_S - 14:
        phases(cp.float64, "auto")
    if time.perf_counter() - T0 < BUDGET_S - 10:
        phases(cp.float32, "fp32-emulated")
    try:
        table()
    except Exception:
        traceback.print_exc()
    out = Path(os.environ.get("OUT", "/tmp")) / "sketch.json"
    out.write_text(json.dumps({"device": cp.cuda.runtime.getDeviceProperties(0)["name"]
                               .decode(), "seconds": time.perf_counter() - T0,
                               "rows": ROWS}, indent=1, default=str))
    print(f"wrote {out} ({time.perf_counter() - T0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
