"""Householder QR in LAPACK's raw layout with ``diag(R) >= 0`` (LAPACK ``xGEQRFP``).

``(H, tau)`` with ``R`` on and above the diagonal of ``H`` and the Householder vectors
``v_i`` (unit first entry implied) below it, ``Q = H_1 ... H_k``,
``H_i = I - tau_i v_i v_i^H``: what ``scipy.linalg.qr(mode="raw")`` returns, for use
with LAPACK's ``xORMQR``/``xUNMQR``. Each reflector maps its column to ``+||x|| e_1``
(``xLARFGP``, the cancellation-free form of ``alpha - beta``), so ``R``'s diagonal is
real and non-negative: the factors agree with :func:`mpqr.qr`'s.

Blocked: panels of :data:`PANEL` columns reflected column by column, then the block
reflector ``I - Y T Y^H`` (``T`` by the UT transform) applied to the trailing columns
by two products through the precision policy.
"""

from __future__ import annotations

import math
from typing import Any

from mpqr.backends._base import compact_wy_t
from mpqr.policy import gemm, gemm_sub
from mpqr.qr._kernels import ct, is_complex, panel_precision, times_pow2, unit_shift

__all__ = ["PANEL", "householder_raw"]

#: Panel width (LAPACK's geqrf block size on CPUs).
PANEL = 32


def householder_raw(backend: Any, a: Any, *, precision: Any, prec_name: str
                    ) -> tuple[Any, Any]:
    """``(H, tau)`` of a 2-D ``a`` (``m x n``, any shape; module docstring); ``a`` is not
    modified. ``tau`` has ``min(m, n)`` entries."""
    xp = backend.xp
    m, n = a.shape
    k = min(m, n)
    # a matrix far from 1 in magnitude is reflected at unit scale (a power of two: exact):
    # squares and products of entries near the range's ends would overflow, and subnormal
    # entries carry few bits; the reflectors do not depend on the scale, R is scaled back
    shift = unit_shift(backend, a)
    h = times_pow2(backend, a, shift) if shift else xp.asarray(a, copy=True)
    pp = panel_precision(prec_name, a.dtype, xp)
    taus = []
    for j in range(0, k, PANEL):
        e = min(j + PANEL, k)
        tau = _panel(xp, h, j, e)
        taus.append(tau)
        if e < n:
            # Q^H X = X - Y T^H (Y^H X) on the trailing columns
            y = xp.tril(h[j:, j:e], k=-1) + xp.eye(m - j, e - j, dtype=h.dtype)
            t = compact_wy_t(backend, y, tau)
            c = gemm(ct(xp, y), h[j:, e:], precision=precision, label="raw-update-YhX",
                     backend=backend)
            c = gemm(ct(xp, t), c, precision=pp, label="raw-update-TC", backend=backend)
            gemm_sub(h[j:, e:], y, c, precision=precision, label="raw-update-YC",
                     backend=backend)
    tau = xp.concat(taus) if taus else xp.zeros((0,), dtype=a.dtype)
    if shift:
        upper = xp.triu(h[:k, :])
        h[:k, :] = (h[:k, :] - upper) + times_pow2(backend, upper, -shift)  # disjoint: exact
    return h, tau


def _norm(xp: Any, x: Any) -> float:
    """``||x||_2`` as a float, without the overflow (or underflow) of squaring entries far
    from 1: scaled by the largest magnitude there (as LAPACK's ``xNRM2``)."""
    nrm = float(xp.linalg.vector_norm(x))
    if 1e-100 < nrm < 1e150:
        return nrm  # no square past the range (one reduction: the usual case)
    mx = float(xp.max(xp.abs(x)))
    if mx == 0.0 or not math.isfinite(mx):
        return nrm
    return mx * float(xp.linalg.vector_norm(x / mx))


def _panel(xp: Any, h: Any, j: int, e: int) -> Any:
    """Reflect columns ``j:e`` of ``h`` in place (rows ``j:``); their ``tau``."""
    m = h.shape[0]
    cplx = is_complex(xp, h)
    taus = []
    for i in range(j, e):
        alpha = complex(h[i, i]) if cplx else float(h[i, i])
        x2 = h[i + 1:, i]
        xn2 = _norm(xp, x2) if i + 1 < m else 0.0
        ar, ai = (alpha.real, alpha.imag) if cplx else (alpha, 0.0)
        if xn2 == 0.0 and ai == 0.0:
            if ar >= 0:
                taus.append(0.0)  # H = I
                continue
            # H = I - 2 e1 e1^H flips the sign (xLARFGP)
            h[i, i] = -ar
            taus.append(2.0)
            if i + 1 < e:
                h[i:i + 1, i + 1:e] = -h[i:i + 1, i + 1:e]
            continue
        beta = math.hypot(abs(alpha), xn2)
        # alpha - beta without cancellation when Re(alpha) > 0: -(ai^2 + xn2^2) / s with
        # each square divided by s >= beta first, so that no square overflows
        s = ar + beta
        dr = -(ai * (ai / s) + xn2 * (xn2 / s)) if ar > 0 else ar - beta
        d = complex(dr, ai) if cplx else dr
        tau = (beta - alpha) / beta
        h[i + 1:, i] = x2 / d
        h[i, i] = beta
        taus.append(tau)
        if i + 1 < e:
            # H^H X = X - conj(tau) v (v^H X) on the panel's later columns
            v = xp.concat([xp.ones((1,), dtype=h.dtype), h[i + 1:, i]])
            blk = h[i:, i + 1:e]
            w = xp.sum((xp.conj(v) if cplx else v)[:, None] * blk, axis=0)
            tc = tau.conjugate() if cplx else tau
            h[i:, i + 1:e] = blk - tc * v[:, None] * w[None, :]
    return xp.asarray(taus, dtype=h.dtype)
