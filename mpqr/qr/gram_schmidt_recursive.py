"""Recursive Gram-Schmidt QR (RGSQRF, Zhang, Baharlouei & Wu, HPDC'20).

Split the columns in halves, orthonormalise the left half recursively, project
it out of the right half with two large GEMMs (``R12 = Q1^H A2``,
``A2 -= Q1 R12``), recurse on the right half. Panels at the cutoff use the
communication-avoiding tall-skinny QR (:func:`~mpqr.qr._kernels.tsqr`), which
is orthogonal to working precision. With ``reorth=True`` every projection is
done twice ("twice is enough", Giraud et al.), which keeps
``||I - Q^H Q||`` near ``u`` for ``cond(A) < ~1/u``; without it orthogonality
degrades like ``cond(A) u_gemm``. Either way Gram-Schmidt is less robust than
Householder for very ill-conditioned A.

Columns are first scaled by exact powers of two to unit-order norms, so no
fp16 engine overflows whatever the column magnitudes; since ``A D = Q R_s``
gives ``A = Q (R_s D^{-1})``, only the columns of R are rescaled (exactly).
"""

from __future__ import annotations

import math
from typing import Any

from mpqr._array_api import device
from mpqr._errors import BreakdownError
from mpqr.policy import gemm
from mpqr.qr._kernels import ct, panel_precision, pow2_scale, tsqr
from mpqr.qr.cholqr import gram_roundoff

__all__ = ["RECURSION_CUTOFF", "gram_schmidt_recursive"]

RECURSION_CUTOFF = 32


def _column_scale(backend: Any, a: Any) -> Any:
    """Integer exponents ``e`` with ``max_i |a_ij| * 2**-e_j`` in [1, 2)."""
    xp = backend.xp
    return backend.exponent(xp.max(xp.abs(a), axis=-2))


def gram_schmidt_recursive(backend: Any, a: Any, *, precision: Any, prec_name: str,
                           reorth: bool = True, nb: int = RECURSION_CUTOFF, **_: Any
                           ) -> tuple[Any, Any]:
    """``(Q, R)`` with thin Q for ``(..., m, n)``, ``m >= n``."""
    xp = backend.xp
    *batch, _, n = a.shape
    dev = device(a)
    pp = panel_precision(prec_name, a.dtype, xp)
    e = _column_scale(backend, a)
    q = pow2_scale(backend, a, xp.expand_dims(-e, axis=-2))  # fresh array: the workspace
    r = xp.zeros((*batch, n, n), dtype=a.dtype, device=dev)

    def project(c0: int, cm: int, c1: int, label: str) -> Any:
        q1 = q[..., :, c0:cm]
        b = q[..., :, cm:c1]
        s = gemm(ct(xp, q1), b, precision=precision, label=f"rgs-{label}-QhA", backend=backend)
        q[..., :, cm:c1] = b - gemm(q1, s, precision=precision, label=f"rgs-{label}-QS",
                                    backend=backend)
        return s

    def rec(c0: int, c1: int) -> None:
        k = c1 - c0
        if k <= nb:
            qp, rp = tsqr(backend, q[..., :, c0:c1], precision=pp)
            q[..., :, c0:c1] = qp
            r[..., c0:c1, c0:c1] = rp
            return
        panels = -(-k // nb)
        cm = c0 + nb * ((panels + 1) // 2)
        rec(c0, cm)
        s = project(c0, cm, c1, "proj")
        if reorth:
            s = s + project(c0, cm, c1, "reorth")
        r[..., c0:cm, cm:c1] = s
        rec(cm, c1)

    rec(0, n)
    rec = None  # cut rec's self-reference: q must not outlive the caller's use of it
    if n > nb:
        _check_reach(backend, r, gram_roundoff(xp, a.dtype, prec_name))
    r = pow2_scale(backend, r, xp.expand_dims(e, axis=-2))
    return q, r


def _check_reach(backend: Any, r: Any, u: float) -> None:
    """BreakdownError once ``cond(x) u n >= 1``, estimated from ``diag(R)``.

    The projections lose orthogonality like ``cond(x) u`` of the GEMM precision;
    past ``1/u`` Q is no orthonormal basis (fp16 at cond(x) = 1e8 gave
    ``||I - Q^T Q||_F = 2.8``). The panels alone (n <= the cutoff) are TSQR, which
    is stable for any x, so only the recursion is checked.
    """
    xp = backend.xp
    d = xp.abs(xp.linalg.diagonal(r))
    lo, hi = float(xp.min(d)), float(xp.max(d))  # one host sync
    n = r.shape[-1]
    if math.isfinite(hi) and hi > 0 and lo > 0 and hi / lo * u * n < 1:
        return
    if not math.isfinite(hi):
        return  # NaN/Inf input: it propagates to Q and R (IEEE)
    cond = hi / lo if lo > 0 else math.inf
    raise BreakdownError(
        f"gram-schmidt-recursive broke down: estimated cond(x) >= {cond:.2e} is beyond its "
        f"reach cond(x) < 1/(n u) with u = {u:.1e}; use a Householder method or method='auto'",
        method="gram-schmidt-recursive", cond_estimate=cond)
