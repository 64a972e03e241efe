"""``lapack_driver="gelsy"``'s direct solution on QR with column pivoting (LAPACK ``xGELSY``).

1. ``A P = Q R`` by :func:`mpqr.qr` with ``pivoting=True`` (the products through the
   precision policy).
2. The rank: the largest ``r`` with ``cond(R[:r, :r]) < 1 / rcond``, the condition
   numbers of the growing leading blocks estimated incrementally (Bischof's incremental
   condition estimation, LAPACK ``xLAIC1``), as ``xGELSY`` does.
3. Full column rank: ``x = P R^-1 Q^H b``. Otherwise the minimum-norm solution of the
   truncated problem through the complete orthogonal decomposition
   ``[R11 R12] = L^H Z^H`` (the QR of ``[R11 R12]^H``, ``xGELSY``'s ``xTZRZF``):
   ``x = P Z L^-H (Q^H b)[:r]``.
"""

from __future__ import annotations

import math
from typing import Any

from mpqr._array_api import device
from mpqr.policy import gemm, record_event
from mpqr.qr._kernels import ct

__all__ = ["ice_rank", "solve"]


def ice_rank(backend: Any, r: Any, rcond: float) -> int:
    """The rank ``xGELSY`` assigns to the (pivoted) triangular ``r``: the largest ``k``
    for which the incremental estimates of ``sigma_max`` and ``sigma_min`` of
    ``r[:k, :k]`` satisfy ``smax * rcond < smin`` (0 if ``r[0, 0] == 0``).

    One step (``xLAIC1``): for ``x`` with ``||R_k^H x|| = s`` and the new column
    ``(w, gamma)``, the vector ``[sx; c]`` of the bordered matrix gives
    ``s^2 ||R_k^H x||^2 + |s alpha + c gamma|^2`` (``alpha = w^H x``), a 2 x 2 Hermitian
    form whose extreme eigenvalues are the new estimates. Runs on ``backend.small``
    (the host for a GPU backend)."""
    sb, rs = backend.small(r)
    xp = sb.xp
    k = min(rs.shape[-2], rs.shape[-1])
    if k == 0:
        return 0
    smax = smin = float(xp.abs(rs[0, 0]))
    if not smax > 0:
        return 0
    xmin = xp.ones((1,), dtype=rs.dtype, device=device(rs))
    xmax = xp.ones((1,), dtype=rs.dtype, device=device(rs))
    cplx = xp.isdtype(rs.dtype, "complex floating")
    for i in range(1, k):
        w = rs[:i, i]
        gamma = complex(rs[i, i]) if cplx else float(rs[i, i])
        wh = xp.conj(w) if cplx else w
        s1, c1, smin_new = _laic1(smin, _scalar(xp.sum(wh * xmin), cplx), gamma, False)
        s2, c2, smax_new = _laic1(smax, _scalar(xp.sum(wh * xmax), cplx), gamma, True)
        if not smax_new * rcond < smin_new:
            return i
        xmin = xp.concat([s1 * xmin, xp.asarray([c1], dtype=rs.dtype, device=device(rs))])
        xmax = xp.concat([s2 * xmax, xp.asarray([c2], dtype=rs.dtype, device=device(rs))])
        smin, smax = smin_new, smax_new
    return k


def _scalar(v: Any, cplx: bool) -> complex | float:
    return complex(v) if cplx else float(v)


def _laic1(s: float, alpha: complex, gamma: complex, largest: bool
           ) -> tuple[complex, complex, float]:
    """``(v1, v2, est)``: the unit eigenvector and the square root of the largest (or
    smallest) eigenvalue of ``M = [[s^2 + |alpha|^2, conj(alpha gamma)], [alpha gamma,
    |gamma|^2]]``, the form ``||[L 0; w^H conj(gamma)] [v1 x; v2]||^2`` of one step."""
    scale = max(s, abs(alpha), abs(gamma))
    if scale == 0:
        return 1.0, 0.0, 0.0
    s, alpha, gamma = s / scale, alpha / scale, gamma / scale  # no overflow in squares
    a11 = s * s + abs(alpha) ** 2
    a22 = abs(gamma) ** 2
    off = (alpha * gamma).conjugate()
    mid = (a11 + a22) / 2
    lmax = mid + math.hypot((a11 - a22) / 2, abs(off))
    # the smaller root without cancellation: det(M) = s^2 |gamma|^2
    lam = lmax if largest else (s * s * a22 / lmax if lmax > 0 else 0.0)
    # (M - lam I) v = 0 from whichever row is larger
    v1, v2 = -off, a11 - lam
    u1, u2 = a22 - lam, -off.conjugate()
    if math.hypot(abs(u1), abs(u2)) > math.hypot(abs(v1), abs(v2)):
        v1, v2 = u1, u2
    nv = math.hypot(abs(v1), abs(v2))
    if nv == 0:  # M = lam I: any vector
        return 1.0, 0.0, math.sqrt(lam) * scale
    return v1 / nv, v2 / nv, math.sqrt(lam) * scale


def solve(backend: Any, a: Any, b: Any, rcond: float, prec: str, wprec: str
          ) -> tuple[Any, int]:
    """``(x, rank)`` for 2-D ``a`` (``m x n``) and 2-D ``b`` (``m x nrhs``), any shape
    (module docstring); ``prec`` the precision of the factorizations, ``wprec`` that of
    the products with ``b``."""
    from mpqr.qr.in_memory import qr

    xp = backend.xp
    n = a.shape[1]
    q, r, p = qr(a, pivoting=True, precision=prec)
    rank = ice_rank(backend, r, rcond)
    record_event("method", f"lstsq: gelsy on QR with column pivoting at precision {prec!r}: "
                 f"rank {rank} (incremental condition estimate, rcond {rcond:.2e})",
                 path="qrcp", rank=rank, precision=prec)
    dev = device(r)
    if rank == 0:
        return xp.zeros((n, b.shape[1]), dtype=b.dtype, device=dev), 0
    c = gemm(ct(xp, q[:, :rank]), b, precision=wprec, label="lstsq:gelsy-QHb",
             backend=backend)
    if rank == n:
        y = backend.solve_triangular(r[:n, :n], c)
    else:
        # [R11 R12] = L^H Z^H from the QR of its conjugate transpose (n x rank)
        z, l = qr(xp.asarray(ct(xp, r[:rank, :]), copy=True), precision=prec)
        t = backend.solve_triangular(xp.asarray(ct(xp, l), copy=True), c, lower=True)
        y = gemm(z, t, precision=wprec, label="lstsq:gelsy-Zt", backend=backend)
    inv = xp.argsort(xp.astype(p, xp.int64))
    return xp.take(y, inv, axis=0), rank
