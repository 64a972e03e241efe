"""The tall QR-SVD and scikit-learn under the Array-API plug: variants A/B (CUDA machine).

Run: ``python bench/probes/plugins2_gpu.py`` (CuPy, scikit-learn; JSON to
``$OUT/plugins2.json``). ``SCIPY_ARRAY_API=1`` is set here, before SciPy or
scikit-learn is imported (scikit-learn's array-API dispatch needs it).

1. ``checks``: ``mpqr.svd`` at 2^20 x 256 (the scikit-learn data centred, and Gaussian),
   float64/float32, for every way of the n x n SVD of R (``small_svd_route``) and with Q
   formed or not (``U = Q1 (R2^-1 U_r)``): the route (CholQR2, no fallback, the deferred
   solve), singular values against a float64 reference (to ``4 n u ||x||``), U's
   orthogonality, the backward error, and the leading 32 right singular vectors against
   ``cupy.linalg.svd``'s (scikit-learn's tolerance). PASS/FAIL lines.
2. ``svd_ab``: times at 2^20 x 256, 2^18 x 512, 2^20 x 128: ``cupy.linalg.svd``,
   ``mpqr.qr``, ``mpqr.svd`` with the deferred solve and with Q formed, per R-SVD route;
   the R-SVD routes alone on the R of the data (time, Jacobi sweeps, accuracy against
   LAPACK in float64 on the host); the pieces (``R2^-1 U_r``, ``Q1 W``); float32 under
   ``precision="fp32-emulated"``; at 512 columns gesvdj against cuSOLVER gesvd for R.
3. ``sklearn``: per estimator and dtype, unplugged and plugged fits, the time inside the
   plugged calls (median of 3 synchronised runs), the remainder, the Amdahl bound, the
   agreement with the unplugged result; and plugged with CuPy's own ``mean`` left in
   place (the plug's ``mean`` of a tall matrix is a sum of row blocks' sums: what
   CuPy's own column reduction costs of the remainder).
4. ``mean``: ``cupy.mean(x, axis=0)`` against the plug's (two-stage sum) and
   ``ones/m @ x`` (time and error against a float64 sum).

Run order: checks, sklearn, mean, svd_ab (past ``PLUGINS2_BUDGET`` seconds, 72, the
remaining parts and svd_ab's remaining cases are skipped).
"""
from __future__ import annotations

import os

os.environ["SCIPY_ARRAY_API"] = "1"  # before SciPy / scikit-learn are imported

import contextlib
import importlib
import json
import statistics
import time
import traceback

import cupy as cp
import numpy as np
from mpqr.backends import get_backend

import mpqr
from mpqr._array_api import array_namespace

apps = importlib.import_module("mpqr.qr.applications")

OUT: dict = {"fails": []}
REP = 5
M, N, K = int(os.environ.get("PLUGINS2_ROWS", 2 ** 20)), 256, 32  # rows: a dry run may shrink
T_START = time.perf_counter()
BUDGET_S = float(os.environ.get("PLUGINS2_BUDGET", 72.0))
PARTS = os.environ.get("PLUGINS2_PARTS", "checks,sklearn,mean,svd_ab").split(",")
BE = get_backend(array_namespace(cp.ones(1)))
ROUTES = ("gesvdj", "gesvdj-t", "eigh-gesvdj")


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


def over_budget():
    return time.perf_counter() - T_START > BUDGET_S


_PARTS: dict = {}
#: the order the parts run in (the budget skips the last ones first)
ORDER = ("checks", "sklearn", "mean", "svd_ab")


def part(name):
    def deco(fn):
        _PARTS[name] = fn
        return fn
    return deco


def run_part(name):
    t0 = time.perf_counter()
    if name not in PARTS or name not in _PARTS:
        return
    if over_budget():
        print(f"[{name}] skipped: past the {BUDGET_S:.0f} s budget")
        OUT[name] = {"skipped": "time budget"}
        return
    try:
        OUT[name] = _PARTS[name]()
    except Exception:
        traceback.print_exc()
        OUT[name] = {"error": traceback.format_exc()}
        OUT["fails"].append(name)
    print(f"[{name}] {time.perf_counter() - t0:.1f} s")


@contextlib.contextmanager
def setting(**kw):
    """Backend class attributes (small_svd_route, gesvdj_max) for the block."""
    cls = type(BE)
    saved = {k: cls.__dict__[k] for k in kw if k in cls.__dict__}
    for k, v in kw.items():
        setattr(cls, k, v)
    try:
        yield
    finally:
        for k in kw:
            if k in saved:
                setattr(cls, k, saved[k])
            else:
                delattr(cls, k)


