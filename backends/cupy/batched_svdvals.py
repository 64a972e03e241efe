"""Singular values of a stack of small matrices on the GPU: one-sided Jacobi, one thread
block per matrix, one launch (``kernels/batched_svdvals.cu``).

CuPy's batched SVD (cuSOLVER ``gesvdjBatched``) stops at 32 x 32; past it CuPy loops
``gesvd`` per member. Here each block keeps its member in shared memory and runs cyclic
one-sided Jacobi sweeps (round-robin pairs over the block's warps) until a sweep rotates
nothing; the singular values are the final column norms, with the relative accuracy of
one-sided Jacobi (to a few units of the working precision against LAPACK's ``gesdd``).

Limits (:func:`supports`): real float32/float64 stacks with ``min(m, n) <= MAX_N`` whose
member fits one block's shared memory (:data:`MAX_SHARED`).
"""

from __future__ import annotations

import math

import cupy as cp
import numpy as np

__all__ = ["MAX_N", "MAX_SHARED", "MAX_SWEEPS", "supports", "svdvals"]

#: widest member (columns after a wide member's transpose)
MAX_N = 128
#: dynamic shared memory a block may opt in to (sm_80 and sm_90: 227 KiB)
MAX_SHARED = 227 * 1024
#: sweeps before the kernel stops whatever the rotations (cyclic Jacobi converges
#: quadratically: 6-10 sweeps at these sizes)
MAX_SWEEPS = 30


def _smem(m: int, n: int, itemsize: int) -> int:
    return (m * n + n) * itemsize


def supports(a) -> bool:
    """A real float32/float64 stack ``(..., m, n)`` with members that fit one block."""
    if not (isinstance(a, cp.ndarray) and a.ndim > 2 and a.dtype in (cp.float32, cp.float64)
            and a.size > 0):
        return False
    m, n = max(a.shape[-2:]), min(a.shape[-2:])
    return n <= MAX_N and _smem(m, n, a.itemsize) <= MAX_SHARED


def _kernel(dtype, smem: int):
    from mpqr.backends.cupy.modules import ctype, functions

    (kern,) = functions("batched_svdvals.cu",
                        (f"batched_svdvals<{ctype(np.dtype(dtype).name)}>",))
    if smem > 48 * 1024 and kern.max_dynamic_shared_size_bytes < smem:
        kern.max_dynamic_shared_size_bytes = smem  # beyond 48 KiB: opt in
    return kern


def svdvals(a, *, sweeps=None):
    """Singular values ``(..., min(m, n))``, descending, of every member of ``a``
    (:func:`supports`); ``a`` is not modified. ``sweeps``: an int32 array of the batch's
    size that receives the sweeps each member took (diagnostics)."""
    *batch, m, n = a.shape
    if m < n:  # the transpose has the same singular values
        a, m, n = cp.swapaxes(a, -1, -2), n, m
    nb = math.prod(batch)
    x = cp.ascontiguousarray(a).reshape(nb, m, n)
    s = cp.empty((nb, n), dtype=a.dtype)
    smem = _smem(m, n, a.itemsize)
    pairs = (n + 1) // 2  # per round; about two a warp
    warps = min(16, max(2, -(-pairs // 2)))
    tol = math.sqrt(m) * float(np.finfo(a.dtype).eps)
    _kernel(a.dtype, smem)(
        (nb,), (32 * warps,),
        (x, np.int64(nb), np.int32(m), np.int32(n), s, a.dtype.type(tol),
         np.int32(MAX_SWEEPS), sweeps if sweeps is not None else np.uint64(0)),
        shared_mem=smem)
    return s.reshape(*batch, n)
