"""Small device QR and least squares straight through cuSOLVER, with mpqr's conventions.

The CuPy counterpart of :mod:`mpqr.backends.numpy.small`: the small-input fast path of
:func:`mpqr.qr` and :func:`mpqr.lstsq` (``mpqr/_fast.py``) calls these for exact
``cupy.ndarray`` inputs below the backend's ``small_max``. One ``geqrf`` (+ ``orgqr``/
``ungqr``) for QR; ``geqrf`` + ``ormqr``/``unmqr`` + ``trsm`` for least squares (the
route of ``cupyx.lapack.gels``), with the singular values of the small ``R`` on the host
for SciPy's ``rank`` and ``s``. Workspace sizes are cached per dtype and shape. The
column maxima of the input come to the host for the range and NaN/Inf check (the
general route rescales such columns or reports non-finite input, so those inputs return
None and take it): QR's one synchronisation; least squares also brings ``R`` over.
``diag(R)`` real and ``>= 0`` by one elementwise kernel on ``R`` and one on ``Q``.
"""

from __future__ import annotations

import math
from typing import Any

import cupy as cp
import numpy as np
from cupy_backends.cuda.libs import cublas, cusolver
from mpqr.backends.numpy.small import _RANGE

__all__ = ["SVD_HOST_MAX_N", "small_lstsq", "small_qr"]

_PREFIX = {"f": "s", "d": "d", "F": "c", "D": "z"}
#: (dtype char, routine, sizes...) -> workspace elements
_LWORK: dict[tuple[Any, ...], int] = {}
_ONE = {c: np.ones((), dtype=c) for c in "fdFD"}
#: least squares with more columns take the general route: R's singular values are taken
#: on the host, where n = 256 was already slower than on the GPU (``host_steps_max``)
SVD_HOST_MAX_N = 128

# R from geqrf's output (triu), each row by the conjugate phase of its diagonal entry,
# the diagonal exactly |d|; the phases go to p for Q's columns. ``qrt``: the transpose of
# geqrf's column-major m x n matrix (C-contiguous: entry (row, col) at col * m + row);
# ``i`` runs over R's (k, n) in C order (reduce_dims=False keeps that index logical)
_R_REAL = cp.ElementwiseKernel(
    "raw T qrt, int64 m, int64 n", "T r, raw T p",
    """
    const ptrdiff_t row = i / n, col = i % n;
    const T d = qrt[row * m + row];
    const T s = d < T(0) ? T(-1) : T(1);
    if (col == row) p[row] = s;
    r = col < row ? T(0) : qrt[col * m + row] * s;
    """, "mpqr_small_r_real", reduce_dims=False)
_R_COMPLEX = cp.ElementwiseKernel(
    "raw T qrt, int64 m, int64 n", "T r, raw T p",
    """
    const ptrdiff_t row = i / n, col = i % n;
    const T d = qrt[row * m + row];
    const auto ad = abs(d);
    const T s = ad != 0 ? d / ad : T(1);
    if (col == row) { p[row] = s; r = T(ad); }
    else r = col < row ? T(0) : qrt[col * m + row] * conj(s);
    """, "mpqr_small_r_complex", reduce_dims=False)
# Q's columns by the phases (``i`` over Q's (m, n) in C order)
_Q_COLUMNS = cp.ElementwiseKernel(
    "raw T p, int64 n", "T q", "q = q * p[i % n];", "mpqr_small_q_columns",
    reduce_dims=False)


def _funcs(char: str, *names: str) -> list[Any]:
    p = _PREFIX[char]
    unitary = char in "FD"
    out = []
    for name in names:
        if unitary:
            name = name.replace("orgqr", "ungqr").replace("ormqr", "unmqr")
        out.append(getattr(cusolver, p + name))
    return out


def _lwork(key: tuple[Any, ...], size: Any, *args: Any) -> int:
    lw = _LWORK.get(key)
    if lw is None:
        lw = _LWORK[key] = max(1, int(size(*args)))
    return lw


def _column_max(a: Any, extra: Any = None) -> Any:
    """The column maxima of ``|a|`` on the device (NaN stays NaN), and ``extra``'s
    largest entry after them; read later, with one transfer, so that the factorization
    is queued before the host waits for the check."""
    mx = cp.abs(a).max(axis=0)
    if extra is not None:
        mx = cp.concatenate([mx, cp.abs(extra).max(keepdims=True).ravel().astype(mx.dtype)])
    return mx


def _in_range(mx: np.ndarray, single: bool) -> bool:
    lo, hi = _RANGE[single]
    if not mx.size:
        return True
    if not mx.max() < hi:  # NaN compares False
        return False
    return not bool(((mx < lo) & (mx != 0)).any())


def _geqrf(x: Any) -> tuple[Any, Any, Any]:
    """geqrf in place on the F-ordered ``x``: ``(tau, dev_info, handle)``."""
    char = x.dtype.char
    m, n = x.shape
    handle = cp.cuda.device.get_cusolver_handle()
    geqrf, size = _funcs(char, "geqrf", "geqrf_bufferSize")
    lw = _lwork((char, "geqrf", m, n), size, handle, m, n, x.data.ptr, m)
    work = cp.empty(lw, dtype=x.dtype)
    tau = cp.empty(min(m, n), dtype=x.dtype)
    info = cp.empty((), dtype=np.int32)
    geqrf(handle, m, n, x.data.ptr, m, tau.data.ptr, work.data.ptr, lw, info.data.ptr)
    return tau, info, handle


