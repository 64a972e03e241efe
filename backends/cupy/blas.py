"""The CuPy backend's cuBLAS calls, also inside a CUDA graph capture.

CuPy's cuBLAS wrappers refuse a stream that is capturing (``setStream`` raises
NotImplementedError), though cuBLAS itself records its GEMMs and TRSMs into a graph
(host-pointer scalars are read at capture). Inside :func:`capturing` (the graph replays
of :mod:`mpqr.backends.cupy.graphs`) the same calls go through nvmath-python's cuBLAS
bindings (the optional ``graphs`` extra) on a handle of their own; elsewhere through
CuPy's, on the handle the caller passes.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

__all__ = ["available", "capturing", "geam", "gemm_ex", "gemm_strided_batched_ex", "is_capturing",
           "trsm"]

_CAPTURING = contextvars.ContextVar("mpqr_cublas_capturing", default=False)
#: nvmath's cuBLAS handle per device (its own library state: never CuPy's handle)
_HANDLES: dict[int, int] = {}


def available() -> str | None:
    """None where graph captures can call cuBLAS (nvmath-python imports), else why not."""
    try:
        import nvmath.bindings.cublas  # noqa: F401
    except Exception as exc:  # not installed, or its CUDA libraries not found
        return f"nvmath-python's cuBLAS bindings: {type(exc).__name__}: {exc}"
    return None


def is_capturing() -> bool:
    """Whether cuBLAS calls go through nvmath-python here (:func:`capturing`)."""
    return _CAPTURING.get()


@contextlib.contextmanager
def capturing() -> Iterator[None]:
    """cuBLAS calls within go through nvmath-python (a CUDA graph capture)."""
    token = _CAPTURING.set(True)
    try:
        yield
    finally:
        _CAPTURING.reset(token)


def _nv() -> tuple[Any, int]:
    """``(nvmath's cublas module, its handle on the current stream)``."""
    import cupy as cp
    from nvmath.bindings import cublas as nv

    dev = cp.cuda.Device().id
    h = _HANDLES.get(dev)
    if h is None:
        h = _HANDLES[dev] = nv.create()
    nv.set_stream(h, cp.cuda.get_current_stream().ptr)
    return nv, h


def gemm_ex(handle: int, ta: int, tb: int, m: int, n: int, k: int, alpha: int, a: int,
            atype: int, lda: int, b: int, btype: int, ldb: int, beta: int, c: int,
            ctype: int, ldc: int, compute: int, algo: int) -> None:
    """``cublasGemmEx`` with host-pointer scalars ``alpha``/``beta`` (addresses; the
    caller set ``handle``'s pointer mode to host, once for a run of calls)."""
    if _CAPTURING.get():
        nv, h = _nv()
        nv.gemm_ex(h, ta, tb, m, n, k, alpha, a, atype, lda, b, btype, ldb, beta, c, ctype,
                   ldc, compute, algo)
        return
    from cupy.cuda import cublas

    cublas.gemmEx(handle, ta, tb, m, n, k, alpha, a, atype, lda, b, btype, ldb, beta, c, ctype,
                  ldc, compute, algo)


def gemm_strided_batched_ex(handle: int, ta: int, tb: int, m: int, n: int, k: int,
                            alpha: int, a: int, atype: int, lda: int, sa: int, b: int,
                            btype: int, ldb: int, sb: int, beta: int, c: int, ctype: int,
                            ldc: int, sc: int, count: int, compute: int, algo: int) -> None:
    """``cublasGemmStridedBatchedEx`` with host-pointer scalars."""
    if _CAPTURING.get():
        nv, h = _nv()
        nv.gemm_strided_batched_ex(h, ta, tb, m, n, k, alpha, a, atype, lda, sa, b, btype,
                                   ldb, sb, beta, c, ctype, ldc, sc, count, compute, algo)
        return
    from cupy.cuda import cublas

    cublas.gemmStridedBatchedEx(handle, ta, tb, m, n, k, alpha, a, atype, lda, sa, b, btype,
                                ldb, sb, beta, c, ctype, ldc, sc, count, compute, algo)


def geam(handle: int, double: bool, ta: int, tb: int, m: int, n: int, alpha: int, a: int,
         lda: int, beta: int, b: int, ldb: int, c: int, ldc: int) -> bool:
    """``cublas{S,D}geam`` (``C = alpha op(A) + beta op(B)``, column-major) with host-pointer
    scalars; False (nothing done) inside a capture whose bindings lack it."""
    if _CAPTURING.get():
        nv, h = _nv()
        fn = getattr(nv, "dgeam" if double else "sgeam", None)
        if fn is None:
            return False
        fn(h, ta, tb, m, n, alpha, a, lda, beta, b, ldb, c, ldc)
        return True
    from cupy.cuda import cublas

    (cublas.dgeam if double else cublas.sgeam)(handle, ta, tb, m, n, alpha, a, lda, beta, b,
                                               ldb, c, ldc)
    return True


def trsm(a: Any, b: Any, *, lower: bool, unit_diagonal: bool) -> Any:
    """``solve(a, b)`` for a triangular 2-D float32/float64 ``a`` inside a capture: one
    cublas{S,D}trsm on a column-major copy of ``b`` (the result as a new array)."""
    import cupy as cp
    import numpy as np

    nv, h = _nv()
    n, nrhs = b.shape
    dt = a.dtype
    # column-major copies by elementwise kernels (CuPy's asfortranarray of a C-ordered
    # matrix calls cuBLAS geam through its own wrapper, which a capture refuses)
    af = cp.empty(a.shape, dtype=dt, order="F")
    af[...] = a
    x = cp.empty(b.shape, dtype=dt, order="F")
    x[...] = b
    one = np.ones(1, dtype=dt)
    fn = nv.strsm if dt == cp.float32 else nv.dtrsm
    # side left, fill lower/upper, no transpose, unit or non-unit diagonal
    fn(h, 0, 0 if lower else 1, 0, 1 if unit_diagonal else 0, n, nrhs, one.ctypes.data,
       af.data.ptr, max(1, af.shape[0]), x.data.ptr, max(1, n))
    return x
