"""Where the framework front ends lose time (CUDA machine with CuPy, torch, scikit-learn).

1. torch.linalg.lstsq 2^22 x 64 float64: torch's own, patched, mpqr.lstsq on the same
   tensor and on a CuPy view, the conversions, and a cProfile of one patched call.
2. mpqr.svd 2^20 x 256 float64/float32 by stage: mpqr.qr, the small SVD of R with each
   candidate (cuSOLVER gesvd, gesvdj, eigh of R^T R, host LAPACK incl. transfers), Q @ U_r,
   against cupy.linalg.svd.
3. scikit-learn (array_api_dispatch, CuPy 2^20 x 256): plugged/unplugged times and the time
   spent inside plugged functions, so the non-plugged remainder (Amdahl bound) is known.

Prints a table; JSON to $OUT/plugins2.json.  Run: python bench/probes/plugins2_gpu.py
"""
from __future__ import annotations

import contextlib
import cProfile
import io
import json
import os
import pstats
import statistics
import time
import traceback

import cupy as cp
import numpy as np

import mpqr

OUT: dict = {}
REP = 5


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


def part(name):
    def deco(fn):
        t0 = time.perf_counter()
        try:
            OUT[name] = fn()
        except Exception:
            traceback.print_exc()
            OUT[name] = {"error": traceback.format_exc()}
        print(f"[{name}] {time.perf_counter() - t0:.1f} s")
        return fn
    return deco


@part("torch_lstsq")
def _lstsq():
    import mpqr.compat.torch as mct
    import torch
    m, n = 2 ** 22, 64
    g = torch.Generator(device="cuda").manual_seed(0)
    A = torch.randn(m, n, dtype=torch.float64, device="cuda", generator=g)
    B = torch.randn(m, 1, dtype=torch.float64, device="cuda", generator=g)
    r = {}
    r["torch_gels_ms"] = med(lambda: torch.linalg.lstsq(A, B))
    with mct.patch():
        r["patched_ms"] = med(lambda: torch.linalg.lstsq(A, B))
        x_p = torch.linalg.lstsq(A, B).solution
    r["mpqr_lstsq_torch_ms"] = med(lambda: mpqr.lstsq(A, B, check_finite=False))
    Ac, Bc = cp.from_dlpack(A), cp.from_dlpack(B)
    r["dlpack_in_ms"] = med(lambda: (cp.from_dlpack(A), cp.from_dlpack(B)))
    r["mpqr_lstsq_cupy_ms"] = med(lambda: mpqr.lstsq(Ac, Bc, check_finite=False))
    r["mpqr_lstsq_cupy_gelsy_ms"] = med(
        lambda: mpqr.lstsq(Ac, Bc, check_finite=False, lapack_driver="gelsy"))
    r["isfinite_check_ms"] = med(lambda: bool(torch.isfinite(A).all())
                                 and bool(torch.isfinite(B).all()))
    r["sum_check_ms"] = med(lambda: bool(torch.isfinite(A.sum())) and bool(torch.isfinite(B.sum())))
    r["to_same_dtype_ms"] = med(lambda: torch.stack([A[:, :1]]).reshape(m, 1).to(A.dtype))
    with mct.patch(), mpqr.explain() as tr:
        torch.linalg.lstsq(A, B)
    r["explain"] = str(tr)[:3000]
    pr = cProfile.Profile()
    with mct.patch():
        sync()
        pr.enable()
        torch.linalg.lstsq(A, B)
        sync()
        pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(25)
    r["cprofile"] = s.getvalue()[:6000]
    x_t = torch.linalg.lstsq(A, B).solution
    err = float((x_p - x_t).abs().max() / x_t.abs().max())
    r["rel_diff_vs_torch"] = err
    r["PASS"] = err < 1e-10
    r["speedup"] = r["torch_gels_ms"] / r["patched_ms"]
    print(json.dumps({k: v for k, v in r.items() if k not in ("cprofile", "explain")}, indent=1))
    print(r["explain"][:1500])
    print(r["cprofile"][:4000])
    return r


