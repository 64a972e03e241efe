"""Square QR by the Cholesky methods: do they pay where they certify?

``python3 bench/probes/square_cholqr.py OUT.json [N ...]`` times, on the GPU, cuSOLVER's QR
and ``mpqr.qr`` with ``cholqr2`` / ``shifted-cholqr3`` / the ``auto`` choice at each
precision, on Gaussian N x N matrices (cond ~ N) and on matrices of cond 1e5 and 1e8, with
each run's backward error, orthogonality and whether the certificate held; then the time
of one pass's phases (Gram product, Cholesky, the right solve) at 16384.
"""

from __future__ import annotations

import json
import sys
import time

import cupy as cp
import cupyx.scipy.linalg as cxl
import numpy as np

import mpqr
from mpqr.bench._timing import release_pool, time_it


def matrix(n: int, cond: float | None, dtype, seed: int = 0):
    rng = cp.random.default_rng(seed)
    a = rng.standard_normal((n, n), dtype=cp.float64)
    if cond is not None:  # U diag(s) V^T with geometric singular values
        u, _ = cp.linalg.qr(a)
        v, _ = cp.linalg.qr(rng.standard_normal((n, n), dtype=cp.float64))
        s = cp.logspace(0, -np.log10(cond), n)
        a = (u * s) @ v.T
    return a.astype(dtype)


def errors(a, q, r):
    a64 = a.astype(cp.float64)
    q64, r64 = q.astype(cp.float64), r.astype(cp.float64)
    back = float(cp.linalg.norm(a64 - q64 @ r64) / cp.linalg.norm(a64))
    n = q.shape[1]
    orth = float(cp.linalg.norm(q64.T @ q64 - cp.eye(n)) / n)
    return back, orth


def main() -> None:
    out = sys.argv[1]
    sizes = [int(s) for s in sys.argv[2:]] or [8192, 16384]
    rows = []
    for n in sizes:
        for cond in (None, 1e8):
            for dtype, precs in ((cp.float64, ("fp64", "fp64-emulated")),
                                 (cp.float32, ("fp32", "fp32-emulated", "fp16"))):
                a = matrix(n, cond, dtype)
                t_ref = time_it(cp, lambda a=a: cp.linalg.qr(a), repeat=3, max_seconds=3)
                rows.append({"n": n, "cond": cond, "dtype": str(a.dtype), "what": "cusolver",
                             "seconds": t_ref})
                print(n, cond, a.dtype, "cusolver", f"{t_ref * 1e3:.1f} ms", flush=True)
                for prec in precs:
                    for method in ("cholqr2", "shifted-cholqr3", "auto"):
                        row = {"n": n, "cond": cond, "dtype": str(a.dtype), "what": method,
                               "precision": prec}
                        try:
                            with mpqr.explain() as tr:
                                q, r = mpqr.qr(a, precision=prec, method=method)
                            row["backward"], row["orthogonality"] = errors(a, q, r)
                            row["events"] = [e.kind for e in tr.events][:8]
                            del q, r
                            row["seconds"] = time_it(
                                cp, lambda a=a, p=prec, m=method: mpqr.qr(a, precision=p,
                                                                          method=m),
                                repeat=3, max_seconds=4)
                            row["vs_cusolver"] = t_ref / row["seconds"]
                        except mpqr.BreakdownError as exc:
                            row["breakdown"] = str(exc)[:120]
                        release_pool(cp)
                        rows.append(row)
                        print({k: v for k, v in row.items() if k != "events"}, flush=True)
                del a
                release_pool(cp)
    # one pass's phases at the largest size, float64
    n = sizes[-1]
    a = matrix(n, None, cp.float64)
    for prec in ("fp64", "fp64-emulated"):
        g = mpqr.matmul(a.T, a, precision=prec)
        t_gram = time_it(cp, lambda p=prec: mpqr.matmul(a.T, a, precision=p), repeat=3)
        r = cp.linalg.cholesky(g).T
        t_chol = time_it(cp, lambda g=g: cp.linalg.cholesky(g), repeat=3)
        t_trsm = time_it(cp, lambda r=r: cxl.solve_triangular(r, a.T, trans="T", lower=False),
                         repeat=3)
        rows.append({"n": n, "phase": "one pass", "precision": prec, "gram": t_gram,
                     "cholesky": t_chol, "right_solve": t_trsm})
        print(rows[-1], flush=True)
    with open(out, "w") as f:
        json.dump({"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
                   "date": time.strftime("%Y-%m-%d"), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
