"""Adaptive mixed-precision singular-value QR (Yamazaki, Tomov, Dongarra, Fig. 10).

One pass: Gram matrix ``G = V^H V`` in the working precision, symmetrically
scaled to unit diagonal (Stathopoulos & Wu); its SVD ``G = U S U^H`` with
singular values below ``eps * s_1`` lifted to ``eps * s_1`` (so nothing
breaks down); ``R`` from the QR of ``S^{1/2} U^H``; ``Q = V R^{-1}`` by a
triangular solve. Passes repeat on Q until ``||I - Q^H Q||_F <= n u`` or a
pass no longer reduces it fourfold (the Gram matrix's own rounding floor).

``eps`` is that of the Gram matrix's GEMM precision (fp32's for ``"fp32"``,
``"fp32-emulated"`` and ``"fp16"``, whose engines accumulate in fp32), else the
dtype's. The solve is the only step whose error grows linearly, not quadratically, in
``cond(V)``: when ``cond(G) > 1/eps`` the first two steps already dominate the
orthogonality error and the solve may run in half the working precision
(float32 for float64 input) without changing its order. It raises the
*backward* error to the half precision's level, so it is used only where the
caller's precision setting already accepts fp32-level products (``"fp32"``,
``"fp32-emulated"``, ``"fp16"`` on float64 input) or ``mixed=True`` is passed;
``"auto"`` and the fp64 settings keep working-precision solves.
"""

from __future__ import annotations

import math
from typing import Any

from mpqr._array_api import device
from mpqr._errors import BreakdownError
from mpqr.policy import record_event
from mpqr.qr._kernels import ct
from mpqr.qr.cholqr import _rr, gram_roundoff, right_solve_upper, unit_roundoff
from mpqr.qr.gram_blocked import gram

__all__ = ["MAX_PASSES", "svqr"]

MAX_PASSES = 6
_PRECISION_U = {"fp32": 2.0**-24, "fp32-emulated": 2.0**-24, "fp16": 2.0**-24}


def _one_pass(backend: Any, v: Any, g: Any, mixed: bool, it: int, eps: float
              ) -> tuple[Any, Any]:
    """One SVQR pass on ``v`` whose Gram matrix ``g`` (accurate to ``eps``) the caller made."""
    xp = backend.xp
    if not bool(xp.all(xp.isfinite(g))):  # the SVD below would fail or return garbage
        raise BreakdownError("svqr broke down: the Gram matrix x^H x is not finite "
                             "(x holds NaN or Inf)", method="svqr", cond_estimate=math.inf)
    dg = xp.real(xp.linalg.diagonal(g)) if xp.isdtype(g.dtype, "complex floating") \
        else xp.linalg.diagonal(g)
    # zero columns: leave them unscaled (they contribute a zero column of R)
    d = xp.where(dg > 0, 1 / xp.sqrt(xp.where(dg > 0, dg, xp.ones_like(dg))),
                 xp.ones_like(dg))
    dc = xp.astype(d, g.dtype)
    gs = g * xp.expand_dims(dc, axis=-1) * xp.expand_dims(dc, axis=-2)
    u, s, _ = backend.svd(gs)
    s1 = s[..., :1]
    floor = eps * s1
    lifted = xp.where(s < floor, floor, s)
    smin = s[..., -1:]
    tiny = xp.full_like(smin, xp.finfo(smin.dtype).smallest_normal)
    cond_g = float(xp.max(s1 / xp.where(smin > 0, smin, tiny)))  # one host sync per pass
    if not float(xp.min(s1)) > 0:  # a zero matrix has no column space to orthonormalise
        raise BreakdownError("svqr broke down: x (or a matrix of the stack) is zero",
                             method="svqr", cond_estimate=math.inf)
    b = xp.expand_dims(xp.astype(xp.sqrt(lifted), u.dtype), axis=-1) * ct(xp, u)
    _, rs = backend.qr_panel(b)
    r = rs / xp.expand_dims(dc, axis=-2)  # V D = Q Rs  =>  V = Q (Rs D^{-1})
    half = mixed and cond_g > 1 / eps and v.dtype in (xp.float64, xp.complex128)
    record_event("svqr-pass", f"svqr pass {it}: cond(G) = {cond_g:.2e}, triangular solve in "
                 f"{'half' if half else 'working'} precision", cond_gram=cond_g, half=half)
    if half:
        lo = xp.float32 if v.dtype == xp.float64 else xp.complex64
        q = xp.astype(right_solve_upper(backend, xp.astype(v, lo), xp.astype(r, lo)), v.dtype)
    else:
        q = right_solve_upper(backend, v, r)
    return q, r


def _checked(q: Any, r: Any, err: float, n: int, u_gram: float) -> tuple[Any, Any]:
    """``(q, r)`` if ``||I - Q^H Q||_F`` stalled at the rounding floor, else BreakdownError.

    Past ``cond(x) ~ 1/eps`` the passes stall far above it (``||I - Q^H Q||_F``
    of order 1): that Q is no orthonormal basis and must not be returned.
    """
    limit = min(32 * n * u_gram, 0.5)
    if err <= limit:
        return q, r
    raise BreakdownError(
        f"svqr broke down: the passes stalled at ||I - Q^H Q||_F = {err:.2e} > {limit:.2e} "
        "(x is numerically rank deficient at this precision); use a Householder method or "
        "method='auto'", method="svqr", cond_estimate=math.inf)


def svqr(backend: Any, a: Any, *, precision: Any, prec_name: str, mixed: bool | None = None,
         **_: Any) -> tuple[Any, Any]:
    """Adaptive mixed-precision SVQR; ``(Q, R)`` with thin Q (see the module docstring)."""
    xp = backend.xp
    n = a.shape[-1]
    if mixed is None:
        mixed = prec_name in ("fp32", "fp32-emulated", "fp16")
    u = unit_roundoff(xp, a.dtype)
    # the Gram matrix is only as accurate as its GEMM engine
    eps = 2 * max(u, _PRECISION_U.get(prec_name, 0.0))
    eye = xp.eye(n, dtype=a.dtype, device=device(a))
    q, r = _one_pass(backend, a, gram(backend, a, precision, "svqr-gram"), mixed, 1, eps)
    prev = math.inf
    for it in range(2, MAX_PASSES + 1):
        g = gram(backend, q, precision, "svqr-gram")
        err = float(xp.max(xp.linalg.matrix_norm(g - eye, ord="fro")))  # one sync per pass
        # done at n u, or once a pass stops paying (passes converge quadratically
        # until the rounding floor of the Gram matrix itself)
        if err <= n * u:
            return q, r
        if err > prev / 4:
            return _checked(q, r, err, n, gram_roundoff(xp, a.dtype, prec_name))
        prev = err
        if not math.isfinite(err):
            break
        q, r2 = _one_pass(backend, q, g, mixed, it, eps)
        r = _rr(backend, r2, r, prec_name)
    else:
        record_event("svqr", f"svqr stopped after {MAX_PASSES} passes with "
                     f"||I - Q^H Q||_F = {err:.2e}", passes=MAX_PASSES)
        return _checked(q, r, err, n, gram_roundoff(xp, a.dtype, prec_name))
    raise BreakdownError(f"svqr did not reach orthogonality in {MAX_PASSES} passes "
                         "(non-finite input?)", method="svqr", cond_estimate=math.inf)
