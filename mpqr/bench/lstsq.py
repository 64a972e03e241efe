"""Least squares: mpqr.lstsq against cuSOLVER's routes, time and residual.

``python -m mpqr bench lstsq [--cpu] [--shapes 1048576x256,...] [--json PATH]``

Per float64 shape (Gaussian A and b), the median time and the normal-equation
residual ``||A^T (b - A x)|| / (||A||_2^2 ||x||)`` of

* ``svd``: ``cupy.linalg.lstsq`` (SVD-based; ``numpy.linalg.lstsq`` on the CPU),
* ``qr``: the cuSOLVER QR route ``cupy.linalg.qr`` + ``Q^T b`` +
  ``cupyx.scipy.linalg.solve_triangular`` (NumPy/SciPy on the CPU) — the
  baseline the speed-ups are relative to,
* ``gels-irs``: ``cupyx.cusolver.gels`` (cuSOLVER's mixed-precision
  iterative-refinement solver) where CuPy provides it, else "unavailable",
* ``mpqr[...]``: :func:`mpqr.lstsq` for each ``precision/refine/driver``
  configuration; the explain trace of one extra run gives the path and the
  refinement iterations.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

import numpy as np

from mpqr.bench._charts import grouped_bars
from mpqr.bench._timing import default_xp, environment, is_cupy, release_pool, time_it, write_json

__all__ = ["main", "plot"]

GPU_SHAPES = [(2**20, 256), (65536, 2048), (2**22, 64)]
CPU_SHAPES = [(2**14, 64), (4096, 256)]
#: (precision, refine, lapack_driver); gelsy = no singular values (like the QR route)
CONFIGS = [("fp16", "cgls", "gelsy"), ("fp32-emulated", "cgls", "gelsy"),
           ("fp16", "auto", "gelsd"), ("auto", "auto", "gelsy"), ("auto", "auto", "gelsd")]


def _parse_shapes(text: str) -> list[tuple[int, int]]:
    out = []
    for item in text.split(","):
        m, n = item.lower().split("x")
        out.append((int(m), int(n)))
    return out


def _parse_configs(text: str) -> list[tuple[str, str | None, str]]:
    out = []
    for item in text.split(","):
        p, r, d = item.split("/")
        out.append((p, None if r == "none" else r, d))
    return out


def _metric(xp, a, b, x, anorm: float) -> float:
    r = b - a @ x
    return float(xp.linalg.norm(a.T @ r) / (anorm**2 * xp.linalg.norm(x)))


def _qr_route(xp):
    if is_cupy(xp):
        from cupyx.scipy.linalg import solve_triangular
    else:
        from scipy.linalg import solve_triangular

    def run(a, b):
        q, r = xp.linalg.qr(a)
        return solve_triangular(r, q.T @ b, lower=False)

    return run


def _svd_route(xp):
    def run(a, b):
        return xp.linalg.lstsq(a, b, rcond=None)[0]

    return run


def _gels(xp):
    if not is_cupy(xp):
        return None, "unavailable (CPU)"
    try:
        from cupyx import cusolver

        gels = cusolver.gels
    except Exception as exc:  # CuPy builds without the IRS wrapper
        return None, f"unavailable ({type(exc).__name__}: {exc})"
    return (lambda a, b: gels(a, b)), None


def _mpqr_run(precision, refine, driver):
    import mpqr

    def run(a, b):
        return mpqr.lstsq(a, b, check_finite=False, lapack_driver=driver, precision=precision,
                          refine=refine)[0]

    return run


def _trace_info(fn, a, b) -> dict[str, Any]:
    import mpqr

    with mpqr.explain() as trace:
        fn(a, b)
    ev = [e for e in trace.events if e.kind == "refine"]
    fb = [e.message for e in trace.events if e.kind == "fallback"]
    engines = trace.engines()
    return {"iterations": ev[0].data["iterations"] if ev else 0,
            "converged": ev[0].data["converged"] if ev else None,
            "fallback": fb, "engines": engines}


def bench_shape(xp, m: int, n: int, configs, repeat: int, seed: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    a = xp.asarray(rng.standard_normal((m, n)))
    b = xp.asarray(rng.standard_normal(m))
    r = xp.linalg.qr(a, mode="r")
    anorm = float(np.linalg.svd(np.asarray(r.get() if hasattr(r, "get") else r),
                                compute_uv=False)[0])
    del r
    rows: dict[str, Any] = {}
    methods: list[tuple[str, Any, str | None]] = [("svd", _svd_route(xp), None),
                                                   ("qr", _qr_route(xp), None)]
    g, why = _gels(xp)
    methods.append(("gels-irs", g, why))
    for p, ref, d in configs:
        methods.append((f"mpqr[{p}/{ref}/{d}]", _mpqr_run(p, ref, d), None))
    for name, fn, why in methods:
        if fn is None:
            rows[name] = {"status": why}
            continue
        try:
            x = fn(a, b)
            t = time_it(xp, lambda fn=fn: fn(a, b), repeat=repeat, warmup=1)
            row = {"time_s": t, "residual": _metric(xp, a, b, x, anorm)}
            if name.startswith("mpqr"):
                row.update(_trace_info(fn, a, b))
            rows[name] = row
        except Exception as exc:  # report and go on (e.g. out of memory for the SVD route)
            rows[name] = {"status": f"failed ({type(exc).__name__}: {exc})"}
        release_pool(xp)
    base = rows.get("qr", {}).get("time_s")
    for row in rows.values():
        if base and "time_s" in row:
            row["speedup_vs_qr"] = base / row["time_s"]
    return {"m": m, "n": n, "dtype": "float64", "anorm": anorm, "results": rows}


def _print(res: dict[str, Any]) -> None:
    print(f"\n{res['m']} x {res['n']} float64")
    print(f"  {'method':<34} {'time ms':>10} {'vs qr':>7} {'residual':>10}  notes")
    for name, row in res["results"].items():
        if "time_s" not in row:
            print(f"  {name:<34} {'-':>10} {'-':>7} {'-':>10}  {row['status']}")
            continue
        note = ""
        if "iterations" in row:
            note = f"{row['iterations']} it" + (" FALLBACK" if row["fallback"] else "")
        print(f"  {name:<34} {row['time_s'] * 1e3:10.3f} {row.get('speedup_vs_qr', math.nan):7.2f}"
              f" {row['residual']:10.2e}  {note}")


def plot(payload: dict[str, Any], path: str) -> bool:
    """Speed-up of each method over the QR route per shape as a PNG."""
    res = payload["results"]
    shapes = [f"{r['m']}x{r['n']}" for r in res]
    methods = list(dict.fromkeys(k for r in res for k in r["results"] if k != "qr"))
    series = {k: [r["results"].get(k, {}).get("speedup_vs_qr") for r in res] for k in methods}
    env = payload["environment"]
    return grouped_bars(path, shapes, series, reference=1.0,
                        ylabel="speed-up over the QR route (float64)",
                        title=f"mpqr.lstsq — {env.get('device')} {env.get('date')}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mpqr bench lstsq", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpu", action="store_true", help="NumPy backend, small default shapes")
    p.add_argument("--shapes", help="comma-separated MxN list (default: the standard shapes)")
    p.add_argument("--configs", help="comma-separated precision/refine/driver list, e.g. "
                   "fp16/cgls/gelsy,auto/auto/gelsd (refine 'none' for the direct answer)")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--json", help="write the results as JSON to this path")
    p.add_argument("--png", help="draw the speed-ups here (needs matplotlib)")
    args = p.parse_args(argv)
    xp = np if args.cpu else default_xp()
    shapes = _parse_shapes(args.shapes) if args.shapes else (
        GPU_SHAPES if is_cupy(xp) else CPU_SHAPES)
    configs = _parse_configs(args.configs) if args.configs else CONFIGS
    env = environment(xp)
    print(f"mpqr lstsq benchmark on {env['device']} ({env['backend']})")
    results = []
    for m, n in shapes:
        res = bench_shape(xp, m, n, configs, args.repeat)
        _print(res)
        results.append(res)
    payload = {"benchmark": "lstsq", "environment": env, "results": results}
    write_json(args.json, payload)
    if args.png:
        plot(payload, args.png)
    return 0