def _svd_stages(dtype):
    m, n = 2 ** 20, 256
    x = cp.random.default_rng(0).standard_normal((m, n), dtype=dtype)
    r = {}
    r["cupy_svd_ms"] = med(lambda: cp.linalg.svd(x, full_matrices=False))
    r["mpqr_svd_ms"] = med(lambda: mpqr.svd(x))
    r["mpqr_qr_ms"] = med(lambda: mpqr.qr(x))
    q, R = mpqr.qr(x)
    r["small_gesvd_ms"] = med(lambda: cp.linalg.svd(R, full_matrices=False))
    try:
        from cupyx import cusolver
        r["small_gesvdj_ms"] = med(lambda: cusolver.gesvdj(R, full_matrices=False))
    except Exception as e:
        r["small_gesvdj_ms"] = repr(e)

    def via_eigh():  # R^T R = V S^2 V^T: loses half the digits of small singular values
        w, v = cp.linalg.eigh(R.T @ R)
        return w, v
    r["small_eigh_RtR_ms"] = med(via_eigh)

    def host():
        u, s, vh = np.linalg.svd(cp.asnumpy(R), full_matrices=False)
        return cp.asarray(u), cp.asarray(s), cp.asarray(vh)
    r["small_host_lapack_ms"] = med(host)
    ur = cp.linalg.svd(R, full_matrices=False)[0]
    r["QU_gemm_ms"] = med(lambda: mpqr.matmul(q, ur))
    r["QU_cupy_matmul_ms"] = med(lambda: q @ ur)
    s_ref = cp.linalg.svd(x, compute_uv=False)
    s_m = mpqr.svd(x)[1]
    tol = (1e-12 if dtype == "float64" else 2e-5)
    err = float(cp.abs(s_m - s_ref).max() / s_ref[0])
    r["rel_err_s"], r["PASS"] = err, err < tol
    r["speedup"] = r["cupy_svd_ms"] / r["mpqr_svd_ms"]
    print(dtype, json.dumps(r, indent=1))
    return r


part("svd_f64")(lambda: _svd_stages("float64"))
part("svd_f32")(lambda: _svd_stages("float32"))


@part("sklearn")
def _sklearn():
    from mpqr.compat import _xp_functions as xf
    from mpqr.compat.array_api import patch
    from sklearn import config_context

    from mpqr.bench import arrayapi as ab
    inside = {"t": 0.0, "calls": {}}
    orig = xf._running

    @contextlib.contextmanager
    def timed(lib, name, *a, **k):
        if inside.get("depth"):  # nested plugged call: counted by the outer one
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
        x, y = ab._data(cp, 2 ** 20, 256, dtype)
        for case in ab.CASES:
            with config_context(array_api_dispatch=True):
                nat = med(lambda c=case, a=x, b=y: ab._fit(c, a, b, 32), rep=3)
                with patch():
                    plug = med(lambda c=case, a=x, b=y: ab._fit(c, a, b, 32), rep=3)
                    xf._running = timed
                    try:
                        inside["t"], inside["calls"] = 0.0, {}
                        sync()
                        t0 = time.perf_counter()
                        ab._fit(case, x, y, 32)
                        sync()
                        tot = (time.perf_counter() - t0) * 1e3
                    finally:
                        xf._running = orig
            row = {"case": case, "dtype": dtype, "native_ms": nat, "plugged_ms": plug,
                   "speedup": nat / plug, "timed_run_ms": tot,
                   "inside_plugged_ms": inside["t"] * 1e3,
                   "remainder_ms": tot - inside["t"] * 1e3, "calls": dict(inside["calls"]),
                   "amdahl_bound": nat / max(tot - inside["t"] * 1e3, 1e-9)}
            out.append(row)
            print(f"{case:<15} {dtype:<8} native {nat:8.2f} plugged {plug:8.2f} "
                  f"({nat / plug:.2f}x) inside {row['inside_plugged_ms']:8.2f} "
                  f"rest {row['remainder_ms']:8.2f} bound {row['amdahl_bound']:.2f}x "
                  f"{row['calls']}")
    return out


path = os.path.join(os.environ.get("OUT", "/tmp"), "plugins2.json")
with open(path, "w") as f:
    json.dump(OUT, f, indent=1, default=str)
print("wrote", path)
