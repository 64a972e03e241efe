"""Cholesky factor and triangular inverse of a wide ``n x n`` matrix by halves on cuBLAS.

cuSOLVER's ``potrf`` at ``n = 4096`` ran at ~4 TFLOP/s on an H200 (5.5 ms float64, 4.5
float32: a wide CholQR2 pays it twice), and ``trsm`` on the identity at ~15 (4.5 ms).
By halves, the bulk of the flops become products of half the size:

* Cholesky, upper (``R^T R = G``): ``R11 = chol(G11)``, ``R12 = R11^-T G12`` (trsm),
  ``S = G22 - R12^T R12`` (one product accumulated into a copy of ``G22``),
  ``R22 = chol(S)``; blocks of at most the leaf width by ``potrf``. The blocked
  Cholesky of LAPACK, in the same rounding-error class (backward stable). A leaf that
  fails leaves a non-finite factor as ``potrf`` does (its NaN spreads to the blocks
  after it), so the caller's finiteness check reads it the same way.
* Inverse of upper-triangular ``R``: ``X11 = R11^-1``, ``X22 = R22^-1`` (recursively),
  ``X12 = -(X11 R12) R22^-1`` (a product, then a right-side trsm): every block solves
  ``X R = I`` by substitution against a diagonal block of ``R``, so ``|X R - I|`` keeps
  the substitution's ``γ_n |X||R|`` form.
"""

from __future__ import annotations

import cupy as cp
import numpy as np

__all__ = ["cholesky_upper", "inverse_upper", "supports"]


def supports(a) -> bool:
    return a.ndim == 2 and a.shape[0] == a.shape[1] and a.dtype in (cp.float32, cp.float64)


def _half(n: int) -> int:
    return (n // 2 + 63) // 64 * 64  # aligned blocks


def _trsm(r, b, *, side_left: bool, trans: bool) -> None:
    """``b <- op(r)^-1 b`` (``side_left``) or ``b <- b op(r)^-1`` in place (``op``: the
    transpose where ``trans``), ``r`` upper triangular; both with unit stride along rows.

    cuBLAS reads row-major ``b`` (m x n) as column-major ``b^T`` and upper ``r`` as lower
    ``r^T``: ``op(r)^-1 b`` is ``b^T op(r^T)^-1`` there (side right), ``b op(r)^-1`` is
    ``op(r^T)^-1 b^T`` (side left), with the same ``op`` either way."""
    from cupy.cuda import device
    from cupy_backends.cuda.libs import cublas

    m, n = b.shape
    one = np.ones((), dtype=b.dtype)
    fn = cublas.dtrsm if b.dtype == cp.float64 else cublas.strsm
    fn(device.get_cublas_handle(),
       cublas.CUBLAS_SIDE_RIGHT if side_left else cublas.CUBLAS_SIDE_LEFT,
       cublas.CUBLAS_FILL_MODE_LOWER, cublas.CUBLAS_OP_T if trans else cublas.CUBLAS_OP_N,
       cublas.CUBLAS_DIAG_NON_UNIT, n, m, one.ctypes.data, r.data.ptr,
       r.strides[0] // r.itemsize, b.data.ptr, b.strides[0] // b.itemsize)


def cholesky_upper(g, leaf: int):
    """Upper ``R`` with ``R^T R = g`` (real 2-D ``g``, only its upper triangle read at the
    leaves' ``potrf`` and in ``G12``/``G22``); a new C-ordered array."""
    n = g.shape[0]
    r = cp.zeros((n, n), dtype=g.dtype)
    _chol_into(g, r, leaf)
    return r


def _chol_into(g, r, leaf: int) -> None:
    n = g.shape[0]
    if n <= leaf:
        r[...] = cp.linalg.cholesky(cp.ascontiguousarray(g)).T
        return
    h = _half(n)
    if h >= n:
        h = n // 2
    _chol_into(g[:h, :h], r[:h, :h], leaf)
    r12 = r[:h, h:]
    r12[...] = g[:h, h:]
    _trsm(r[:h, :h], r12, side_left=True, trans=True)  # R11^T R12 = G12
    s = cp.array(g[h:, h:], order="C")
    s -= r12.T @ r12
    _chol_into(s, r[h:, h:], leaf)


def inverse_upper(r, leaf: int):
    """``r^-1`` for upper-triangular real 2-D ``r`` (a new C-ordered array)."""
    n = r.shape[0]
    x = cp.zeros((n, n), dtype=r.dtype)
    _inv_into(cp.ascontiguousarray(r), x, leaf)
    return x


def _inv_into(r, x, leaf: int) -> None:
    n = r.shape[0]
    if n <= leaf:
        blk = cp.eye(n, dtype=r.dtype)
        _trsm(r, blk, side_left=False, trans=False)  # I R^-1
        x[...] = blk
        return
    h = _half(n)
    if h >= n:
        h = n // 2
    _inv_into(r[:h, :h], x[:h, :h], leaf)
    _inv_into(r[h:, h:], x[h:, h:], leaf)
    t = -(x[:h, :h] @ r[:h, h:])
    _trsm(r[h:, h:], t, side_left=False, trans=False)  # X12 R22 = -X11 R12
    x[:h, h:] = t