@contextlib.contextmanager
def q_formed():
    """The QR-SVD as before: Q = Q1 R2^-1 formed, then U = Q U_r."""
    saved = apps.defer_last_solve
    apps.defer_last_solve = lambda _a: contextlib.nullcontext([None, None])
    try:
        yield
    finally:
        apps.defer_last_solve = saved


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


def centred(dtype):
    key = ("c", dtype)
    if key not in _DATA:
        x, _ = data(dtype)
        _DATA[key] = x - x.mean(axis=0)
    return _DATA[key]


def gaussian(m, n, dtype, seed=1):
    return cp.random.default_rng(seed).standard_normal((m, n)).astype(dtype)


def unit(dtype):
    return 2.0 ** -53 if dtype == "float64" else 2.0 ** -24


def svd_metrics(x, u, s, vh, s_ref, vh_ref):
    """Singular values' error / ||x||, U's orthogonality, the backward error, the leading
    K right singular vectors' largest entry difference after sign alignment."""
    n = x.shape[1]
    u64, vh64, x64 = u.astype(cp.float64), vh.astype(cp.float64), x.astype(cp.float64)
    s64 = s.astype(cp.float64)
    err_s = float(cp.max(cp.abs(s64 - s_ref)) / s_ref[0])
    orth = float(cp.linalg.norm(u64.T @ u64 - cp.eye(n)))
    back = float(cp.linalg.norm(x64 - (u64 * s64) @ vh64) / cp.linalg.norm(x64))
    a, b = vh64[:K], vh_ref[:K].astype(cp.float64)
    sign = cp.sign(cp.sum(a * b, axis=1, keepdims=True))
    comp = float(cp.max(cp.abs(a * sign - b)))
    return {"s_err": err_s, "orth": orth, "backward": back, "components_diff": comp}


def _checks_one(dtype):
    out = {}
    u0 = unit(dtype)
    for label, x in (("sklearn-centred", centred(dtype)), ("gaussian", gaussian(M, N, dtype))):
        x64 = x.astype(cp.float64)
        s_ref = cp.linalg.svd(x64, compute_uv=False)
        _uc, _sc, vh_ref = cp.linalg.svd(x, full_matrices=False)
        del x64, _uc
        for route in ROUTES:
            for formed in (False, True):
                tag = f"{label} {dtype} {route}{' Q formed' if formed else ''}"
                try:
                    with setting(small_svd_route=route), \
                            (q_formed() if formed else contextlib.nullcontext()), \
                            mpqr.explain() as tr:
                        u, s, vh = mpqr.svd(x)
                except Exception:
                    traceback.print_exc()
                    check(f"svd {tag}: runs", False)
                    continue
                kinds = [e.kind for e in tr.events]
                met = svd_metrics(x, u, s, vh, s_ref, vh_ref)
                met["deferred"] = "deferred-solve" in kinds
                met["fallback"] = [e.message for e in tr.events if e.kind == "fallback"]
                out[tag] = met
                del u, s, vh
                ok_route = (not met["fallback"]) and met["deferred"] != formed
                check(f"svd {tag}: CholQR2, no fallback, deferred solve {not formed}",
                      ok_route, str(met["fallback"])[:160])
                check(f"svd {tag}: s within 4 n u ||x||", met["s_err"] <= 4 * N * u0,
                      f"{met['s_err']:.2e}")
                # R's Jacobi SVD: a column takes ~n rotations a sweep, ~10 sweeps
                check(f"svd {tag}: ||U^T U - I|| <= 16 n^1.5 u",
                      met["orth"] <= 16 * N ** 1.5 * u0, f"{met['orth']:.2e}")
                check(f"svd {tag}: backward <= 8 n u", met["backward"] <= 8 * N * u0,
                      f"{met['backward']:.2e}")
                if label.startswith("sklearn"):  # separated singular values (0.9^j)
                    tol = 1e-10 if dtype == "float64" else 1e-3
                    check(f"svd {tag}: leading {K} components as cupy's", met[
                        "components_diff"] <= tol, f"{met['components_diff']:.2e}")
        print(dtype, label, json.dumps({k: v for k, v in out.items() if label in k},
                                       indent=None)[:1500])
    return out


@part("checks")
def _checks():
    return {k: v for dtype in ("float64", "float32") for k, v in _checks_one(dtype).items()}


