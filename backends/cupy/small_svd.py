"""The SVD of one small factor on the GPU (the ``n x n`` R of a QR-SVD, ``n`` in the
hundreds): cuSOLVER's Jacobi SVD (``gesvdj``) with its parameters, and the routes built
on it (:data:`ROUTES`).

* ``"gesvdj"``: one-sided Jacobi on R itself (what ``cupyx.cusolver.gesvdj`` runs).
* ``"gesvdj-t"``: on ``R^H`` (its SVD's factors swapped back): the rows of an upper
  triangular R from QR are ordered by the diagonal's decay, so its transpose's columns
  are the better ordered for the cyclic sweeps.
* ``"eigh-gesvdj"``: ``V0`` from the eigenvectors of ``R^H R`` (``syevd``), then Jacobi on
  ``B = R V0``, whose columns are already nearly orthogonal: the sweeps' count drops, and
  the accuracy is the Jacobi SVD's of ``B`` (backward error ``~ n u ||R||``, not the
  squared condition number of the eigenvalues).

Each returns ``(U, s, Vh)`` with ``a = U diag(s) Vh``, ``s`` descending. Measured on an
H200 (2^20 x 256, the R of CholQR2): the three are equally accurate; ``gesvdj`` and
``gesvdj-t`` take the same sweeps (2 on graded columns, 9 on Gaussian ones: 2.1 and 8.8
ms), ``eigh-gesvdj`` more (6 and 14; 7.3 and 15.7 ms): ``"gesvdj"`` is the default.
"""

from __future__ import annotations

import cupy as cp
import numpy as np

__all__ = ["ROUTES", "gesvdj", "svd"]

ROUTES = ("gesvdj", "gesvdj-t", "eigh-gesvdj")

_PREFIX = {np.dtype(np.float32): "s", np.dtype(np.float64): "d",
           np.dtype(np.complex64): "c", np.dtype(np.complex128): "z"}


def gesvdj(a, *, tol: float | None = None, max_sweeps: int | None = None,
           stats: dict | None = None):
    """``(U, s, V)`` of a 2-D float32/float64/complex ``a`` (``a = U diag(s) V^H``, thin) by
    ``cusolverDn<t>gesvdj``; ``a`` is not modified. ``tol`` / ``max_sweeps``: the Jacobi
    parameters (cuSOLVER's defaults: the unit roundoff, 100). ``stats``: a dict that
    receives ``sweeps`` and ``residual`` (read after a device sync)."""
    from cupy_backends.cuda.libs import cusolver as lib

    prefix = _PREFIX[np.dtype(a.dtype)]
    real = np.dtype(a.dtype).char.lower()
    m, n = a.shape
    k = min(m, n)
    x = cp.array(a, order="F", copy=True)  # overwritten by cuSOLVER
    s = cp.empty(k, dtype=real)
    u = cp.empty((m, k), dtype=a.dtype, order="F")
    v = cp.empty((n, k), dtype=a.dtype, order="F")
    handle = cp.cuda.device.get_cusolver_handle()
    params = lib.createGesvdjInfo()
    try:
        if tol is not None:
            lib.xgesvdjSetTolerance(params, float(tol))
        if max_sweeps is not None:
            lib.xgesvdjSetMaxSweeps(params, int(max_sweeps))
        jobz = lib.CUSOLVER_EIG_MODE_VECTOR
        args = (handle, jobz, 1, m, n, x.data.ptr, m, s.data.ptr, u.data.ptr, m,
                v.data.ptr, n)
        lwork = getattr(lib, prefix + "gesvdj_bufferSize")(*args, params)
        work = cp.empty(lwork, dtype=a.dtype)
        info = cp.empty(1, dtype=np.int32)
        getattr(lib, prefix + "gesvdj")(*args, work.data.ptr, lwork, info.data.ptr, params)
        if stats is not None:
            cp.cuda.get_current_stream().synchronize()
            stats["sweeps"] = int(lib.xgesvdjGetSweeps(handle, params))
            stats["residual"] = float(lib.xgesvdjGetResidual(handle, params))
            stats["info"] = int(info.get()[0])
    finally:
        lib.destroyGesvdjInfo(params)
    return u, s, v


#: single-precision factors are taken in double and rounded back: cuSOLVER's sgesvdj on a
#: 256 x 256 R of Gaussian data left a backward error of 7.3e-5 (~1200 u) and
#: ``||U^T U - I||_F`` 4.9e-4 after 7 sweeps (H200, bench/probes/plugins2_gpu.py), where
#: dgesvdj is at a few u of float32; 8.8 against 5.4 ms (graded R: 2.1 against 1.0 ms)
_DOUBLE = {np.dtype(np.float32): np.float64, np.dtype(np.complex64): np.complex128}


def svd(a, route: str = "gesvdj", stats: dict | None = None):
    """``(U, s, Vh)`` of a 2-D ``a`` by ``route`` (:data:`ROUTES`), thin; float32 and
    complex64 through their double types, rounded back."""
    if route not in ROUTES:
        raise ValueError(f"`route` must be one of {ROUTES}, got {route!r}")
    wide = _DOUBLE.get(np.dtype(a.dtype))
    if wide is not None:
        u, s, vh = _svd(a.astype(wide), route, stats)
        return (u.astype(a.dtype), s.astype(np.dtype(a.dtype).char.lower()),
                vh.astype(a.dtype))
    return _svd(a, route, stats)


def _svd(a, route: str, stats: dict | None):
    if route == "gesvdj":
        u, s, v = gesvdj(a, stats=stats)
        return u, s, cp.conj(v.T)
    if route == "gesvdj-t":
        # a^H = U' S V'^H, so a = V' S U'^H
        u, s, v = gesvdj(cp.conj(a.T), stats=stats)
        return v, s, cp.conj(u.T)
    # "eigh-gesvdj"; eigenvalues ascending: reversed, so B's columns come in descending norm
    _w, v0 = cp.linalg.eigh(cp.conj(a.T) @ a)
    v0 = v0[:, ::-1]
    ub, s, vb = gesvdj(a @ v0, stats=stats)
    return ub, s, cp.conj((v0 @ vb).T)
