"""Triangular solves of a stack in a few cuBLAS calls: ``trsmBatched`` on diagonal blocks
of at most :data:`LEAF` rows, a batched product for each off-diagonal block above that.

The portable recursion (:meth:`~mpqr.backends._base.ArrayAPIBackend.solve_triangular`)
halves down to single rows: ~2n launches with their Python around them, milliseconds
for the 512-column reflector blocks of ``geqrf-wy``. Here the halving stops at
:data:`LEAF` rows and every leaf is one ``trsmBatched`` for the whole stack.
"""

from __future__ import annotations

import cupy as cp
import numpy as np

__all__ = ["LEAF", "inverse_upper", "solve", "supports"]

#: diagonal blocks up to this size are one trsmBatched call for the stack
LEAF = 64


def supports(a, b) -> bool:
    """Real float32/float64 stacks ``a`` ``(..., k, k)``, ``b`` ``(..., k, r)`` of one
    dtype and one batch shape."""
    return (a.ndim > 2 and b.ndim == a.ndim and a.dtype == b.dtype
            and a.dtype in (cp.float32, cp.float64) and a.shape[:-2] == b.shape[:-2]
            and a.shape[-1] == a.shape[-2] == b.shape[-2])


def solve(a, b, *, lower: bool = False, unit_diagonal: bool = False):
    """``x`` with ``a @ x = b`` for every member (:func:`supports`); neither input is
    modified; ``x`` is a new C-contiguous stack."""
    k = b.shape[-2]
    if a.size == 0 or b.size == 0:
        return cp.empty(b.shape, dtype=b.dtype)
    if k <= LEAF:
        return _leaf(a, b, lower, unit_diagonal)
    h = max(LEAF, (k // 2) // 32 * 32)
    x = cp.empty(b.shape, dtype=b.dtype)
    if lower:
        x[..., :h, :] = solve(a[..., :h, :h], b[..., :h, :], lower=True,
                              unit_diagonal=unit_diagonal)
        x[..., h:, :] = solve(a[..., h:, h:], b[..., h:, :] - a[..., h:, :h] @ x[..., :h, :],
                              lower=True, unit_diagonal=unit_diagonal)
    else:
        x[..., h:, :] = solve(a[..., h:, h:], b[..., h:, :], lower=False,
                              unit_diagonal=unit_diagonal)
        x[..., :h, :] = solve(a[..., :h, :h], b[..., :h, :] - a[..., :h, h:] @ x[..., h:, :],
                              lower=False, unit_diagonal=unit_diagonal)
    return x


def _leaf(a, b, lower, unit):
    from cupy.cuda import cublas, device

    k, r = b.shape[-2:]
    nb = b.size // (k * r)
    ac = cp.ascontiguousarray(a)
    x = cp.array(b, order="C", copy=True)  # cuBLAS solves in place
    it = a.itemsize
    # row-major a is column-major a^T: a x = b  <=>  x^T a^T = b^T (side right, the other
    # triangle), x^T being x's row-major storage read column-major (r x k, ld r)
    ap = cp.arange(nb, dtype=cp.uint64) * np.uint64(k * k * it) + np.uint64(ac.data.ptr)
    xp_ = cp.arange(nb, dtype=cp.uint64) * np.uint64(k * r * it) + np.uint64(x.data.ptr)
    one = np.ones((), dtype=a.dtype)
    call = cublas.dtrsmBatched if a.dtype == cp.float64 else cublas.strsmBatched
    call(device.get_cublas_handle(), cublas.CUBLAS_SIDE_RIGHT,
         cublas.CUBLAS_FILL_MODE_UPPER if lower else cublas.CUBLAS_FILL_MODE_LOWER,
         cublas.CUBLAS_OP_N, cublas.CUBLAS_DIAG_UNIT if unit else cublas.CUBLAS_DIAG_NON_UNIT,
         r, k, one.ctypes.data, ap.data.ptr, k, xp_.data.ptr, r, nb)
    return x


def inverse_upper(a):
    """``a^-1`` of every member of an upper-triangular stack (:func:`supports` with
    ``b = a``): diagonal blocks of at most :data:`LEAF` rows by ``trsmBatched`` on the
    identity, the blocks above them by two batched products each,
    ``inv([[A, B], [0, C]]) = [[A^-1, -A^-1 B C^-1], [0, C^-1]]`` (the leaves solve ``LEAF``
    right-hand sides instead of ``k``, as :func:`solve` on the identity would)."""
    k = a.shape[-1]
    if a.size == 0:
        return cp.empty(a.shape, dtype=a.dtype)
    if k <= LEAF:
        return _leaf(a, cp.broadcast_to(cp.eye(k, dtype=a.dtype), a.shape), False, False)
    h = max(LEAF, (k // 2) // 32 * 32)
    x = cp.zeros(a.shape, dtype=a.dtype)
    ai = inverse_upper(a[..., :h, :h])
    ci = inverse_upper(a[..., h:, h:])
    x[..., :h, :h] = ai
    x[..., h:, h:] = ci
    x[..., :h, h:] = -(ai @ (a[..., :h, h:] @ ci))
    return x
