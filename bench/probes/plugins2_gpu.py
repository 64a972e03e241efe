"""scikit-learn on CuPy through the Array-API plug: where the time goes (CUDA machine).

Run: ``python bench/probes/plugins2_gpu.py`` (CuPy, scikit-learn; JSON to
``$OUT/plugins2.json``). ``SCIPY_ARRAY_API=1`` is set here, before SciPy or
scikit-learn is imported (scikit-learn's array-API dispatch needs it).

1. ``checks``: CholQR2 on column-graded input (the scikit-learn data: Gaussian columns
   scaled by 0.9^j, cond ~5e11, column-scaled cond ~1): ``mpqr.qr``'s route (CholQR2
   without a fallback, the device's n x n steps accepted), orthogonality and column-wise
   backward error; ``mpqr.svd``'s singular values against a float64 reference
   (float32 too: the reference is float64 of the same data). PASS/FAIL lines.
2. ``qr_svd``: ``mpqr.qr`` / ``mpqr.svd`` on graded and on Gaussian data, the column-scaled
   tests on and off (``SCALE_FREE`` emptied: the route before), ``cupy.linalg.svd``.
3. ``sklearn``: per estimator and dtype, unplugged and plugged (scaled tests on and off)
   fits, the time inside plugged calls (synchronised around each), the remainder, the
   Amdahl bound (unplugged / remainder) and the agreement with the unplugged result.
4. ``steps``: scikit-learn's own non-plugged calls on the same data, one by one
   (validation, ``xp.mean(X, axis=0)`` and the same mean as a product, the centering copy,
   ``svd_flip``, the power iteration's products...), and ``xp.mean`` under CuPy's
   cuTENSOR accelerator where it is installed.
"""
from __future__ import annotations

import os

os.environ["SCIPY_ARRAY_API"] = "1"  # before SciPy / scikit-learn are imported

import contextlib
import importlib
import json
import math
import statistics
import time
import traceback

import cupy as cp
import numpy as np
from mpqr.backends import get_backend

import mpqr
from mpqr._array_api import array_namespace

cq = importlib.import_module("mpqr.qr.cholqr")  # (mpqr.qr is also the function's name)

OUT: dict = {"fails": []}
REP = 5
M, N, K = int(os.environ.get("PLUGINS2_ROWS", 2 ** 20)), 256, 32  # rows: a dry run may shrink
T_START = time.perf_counter()
BUDGET_S = float(os.environ.get("PLUGINS2_BUDGET", 80.0))
PARTS = os.environ.get("PLUGINS2_PARTS", "checks,qr_svd,sklearn,steps").split(",")


def sync():
    cp.cuda.Device().synchronize()


def med(f, rep=REP, warm=1):
    for _ in range(warm):
        f()
    ts = []
    for _ in range(rep):
        sync()
        t0 = time.perf_counter()
        f()
        sync()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def check(name, ok, detail=""):
    print(f"{'PASS' if ok else 'FAIL'} {name} {detail}")
    if not ok:
        OUT["fails"].append(name)
    return bool(ok)


def part(name):
    def deco(fn):
        t0 = time.perf_counter()
        if name not in PARTS:
            return fn
        if t0 - T_START > BUDGET_S:
            print(f"[{name}] skipped: past the {BUDGET_S:.0f} s budget")
            OUT[name] = {"skipped": "time budget"}
            return fn
        try:
            OUT[name] = fn()
        except Exception:
            traceback.print_exc()
            OUT[name] = {"error": traceback.format_exc()}
            OUT["fails"].append(name)
        print(f"[{name}] {time.perf_counter() - t0:.1f} s")
        return fn
    return deco


@contextlib.contextmanager
def scaled_tests(on):
    """CholQR's column-scaled tests on (the code as it is) or off (the route before)."""
    saved = cq.SCALE_FREE
    cq.SCALE_FREE = saved if on else frozenset()
    try:
        yield
    finally:
        cq.SCALE_FREE = saved


_DATA: dict = {}


