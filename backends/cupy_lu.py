"""Signed unpivoted LU (``L U = A - diag(s)``) of an ``n x n`` block on the GPU.

The Householder reconstruction of a panel from an orthonormal Q (LAPACK's
``orhr_col``; :func:`mpqr.qr._kernels.householder_from_q`, after TSQR) needs this
LU of Q's top ``n x n`` block. The base backend's recursion by halves
(``U12 = L11^-1 A12``, ``L21 = A21 U11^-1``, ``A22 -= L21 U12``) runs on cuBLAS,
and blocks of at most :data:`BLOCK` run in one thread block (``kernels/lu_signed.cu``),
compiled on first use and cached by CuPy. H100, float64, against the host round trip
of the NumPy backend (with the host's default BLAS threads): n = 64 0.33 vs 1.9 ms,
128 0.79 vs 3.3, 512 3.1 vs 33 (bench/NOTES.md, session 10).
"""

from __future__ import annotations

import functools
from pathlib import Path

import cupy as cp

__all__ = ["BLOCK", "lu_signed", "supports"]

#: widest diagonal block factored by one thread block (shared memory: 64 x 65 doubles)
BLOCK = 64
_THREADS = 256
_SOURCE = Path(__file__).resolve().parent / "kernels" / "lu_signed.cu"


def supports(a) -> bool:
    # complex pivots need a phase, not a sign: those stay on the host path
    return a.ndim == 2 and a.shape[0] == a.shape[1] and a.dtype in (cp.float32, cp.float64)


@functools.cache
def _kernel(dtype_name: str):
    t = "double" if dtype_name == "float64" else "float"
    name = f"lu_signed_block<{t}, {BLOCK}>"
    mod = cp.RawModule(code=_SOURCE.read_text(), options=("--std=c++17",),
                       name_expressions=[name])
    return mod.get_function(name)


def lu_signed(a):
    """``(L, U, s)`` with ``L @ U = a - diag(s)`` for a square float32/float64 ``a``;
    ``L`` unit lower and ``U`` upper, with explicit zeros (the host version's form)."""
    from cupyx.scipy.linalg import solve_triangular

    n = a.shape[0]
    w = cp.array(a, order="C", copy=True)
    s = cp.empty(n, dtype=a.dtype)
    kern = _kernel(cp.dtype(a.dtype).name)

    def rec(lo: int, hi: int) -> None:
        k = hi - lo
        if k <= BLOCK:
            kern((1,), (_THREADS,), (w[lo:, lo:], cp.int64(n), s[lo:], cp.int32(k)))
            return
        # split on a multiple of BLOCK so that every leaf is a full block but the last
        h = BLOCK * max(1, (k // BLOCK) // 2)
        mid = lo + h
        rec(lo, mid)
        d = w[lo:mid, lo:mid]
        w[lo:mid, mid:hi] = solve_triangular(d, w[lo:mid, mid:hi], lower=True,
                                             unit_diagonal=True)
        # L21 = A21 U11^-1, as U11^T L21^T = A21^T
        w[mid:hi, lo:mid] = solve_triangular(d, w[mid:hi, lo:mid].T, trans="T",
                                             lower=False).T
        w[mid:hi, mid:hi] -= w[mid:hi, lo:mid] @ w[lo:mid, mid:hi]
        rec(mid, hi)

    if n:
        rec(0, n)
    return cp.tril(w, -1) + cp.eye(n, dtype=w.dtype), cp.triu(w), s