def _small_routes(r, dtype):
    """The R-SVD routes alone on ``r`` (time, sweeps, accuracy against float64 LAPACK)."""
    from mpqr.backends.cupy import small_svd

    rh = cp.asnumpy(r).astype(np.float64)
    s_ref = np.linalg.svd(rh, compute_uv=False)
    n = r.shape[0]
    row = {}
    for route in ROUTES:
        try:
            stats = {}
            u, s, vh = small_svd.svd(r, route, stats=stats)
            un, sn, vn = (cp.asnumpy(t).astype(np.float64) for t in (u, s, vh))
            row[route] = {
                "ms": med(lambda rt=route: small_svd.svd(r, rt)),
                "sweeps": stats.get("sweeps"), "residual": stats.get("residual"),
                "s_err": float(np.max(np.abs(sn - s_ref)) / s_ref[0]),
                "orth_u": float(np.linalg.norm(un.T @ un - np.eye(n))),
                "orth_v": float(np.linalg.norm(vn @ vn.T - np.eye(n))),
                "backward": float(np.linalg.norm(rh - (un * sn) @ vn) / np.linalg.norm(rh))}
        except Exception as exc:
            traceback.print_exc()
            row[route] = {"error": repr(exc)[:300]}
    try:
        row["cupy_gesvd_ms"] = med(lambda: cp.linalg.svd(r, full_matrices=False), rep=3)
        row["host_gesdd_ms"] = med(lambda: np.linalg.svd(cp.asnumpy(r), full_matrices=False),
                                   rep=3)
    except Exception as exc:
        row["baselines_error"] = repr(exc)[:300]
    u0 = unit(dtype)
    for route in ROUTES:
        m = row.get(route, {})
        if "s_err" in m:
            check(f"R-SVD {route} {n}x{n} {dtype}: s, backward within 30 n u, U, V "
                  "orthonormal to 16 n^1.5 u",
                  max(m["s_err"], m["backward"]) <= 30 * n * u0
                  and max(m["orth_u"], m["orth_v"]) <= 16 * n ** 1.5 * u0,
                  json.dumps({k: m[k] for k in ("s_err", "orth_u", "orth_v", "backward")}))
    return row


def _qr_pieces(x):
    """CholQR2's pieces one by one: the Gram product, the n x n steps of a pass (at 256
    columns past the device kernel's 64: CuPy calls, each check read back), ``A X`` with
    X upper triangular, a full ``A W``, ``mode="r"`` (two Grams, one ``A X``, the steps),
    and a 256 x 256 R to the host and back."""
    from mpqr.qr import cholqr as chq
    from mpqr.qr.gram_blocked import gram

    p = {}
    n = x.shape[1]
    g = gram(BE, x, None, "probe-gram")
    p["gram"] = med(lambda: gram(BE, x, None, "probe-gram"))
    p["chol_steps_kernel_supported"] = float(BE.chol_steps(g) is not None)
    p["cupy_cholesky"] = med(lambda: cp.linalg.cholesky(g))
    r = cp.ascontiguousarray(cp.linalg.cholesky(g).T)
    eye = cp.eye(n, dtype=x.dtype)
    p["inverse_by_substitution"] = med(lambda: BE.right_solve_upper(eye, r))
    xinv = BE.right_solve_upper(eye, r)
    p["check_gram"] = med(lambda: chq._check_gram(BE, g, "cholqr2", "auto"))
    p["diag_ratio_scaled"] = med(lambda: chq._diag_ratio(BE, r, True))
    p["cond1_scaled"] = med(lambda: chq._cond1(BE, r, xinv, True))
    p["certificate_norm"] = med(lambda: float(cp.linalg.norm(g - eye)))
    p["A_X_upper"] = med(lambda: chq._times_upper(BE, x, xinv, "probe", "auto"))
    p["A_W_full"] = med(lambda: mpqr.matmul(x, xinv))
    p["R_to_host_and_back"] = med(lambda: cp.asarray(cp.asnumpy(r)))
    p["qr_mode_r"] = med(lambda: mpqr.qr(x, mode="r"))
    return {f"qr_piece_{k}": v for k, v in p.items()}