def data(dtype):
    """The scikit-learn data (as ``mpqr bench arrayapi``'s, made on the device): Gaussian
    columns scaled by 0.9^j, ``y = X w + 0.01 e``."""
    if dtype not in _DATA:
        rng = cp.random.default_rng(0)
        scale = cp.asarray(0.9 ** np.arange(N))
        x = rng.standard_normal((M, N)) * scale
        y = x @ rng.standard_normal(N) + 0.01 * rng.standard_normal(M)
        _DATA[dtype] = (x.astype(dtype), y.astype(dtype))
    return _DATA[dtype]


def gaussian(dtype):
    return cp.random.default_rng(1).standard_normal((M, N)).astype(dtype)


def events(trace, kind):
    return [e for e in trace.events if e.kind == kind]


def _checks_one(dtype):
    r = {}
    x, _ = data(dtype)
    xc = x - x.mean(axis=0)
    u = 2.0 ** -53 if dtype == "float64" else 2.0 ** -24
    with mpqr.explain() as tr:
        q, rr = mpqr.qr(xc)
    fb = [e.message for e in events(tr, "fallback")]
    steps = [e.message for e in events(tr, "small-steps")]
    inv = [e.message for e in events(tr, "apply-inverse")]
    q64, r64, x64 = q.astype(cp.float64), rr.astype(cp.float64), xc.astype(cp.float64)
    orth = float(cp.linalg.norm(q64.T @ q64 - cp.eye(N)))
    colbe = float(cp.max(cp.linalg.norm(x64 - q64 @ r64, axis=0)
                         / cp.linalg.norm(x64, axis=0)))
    s_ref = cp.linalg.svd(x64, compute_uv=False)
    s = mpqr.svd(xc)[1]
    s_cp = cp.linalg.svd(xc, compute_uv=False)
    err = float(cp.max(cp.abs(s.astype(cp.float64) - s_ref)) / s_ref[0])
    err_cp = float(cp.max(cp.abs(s_cp.astype(cp.float64) - s_ref)) / s_ref[0])
    r[dtype] = {"fallbacks": fb, "small_steps": steps, "apply_inverse": inv,
                "orthogonality": orth, "column_backward": colbe,
                "svd_rel_err_s": err, "cupy_svd_rel_err_s": err_cp}
    print(dtype, json.dumps(r[dtype], indent=1))
    check(f"qr graded {dtype}: CholQR2, no fallback", not fb, str(fb)[:200])
    check(f"qr graded {dtype}: no n x n step redone", not any(
        "host route" in m for m in steps), str(steps)[:200])
    check(f"qr graded {dtype}: orthogonality <= 8 n u", orth <= 8 * N * u, f"{orth:.2e}")
    check(f"qr graded {dtype}: column backward error <= 8 sqrt(n) u",
          colbe <= 8 * math.sqrt(N) * u, f"{colbe:.2e}")
    # singular values: rounding of m-term sums (sqrt(m) u) relative to s_max
    check(f"svd graded {dtype}: s within 8 sqrt(m) u of float64",
          err <= 8 * math.sqrt(M) * u, f"{err:.2e} (cupy's own {err_cp:.2e})")
    # 64 columns: the n x n steps run on the device (one launch); graded 0.6^j
    n64 = 64
    x = cp.random.default_rng(3).standard_normal((M, n64)) * cp.asarray(
        0.6 ** np.arange(n64))
    x = x.astype(dtype)
    with mpqr.explain() as tr:
        q, rr = mpqr.qr(x)
    fb = [e.message for e in events(tr, "fallback")]
    steps = [e.message for e in events(tr, "small-steps")]
    q64 = q.astype(cp.float64)
    orth = float(cp.linalg.norm(q64.T @ q64 - cp.eye(n64)))
    r[dtype + "_64"] = {"fallbacks": fb, "small_steps": steps, "orthogonality": orth}
    check(f"qr graded 2^20 x 64 {dtype}: CholQR2, no fallback", not fb, str(fb)[:200])
    check(f"qr graded 2^20 x 64 {dtype}: device steps accepted", bool(steps) and not any(
        "host route" in m for m in steps), str(steps)[:300])
    check(f"qr graded 2^20 x 64 {dtype}: orthogonality <= 8 n u", orth <= 8 * n64 * u,
          f"{orth:.2e}")
    return r


