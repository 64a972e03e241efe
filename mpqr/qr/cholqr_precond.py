"""Preconditioned Cholesky QR: CholQR's speed for ill-conditioned tall matrices.

CholQR2 squares the condition number in its Gram matrix and stops at
``cond(A) ~ u^(-1/2)``. This method keeps CholQR's passes and its certificate and
reaches ``cond(A) ~ u^(-1)``: it builds an upper-triangular preconditioner
``P = R_k ... R_1`` from the Gram matrices of ``W_j = A (R_j ... R_1)^-1`` until
``W = A P^-1`` is certified orthonormal to working accuracy, then finishes as
CholQR2's second pass does::

    G = W^H W,  ||G - I||_F <= 1/2  (the certificate),  R_c = chol(G),
    Q = A P^-1 R_c^-1,  R = R_c P.

Each ``R_j`` is the Cholesky factor of ``W_{j-1}``'s Gram matrix ``G``: plain
where its pivots say ``W_{j-1}`` is within CholQR's reach, else *shifted*,
``chol(G + s diag(G))`` with ``s = n u`` (raised by 16x until the factorization
succeeds). The shift bounds ``cond(W_j)`` by about ``sqrt(s) cond(W_{j-1})``
(Fukaya et al. 2020, with the shift relative to each column's norm so that
column scaling does not matter), so every shifted pass takes ``cond`` down by
about ``(n u)^(-1/2)`` — seven to eight decades in float64. At float64 and
``cond(A)`` up to ``~1e14`` this is one Gram pass more than CholQR2; up to
``~u^-1``, two.

Why not a random sketch (``R_s`` from ``qr(S A)``, Fan, Guo & Lin 2021; Higgins
et al. 2024): its ``W = A R_s^-1`` has ``cond(W) = O(1)``, not ``1 + O(u)``, so it
too needs two Gram passes after the sketch pass, and ``qr(method="auto")`` has
already spent one Gram pass on CholQR2's attempt, which the shifted factor reuses.
Why not TSQR's R: its tile kernels are compute-bound in float64 (2^24 x 32 on an
H100: 39 ms, against ~10 ms for CholQR2).

Under ``qr(method="auto")`` the chain continues CholQR2: from its Gram matrix where its
first Cholesky failed, from its first factor and second Gram matrix where only its
certificate failed (:func:`resume_chain`); no pass over A is repeated.

When ``u cond(A)`` is not small the matrix is numerically rank-deficient: its
QR factorization is not determined to working accuracy, and this method raises
:class:`mpqr.BreakdownError` (``qr(method="auto")`` falls back to Householder).
The estimate is ``cond(R D^-1)``, ``D`` the column norms (scaling columns does
not change what the factorization can resolve).

Stacks take the same products as one matrix (every pass over the whole stack); their
``n x n`` factorizations are chosen matrix by matrix.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from mpqr._array_api import array_namespace, device
from mpqr._errors import BreakdownError, LinAlgError
from mpqr.policy import fused_gemm, gemm, record_event
from mpqr.qr._kernels import ct, panel_precision
from mpqr.qr.cholqr import (
    _apply_inverse,
    _check_gram,
    _first_gram,
    _fusable,
    _inverse_by_gemm,
    _rr,
    _times_upper,
    gram_roundoff,
    inverse_and_cond,
    right_solve_upper,
)
from mpqr.qr.gram_blocked import gram

__all__ = ["MAX_GRAMS", "NAME", "RANK_DEFICIENT", "Chain", "Resume", "estimate_cond",
           "precondition", "preconditioned_cholqr", "resume_chain"]

NAME = "preconditioned-cholqr"

#: Gram passes before the method gives up: the last must be certified. Two shifted
#: passes and a plain one reach ``u^-1``; the rest is margin for a certificate missed
#: by a plain pass whose pivots underestimated ``cond``.
MAX_GRAMS = 6

#: ``u cond(R D^-1) >= RANK_DEFICIENT``: numerically rank-deficient (the smallest
#: singular value is within a rounding error of the data's largest)
RANK_DEFICIENT = 0.5

#: first shift, relative to ``n u diag(G)``, and its growth after a failed Cholesky
_SHIFT, _SHIFT_GROWTH, _SHIFT_TRIES = 1.0, 16.0, 8

#: a plain factor with pivot ratio at most this leaves a W whose next Gram matrix is
#: within 1/2 of I (CholQR's orthogonality error is ~ n u ratio^2)
_WELL = 16.0

#: up to this many columns the condition estimate is the singular values' ratio (one
#: LAPACK call; 2-core CPU, NumPy: 0.23 ms at 64 columns against 0.59 ms of power
#: iterations, 5.7 against 2.1 ms at 256), past it power iterations
_SVD_MAX_N = 64

#: power iterations of the condition estimate: on (R^H R)^-1 (two n x n triangular
#: solves each; close small singular values give a close estimate even unconverged),
#: and on R^H R (one n x n product each; its columns have unit norm, so
#: ||R||_2 lies in [1, sqrt(n)] and its top singular values are usually apart)
_COND_ITERS, _GROW_ITERS = 12, 6


@dataclass
class Chain:
    """The outcome of :func:`precondition`: ``R = rc @ factors[0] @ factors[1] ...``.

    Its rank test and the explain trace's ``route`` event are :meth:`verify`'s, which
    the caller runs once it has queued its pass for ``Q`` (the host's ``n x n`` work
    then overlaps the device's)."""

    sb: Any             #: the small backend the factors live in
    rc: Any             #: the certified pass's Cholesky factor
    factors: list[Any]  #: ``R_k, ..., R_1`` (last first)
    pre: Any            #: their product ``P``
    prec_name: str
    u: float            #: the Gram matrices' unit roundoff
    dist: float         #: the certificate ``||W^H W - I||_F``
    grams: int          #: Gram passes, the certified one included
    shifts: int         #: shifted factors among them
    where: str
    cond: float | None = None  #: estimated ``cond(x D^-1)``, once verified
    _r: Any = None

    @property
    def r(self) -> Any:
        """``R = R_c P``: the same products, in the same order, as ``rc @ factors[0] @
        factors[1] ...`` (``P`` was built factor by factor)."""
        if self._r is None:
            self._r = _rr(self.sb, self.rc, self.pre, self.prec_name)
        return self._r

    def verify(self) -> float:
        """The rank test on ``R_c P`` (:class:`mpqr.BreakdownError` where ``x`` is
        numerically rank-deficient) and the ``route`` event; the estimated cond."""
        if self.cond is None:
            sb, prec = self.sb, self.prec_name
            cond = _max(estimate_cond(sb, self.r, prec))
            if not cond * self.u < RANK_DEFICIENT:
                _rank_deficient(cond, self.u)
            record_event("route", f"{self.where}: certified after {self.grams} Gram passes "
                         f"({self.shifts} shifted; ||W^H W - I||_F = {self.dist:.1e} <= 0.5); "
                         f"estimated cond(x) = {cond:.2e} (columns scaled to unit norm)",
                         method=NAME, grams=self.grams, shifted=self.shifts,
                         cond_estimate=cond, certificate=self.dist)
            self.cond = cond
        return self.cond


def precondition(sb: Any, g: Any,
                 next_gram: Callable[[Any, Any, bool], Callable[[], tuple[Any, Any]]], *,
                 n: int, prec_name: str, where: str = NAME,
                 start: list[Any] | None = None) -> Chain:
    """The preconditioner of ``x`` from its Gram matrix ``g`` (small backend ``sb``):
    plain or shifted Cholesky factors until a Gram matrix is certified. The caller runs
    the returned chain's :meth:`Chain.verify` (rank test, ``route`` event).

    ``next_gram(R_j, P, final)`` queues the pass that forms the Gram matrix of the next
    ``W`` (``W_{j-1} R_j^-1``, i.e. ``x P^-1``) and returns a function that waits for it
    and returns ``(small backend, Gram matrix)`` (between the two, the host estimates
    ``cond(P)``); ``final``: ``R_j`` is a plain factor, so that ``W`` is expected to be
    certified (a caller that stores the certified ``W`` stores that one). The in-core
    method, the out-of-core and the Dask routes differ only there. ``start``: factors
    already applied (``R_k, ..., R_1``, last first; ``g`` is then the Gram matrix of
    ``x (R_k ... R_1)^-1``): CholQR2's, whose certificate failed. Raises
    :class:`mpqr.BreakdownError` (numerically rank-deficient, not finite, out of range,
    or no certificate after ``MAX_GRAMS``)."""
    u = gram_roundoff(sb.xp, g.dtype, prec_name)
    factors: list[Any] = list(start or [])
    pre = None
    for f in factors[::-1]:
        pre = f if pre is None else _rr(sb, f, pre, prec_name)
    shifts = 0
    # the last factors' pivot ratios (inf where shifted; a started chain's are not known,
    # so its first uncertified Gram matrix does not count as evidence of rank deficiency)
    ratio = sb.xp.asarray(math.inf, dtype=sb.xp.float64) if factors else None
    for k in range(len(factors), MAX_GRAMS):
        _check_gram(sb, g, NAME, prec_name)
        if k:
            xs = sb.xp
            dist = xs.linalg.matrix_norm(g - xs.eye(n, dtype=g.dtype, device=device(g)),
                                         ord="fro")
            worst = float(xs.max(dist))
            if worst <= 0.5:
                return _certified(sb, g, pre, factors, prec_name, u, worst, k + 1, shifts,
                                  where)
            if bool(xs.any((dist > 0.5) & (ratio <= _WELL))):
                # the last W was well-conditioned, so this one should have been orthonormal:
                # recomputed from x (fused), its small singular directions are rounding noise
                _rank_deficient(_max(estimate_cond(sb, pre, prec_name)), u,
                                "the preconditioned matrix does not become orthonormal")
        r, shift, ratio = _precondition(sb, g, u, n)
        shifts += shift > 0
        record_event("precondition", f"{where}: pass {k + 1}: " + (
            f"shifted Cholesky factor (shift {shift:.1e} diag(G)): its Gram matrix is "
            "beyond CholQR's reach" if shift else "plain Cholesky factor"),
            method=NAME, shift=shift, gram_pass=k + 1)
        factors.insert(0, r)
        pre = r if pre is None else _rr(sb, r, pre, prec_name)
        fetch = next_gram(r, pre, shift == 0)
        if k:  # cond(P) approaches cond(x) from below: stop as soon as it passes the limit
            cond = _max(estimate_cond(sb, pre, prec_name))
            if not cond * u < RANK_DEFICIENT:
                _rank_deficient(cond, u)
        sb, g = fetch()
    raise BreakdownError(
        f"{NAME} broke down: no certified Gram matrix after {MAX_GRAMS} passes "
        "(x is too ill-conditioned); use a Householder method or method='auto'",
        method=NAME, cond_estimate=math.inf)


def _certified(sb: Any, g: Any, pre: Any, factors: list[Any], prec_name: str, u: float,
               dist: float, grams: int, shifts: int, where: str) -> Chain:
    """The certified pass: ``R_c = chol(G)`` (the rank test is :meth:`Chain.verify`)."""
    try:
        rc = sb.cholesky(g, upper=True)
    except LinAlgError as exc:  # ||G - I||_F <= 1/2 is positive definite: not expected
        raise BreakdownError(f"{NAME} broke down: the certified Gram matrix did not "
                             f"factor ({exc})", method=NAME, cond_estimate=math.inf) from exc
    return Chain(sb, rc, factors, pre, prec_name, u, dist, grams, shifts, where)


@dataclass
class Resume:
    """A chain handed over by CholQR2 whose certificate failed: its factor(s), the Gram
    matrix of ``W = x R1^-1`` (small backend ``sb``), and that ``W`` where it was stored
    (None where it was not: formed in the solve's pass over ``x``)."""

    a: Any
    sb: Any
    g: Any
    factors: list[Any]  #: last first
    w: Any


_RESUME: contextvars.ContextVar[Resume | None] = contextvars.ContextVar(
    "mpqr_precond_resume", default=None)


@contextlib.contextmanager
def resume_chain(state: Resume) -> Iterator[None]:
    """Within the block, :func:`preconditioned_cholqr` of exactly ``state.a`` continues
    from ``state`` instead of starting from ``x``'s Gram matrix, once (traced):
    ``qr(method="auto")`` hands over a CholQR2 whose second Gram matrix was not
    certified (its passes are not paid again)."""
    token = _RESUME.set(state)
    try:
        yield
    finally:
        _RESUME.reset(token)


def _resumed(a: Any) -> Resume | None:
    state = _RESUME.get()
    if state is None or state.a is not a:
        return None
    _RESUME.set(None)  # once
    record_event("gram-reuse", f"{NAME}: continues from CholQR2's first factor and the "
                 "Gram matrix of x R1^-1 (its uncertified second pass): no pass over x "
                 "is repeated", method=NAME)
    return state


def preconditioned_cholqr(backend: Any, a: Any, *, precision: Any, prec_name: str,
                          want_q: bool = True, **_: Any) -> tuple[Any, Any]:
    """``(Q or None, R)`` of ``a`` (``(..., m, n)``, ``m >= n``) by preconditioned CholQR
    (module docstring); :class:`mpqr.BreakdownError` where ``a`` is numerically
    rank-deficient or holds NaN/Inf, or a column's squared norm leaves the range.

    Where the backend fuses the solve with its Gram product (2-D float64, at most
    ``backend.fused_gram_max_n`` columns) and the policy runs that product natively, each
    ``W = a P^-1`` comes from one pass over ``a`` that forms its Gram matrix, and is not
    stored; except, past ``backend.fused_cholqr_max_n`` columns, the ``W`` expected to be
    certified (after a plain factor), which the same pass writes out, so that
    ``Q = W R_c^-1`` is one GEMM instead of two solves from ``a``."""
    m, n = a.shape[-2:]
    fusable = _fusable_gram(backend, a)
    solve_twice = _fusable(backend, a)  # Q solved twice from a beats storing the last W
    w = a  # the last W stored (a: none yet); None where the last W was not stored
    start = None
    lim = backend.precondition_small_max

    def small(g: Any) -> tuple[Any, Any]:
        return backend.small(g) if lim is None else backend.small(g, limit=lim)

    state = _resumed(a)
    if state is not None:
        pair, start, w = (state.sb, state.g), state.factors, state.w
    else:
        pair = _first_gram(a, NAME)
        if pair is None:
            pair = small(gram(backend, a, precision, f"{NAME}-gram"))
    if pair[0] is backend and lim is not None:  # handed over where the backend keeps it
        pair = small(pair[1])
        if start is not None and pair[0] is not backend:
            start = [small(f)[1] for f in start]

    def next_gram(r: Any, pre: Any, final: bool) -> Callable[[], tuple[Any, Any]]:
        nonlocal w
        if fusable and fused_gemm(backend, a.dtype, (n, n, m), engine="native-fp64",
                                  precision=precision, label=f"{NAME}-gram"):
            out = None
            if final and not solve_twice:  # stored, its Gram matrix from the same pass
                out = backend.xp.empty(a.shape, dtype=a.dtype, device=device(a))
            w = out
            g = backend.right_solve_gram(a, backend.from_small(pre, a), out=out)
        else:
            if w is None:  # W = a P^-1 from a (the last W was not stored)
                w = right_solve_upper(backend, a, backend.from_small(pre, a), prec_name)
            else:
                w = _apply_inverse(backend, pair[0], w, r, NAME, prec_name)
            g = gram(backend, w, precision, f"{NAME}-gram")
        return lambda: small(g)

    c = precondition(*pair, next_gram, n=n, prec_name=prec_name, start=start)
    if not want_q:
        c.verify()
    q = None
    if want_q and w is None:
        record_event("fused-solve", f"{NAME}: the certified W = x P^-1 is not stored: its "
                     "Gram matrix was formed in the solve's pass over x, and Q = "
                     "(x P^-1) R^-1 is solved from x", method=NAME)
        q = backend.right_solve_twice(a, backend.from_small(c.pre, a),
                                      backend.from_small(c.rc, a))
    elif want_q and _inverse_by_gemm(backend, w, n):
        x, kappa = inverse_and_cond(c.sb, c.rc)
        record_event("apply-inverse", f"{NAME}: Q = W @ inv(R) by GEMM (certified "
                     f"pass: cond_2(R) <= sqrt(3); cond_1(R) = {kappa:.3g})", cond_1=kappa)
        q = _times_upper(backend, w, backend.from_small(x, w), f"{NAME}-apply-inverse",
                         panel_precision(prec_name, w.dtype, backend.xp))
    elif want_q:
        q = _apply_inverse(backend, c.sb, w, c.rc, NAME, prec_name)
    c.verify()  # Q's pass is queued: the rank test runs beside it
    return q, backend.from_small(c.r, a)


def _fusable_gram(backend: Any, a: Any) -> bool:
    max_n = backend.fused_gram_max_n
    return (max_n is not None and a.ndim == 2 and a.dtype == backend.xp.float64
            and 0 < a.shape[1] <= max_n)


def _max(v: Any) -> float:
    return float(array_namespace(v).max(v))


def _rank_deficient(cond: float, u: float, why: str = "", name: str = NAME) -> None:
    """Raise the refusal of ``name`` (the method that found it) for a numerically
    rank-deficient x."""
    limit = RANK_DEFICIENT / u
    raise BreakdownError(
        f"{name} broke down: x is numerically rank-deficient (estimated cond(x) "
        f"{'= ' if cond >= limit else '>= '}{cond:.2e} with its columns scaled to unit "
        f"norm; {RANK_DEFICIENT:g}/u = {limit:.1e}{'; ' + why if why else ''}): its QR "
        "factorization is not determined to working accuracy; use a Householder method "
        "or method='auto'", method=name, cond_estimate=cond)


def _precondition(sb: Any, g: Any, u: float, n: int) -> tuple[Any, float, Any]:
    """``(R, s, ratio)`` for a Gram matrix or a stack of them: per matrix, the plain
    Cholesky factor where its pivots, relative to the column norms, put the matrix within
    CholQR's reach (``ratio``: the pivots' largest over smallest), else the factor of
    ``g + s diag(g)`` (``ratio = inf``); ``s``: the largest shift used (0: none)."""
    xs = sb.xp
    if g.ndim == 2:
        r, s, ratio = _precondition_one(sb, g, u, n)
        return r, s, xs.asarray(ratio, dtype=xs.float64)
    *batch, _, _ = g.shape
    flat = xs.reshape(g, (-1, n, n))
    out = [_precondition_one(sb, flat[i, ...], u, n) for i in range(flat.shape[0])]
    r = xs.reshape(xs.stack([o[0] for o in out]), g.shape)
    ratio = xs.reshape(xs.asarray([o[2] for o in out], dtype=xs.float64), tuple(batch))
    return r, max(o[1] for o in out), ratio


def _precondition_one(sb: Any, g: Any, u: float, n: int) -> tuple[Any, float, float]:
    xs = sb.xp
    d2 = xs.real(xs.linalg.diagonal(g))
    try:
        r = sb.cholesky(g, upper=True)
        rel = xs.abs(xs.linalg.diagonal(r)) / xs.sqrt(d2)
        lo, hi = float(xs.min(rel)), float(xs.max(rel))
        if math.isfinite(hi) and lo > 0 and (hi / lo) ** 2 * u * n < 1:
            return r, 0.0, hi / lo
    except LinAlgError:
        pass
    eye = xs.eye(n, dtype=g.dtype, device=device(g))
    s = _SHIFT * n * u
    for _ in range(_SHIFT_TRIES):
        try:
            return sb.cholesky(g + eye * xs.astype(s * d2, g.dtype), upper=True), s, math.inf
        except LinAlgError:
            s *= _SHIFT_GROWTH
    raise BreakdownError(f"{NAME} broke down: even the shifted Gram matrix did not factor "
                         f"(shift {s:.1e} diag(G))", method=NAME, cond_estimate=math.inf)


def estimate_cond(sb: Any, r: Any, prec_name: str = "auto") -> Any:
    """2-norm condition number of upper-triangular ``r`` (or of each of a stack) with its
    columns scaled to unit norm: from its singular values up to ``_SVD_MAX_N`` columns,
    else by power iteration on ``R^H R`` and on its inverse (two triangular solves per
    step: a lower bound, within a few percent where the extreme singular values are
    separated); ``inf`` for a zero or non-finite diagonal. Returns a float64 array of
    the stack's shape."""
    xs = sb.xp
    n = r.shape[-1]
    norms = xs.sqrt(xs.sum(xs.abs(r) ** 2, axis=-2))  # (..., n)
    dr = xs.abs(xs.linalg.diagonal(r))
    bad = ~(xs.all(xs.isfinite(norms), axis=-1) & xs.all(dr > 0, axis=-1))
    if bool(xs.any(bad)):
        return xs.full(bad.shape, math.inf, dtype=xs.float64, device=device(r))
    rn = r / xs.expand_dims(norms, axis=-2)
    if n <= _SVD_MAX_N:
        sv = sb.svdvals(rn)
        lo = sv[..., -1]
        est = sv[..., 0] / xs.where(lo > 0, lo, xs.ones_like(lo))
        return xs.astype(xs.where((lo > 0) & xs.isfinite(est), est,
                                  xs.asarray(math.inf, dtype=est.dtype)), xs.float64)
    k = xs.arange(n, dtype=xs.float64, device=device(r))
    v0 = xs.reshape(xs.astype((1 + k / n) * (1 - 2 * (k % 2)), r.dtype), (n, 1))
    v0 = xs.zeros((*r.shape[:-2], n, 1), dtype=r.dtype, device=device(r)) + v0
    prec = panel_precision(prec_name, r.dtype, xs)

    def power(step: Any, iters: int) -> Any:
        v, lam = v0, None
        for _ in range(iters):
            nv = xs.linalg.matrix_norm(v, ord="fro")
            v = v / xs.reshape(nv, (*nv.shape, 1, 1))
            v = step(v)
            lam = xs.linalg.matrix_norm(v, ord="fro")
        return lam

    # ||R D^-1||_2^2 from its (n x n) Gram matrix, one product through the policy
    m = gemm(ct(xs, rn), rn, precision=prec, label="cond-estimate", backend=sb)

    def grow(v: Any) -> Any:
        return gemm(m, v, precision=prec, label="cond-estimate", backend=sb)

    def shrink(v: Any) -> Any:
        return sb.solve_triangular(rn, sb.solve_triangular(ct(xs, rn), v, lower=True),
                                   lower=False)

    est = xs.sqrt(power(grow, _GROW_ITERS) * power(shrink, _COND_ITERS))
    return xs.where(xs.isfinite(est), est, xs.asarray(math.inf, dtype=est.dtype))
