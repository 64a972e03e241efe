"""Low-rank approximation of a tall matrix through the QR-SVD.

``mpqr.svd`` factors ``A = QR`` (the big, GEMM-rich step, run through the
precision policy), takes the SVD of the small ``n x n`` factor ``R`` and forms
``U = Q U_R``. Truncating it after ``k`` terms gives the best rank-``k``
approximation (Eckart-Young): ``||A - A_k||_2 = sigma_{k+1}``. This is the
QR-SVD route of Zhang, Baharlouei & Wu (HPDC'20) for tall data matrices.

The tensor-core precisions shift the attainable floor, not the method: with
``precision="fp32-emulated"`` the error of ``A_k`` is ``sigma_{k+1}`` up to a
few fp32 roundings of ``||A||``.

Run: ``python docs/examples/low_rank.py``
"""

from __future__ import annotations

import numpy as np

import mpqr


def test_matrix(m: int, n: int, decay: float, rng: np.random.Generator) -> np.ndarray:
    """``U diag(decay^j) V^T`` with random orthonormal U (m x n) and V (n x n)."""
    u, _ = np.linalg.qr(rng.standard_normal((m, n)))
    v, _ = np.linalg.qr(rng.standard_normal((n, n)))
    return (u * decay ** np.arange(n)) @ v.T


def main(m: int = 4000, n: int = 120, ranks: tuple[int, ...] = (5, 10, 20), seed: int = 0,
         precisions: tuple[str, ...] = ("fp64", "fp32-emulated"),
         verbose: bool = True) -> list[dict]:
    rng = np.random.default_rng(seed)
    a = test_matrix(m, n, 0.7, rng)
    sigma = np.linalg.svd(a, compute_uv=False)  # LAPACK reference
    rows = []
    for precision in precisions:
        u, s, vh = mpqr.svd(a, precision=precision)
        for k in ranks:
            ak = (u[:, :k] * s[:k]) @ vh[:k]
            err = float(np.linalg.norm(a - ak, 2))
            rows.append({"precision": precision, "k": k, "error": err,
                         "sigma_k+1": float(sigma[k]), "sigma_1": float(sigma[0]),
                         "max_sv_error": float(np.max(np.abs(s - sigma)))})
    if verbose:
        print(f"{'precision':<15}{'k':>4}{'||A-A_k||_2':>14}{'sigma_k+1':>12}"
              f"{'max |s - s_lapack|':>20}")
        for r in rows:
            print(f"{r['precision']:<15}{r['k']:>4}{r['error']:>14.3e}{r['sigma_k+1']:>12.3e}"
                  f"{r['max_sv_error']:>20.2e}")
    return rows


if __name__ == "__main__":
    main()