def _r_factor(x: Any, k: int) -> tuple[Any, Any]:
    """``(R, phases)``: the k x n upper triangle of geqrf's ``x`` with ``diag(R) >= 0``."""
    m, n = x.shape
    r = cp.empty((k, n), dtype=x.dtype)
    p = cp.empty(k, dtype=x.dtype)
    kern = _R_COMPLEX if x.dtype.kind == "c" else _R_REAL
    kern(x.T, m, n, r, p)
    return r, p


def small_qr(a: Any, mode: str, single: bool = False) -> tuple[Any, Any] | None:
    """``(Q or None, R)`` of a 2-D tall (``m >= n``) ``a`` with ``diag(R)`` real and
    ``>= 0`` (``mode``: reduced or r; complete returns None), as ``qr(method="geqrf")``
    gives it; None where a column maximum is NaN/Inf or outside the range the general
    route leaves unscaled. ``a`` is never modified (cuSOLVER gets a copy)."""
    m, n = a.shape
    if mode == "complete" or m < n:
        return None
    mx = _column_max(a)
    x = cp.array(a, order="F", copy=True)
    tau, info, handle = _geqrf(x)
    r, p = _r_factor(x, n)
    if mode != "r":
        char = x.dtype.char
        orgqr, size = _funcs(char, "orgqr", "orgqr_bufferSize")
        lw = _lwork((char, "orgqr", m, n), size, handle, m, n, n, x.data.ptr, m,
                    tau.data.ptr)
        work = cp.empty(lw, dtype=x.dtype)
        orgqr(handle, m, n, n, x.data.ptr, m, tau.data.ptr, work.data.ptr, lw,
              info.data.ptr)
        _Q_COLUMNS(p, n, x)
    # the range check read once the work is queued (what it rejects is recomputed by the
    # general route; the input was never touched)
    if not _in_range(mx.get(), single or a.dtype.char in "fF"):
        return None
    return (None, r) if mode == "r" else (x, r)


def small_lstsq(a: Any, b: Any, cut: float, u: float) -> tuple[Any, Any, Any, Any] | None:
    """Least squares of a tall (``m >= n``) full-rank ``a`` with 1-D/2-D ``b`` of its
    dtype by QR: ``(x, rsq, rank, s)`` with ``x`` of shape ``(n, k)``, ``rsq`` the squared
    residual norms ``(k,)`` (None for ``m == n``), ``rank == n`` and ``s`` the singular
    values of ``R`` (those of ``a``), descending, on the device. ``cut``: the relative
    rank cutoff; ``u``: the unit roundoff. None (the general route decides) where ``a``
    or ``b`` holds NaN/Inf or columns out of range, or where the rank by ``cut`` is below
    ``n`` or ``R`` is too close to it for a triangular solve
    (:func:`mpqr.lstsq.solver.solvable`'s rule). The inputs are never modified."""
    from mpqr.lstsq.solver import RESOLUTION

    m, n = a.shape
    if m < n or not 0 < n <= SVD_HOST_MAX_N:
        return None
    b2 = b[:, None] if b.ndim == 1 else b
    k = b2.shape[1]
    mxd = _column_max(a, b2)
    x = cp.array(a, order="F", copy=True)
    c = cp.array(b2, order="F", copy=True)
    tau, info, handle = _geqrf(x)
    rd = x[:n]  # R above the reflectors (ormqr and trsm leave x as it is)
    char = x.dtype.char
    ormqr, size = _funcs(char, "ormqr", "ormqr_bufferSize")
    trans = cublas.CUBLAS_OP_C if char in "FD" else cublas.CUBLAS_OP_T
    lw = _lwork((char, "ormqr", m, n, k), size, handle, cublas.CUBLAS_SIDE_LEFT, trans,
                m, k, n, x.data.ptr, m, tau.data.ptr, c.data.ptr, m)
    work = cp.empty(lw, dtype=x.dtype)
    ormqr(handle, cublas.CUBLAS_SIDE_LEFT, trans, m, k, n, x.data.ptr, m, tau.data.ptr,
          c.data.ptr, m, work.data.ptr, lw, info.data.ptr)
    trsm = getattr(cublas, _PREFIX[char] + "trsm")
    trsm(cp.cuda.device.get_cublas_handle(), cublas.CUBLAS_SIDE_LEFT,
         cublas.CUBLAS_FILL_MODE_UPPER, cublas.CUBLAS_OP_N, cublas.CUBLAS_DIAG_NON_UNIT,
         n, k, _ONE[char].ctypes.data, x.data.ptr, m, c.data.ptr, m)
    sol = cp.ascontiguousarray(c[:n])
    rsq = None
    if m > n:
        t = c[n:]
        rsq = cp.sum((t.real * t.real + t.imag * t.imag) if t.dtype.kind == "c" else t * t,
                     axis=0)
    # the checks, read once the solve is queued: two transfers, the host's SVD of R
    # while nothing else waits; what they reject the general route recomputes
    mx = mxd.get()
    if not (np.isfinite(mx[-1]) and _in_range(mx[:-1], a.dtype.char in "fF")):
        return None
    s = np.linalg.svd(np.triu(rd.get()), compute_uv=False)
    s1 = float(s[0]) if s.size else 0.0
    if not (s1 > 0.0 and np.isfinite(s1)):
        return None
    rank = int(np.count_nonzero(s > cut * s1))
    if rank < n or not float(s[-1]) > (cut + RESOLUTION * math.sqrt(n) * u) * s1:
        return None
    return sol, rsq, rank, cp.asarray(s)