@part("checks")
def _checks():
    return {k: v for dtype in ("float64", "float32") for k, v in _checks_one(dtype).items()}


def _qr_svd_one(dtype):
    x, _ = data(dtype)
    xc = x - x.mean(axis=0)
    g = gaussian(dtype)
    row = {}
    for on in (True, False):
        tag = "scaled" if on else "unscaled"
        with scaled_tests(on):
            row[f"qr_graded_{tag}_ms"] = med(lambda: mpqr.qr(xc))
            row[f"svd_graded_{tag}_ms"] = med(lambda: mpqr.svd(xc))
    row["qr_gaussian_ms"] = med(lambda: mpqr.qr(g))
    row["svd_gaussian_ms"] = med(lambda: mpqr.svd(g))
    row["cupy_svd_ms"] = med(lambda: cp.linalg.svd(xc, full_matrices=False), rep=3)
    q, rr = mpqr.qr(xc)
    ur = cp.linalg.svd(rr, full_matrices=False)[0]
    be = get_backend(array_namespace(rr))
    row["small_svd_ms"] = med(lambda: be.svd(rr[:N], full_matrices=False))
    row["QU_ms"] = med(lambda: mpqr.matmul(q, ur))
    print(dtype, json.dumps(row, indent=1))
    return row


@part("qr_svd")
def _qr_svd():
    return {dtype: _qr_svd_one(dtype) for dtype in ("float64", "float32")}


@part("sklearn")
def _sklearn():
    from mpqr.compat import _xp_functions as xf
    from mpqr.compat.array_api import patch
    from sklearn import config_context

    from mpqr.bench import arrayapi as ab

    inside = {"t": 0.0, "calls": {}, "by": {}, "depth": 0}
    orig = xf._running

    @contextlib.contextmanager
    def timed(lib, name, *a, **k):
        if inside["depth"]:  # nested plugged call: counted by the outer one
            with orig(lib, name, *a, **k) as v:
                yield v
            return
        inside["depth"] = 1
        sync()
        t0 = time.perf_counter()
        try:
            with orig(lib, name, *a, **k) as v:
                yield v
            sync()
        finally:
            inside["depth"] = 0
        dt = time.perf_counter() - t0
        inside["t"] += dt
        inside["calls"][name] = inside["calls"].get(name, 0) + 1
        inside["by"][name] = inside["by"].get(name, 0.0) + dt * 1e3

    out = []
    for dtype in ("float64", "float32"):
        x, y = data(dtype)
        for case in ab.CASES:
            def fit(c=case, a=x, b=y):
                return ab._fit(c, a, b, K)

            with config_context(array_api_dispatch=True):
                ref = fit()
                nat = med(fit)
                with patch():
                    got = fit()
                    plug = med(fit)
                    with scaled_tests(False):
                        plug_old = med(fit, rep=3)
                    xf._running = timed
                    try:
                        inside.update(t=0.0, calls={}, by={})
                        sync()
                        t0 = time.perf_counter()
                        fit()
                        sync()
                        tot = (time.perf_counter() - t0) * 1e3
                    finally:
                        xf._running = orig
            ins = inside["t"] * 1e3
            agree = ab._agreement(got, ref)
            row = {"case": case, "dtype": dtype, "native_ms": nat, "plugged_ms": plug,
                   "plugged_unscaled_tests_ms": plug_old, "speedup": nat / plug,
                   "speedup_unscaled_tests": nat / plug_old, "timed_run_ms": tot,
                   "inside_plugged_ms": ins, "inside_by_function_ms": dict(inside["by"]),
                   "remainder_ms": tot - ins, "calls": dict(inside["calls"]),
                   "amdahl_bound": nat / max(tot - ins, 1e-9), "agreement": agree}
            out.append(row)
            tol = 1e-10 if dtype == "float64" else 1e-3
            worst = max(agree.values()) if agree else float("nan")
            check(f"sklearn {case} {dtype}: agrees with unplugged", worst <= tol,
                  f"{agree}")
            print(f"{case:<15} {dtype:<8} native {nat:7.2f} plugged {plug:7.2f} "
                  f"({nat / plug:.2f}x; unscaled tests {plug_old:7.2f}) inside {ins:7.2f} "
                  f"rest {tot - ins:7.2f} bound {row['amdahl_bound']:.2f}x {row['calls']}")
    return out


