"""The sketch route as it was before this round's changes (A/B baseline of sketch_gpu.py).

A copy of ``mpqr/qr/sketch.py``'s ``sketch_cholqr`` of 2026-11-28 (third round): the rank
test's condition estimate of R = R1 R0 on the host after Q (on the critical path), R1 R0
formed on the host, no prefetched sketch. The probe pairs it with the halving order of
the blocked substitution (``cholqr.LEFT_LOOKING = False``) and no prefetch.
"""

from __future__ import annotations

from typing import Any

from mpqr._array_api import device
from mpqr._errors import BreakdownError, LinAlgError
from mpqr.policy import record_event
from mpqr.qr._kernels import panel_precision
from mpqr.qr.cholqr import (
    _apply_inverse,
    _check_gram,
    _inverse_by_gemm,
    _rr,
    _times_upper,
    gram_roundoff,
    right_solve_upper_gram,
)
from mpqr.qr.cholqr_precond import (
    RANK_DEFICIENT,
    Resume,
    estimate_cond,
    preconditioned_cholqr,
    resume_chain,
)
from mpqr.qr.cholqr_precond import (
    _rank_deficient as _refuse,
)

__all__ = ["NAME", "ONE_PASS_COND", "SEED", "SKETCH_ROWS", "sketch_cholqr"]

NAME = "sketch-cholqr"

#: sketch rows per column: CountSketch embeds an n-dimensional range with distortion
#: ~ sqrt(n / k) for incoherent ranges; where it does not, the chain's extra pass does
SKETCH_ROWS = 4

#: largest estimated ``cond(W D^-1)`` for which one CholQR pass is accepted: its
#: orthogonality error ``~ n u cond^2`` stays within 16 n u
ONE_PASS_COND = 4.0

#: the hash seed (fixed: results are reproducible)
SEED = 0x5EED


def sketch_cholqr(backend: Any, a: Any, *, precision: Any, prec_name: str,
                  want_q: bool = True, **kw: Any) -> tuple[Any, Any]:
    """``(Q or None, R)`` of ``a`` (``(..., m, n)``, ``m >= n``) by sketch-preconditioned
    CholQR (module docstring); :class:`mpqr.BreakdownError` where ``a`` is numerically
    rank-deficient or not finite."""
    m, n = a.shape[-2:]
    k = SKETCH_ROWS * n
    y = backend.sketch_rows(a, k, SEED) if a.ndim == 2 and m >= 2 * k else None
    if y is None:
        record_event("route", f"{NAME}: no sketch here (a stack, fewer than "
                     f"{2 * SKETCH_ROWS} n rows, or a backend without a scatter-add): "
                     "preconditioned-cholqr", method=NAME)
        return preconditioned_cholqr(backend, a, precision=precision, prec_name=prec_name,
                                     want_q=want_q, **kw)
    sb, ys = backend.small(y)
    if not sb.all_finite(ys):
        raise BreakdownError(f"{NAME} broke down: x holds NaN or Inf", method=NAME,
                             cond_estimate=float("inf"))
    _, r0 = sb.library_qr(ys, "r")
    xs = sb.xp
    d0 = xs.abs(xs.linalg.diagonal(r0))
    if not (bool(xs.all(d0 > 0)) and sb.all_finite(r0)):
        _rank_deficient(float("inf"), gram_roundoff(xs, ys.dtype, prec_name),
                        "the sketch's R has a zero or non-finite pivot")
    # rows scaled by the pivots' conjugate phases: R = R_1 R_0 has a positive diagonal
    dr = xs.linalg.diagonal(r0)
    r0 = r0 * xs.expand_dims(xs.conj(dr) / xs.astype(d0, dr.dtype), axis=-1)
    # W = x R_0^-1 (substitution; the off-diagonal blocks through the policy) and its Gram
    # matrix, in the solve's pass where the backend fuses them
    r0d = backend.from_small(r0, a)
    w, g = right_solve_upper_gram(backend, a, r0d, precision, prec_name, f"{NAME}-gram",
                                  store=want_q)
    # the n x n steps where the preconditioned method runs them (host up to its limit)
    lim = backend.precondition_small_max
    sb, g = backend.small(g) if lim is None else backend.small(g, limit=lim)
    r0 = _to(backend, sb, r0d)
    u = gram_roundoff(sb.xp, g.dtype, prec_name)
    cond_w = float("inf")
    r1 = None
    try:
        _check_gram(sb, g, NAME, prec_name)
        r1 = sb.cholesky(g, upper=True)
    except (LinAlgError, BreakdownError):
        r1 = None
    q = None
    if r1 is not None:
        if want_q and _inverse_by_gemm(backend, w, n):
            # queued before the estimate below (which then runs beside it) and kept only
            # where the estimate accepts the pass: cond_2(R_1 D^-1) <= ONE_PASS_COND bounds
            # the GEMM's backward error by that factor times substitution's
            # X = R_1^-1 by substitution on I where W lives (the host's took 4 ms at 256
            # columns on an H200's host, on the critical path)
            xp = backend.xp
            x = backend.right_solve_upper(xp.eye(n, dtype=w.dtype, device=device(w)),
                                          backend.from_small(r1, w))
            q = _times_upper(backend, w, x, f"{NAME}-apply-inverse",
                             panel_precision(prec_name, w.dtype, xp))
        cond_w = float(sb.xp.max(estimate_cond(sb, r1, prec_name)))
    if r1 is None or not cond_w <= ONE_PASS_COND:
        del q
        record_event("route", f"{NAME}: estimated cond(x R0^-1) = {cond_w:.2e} > "
                     f"{ONE_PASS_COND:g}: the preconditioned chain continues from R0 and "
                     "its Gram matrix", method=NAME, cond_sketched=cond_w)
        state = Resume(a, sb, g, [r0], w)
        with resume_chain(state):
            return preconditioned_cholqr(backend, a, precision=precision,
                                         prec_name=prec_name, want_q=want_q, **kw)
    if q is not None:
        record_event("apply-inverse", f"{NAME}: Q = W @ inv(R1) by GEMM (estimated "
                     f"cond_2(R1 D^-1) = {cond_w:.2f} <= {ONE_PASS_COND:g})",
                     cond_sketched=cond_w)
    elif want_q:
        q = _apply_inverse(backend, sb, w, r1, NAME, prec_name)
    r = _rr(sb, r1, r0, prec_name)
    cond = float(sb.xp.max(estimate_cond(sb, r, prec_name)))
    if not cond * u < RANK_DEFICIENT:
        _rank_deficient(cond, u)
    record_event("route", f"{NAME}: CountSketch ({k} x {m}) preconditioner, one CholQR "
                 f"pass (estimated cond(x R0^-1) = {cond_w:.2f} <= {ONE_PASS_COND:g}); "
                 f"estimated cond(x) = {cond:.2e} (columns scaled to unit norm)",
                 method=NAME, cond_sketched=cond_w, cond_estimate=cond, grams=1)
    return q, backend.from_small(r, a)


def _to(backend: Any, sb: Any, x: Any) -> Any:
    """``x`` (on ``backend``'s device) in the small backend ``sb``'s namespace."""
    if sb is backend:
        return x
    return backend.small(x, limit=x.size)[1]


def _rank_deficient(cond: float, u: float, why: str = "") -> None:
    _refuse(cond, u, why, NAME)
