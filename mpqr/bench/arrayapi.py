"""``python -m mpqr bench arrayapi``: scikit-learn on array-API input, plugged vs not.

scikit-learn with ``array_api_dispatch=True`` on CuPy (NumPy with ``--cpu``): PCA
(``svd_solver="full"``), PCA (``"randomized"``, ``power_iteration_normalizer="QR"``),
``Ridge(solver="svd")`` and ``randomized_svd`` (QR normalizer), each fitted natively,
under ``mpqr.compat.array_api.patch()`` and, on float32, under
``patch(precision="fp32-emulated")`` (the products through the precision policy too).
Agreement with the native run: the largest principal angle between the component
subspaces (PCA, ``randomized_svd``'s ``Vt``), the sign-aligned largest difference of the
components relative to their largest entry, and the relative difference of Ridge's
coefficients and of the singular values.

Timing: wall clock with the whole device synchronized before and after each fit, median
over ``--repeat`` rounds that run the variants in turn (one warm-up each), all in one
process. scikit-learn needs ``SCIPY_ARRAY_API=1`` before SciPy is imported: without it
the command runs itself again in a child process with it set.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import mpqr
from mpqr.bench._charts import grouped_bars
from mpqr.bench._timing import default_xp, environment, is_cupy, release_pool, to_host, write_json

CASES = ("pca-full", "pca-randomized", "ridge-svd", "randomized-svd")


def _sync(xp: Any) -> None:
    if is_cupy(xp):
        xp.cuda.Device().synchronize()


def _data(xp: Any, rows: int, cols: int, dtype: str, seed: int = 0) -> tuple[Any, Any]:
    """A matrix with a decaying spectrum (a gap of 10% between neighbouring columns'
    scales, so the leading subspaces are well defined) and a right-hand side."""
    rng = np.random.default_rng(seed)
    scale = 0.9 ** np.arange(cols)
    x = xp.asarray((rng.standard_normal((rows, cols)) * scale).astype(dtype))
    y = xp.asarray((to_host(x).astype(np.float64) @ rng.standard_normal(cols)
                    + 0.01 * rng.standard_normal(rows)).astype(dtype))
    return x, y


def _fit(case: str, x: Any, y: Any, k: int) -> dict[str, Any]:
    """Run one case; its results as host arrays."""
    from sklearn.decomposition import PCA
    from sklearn.linear_model import Ridge
    from sklearn.utils.extmath import randomized_svd

    if case == "pca-full":
        est = PCA(n_components=k, svd_solver="full").fit(x)
        return {"components": to_host(est.components_), "s": to_host(est.singular_values_)}
    if case == "pca-randomized":
        est = PCA(n_components=k, svd_solver="randomized", power_iteration_normalizer="QR",
                  random_state=0).fit(x)
        return {"components": to_host(est.components_), "s": to_host(est.singular_values_)}
    if case == "ridge-svd":
        est = Ridge(alpha=1.0, solver="svd").fit(x, y)
        return {"coef": to_host(est.coef_)}
    _, s, vt = randomized_svd(x, k, power_iteration_normalizer="QR", random_state=0)
    return {"components": to_host(vt), "s": to_host(s)}


def _agreement(got: dict[str, Any], ref: dict[str, Any]) -> dict[str, float]:
    """Principal angle and sign-aligned differences against the native run (float64)."""
    out: dict[str, float] = {}
    if "components" in ref:
        a = np.asarray(got["components"], np.float64)
        b = np.asarray(ref["components"], np.float64)
        qa, qb = np.linalg.qr(a.T)[0], np.linalg.qr(b.T)[0]
        # sine of the largest principal angle: ||(I - Qb Qb^T) Qa||_2 (no cancellation)
        out["subspace_angle"] = float(np.linalg.norm(qa - qb @ (qb.T @ qa), 2))
        signs = np.sign(np.sum(a * b, axis=1, keepdims=True))
        out["components_diff"] = float(np.max(np.abs(a * signs - b)) / np.max(np.abs(b)))
        out["s_diff"] = float(np.max(np.abs(got["s"] - ref["s"])) / np.max(np.abs(ref["s"])))
    if "coef" in ref:
        a, b = np.asarray(got["coef"], np.float64), np.asarray(ref["coef"], np.float64)
        out["coef_diff"] = float(np.linalg.norm(a - b) / np.linalg.norm(b))
    return out


def _variants(dtype: str) -> dict[str, Callable[[], Any]]:
    import contextlib

    from mpqr.compat.array_api import patch

    out: dict[str, Callable[[], Any]] = {"native": contextlib.nullcontext,
                                         "mpqr": patch}
    if dtype == "float32":
        out["mpqr-fp32-emulated"] = lambda: patch(precision="fp32-emulated")
    return out


def run(xp: Any, rows: int, cols: int, dtypes: list[str], cases: list[str], k: int,
        repeat: int, max_seconds: float) -> dict[str, Any]:
    from sklearn import config_context

    results = []
    for dtype in dtypes:
        x, y = _data(xp, rows, cols, dtype)
        variants = _variants(dtype)
        for case in cases:
            times: dict[str, list[float]] = {v: [] for v in variants}
            outputs: dict[str, dict[str, Any]] = {}
            plugged: dict[str, dict[str, int]] = {}
            engines: dict[str, dict[str, int]] = {}
            with config_context(array_api_dispatch=True):
                for v, ctx in variants.items():  # warm-up, results and the trace
                    with mpqr.explain() as trace, ctx():
                        outputs[v] = _fit(case, x, y, k)
                    calls: dict[str, int] = {}
                    for e in trace.events:
                        if e.kind == "array-api" and e.data.get("route") != "native":
                            calls[e.data["function"]] = calls.get(e.data["function"], 0) + 1
                    plugged[v], engines[v] = calls, trace.engines()
                start = time.perf_counter()
                for _ in range(repeat):
                    for v, ctx in variants.items():
                        release_pool(xp)
                        _sync(xp)
                        t0 = time.perf_counter()
                        with ctx():
                            _fit(case, x, y, k)
                        _sync(xp)
                        times[v].append(time.perf_counter() - t0)
                    if time.perf_counter() - start > max_seconds:
                        break
            med = {v: statistics.median(t) for v, t in times.items()}
            row = {"case": case, "dtype": dtype, "rows": rows, "cols": cols, "k": k,
                   "seconds": med, "repeats": len(times["native"]),
                   "speedup": {v: med["native"] / t for v, t in med.items() if v != "native"},
                   "plugged_calls": plugged, "engines": engines,
                   "agreement": {v: _agreement(outputs[v], outputs["native"])
                                 for v in variants if v != "native"}}
            results.append(row)
            print(f"{case:<15} {dtype:<8} " + "  ".join(
                f"{v} {t * 1e3:9.2f} ms" for v, t in med.items()) + "  speed-up " + ", ".join(
                f"{v} {s:.2f}x" for v, s in row["speedup"].items()))
        del x, y
        release_pool(xp)
    return {"environment": environment(xp), "results": results}


def plot(payload: dict[str, Any], path: str) -> bool:
    rows = payload["results"]
    groups = [f"{r['case']}\n{r['dtype']}" for r in rows]
    names = sorted({v for r in rows for v in r["speedup"]})
    series = {v: [r["speedup"].get(v) for r in rows] for v in names}
    env = payload["environment"]
    return grouped_bars(path, groups, series, ylabel="speed-up over scikit-learn's own calls",
                        title=f"scikit-learn array API, {rows[0]['rows']} x {rows[0]['cols']} "
                              f"({env['device']})", log=False, reference=1.0)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="python -m mpqr bench arrayapi", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=2**20)
    p.add_argument("--cols", type=int, default=256)
    p.add_argument("--components", type=int, default=32, help="k of PCA and randomized_svd")
    p.add_argument("--dtypes", default="float64,float32")
    p.add_argument("--cases", default=",".join(CASES), help=f"comma list of {', '.join(CASES)}")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--max-seconds", type=float, default=60.0,
                   help="time cap per case (all variants)")
    p.add_argument("--json", default=None)
    p.add_argument("--png", default=None)
    p.add_argument("--cpu", action="store_true", help="NumPy even where a GPU is visible")
    args = p.parse_args(argv)
    cases = args.cases.split(",")
    bad = [c for c in cases if c not in CASES]
    if bad:
        p.error(f"--cases takes {', '.join(CASES)}; got {', '.join(bad)}")
    if os.environ.get("SCIPY_ARRAY_API") != "1":
        env = {**os.environ, "SCIPY_ARRAY_API": "1"}
        return subprocess.run([sys.executable, "-m", "mpqr", "bench", "arrayapi", *argv],
                              env=env, check=False).returncode
    xp = np if args.cpu else default_xp()
    payload = run(xp, args.rows, args.cols, args.dtypes.split(","), cases,
                  min(args.components, args.cols), args.repeat, args.max_seconds)
    write_json(args.json, payload)
    if args.png:
        plot(payload, args.png)
    return 0