@part("steps")
def _steps():
    from sklearn import config_context
    from sklearn.linear_model._base import _preprocess_data
    from sklearn.utils._array_api import get_namespace
    from sklearn.utils.extmath import svd_flip
    from sklearn.utils.validation import check_array

    def one(dtype):
        x, y = data(dtype)
        row = {}
        with config_context(array_api_dispatch=True):
            xp, _ = get_namespace(x)
            row["check_array_ms"] = med(lambda: check_array(
                x, dtype=[xp.float64, xp.float32], force_writeable=True))
            row["mean_axis0_ms"] = med(lambda: xp.mean(x, axis=0))
            ones = cp.full((1, M), 1.0 / M, dtype=dtype)
            row["mean_as_product_ms"] = med(lambda: ones @ x)
            row["sum_all_ms"] = med(lambda: xp.sum(x))
            row["copy_ms"] = med(lambda: xp.asarray(x, copy=True))
            mean = xp.mean(x, axis=0)
            xc = xp.asarray(x, copy=True)
            row["subtract_inplace_ms"] = med(lambda: xc.__isub__(mean))
            u, _, vt = mpqr.svd(x - mean)
            row["svd_flip_v_based_ms"] = med(lambda: svd_flip(u, vt, u_based_decision=False))
            u42 = u[:, :K + 10].copy()
            v42 = vt[:K + 10].copy()
            row["svd_flip_u_based_42_ms"] = med(lambda: svd_flip(u42, v42))
            row["square_sum_ms"] = med(lambda: xp.sum(xc ** 2))
            qq = cp.linalg.qr(cp.random.default_rng(2).standard_normal((N, K + 10)))[0]
            qq = qq.astype(dtype)
            qm = u42
            row["A_Q_ms"] = med(lambda: x @ qq)
            row["At_Q_ms"] = med(lambda: x.T @ qm)
            row["Qt_A_ms"] = med(lambda: qm.T @ x)
            row["Q_Uhat_ms"] = med(lambda: qm @ cp.eye(K + 10, dtype=dtype))
            y2 = y[:, None]
            row["Ut_y_ms"] = med(lambda: u.T @ y2)
            row["preprocess_data_ms"] = med(lambda: _preprocess_data(
                x, y, fit_intercept=True, copy=True))
        try:
            from cupy._core import _accelerator as acc
            row["accelerators"] = {"routine": acc.get_routine_accelerators(),
                                   "reduction": acc.get_reduction_accelerators()}
            try:
                from cupy import cutensor as ct
            except ImportError:
                from cupyx import cutensor as ct
            row["cutensor_module"] = getattr(ct, "__name__", str(ct))
            saved = acc.get_routine_accelerators()
            acc.set_routine_accelerators(["cub", "cutensor"])
            try:
                row["mean_axis0_cutensor_ms"] = med(lambda: cp.mean(x, axis=0))
            finally:
                acc.set_routine_accelerators(saved)
        except Exception as exc:  # cuTENSOR not installed: recorded, not a failure
            row["mean_axis0_cutensor_ms"] = repr(exc)[:200]
        print(dtype, json.dumps(row, indent=1))
        return row

    return {dtype: one(dtype) for dtype in ("float64", "float32")}


OUT["seconds"] = time.perf_counter() - T_START
path = os.path.join(os.environ.get("OUT", "/tmp"), "plugins2.json")
with open(path, "w") as f:
    json.dump(OUT, f, indent=1, default=str)
print("FAILED:", OUT["fails"] if OUT["fails"] else "none")
print("wrote", path, f"({OUT['seconds']:.1f} s)")
