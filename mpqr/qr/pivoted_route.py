"""Which route ``qr(pivoting=...)`` takes (:func:`qr_pivoted`): the pivot rules of
:mod:`mpqr.qr.pivoted` (column-norm pivoting, HQRRP), LAPACK ``geqp3``'s order where the
backend has it, else (``backend.qrcp_exact_route``) the greedy order from pivoted
Cholesky of the Gram matrix (:mod:`mpqr.qr.pivoted_gram`, the default), the blocked QRCP
in the greedy order of :mod:`mpqr.qr.pivoted_exact` or HQRRP's order repaired by
adjacent column exchanges (:mod:`mpqr.qr.pivoted_repair`); the Gram and repair routes
fall back to the blocked QRCP where the exchanges pass their bound. Each is followed by
the pass that makes ``abs(diag(R))`` non-increasing exactly (except
``pivoting="randomized"``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mpqr.policy import record_event
from mpqr.qr import pivoted
from mpqr.qr._kernels import times_pow2, unit_shift
from mpqr.qr.pivoted_exact import blocked_qrcp, monotone_diagonal, unit_roundoff
from mpqr.qr.pivoted_gram import gram_qrcp, take_columns
from mpqr.qr.pivoted_repair import repair_diagonal

__all__ = ["qr_pivoted"]


def qr_pivoted(backend: Any, a: Any, *, factor: Callable[[Any], tuple[Any, Any]],
               precision: Any, prec_name: str, want_q: bool, complete: bool,
               max_rank: int | None = None, rtol: float | None = None,
               ordering: str = "greedy") -> tuple[Any | None, Any, Any]:
    """``(Q or None, R, P)`` with ``a[..., :, P] = Q R`` for a non-empty stack ``a``.

    ``factor(ap)`` is the unpivoted QR (sign-normalised ``(Q or None, R)``) used by the
    deterministic route. ``P`` is int32 ``(..., n)``. With ``max_rank``/``rtol``
    (2-D ``a``): ``Q`` is ``(m, k)`` and ``R`` ``(k, n)`` for the kept ``k``.
    ``ordering="greedy"``: ``|R_{k+1,k+1}| <= |R_kk|`` for every ``k``, exactly, in
    ``geqp3``'s greedy order (library, deterministic and blocked routes; the Gram route
    up to near-ties, :mod:`mpqr.qr.pivoted_gram`) or in HQRRP's order repaired by
    column exchanges (the repair route: not necessarily ``geqp3``'s ``P``);
    ``"randomized"``: :func:`~mpqr.qr.pivoted.hqrrp` as it
    comes (rank-revealing, the diagonal not monotone).

    A matrix whose largest magnitude lies beyond ``2**±SAFE_EXPONENT`` (its column norms'
    squares would overflow or lose their digits) is factored at unit
    scale (times a power of two: exact) and ``R`` scaled back; ``Q``, ``P`` and the rank
    decisions do not depend on the scale.
    """
    shift = unit_shift(backend, a)
    q, r, p = _qr_pivoted(backend, times_pow2(backend, a, shift), factor=factor,
                          precision=precision, prec_name=prec_name, want_q=want_q,
                          complete=complete, max_rank=max_rank, rtol=rtol,
                          ordering=ordering)
    return q, times_pow2(backend, r, -shift), p


def _qr_pivoted(backend: Any, a: Any, *, factor: Callable[[Any], tuple[Any, Any]],
                precision: Any, prec_name: str, want_q: bool, complete: bool,
                max_rank: int | None, rtol: float | None,
                ordering: str) -> tuple[Any | None, Any, Any]:
    """:func:`qr_pivoted` on a matrix in range: the route and its ordering."""
    xp = backend.xp
    *batch, m, n = a.shape
    kmax = min(m, n) if max_rank is None else min(m, n, max_rank)
    u = unit_roundoff(prec_name, a.dtype, xp)
    if batch or m * n <= pivoted.DETERMINISTIC_MAX_SIZE:
        record_event("method", f"qr(pivoting=True): column-norm pivoting (deterministic) on "
                     f"{'a stack of ' if batch else ''}{m}x{n}, then the unpivoted QR of the "
                     "permuted matrix", method="qrcp-deterministic", shape=(m, n))
        with backend.ignore_fp_warnings():  # NaN/Inf input: IEEE results, no warnings
            p = pivoted.deterministic_pivots(backend, a, kmax)
        return _factor_in_order(backend, a, p, factor, kmax, max_rank, rtol, u)
    if ordering != "randomized" and getattr(backend, "qrcp_library", False):
        record_event("method", f"qr(pivoting=True): the array library's QRCP (LAPACK geqp3) "
                     f"orders {m}x{n}, then the unpivoted QR of the permuted matrix",
                     method="qrcp-library", shape=(m, n))
        with backend.ignore_fp_warnings():
            p = backend.qrcp_order(a, kmax)
        return _factor_in_order(backend, a, p, factor, kmax, max_rank, rtol, u)
    block = backend.qrcp_block or pivoted.BLOCK
    if ordering == "randomized":
        record_event("method", f"qr(pivoting='randomized'): blocked randomized QRCP (HQRRP) "
                     f"on {m}x{n}, blocks of {block}, sketch of {block + pivoted.OVERSAMPLE} rows",
                     method="hqrrp", shape=(m, n), block=block)
        with backend.ignore_fp_warnings():
            return pivoted.hqrrp(backend, a, precision=precision, prec_name=prec_name,
                         want_q=want_q, complete=complete, max_rank=max_rank, rtol=rtol)
    exact_route = getattr(backend, "qrcp_exact_route", "blocked")
    if exact_route == "gram" and backend.all_finite(a):
        record_event("method", f"qr(pivoting=True): greedy order from pivoted Cholesky of "
                     f"the Gram matrix of {m}x{n}, the unresolved trailing columns ordered "
                     "again from their own Gram matrix, then adjacent column exchanges "
                     "until |diag(R)| is non-increasing", method="qrcp-gram", shape=(m, n))
        with backend.ignore_fp_warnings():
            q, r, p, info = gram_qrcp(
                backend, a, factor=factor, prec_name=prec_name, precision=precision,
                want_q=want_q, householder=getattr(factor, "householder", False)
                and not complete)
            out = repair_diagonal(backend, q, r, p, u=u)
        if out is not None:
            q, r, p, swaps = out
            record_event("pivot", f"qr(pivoting=True): {info['levels']} Gram level(s) "
                         f"resolving {info['resolved']} columns, {info['narrow']} ordered "
                         f"column by column, {swaps} exchange(s)", swaps=swaps,
                         levels=info["levels"])
            if max_rank is None and rtol is None:
                return q, r, p
            k = pivoted.truncation_rank(xp, r, kmax, rtol)
            return (None if q is None else q[:, :k]), r[:k, :], p
        record_event("method", "qr(pivoting=True): the Gram order needed more column "
                     "exchanges than the bound: the blocked greedy QRCP instead",
                     method="qrcp-blocked", shape=(m, n))
    if exact_route == "repair":
        record_event("method", f"qr(pivoting=True): blocked randomized QRCP (HQRRP) on "
                     f"{m}x{n}, blocks of {block}, then adjacent column exchanges restored by "
                     "Givens rotations until |diag(R)| is non-increasing (faster than the "
                     "blocked greedy QRCP wherever HQRRP's order is nearly greedy)",
                     method="qrcp-repair", shape=(m, n), block=block)
        with backend.ignore_fp_warnings():
            q, r, p = pivoted.hqrrp(backend, a, precision=precision, prec_name=prec_name,
                                    want_q=want_q, complete=complete, max_rank=max_rank)
            out = repair_diagonal(backend, q, r, p, u=u)
        if out is not None:
            q, r, p, _swaps = out
            if rtol is None:
                return q, r, p
            k = pivoted.truncation_rank(xp, r, min(r.shape), rtol)
            return (None if q is None else q[:, :k]), r[:k, :], p
        record_event("method", "qr(pivoting=True): HQRRP's order too far from the greedy "
                     "one to repair by exchanges: the blocked greedy QRCP instead",
                     method="qrcp-blocked", shape=(m, n))
    record_event("method", f"qr(pivoting=True): blocked QRCP in the greedy order on {m}x{n}, "
                 f"blocks of {block} from {2 * block} candidates (sketch of "
                 f"{block + pivoted.OVERSAMPLE} rows)", method="qrcp-blocked", shape=(m, n),
                 block=block)
    with backend.ignore_fp_warnings():
        q, r, p = blocked_qrcp(backend, a, precision=precision, prec_name=prec_name,
                               want_q=want_q, complete=complete, max_rank=max_rank,
                               rtol=rtol)
        return monotone_diagonal(backend, q, r, p, u=u)


def _factor_in_order(backend: Any, a: Any, p: Any, factor: Callable[[Any], tuple[Any, Any]],
                     kmax: int, max_rank: int | None, rtol: float | None, u: float
                     ) -> tuple[Any | None, Any, Any]:
    """``a[..., :, p]`` factored by ``factor``, its diagonal made non-increasing
    (:func:`~mpqr.qr.pivoted_exact.monotone_diagonal`: ``p`` is a greedy order, so only
    rounding is left to repair), truncated as asked."""
    xp = backend.xp
    q, r = factor(take_columns(xp, a, p))
    with backend.ignore_fp_warnings():
        q, r, p = monotone_diagonal(backend, q, r, p, u=u)
    if max_rank is None and rtol is None:
        return q, r, p
    k = pivoted.truncation_rank(xp, r, kmax, rtol)
    return (None if q is None else q[:, :k]), r[:k, :], p
