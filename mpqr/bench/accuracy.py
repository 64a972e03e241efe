"""QR accuracy table: backward error and orthogonality per method and precision.

``python -m mpqr bench accuracy``.

For each matrix kind (uniform(0,1), standard normal, singular values spaced
arithmetically and geometrically with condition number ``--cond``), method
and precision: backward error ``||A - QR||_F / ||A||_F`` and orthogonality
``||I - Q^T Q||_F / n`` — the quantities of the TC-QR accuracy table (Leng et
al., Table IV: FP64 ~1e-15 / 1e-16, FP32 ~1e-6 / 5e-7, FP16 ~5e-4 / 1e-4 at
1024 x 1024). Errors are measured with native float64 GEMMs on the device, so
the fp64 rows carry a measurement floor of about ``sqrt(n) u``. The GEMM
engines each precision actually used are recorded from the explain trace.
``--cond-sweep`` adds orthogonality against cond(A) (1e0 ... 1e12).
"""

from __future__ import annotations

import argparse
import math
import time
from typing import Any

import numpy as np

import mpqr
from mpqr.backends import get_backend
from mpqr.bench._charts import grouped_bars
from mpqr.bench._timing import default_xp, environment, write_json

__all__ = ["main", "make_matrix", "measure", "plot", "run"]

KINDS = ("uniform", "normal", "arithmetic", "geometric")
METHODS = ("householder-recursive", "householder-tiled", "gram-schmidt-recursive")
PRECISIONS = ("fp64", "fp64-emulated", "fp32", "fp32-emulated", "fp16")


def make_matrix(kind: str, m: int, n: int, cond: float, rng: np.random.Generator) -> np.ndarray:
    """A float64 test matrix of one of the four kinds."""
    if kind == "uniform":
        return rng.uniform(0.0, 1.0, (m, n))
    if kind == "normal":
        return rng.standard_normal((m, n))
    k = min(m, n)
    if kind == "arithmetic":
        s = 1 - (1 - 1 / cond) * np.arange(k) / max(k - 1, 1)
    elif kind == "geometric":
        s = cond ** (-np.arange(k) / max(k - 1, 1))
    else:
        raise ValueError(f"`kind` must be one of {KINDS}; got {kind!r}")
    u, _ = np.linalg.qr(rng.standard_normal((m, k)))
    v, _ = np.linalg.qr(rng.standard_normal((n, k)))
    return (u * s) @ v.T


def measure(xp: Any, a: Any, q: Any, r: Any) -> tuple[float, float]:
    """(backward error, orthogonality) in float64 on the device."""
    a64 = xp.astype(a, xp.float64)
    q64, r64 = xp.astype(q, xp.float64), xp.astype(r, xp.float64)
    n = q.shape[-1]
    be = float(xp.linalg.matrix_norm(a64 - q64 @ r64)) / float(xp.linalg.matrix_norm(a64))
    eye = xp.eye(n, dtype=xp.float64)
    orth = float(xp.linalg.matrix_norm(eye - q64.T @ q64)) / n
    return be, orth


def run(*, xp: Any, m: int, n: int, kinds, methods, precisions, cond: float, seed: int,
        cond_sweep: bool, dtype: str = "float64") -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    rows = []
    for kind in kinds:
        a = xp.asarray(make_matrix(kind, m, n, cond, rng).astype(dtype))
        for method in methods:
            for prec in precisions:
                rows.append(_one(xp, a, kind, method, prec, cond if kind in (
                    "arithmetic", "geometric") else None))
    sweep = []
    if cond_sweep:
        for c in (1e0, 1e2, 1e4, 1e6, 1e8, 1e10, 1e12):
            a = xp.asarray(make_matrix("geometric", m, n, c, rng).astype(dtype))
            for method in methods:
                sweep.append(_one(xp, a, "geometric", method, "fp64", c))
    return {"m": m, "n": n, "dtype": dtype, "cond": cond, "seed": seed, "rows": rows,
            "cond_sweep": sweep}


