"""Orthogonalizing a Krylov basis: SVQR against CholQR2.

Krylov bases ``[b, Ab, A^2 b, ...]`` (as in s-step and communication-avoiding
Krylov solvers) lose linear independence fast: their condition number grows
geometrically with the number of vectors. CholQR2 is the cheapest way to
orthogonalize a tall block (two Gram GEMMs and two triangular solves), but it
squares the condition number and breaks down once ``cond(V) ~ u^(-1/2)``
(about 1e8 in float64); mpqr then raises ``mpqr.BreakdownError`` naming the
method and an estimate of ``cond(V)``. SVQR (Yamazaki, Tomov & Dongarra)
orthogonalizes the same blocks to ``O(u)`` up to ``cond(V) ~ 1/u``.

Run: ``python docs/examples/krylov_basis.py``
"""

from __future__ import annotations

import numpy as np

import mpqr

U = 2.0**-53  # float64 unit roundoff


def krylov_basis(lam: np.ndarray, b: np.ndarray, k: int) -> np.ndarray:
    """Columns ``A^j b / ||A^j b||`` for the diagonal operator ``A = diag(lam)``."""
    v = b / np.linalg.norm(b)
    out = np.empty((lam.size, k))
    for j in range(k):
        out[:, j] = v
        v = lam * v
        v /= np.linalg.norm(v)
    return out


def orthogonality(q: np.ndarray) -> float:
    """``||I - Q^T Q||_F`` (computed in float64)."""
    return float(np.linalg.norm(np.eye(q.shape[1]) - q.T @ q))


def main(m: int = 2000, sizes: tuple[int, ...] = (4, 8, 12, 16, 20), seed: int = 0,
         verbose: bool = True) -> list[dict]:
    rng = np.random.default_rng(seed)
    lam = np.linspace(1.0, 100.0, m)
    b = rng.standard_normal(m)
    rows = []
    for k in sizes:
        v = krylov_basis(lam, b, k)
        row = {"k": k, "cond": float(np.linalg.cond(v))}
        for method in ("svqr", "cholqr2"):
            try:
                q, r = mpqr.qr(v, method=method)
                row[method] = orthogonality(q)
                row[method + "_backward"] = float(np.linalg.norm(v - q @ r) / np.linalg.norm(v))
            except mpqr.BreakdownError as exc:
                row[method] = None
                row[method + "_breakdown"] = exc.cond_estimate
        rows.append(row)
    if verbose:
        print(f"{'k':>3} {'cond(V)':>9} {'svqr ||I-QtQ||':>15} {'cholqr2 ||I-QtQ||':>18}")
        for row in rows:
            chol = (f"{row['cholqr2']:.1e}" if row["cholqr2"] is not None
                    else f"breakdown (cond >= {row['cholqr2_breakdown']:.1e})")
            print(f"{row['k']:>3} {row['cond']:>9.1e} {row['svqr']:>15.1e} {chol:>18}")
    return rows


if __name__ == "__main__":
    main()
