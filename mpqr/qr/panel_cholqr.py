"""Leaf panels by CholQR2 and Householder reconstruction (GPU leaf panels).

The recursive Householder QR needs each leaf panel in compact WY form. cuSOLVER's
``geqrf`` of a ``16384 x 512`` float32 panel takes ~11 ms on an H100: its column
loop is bound by latency, not flops, and the 32 leaves of a 16384^2 QR spend
~176 ms there, half of the whole fp16 QR (bench/NOTES.md, session 9). This route
gets the panel's orthonormal factor from CholQR2 instead (two Gram GEMMs, two
``n x n`` Cholesky factorizations, two triangular solves, at the panel's working
precision) and then the reflectors behind it
(:func:`~mpqr.qr._kernels.householder_from_q`: a signed LU of Q's top block and
two triangular solves; Ballard et al. 2014), all of it GEMM-shaped work.

CholQR2 needs ``cond(panel) < ~u^(-1/2)``. The panel is tried and *certified*:
the first Cholesky must succeed with ``(max r_ii / min r_ii)^2 u n < 1`` and the
second pass's Gram matrix must lie within 1/2 of ``I``, which makes the result
orthonormal to working accuracy. A panel that fails either test (ill-conditioned,
rank-deficient, a zero column, NaN/Inf) goes to ``geqrf`` as before, and the
explain trace records the fallback. Either way the panel's factorization is
backward stable, so this route changes the speed, not the error bounds.
"""

from __future__ import annotations

import math
from typing import Any

from mpqr._array_api import device
from mpqr._errors import LinAlgError
from mpqr.policy import gemm
from mpqr.qr.gram_blocked import gram

__all__ = ["CHOLQR_PANEL_ASPECT", "cholqr2_panel", "takes_cholqr_panel"]

#: rows per column a panel needs for this route (squarer panels are ill-conditioned
#: more often, and their CholQR saves little over ``geqrf``)
CHOLQR_PANEL_ASPECT = 4


def takes_cholqr_panel(backend: Any, a: Any) -> bool:
    """Whether :func:`~mpqr.qr._kernels.householder_panel` tries this route for ``a``:
    2-D real panels at least ``backend.cholqr_panel_min_width`` wide (``None``: never)
    and :data:`CHOLQR_PANEL_ASPECT` times as tall."""
    xp = backend.xp
    min_k = backend.cholqr_panel_min_width
    if min_k is None or a.ndim != 2 or a.dtype not in (xp.float32, xp.float64):
        return False  # stacks and complex panels keep geqrf (the GPU LU kernel is real)
    m, k = a.shape
    return k >= min_k and m >= CHOLQR_PANEL_ASPECT * k


def _unit_roundoff(xp: Any, dtype: Any) -> float:
    return 2.0**-24 if dtype == xp.float32 else 2.0**-53


def cholqr2_panel(backend: Any, a: Any, *, precision: Any) -> tuple[Any, Any, str]:
    """Certified CholQR2 of a tall panel: ``(Q, R, "")``, or ``(None, None, reason)``
    when the panel is outside CholQR2's reach (the caller falls back to ``geqrf``).

    Every product runs at ``precision`` (the panel's working precision), and the
    ``n x n`` steps stay on the device: ``R^-1`` is applied by triangular solves.
    """
    xp = backend.xp
    k = a.shape[-1]
    u = _unit_roundoff(xp, a.dtype)
    eye = xp.eye(k, dtype=a.dtype, device=device(a))
    q, r_acc = a, None
    for step in (1, 2):
        g = gram(backend, q, precision, "panel-cholqr-gram")
        if step == 2:
            dist = float(xp.linalg.matrix_norm(g - eye, ord="fro"))
            if not dist <= 0.5:
                return None, None, f"second pass ||Q1^T Q1 - I||_F = {dist:.2e} > 0.5"
        try:
            r = backend.cholesky(g, upper=True)
        except LinAlgError:
            return None, None, f"Cholesky of pass {step}'s Gram matrix failed"
        d = xp.abs(xp.linalg.diagonal(r))
        lo, hi = float(xp.min(d)), float(xp.max(d))
        if not (math.isfinite(hi) and lo > 0 and (hi / lo) ** 2 * u * k < 1):
            return None, None, (f"pass {step}: diag(R) spans {hi:.2e} / {lo:.2e}, beyond "
                                f"CholQR2's reach at u = {u:.1e}")
        q = xp.asarray(backend.right_solve_upper(q, r))
        r_acc = r if r_acc is None else xp.triu(gemm(r, r_acc, precision=precision,
                                                     label="panel-cholqr-RR",
                                                     backend=backend))
    return q, r_acc, ""