def _ab_one(m, n, dtype, label, x):
    row = {"shape": [m, n], "dtype": dtype, "data": label}
    t = {}
    t["mpqr_qr"] = med(lambda: mpqr.qr(x))
    t["mpqr_svd"] = med(lambda: mpqr.svd(x))
    with q_formed():
        t["mpqr_svd_Q_formed"] = med(lambda: mpqr.svd(x))
    for route in ROUTES[1:]:
        with setting(small_svd_route=route):
            t[f"mpqr_svd_{route}"] = med(lambda: mpqr.svd(x))
    if n > 256:
        with setting(gesvdj_max=256):  # R's SVD by cuSOLVER gesvd, as before
            t["mpqr_svd_R_by_gesvd"] = med(lambda: mpqr.svd(x), rep=3)
    if dtype == "float32":
        t["mpqr_svd_fp32_emulated"] = med(lambda: mpqr.svd(x, precision="fp32-emulated"))
        xx = x.astype(cp.float64)
        s_ref = cp.linalg.svd(xx, compute_uv=False)
        del xx
        s_e = mpqr.svd(x, precision="fp32-emulated")[1].astype(cp.float64)
        row["fp32_emulated_s_err"] = float(cp.max(cp.abs(s_e - s_ref)) / s_ref[0])
    if label != "sklearn-centred" or dtype == "float64":
        t["cupy_svd"] = med(lambda: cp.linalg.svd(x, full_matrices=False), rep=3)
    # the pieces: CholQR2's pieces by hand (the deferred route's last steps)
    from mpqr.qr.cholqr import defer_last_solve
    with defer_last_solve(x) as slot:
        q, r = mpqr.qr(x)
    if q is None and slot[1] is not None:
        q1, r2, _sb = slot[1]
        r2 = BE.from_small(r2, x)
        ur = cp.linalg.svd(r[:n], full_matrices=False)[0]
        t["R2inv_Ur"] = med(lambda: apps._deferred_factor(BE, slot[1], ur, None, x))
        w = apps._deferred_factor(BE, slot[1], ur, None, x)[1]
        t["Q1_W"] = med(lambda: mpqr.matmul(q1, w))
        t["isfinite_R"] = med(lambda: bool(cp.all(cp.isfinite(r))))
        del q1, w
    if m == M and n == N:
        # the n x n steps on the host (one transfer each way) instead of CuPy calls
        with setting(host_steps_max=n * n):
            t["mpqr_svd_host_steps"] = med(lambda: mpqr.svd(x))
            t["mpqr_qr_host_steps"] = med(lambda: mpqr.qr(x))
        t.update(_qr_pieces(x))
        from mpqr.compat.array_api import namespace
        plug = namespace(array_namespace(x))
        t["plug_namespace_svd"] = med(lambda: plug.linalg.svd(x, full_matrices=False))
    row["ms"] = t
    row["R_svd_routes"] = _small_routes(cp.ascontiguousarray(r[:n]), dtype)
    base = t.get("cupy_svd")
    print(f"{label:<16} {m}x{n} {dtype:<8} " + " ".join(
        f"{k}={v:.2f}" for k, v in t.items()) + (f" | vs cupy {base / t['mpqr_svd']:.2f}x"
                                                if base else ""))
    print("   R-SVD routes:", json.dumps(row["R_svd_routes"])[:900])
    return row


