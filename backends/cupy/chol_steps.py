"""The ``n x n`` steps of a CholQR pass in one launch (``kernels/chol_steps.cu``).

:func:`chol_steps` returns ``R = chol(G)``, ``X = R^-1`` and the eight numbers the
checks of :mod:`mpqr.qr.cholqr` read, all on the device and without a host sync, so
that a pass reads them back once instead of moving ``G`` to the host, factoring it there
and moving ``X`` back (about 0.5 ms of GPU idle time per pass at 2^22 x 64, H100,
``python -m mpqr bench qr --shapes 4194304x64 --precisions fp64``). Compiled on first use
for the device's architecture and cached by CuPy.
"""

from __future__ import annotations

import cupy as cp
from mpqr.backends.cupy.modules import ctype, functions

__all__ = ["LIBRARY_MAX_N", "MAX_N", "chol_steps", "library_chol_steps", "supports",
           "supports_library"]

#: widest Gram matrix of the one-block kernel (shared memory: 64 x 65 doubles)
MAX_N = 64
_THREADS = 256
#: widest Gram matrix of :func:`library_chol_steps`; past it the pass's steps run where
#: ``backend.small`` puts them (their cost no longer latency: 65536 x 4096 factors there)
LIBRARY_MAX_N = 512


def _real_square(g) -> bool:
    # real 2-D Gram matrices only: complex ones keep the host path
    return g.ndim == 2 and g.shape[0] == g.shape[1] and g.dtype in (cp.float32, cp.float64)


def supports(g) -> bool:
    return _real_square(g) and 0 < g.shape[0] <= MAX_N


def supports_library(g) -> bool:
    return _real_square(g) and MAX_N < g.shape[0] <= LIBRARY_MAX_N


def _kernel(dtype_name: str):
    return functions("chol_steps.cu", (f"chol_steps<{ctype(dtype_name)}, {MAX_N}, {_THREADS}>",))[0]


def chol_steps(g):
    """``(R, X, st)`` for a symmetric ``g`` accepted by :func:`supports`; ``st`` is the
    float64 vector described in the kernel source."""
    n = g.shape[0]
    g = cp.ascontiguousarray(g)
    r = cp.empty((n, n), dtype=g.dtype)
    x = cp.empty((n, n), dtype=g.dtype)
    st = cp.empty(8, dtype=cp.float64)
    _kernel(cp.dtype(g.dtype).name)((1,), (_THREADS,), (g, cp.int32(n), r, x, st))
    return r, x, st


def library_chol_steps(g):
    """:func:`chol_steps`'s triple for a wider ``g`` (:func:`supports_library`) from
    library calls queued without a host sync: ``potrf`` (its ``info`` kept on the device),
    ``trsm`` on ``I`` for ``X`` (``X R = I``, substitution), and a few reductions for the
    numbers. The steps of a CholQR pass over 256 columns otherwise ran on the GPU as ~130
    small launches with a host sync each (H200, 2^20 x 256 float64 cond 1: 21 ms a call
    against 9.5 ms of kernels; ``python bench/probes/tall_timeline.py OUT``). A failed
    factor gives NaN ``R`` and ``X`` and ``st[3] = 1``, as the portable steps do."""
    from cupy.cuda import cusolver, device
    from cupy_backends.cuda.libs import cublas
    from mpqr.backends.cupy.chol_blocked import _trsm

    n = g.shape[0]
    g = cp.ascontiguousarray(g)
    # C-ordered g read column-major is g^T = g; cuSOLVER's lower factor there is R's
    # upper triangle in row-major order (R^T R = G)
    r = g.copy()
    p = "d" if g.dtype == cp.float64 else "s"
    handle = device.get_cusolver_handle()
    lo = cublas.CUBLAS_FILL_MODE_LOWER
    lwork = getattr(cusolver, f"{p}potrf_bufferSize")(handle, lo, n, r.data.ptr, n)
    work = cp.empty(max(lwork, 1), dtype=g.dtype)
    info = cp.zeros((), dtype=cp.int32)
    getattr(cusolver, f"{p}potrf")(handle, lo, n, r.data.ptr, n, work.data.ptr, lwork,
                                   info.data.ptr)
    r = cp.triu(r)
    x = cp.eye(n, dtype=g.dtype)
    _trsm(r, x, side_left=False, trans=False)  # X R = I
    finite_g = cp.isfinite(g).all()
    failed = (info != 0) | ~finite_g | ~cp.isfinite(r).all() | ~cp.isfinite(x).all()
    nan = cp.asarray(cp.nan, dtype=g.dtype)
    r = cp.where(failed, nan, r)
    x = cp.where(failed, nan, x)
    rd = cp.abs(cp.diagonal(r))
    eye = cp.eye(n, dtype=g.dtype)
    st = cp.stack([v.astype(cp.float64) for v in (
        ~finite_g, cp.diagonal(g).min(), cp.linalg.norm(g - eye), failed, rd.max(),
        rd.min(), cp.abs(r).sum(axis=0).max(), cp.abs(x).sum(axis=0).max())])
    return r, x, st
