"""Signed unpivoted LU (``L U = A - diag(s)``) of an ``n x n`` block on the GPU.

The Householder reconstruction of a panel from an orthonormal Q (LAPACK's
``orhr_col``; :func:`mpqr.qr._kernels.householder_from_q`, after TSQR) needs this
LU of Q's top ``n x n`` block. The base backend's recursion by halves
(``U12 = L11^-1 A12``, ``L21 = A21 U11^-1``, ``A22 -= L21 U12``) runs on cuBLAS,
and blocks of at most :data:`BLOCK` run in one thread block (``kernels/lu_signed.cu``),
compiled on first use and cached by CuPy. H100, float64, against the host round trip
of the NumPy backend (with the host's default BLAS threads): n = 64 0.33 vs 1.9 ms,
128 0.79 vs 3.3, 512 3.1 vs 33.

:func:`reconstruct` makes the whole reconstruction of a panel of at most :data:`PANEL`
columns (``Y``, ``W = Y T``, ``tau``, ``diag(s) R``) in one launch
(``reconstruct_rows`` in the same file), for the blocked leaf panels of
:mod:`mpqr.qr.panel_blocked`.
"""

from __future__ import annotations

import cupy as cp
from mpqr.backends.cupy.modules import ctype, functions

__all__ = ["BLOCK", "PANEL", "lu_signed", "reconstruct", "supports"]

#: widest diagonal block factored by one thread block (shared memory: 64 x 65 doubles)
BLOCK = 64
_THREADS = 256
#: widest panel :func:`reconstruct` takes (its rows are held in registers)
PANEL = 32


def supports(a) -> bool:
    # complex pivots need a phase, not a sign: those stay on the host path
    return a.ndim == 2 and a.shape[0] == a.shape[1] and a.dtype in (cp.float32, cp.float64)


def _kernel(dtype_name: str, which: int = 0):
    t = ctype(dtype_name)
    return functions("lu_signed.cu", (f"lu_signed_block<{t}, {BLOCK}>",
                                      f"reconstruct_rows<{t}, {PANEL}>"))[which]


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


def reconstruct(q, r):
    """``(Y, W, tau, R')`` of the reflectors behind the reduced QR ``(q, r)`` of a panel.

    ``q``: ``m x n`` float32/float64 with orthonormal columns, ``m >= n``, ``n <= PANEL``;
    ``r``: its ``n x n`` upper-triangular factor. ``Y`` is unit lower trapezoidal and
    ``I - W Y^T`` (``W = Y T``) is orthogonal with ``(I - W Y^T)[:, :n] = Q S``;
    ``tau = diag(T)``; ``R' = S R``, so that the panel is ``(I - W Y^T)[:, :n] R'``.
    The same formulas as the base backend's ``reconstruct_panel``, in one launch.
    """
    m, n = q.shape
    q = cp.ascontiguousarray(q)
    r = cp.ascontiguousarray(r)
    y = cp.empty((m, n), dtype=q.dtype)
    w = cp.empty((m, n), dtype=q.dtype)
    tau = cp.empty(n, dtype=q.dtype)
    rout = cp.empty((n, n), dtype=q.dtype)
    if m and n:
        kern = _kernel(cp.dtype(q.dtype).name, 1)
        kern((-(-m // _THREADS),), (_THREADS,),
             (q, r, cp.int64(m), cp.int32(n), y, w, tau, rout))
    return y, w, tau, rout