@part("svd_ab")
def _svd_ab():
    rows = []
    cases = [(M, N, "sklearn-centred"), (M, N, "gaussian"), (M // 4, 512, "gaussian"),
             (M, 128, "gaussian")]
    for m, n, label in cases:
        for dtype in ("float64", "float32"):
            if over_budget():
                rows.append({"skipped": [m, n, dtype, label]})
                continue
            try:
                x = centred(dtype) if label == "sklearn-centred" else gaussian(m, n, dtype)
                rows.append(_ab_one(m, n, dtype, label, x))
            except Exception:
                traceback.print_exc()
                rows.append({"error": traceback.format_exc()[-1500:], "case": [m, n, dtype]})
                OUT["fails"].append(f"svd_ab {m}x{n} {dtype} {label}")
            cp.get_default_memory_pool().free_all_blocks()
    return rows


def two_stage_mean(x, axis=0):
    """The plug's ``mean`` (a sum of row blocks' sums for a tall C-ordered matrix)."""
    from mpqr.compat.array_api import namespace

    return namespace(array_namespace(x)).mean(x, axis=axis)


@contextlib.contextmanager
def mean_native():
    """``patch()`` entered inside leaves CuPy's own ``mean`` in place."""
    from mpqr.compat import _xp_functions as xf

    saved = xf.BLOCKED_MEAN
    xf.BLOCKED_MEAN = frozenset()
    try:
        yield
    finally:
        xf.BLOCKED_MEAN = saved


@part("sklearn")
def _sklearn():
    from mpqr.compat import _xp_functions as xf
    from mpqr.compat.array_api import patch
    from sklearn import config_context

    from mpqr.bench import arrayapi as ab

    inside = {"t": 0.0, "calls": {}, "depth": 0}
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
        inside["t"] += time.perf_counter() - t0
        inside["calls"][name] = inside["calls"].get(name, 0) + 1

    out = []
    for dtype in ("float64", "float32"):
        x, y = data(dtype)
        for case in ab.CASES:
            if over_budget():
                out.append({"skipped": [case, dtype]})
                continue

            def fit(c=case, a=x, b=y):
                return ab._fit(c, a, b, K)

            try:
                with config_context(array_api_dispatch=True):
                    ref = fit()
                    nat = med(fit)
                    with mean_native(), patch():  # the linear algebra only
                        got_fm = fit()
                        plug_fm = med(fit)
                    with patch():
                        got = fit()
                        plug = med(fit)
                        ins, tots = [], []
                        xf._running = timed
                        try:
                            for _ in range(3):
                                inside.update(t=0.0, calls={})
                                sync()
                                t0 = time.perf_counter()
                                fit()
                                sync()
                                tots.append((time.perf_counter() - t0) * 1e3)
                                ins.append(inside["t"] * 1e3)
                        finally:
                            xf._running = orig
                ins_m, tot_m = statistics.median(ins), statistics.median(tots)
                rest_m = statistics.median(t - i for t, i in zip(tots, ins))
                agree = ab._agreement(got, ref)
                agree_fm = ab._agreement(got_fm, ref)
                row = {"case": case, "dtype": dtype, "native_ms": nat, "plugged_ms": plug,
                       "speedup": nat / plug, "plugged_cupy_mean_ms": plug_fm,
                       "speedup_cupy_mean": nat / plug_fm, "timed_run_ms": tot_m,
                       "inside_plugged_ms": ins_m, "remainder_ms": rest_m,
                       "calls": dict(inside["calls"]),
                       "amdahl_bound": nat / max(rest_m, 1e-9), "agreement": agree,
                       "agreement_cupy_mean": agree_fm}
                out.append(row)
                tol = 1e-10 if dtype == "float64" else 1e-3
                worst = max(agree.values()) if agree else float("nan")
                worst_fm = max(agree_fm.values()) if agree_fm else float("nan")
                check(f"sklearn {case} {dtype}: agrees with unplugged", worst <= tol,
                      f"{agree}")
                check(f"sklearn {case} {dtype} (CuPy's mean): agrees with unplugged",
                      worst_fm <= tol, f"{agree_fm}")
                print(f"{case:<15} {dtype:<8} native {nat:7.2f} plugged {plug:7.2f} "
                      f"({nat / plug:.2f}x) cupy-mean {plug_fm:7.2f} ({nat / plug_fm:.2f}x) "
                      f"inside {ins_m:6.2f} rest {rest_m:6.2f} "
                      f"bound {row['amdahl_bound']:.2f}x {row['calls']}")
            except Exception:
                traceback.print_exc()
                out.append({"case": case, "dtype": dtype, "error": traceback.format_exc()})
                OUT["fails"].append(f"sklearn {case} {dtype}")
    return out


def _mean_one(dtype):
    x, _ = data(dtype)
    ref = cp.sum(x.astype(cp.float64), axis=0) / M
    ones = cp.full((1, M), 1.0 / M, dtype=dtype)
    ways = {"cupy_mean": lambda: cp.mean(x, axis=0),
            "two_stage": lambda: two_stage_mean(x, axis=0),
            "ones_product": lambda: (ones @ x)[0]}
    # a sum's rounding error scales with sum |x_i| (per column): the error in those units
    scale = cp.sum(cp.abs(x.astype(cp.float64)), axis=0) / M
    row = {}
    for k, f in ways.items():
        row[k + "_ms"] = med(f)
        row[k + "_err"] = float(cp.max(cp.abs(f().astype(cp.float64) - ref) / scale))
    print("mean", dtype, json.dumps(row))
    bound = 2 * (1024 + M // 1024) * unit(dtype)  # blocked summation: gamma_(b + m/b)
    check(f"two-stage mean {dtype}: within the blocked sum's bound",
          row["two_stage_err"] <= bound,
          f"{row['two_stage_err']:.2e} <= {bound:.1e} (cupy.mean {row['cupy_mean_err']:.2e})")
    return row


@part("mean")
def _mean():
    return {dtype: _mean_one(dtype) for dtype in ("float64", "float32")}


for _name in ORDER:
    run_part(_name)
OUT["seconds"] = time.perf_counter() - T_START
path = os.path.join(os.environ.get("OUT", "/tmp"), "plugins2.json")
with open(path, "w") as f:
    json.dump(OUT, f, indent=1, default=str)
print("FAILED:", OUT["fails"] if OUT["fails"] else "none")
print("wrote", path, f"({OUT['seconds']:.1f} s)")
