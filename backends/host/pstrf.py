"""Pivoted Cholesky of a Hermitian positive semidefinite matrix by LAPACK ``?pstrf``
(SciPy's bindings): the column order of QR with column pivoting from a Gram matrix
(:mod:`mpqr.qr.pivoted_gram`)."""

from __future__ import annotations

import numpy as np

__all__ = ["lapack_pivoted_cholesky"]


def lapack_pivoted_cholesky(g: np.ndarray, tol: float) -> tuple[np.ndarray, int, float]:
    """``(P, k, gmax)`` for a 2-D Hermitian ``g`` (float64 or complex128): ``P`` (int32,
    0-based) the order of pivoted Cholesky (the largest remaining diagonal entry of the
    Schur complement each step, the first of equals), ``k`` the steps taken before the
    first pivot ``<= tol gmax`` (``gmax`` the largest diagonal entry of ``g``; ``k = 0``
    when that is 0). ``g`` is not modified."""
    from mpqr.backends.host.blas import small_lapack
    from scipy.linalg import lapack

    n = g.shape[0]
    gmax = float(np.max(np.real(np.diagonal(g)))) if n else 0.0
    if not gmax > 0:
        return np.arange(n, dtype=np.int32), 0, max(gmax, 0.0)
    fn = lapack.zpstrf if np.iscomplexobj(g) else lapack.dpstrf
    with small_lapack(g.size):
        _c, piv, rank, info = fn(np.asfortranarray(g), tol=tol * gmax, lower=1)
    if info < 0:  # an argument LAPACK refused: a bug here, not the caller's input
        raise RuntimeError(f"?pstrf: argument {-info} was illegal")
    return np.asarray(piv, dtype=np.int32) - 1, int(rank), gmax