def _one(xp, a, kind, method, prec, cond) -> dict[str, Any]:
    row: dict[str, Any] = {"kind": kind, "cond": cond, "method": method, "precision": prec}
    try:
        with mpqr.explain() as trace:
            get_backend(xp).synchronize()
            t0 = time.perf_counter()
            q, r = mpqr.qr(a, precision=prec, method=method)
            get_backend(xp).synchronize()
            row["seconds"] = time.perf_counter() - t0
        row["backward_error"], row["orthogonality"] = measure(xp, a, q, r)
        row["engines"] = trace.engines()
    except (NotImplementedError, mpqr.LinAlgError) as exc:
        row["error"] = f"{type(exc).__name__}: {exc}"
    return row


def format_table(result: dict[str, Any]) -> str:
    lines = [f"QR accuracy, {result['m']} x {result['n']} {result['dtype']} "
             f"(cond = {result['cond']:.0e} for arithmetic/geometric)",
             f"{'kind':<11}{'method':<24}{'precision':<15}{'||A-QR||/||A||':>16}"
             f"{'||I-QtQ||/n':>14}{'time s':>9}  engines"]
    for row in [*result["rows"], *result["cond_sweep"]]:
        kind = row["kind"] if row["cond"] is None else f"{row['kind'][:4]} {row['cond']:.0e}"
        if "error" in row:
            lines.append(f"{kind:<11}{row['method']:<24}{row['precision']:<15}  {row['error']}")
            continue
        eng = ", ".join(f"{k} x{v}" for k, v in row["engines"].items())
        lines.append(f"{kind:<11}{row['method']:<24}{row['precision']:<15}"
                     f"{row['backward_error']:>16.2e}{row['orthogonality']:>14.2e}"
                     f"{row['seconds']:>9.3f}  {eng}")
    return "\n".join(lines)


def plot(payload: dict[str, Any], path: str) -> bool:
    """Largest backward error over the matrix kinds, per method and precision, as a PNG
    (a method that broke down at a precision has no bar)."""
    rows = [r for r in payload["rows"] if "error" not in r]
    methods = list(dict.fromkeys(r["method"] for r in payload["rows"]))
    precs = list(dict.fromkeys(r["precision"] for r in payload["rows"]))
    series = {p: [max((r["backward_error"] for r in rows
                       if r["method"] == m and r["precision"] == p), default=None)
                  for m in methods] for p in precs}
    env = payload.get("environment", {})
    return grouped_bars(path, methods, series, ylabel="max ‖A − QR‖_F / ‖A‖_F",
                        title=f"mpqr.qr accuracy, {payload['m']} x {payload['n']} "
                              f"{payload['dtype']} — {env.get('device')} {env.get('date')}")


def main(argv: list[str] | None = None) -> int:
    """``python -m mpqr bench accuracy [--n 1024] [--json PATH] ...``; returns 0."""
    p = argparse.ArgumentParser(prog="python -m mpqr bench accuracy", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("json_path", nargs="?", default=None, help="write the table as JSON here")
    p.add_argument("--json", default=None, help="same as the positional path")
    p.add_argument("--png", default=None, help="draw the errors here (needs matplotlib)")
    p.add_argument("--m", type=int, default=None, help="rows (default: --n)")
    p.add_argument("--n", type=int, default=1024, help="columns (default 1024)")
    p.add_argument("--cond", type=float, default=1e4)
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--precisions", default=",".join(PRECISIONS))
    p.add_argument("--dtype", default="float64", choices=["float64", "float32"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cond-sweep", action="store_true", help="orthogonality vs cond(A)")
    p.add_argument("--cpu", action="store_true", help="force the NumPy backend")
    args = p.parse_args(argv)
    from mpqr._array_api import array_namespace

    lib = np if args.cpu else default_xp()
    xp = array_namespace(lib.empty(0))  # the standard's functions (astype, matrix_norm)
    m = args.m or args.n
    result = run(xp=xp, m=m, n=args.n, kinds=args.kinds.split(","),
                 methods=args.methods.split(","), precisions=args.precisions.split(","),
                 cond=args.cond, seed=args.seed, cond_sweep=args.cond_sweep, dtype=args.dtype)
    print(format_table(result))
    path = args.json or args.json_path
    payload = {"environment": environment(lib), **result}
    if path:
        write_json(path, payload)
    if args.png:
        plot(payload, args.png)
    ok = all("error" in r or math.isfinite(r["backward_error"]) for r in result["rows"])
    return 0 if ok else 1
