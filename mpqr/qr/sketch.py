"""Randomized (sketch-preconditioned) Cholesky QR for ill-conditioned tall matrices.

One pass over ``x`` forms a CountSketch ``Y = S x`` (``k = SKETCH_ROWS n`` rows,
``backend.sketch_rows``); ``R_0`` is the Householder ``R`` of the small ``Y``. Then
``W = x R_0^-1`` has ``cond(W) = O(1)`` whatever ``cond(x)`` below ``~u^-1`` (Fan, Guo
& Lin 2021; Higgins et al. 2024; Garrison, Chen & Ipsen 2026), so one CholQR pass on
``W`` gives ``Q`` orthonormal to ``O(n u cond(W)^2)``::

    G = W^H W,  R_1 = chol(G),  Q = W R_1^-1,  R = R_1 R_0.

``W`` and ``G`` come from one pass over ``x`` where the backend fuses the substitution
with the Gram product (:func:`mpqr.qr.cholqr.right_solve_upper_gram`: CuPy, float64, up
to 64 columns). That single pass is
accepted where the estimated ``cond(W D^-1)`` (``D``: ``W``'s column norms; CholQR's error
depends on the scaled condition number) is at most :data:`ONE_PASS_COND`; else the chain
of :mod:`mpqr.qr.cholqr_precond` continues from ``R_0`` and ``G`` (no pass repeated)
until its certificate holds. An accepted pass forms ``Q = W X`` with ``X = R_1^-1`` (made
by substitution) by GEMM: ``|fl(W X) R_1 - W| <= ~2 gamma_n |W||X||R_1|`` is, column-scaled,
``cond(R_1 D^-1) <= ONE_PASS_COND`` times substitution's bound, and ``W``'s own backward
error (``x - W R_0``, by row-wise substitution) does not depend on ``cond(x)``. ``R_0^-1``
is never formed: that product's error would grow with ``cond(x)`` (nor are the inverses
of its diagonal blocks: they are ill-conditioned too, so the blocked substitution keeps
substituting its leaves). The rank test is the preconditioned method's, on ``R_0``:
``u cond(R_0 D_0^-1) >= 1/2`` raises :class:`mpqr.BreakdownError` (``qr(method="auto")``
then falls back to Householder), so a numerically rank-deficient ``x`` is never factored
silently wrong. ``R_0 D_0^-1`` has ``x``'s scaled condition number within the sketch's
distortion and ``R``'s within ``cond(R_1)^2``; it is estimated on the host while the
device forms ``W`` and ``G``. Column scaling does not matter: ``S`` is linear and no
Gram matrix of ``x`` itself is formed. Under ``qr(method="auto")`` CholQR2 may queue the
sketch and its ``R`` ahead (:func:`prefetch_sketch`) while the host decides to hand over.

Stacks, backends without ``sketch_rows`` and matrices with fewer than ``2 k`` rows take
the preconditioned method (traced).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

from mpqr._array_api import array_namespace, device
from mpqr._errors import BreakdownError, LinAlgError
from mpqr.policy import record_event
from mpqr.qr._kernels import panel_precision
from mpqr.qr.cholqr import (
    _apply_inverse,
    _check_gram,
    _gram_min,
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
from mpqr.qr.cholqr_steps import StepNumbers, passes

__all__ = ["NAME", "ONE_PASS_COND", "SEED", "SKETCH_ROWS", "prefetch_sketch", "sketch_ahead",
           "sketch_cholqr"]

NAME = "sketch-cholqr"

#: sketch rows per column: CountSketch embeds an n-dimensional range with distortion
#: ~ sqrt(n / k) for incoherent ranges; where it does not, the chain's extra pass does
SKETCH_ROWS = 4

#: largest estimated ``cond(W D^-1)`` for which one CholQR pass is accepted: its
#: orthogonality error ``~ n u cond^2`` stays within 16 n u
ONE_PASS_COND = 4.0

#: the hash seed (fixed: results are reproducible)
SEED = 0x5EED

#: where ``W`` and ``G`` come from one fused pass (one leaf), whether ``W`` is left
#: unstored and an accepted pass forms ``Q = (x R_0^-1) R_1^-1`` from ``x`` by two row-wise
#: substitutions in one pass (``backend.right_solve_twice``, its intermediate rows rounded
#: as the fused pass rounded the ``W`` whose Gram matrix gave ``R_1``) instead of writing
#: ``W`` and then ``Q = W R_1^-1`` by GEMM. Off: on an H200 at 2^22 x 64 the two-solve pass
#: took 4.3 ms against the stored pass's extra 0.9 ms and the GEMM's 1.2 (``auto`` 11.3 ms
#: against 9.3; ``bench/probes/sketch_gpu.py``)
Q_BY_TWO_SOLVES = False

#: whether ``R_1 = chol(W^H W)`` and ``X = R_1^-1`` come from the backend's n x n steps on
#: the device (``backend.chol_steps``) where it has them, instead of ``G``'s round trip to
#: the host's Cholesky (H200, 2^20 x 256 float64 ``auto`` at cond 1e12 / 1e15: with the
#: device's CholQR2 steps, 16.7 / 16.9 ms, 3.6x cuSOLVER; ``python -m mpqr bench qr
#: --shapes 1048576x256 --conds 1,1e8,1e12,1e15``)
DEVICE_FACTOR = True

#: ``[x, S x, R of S x]`` of the :func:`sketch_ahead` block (``[None] * 3`` before a
#: prefetch)
_AHEAD: contextvars.ContextVar[list[Any] | None] = contextvars.ContextVar(
    "mpqr_sketch_ahead", default=None)


@contextlib.contextmanager
def sketch_ahead() -> Iterator[None]:
    """Within the block, :func:`prefetch_sketch` keeps the sketch it queues and the
    first :func:`sketch_cholqr` of exactly that array object takes it instead of
    sketching again (``qr(method="auto")``: CholQR2 queues it where it is likely to
    hand over, before the host's steps that decide)."""
    token = _AHEAD.set([None] * 3)
    try:
        yield
    finally:
        _AHEAD.reset(token)


def prefetch_sketch(backend: Any, a: Any) -> None:
    """Queue ``a``'s sketch and its Householder R (as :func:`sketch_cholqr` forms them,
    on ``backend``'s device, no host sync) inside a :func:`sketch_ahead` block, where
    ``a`` is one the route sketches; else nothing."""
    hold = _AHEAD.get()
    m, n = a.shape[-2:]
    if hold is None or hold[0] is not None or a.ndim != 2 or m < 2 * SKETCH_ROWS * n:
        return
    y = backend.sketch_rows(a, SKETCH_ROWS * n, SEED)
    hold[:] = [a, y, backend.library_qr(y, "r")[1]]


def _sketch(backend: Any, a: Any, k: int) -> tuple[Any, Any]:
    """``(S a, its R or None)`` (``k`` rows): the prefetched ones where they are ``a``'s,
    else the sketch formed now."""
    hold = _AHEAD.get()
    if hold is not None and hold[0] is a:
        y, r0 = hold[1], hold[2]
        hold[:] = [None] * 3  # once
        record_event("sketch", f"{NAME}: the sketch and its R queued during CholQR2's "
                     "first pass are used (formed while the host decided the hand-over)",
                     method=NAME)
        return y, r0
    return backend.sketch_rows(a, k, SEED), None


def sketch_cholqr(backend: Any, a: Any, *, precision: Any, prec_name: str,
                  want_q: bool = True, **kw: Any) -> tuple[Any, Any]:
    """``(Q or None, R)`` of ``a`` (``(..., m, n)``, ``m >= n``) by sketch-preconditioned
    CholQR (module docstring); :class:`mpqr.BreakdownError` where ``a`` is numerically
    rank-deficient or not finite."""
    m, n = a.shape[-2:]
    k = SKETCH_ROWS * n
    y, r0 = _sketch(backend, a, k) if a.ndim == 2 and m >= 2 * k else (None, None)
    if y is None:
        record_event("route", f"{NAME}: no sketch here (a stack, fewer than "
                     f"{2 * SKETCH_ROWS} n rows, or a backend without a scatter-add): "
                     "preconditioned-cholqr", method=NAME)
        return preconditioned_cholqr(backend, a, precision=precision, prec_name=prec_name,
                                     want_q=want_q, **kw)
    # the small QR where the backend's small steps run (the device's, where prefetched)
    sb, ys = backend.small(y) if r0 is None else (backend, y)
    if not sb.all_finite(ys):
        raise BreakdownError(f"{NAME} broke down: x holds NaN or Inf", method=NAME,
                             cond_estimate=float("inf"))
    if r0 is None:
        _, r0 = sb.library_qr(ys, "r")
    xs = sb.xp
    d0 = xs.abs(xs.linalg.diagonal(r0))
    if not (bool(xs.all(d0 > 0)) and sb.all_finite(r0)):
        _rank_deficient(float("inf"), gram_roundoff(xs, ys.dtype, prec_name),
                        "the sketch's R has a zero or non-finite pivot")
    # rows scaled by the pivots' conjugate phases: R = R_1 R_0 has a positive diagonal
    dr = xs.linalg.diagonal(r0)
    r0 = r0 * xs.expand_dims(xs.conj(dr) / xs.astype(d0, dr.dtype), axis=-1)
    r0d = backend.from_small(r0, a)
    # R_0 where the n x n steps run (the host up to the preconditioned method's limit),
    # moved before the device's passes are queued (a transfer waits for the stream)
    lim = backend.precondition_small_max
    hb, r0s = backend.small(r0d) if lim is None else backend.small(r0d, limit=lim)
    # W = x R_0^-1 (substitution; the off-diagonal blocks through the policy) and its Gram
    # matrix, in the solve's pass where the backend fuses them; queued, not waited for
    w, g = right_solve_upper_gram(backend, a, r0d, precision, prec_name, f"{NAME}-gram",
                                  store=want_q and not Q_BY_TWO_SOLVES)
    twice = want_q and w is None  # one fused pass that did not write W
    # the rank test, made while the device forms W and G: the scaled cond(R_0 D_0^-1) is
    # that of x within the sketch's distortion, and R = R_1 R_0's within cond(R_1)^2
    # (<= ONE_PASS_COND^2 where the pass is accepted; else the chain tests its own R)
    u = gram_roundoff(hb.xp, r0s.dtype, prec_name)
    cond = float(hb.xp.max(estimate_cond(hb, r0s, prec_name)))
    if not cond * u < RANK_DEFICIENT:
        _rank_deficient(cond, u)
    # R_1 = chol(G) and X = R_1^-1: on the device without a host sync where the backend
    # makes them there (then only R_1 moves to the host, for the estimate below), else
    # where the preconditioned method runs its n x n steps (the host up to its limit)
    r1d, x = (_device_factor(backend, g, prec_name) if DEVICE_FACTOR and not twice
              else (None, None))
    on_device = r1d is not None
    cond_w = float("inf")
    r1 = None
    if on_device:  # G moves only where the chain below continues from it
        sb, r1 = backend.small(r1d) if lim is None else backend.small(r1d, limit=lim)
    else:
        sb, g = backend.small(g) if lim is None else backend.small(g, limit=lim)
        try:
            _check_gram(sb, g, NAME, prec_name)
            r1 = sb.cholesky(g, upper=True)
        except (LinAlgError, BreakdownError):
            r1 = None
    r0 = r0s if array_namespace(r0s) is sb.xp else _to(backend, sb, r0d)
    q = r = None
    if r1 is not None:
        r1d = backend.from_small(r1, a) if r1d is None else r1d
        if twice:
            q = backend.right_solve_twice(a, r0d, r1d)
        elif want_q and _inverse_by_gemm(backend, w, n):
            # queued before the estimate below (which then runs beside it) and kept only
            # where the estimate accepts the pass: cond_2(R_1 D^-1) <= ONE_PASS_COND bounds
            # the GEMM's backward error by that factor times substitution's
            # X = R_1^-1 by substitution on I where W lives (the host's took 4 ms at 256
            # columns on an H200's host, on the critical path)
            xp = backend.xp
            if x is None:
                x = backend.right_solve_upper(xp.eye(n, dtype=w.dtype, device=device(w)),
                                              r1d)
            q = _times_upper(backend, w, x, f"{NAME}-apply-inverse",
                             panel_precision(prec_name, w.dtype, xp))
        # R = R_1 R_0 where the factors' products run (queued on a device, no host copy)
        r = _rr(backend, r1d, r0d, prec_name)
        cond_w = float(sb.xp.max(estimate_cond(sb, r1, prec_name)))
    if r1 is None or not cond_w <= ONE_PASS_COND:
        del q, r
        record_event("route", f"{NAME}: estimated cond(x R0^-1) = {cond_w:.2e} > "
                     f"{ONE_PASS_COND:g}: the preconditioned chain continues from R0 and "
                     "its Gram matrix", method=NAME, cond_sketched=cond_w)
        state = Resume(a, sb, _to(backend, sb, g) if on_device else g, [r0], w)
        with resume_chain(state):
            return preconditioned_cholqr(backend, a, precision=precision,
                                         prec_name=prec_name, want_q=want_q, **kw)
    if twice:
        record_event("fused-solve", f"{NAME}: W = x R0^-1 is not stored: its Gram matrix "
                     "came from the solve's pass, and Q = (x R0^-1) R1^-1 is solved from x "
                     "(two passes over x fewer)", method=NAME)
    elif q is not None:
        record_event("apply-inverse", f"{NAME}: Q = W @ inv(R1) by GEMM (estimated "
                     f"cond_2(R1 D^-1) = {cond_w:.2f} <= {ONE_PASS_COND:g})",
                     cond_sketched=cond_w)
    elif want_q:
        q = _apply_inverse(backend, sb, w, r1, NAME, prec_name)
    record_event("route", f"{NAME}: CountSketch ({k} x {m}) preconditioner, one CholQR "
                 f"pass (estimated cond(x R0^-1) = {cond_w:.2f} <= {ONE_PASS_COND:g}); "
                 f"estimated cond(x) = {cond:.2e} (columns scaled to unit norm; from the "
                 "sketch's R0)", method=NAME, cond_sketched=cond_w, cond_estimate=cond,
                 grams=1)
    return q, r


def _device_factor(backend: Any, g: Any, prec_name: str) -> tuple[Any, Any]:
    """``(R_1, X = R_1^-1)`` of ``W``'s Gram matrix ``g`` from the backend's n x n steps
    on the device (``backend.chol_steps``: one read-back of their numbers, no transfer
    of ``G`` and the factor's round trip), or ``(None, None)`` where the backend has
    none for ``g`` or a check fails (the host's steps then decide, as before)."""
    steps = backend.chol_steps(g)
    if steps is None:
        return None, None
    r1, x, st = steps
    xp = backend.xp
    if not passes(StepNumbers.from_host(backend.small(st)[1]),
                  u=gram_roundoff(xp, g.dtype, prec_name), n=g.shape[-1],
                  gram_min=_gram_min(xp, g, prec_name), certified=False):
        return None, None
    return r1, x


def _to(backend: Any, sb: Any, x: Any) -> Any:
    """``x`` (on ``backend``'s device) in the small backend ``sb``'s namespace."""
    if sb is backend:
        return x
    return backend.small(x, limit=x.size)[1]


def _rank_deficient(cond: float, u: float, why: str = "") -> None:
    _refuse(cond, u, why, NAME)
