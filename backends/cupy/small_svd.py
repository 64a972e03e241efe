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

Each returns ``(U, s, Vh)`` with ``a = U diag(s) Vh``, ``s`` descending.
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


def svd(a, route: str = "gesvdj", stats: dict | None = None):
    """``(U, s, Vh)`` of a 2-D ``a`` by ``route`` (:data:`ROUTES`), thin."""
    if route == "gesvdj":
        u, s, v = gesvdj(a, stats=stats)
        return u, s, cp.conj(v.T)
    if route == "gesvdj-t":
        # a^H = U' S V'^H, so a = V' S U'^H
        u, s, v = gesvdj(cp.conj(a.T), stats=stats)
        return v, s, cp.conj(u.T)
    if route == "eigh-gesvdj":
        # eigenvalues ascending: reversed, so B's columns come in descending norm
        _w, v0 = cp.linalg.eigh(cp.conj(a.T) @ a)
        v0 = v0[:, ::-1]
        ub, s, vb = gesvdj(a @ v0, stats=stats)
        return ub, s, cp.conj((v0 @ vb).T)
    raise ValueError(f"`route` must be one of {ROUTES}, got {route!r}")
