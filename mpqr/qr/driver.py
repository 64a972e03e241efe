"""The QR methods' registry and the driver that runs one: column scaling, wide inputs,
complete Q from a thin basis, sign normalisation and the fallback of ``auto``."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Any

from mpqr._array_api import device
from mpqr._errors import BreakdownError
from mpqr._gpu_errors import device_errors
from mpqr.engines.native import operands_in_range
from mpqr.policy import gemm_into, record_event
from mpqr.qr._kernels import (
    CERTIFIED_PANEL_MAX_N,
    UncertifiedPanels,
    certified_allowed,
    certified_panels,
    column_exponents,
    ct,
    deferred_certificates,
    eye_like,
    in_safe_range,
    normalize_signs,
    pow2_scale,
    safe_exponent,
    scale_columns,
)
from mpqr.qr.choice import NATIVE_PRECISIONS, precision_of, tall_products_precision

__all__ = ["METHODS", "THIN_ONLY", "empty", "register_method", "run"]

def _householder_tiled(backend, a, **kw):
    from mpqr.qr.householder_tiled import householder_tiled

    return householder_tiled(backend, a, **kw)


#: precisions whose square/wide Householder route (fast or tiled plan) reads nothing back
#: to the host between its launches: its calls of one shape are replayed as one CUDA
#: graph where the backend has them (``backend.replay``), up to REPLAY_MAX_ELEMENTS; the
#: panels' certificate is read after the last launch. H200, float32, replayed against run
#: as it is (``python bench/probes/graphs_gpu.py``), the same bits: 8192^2 fp16 45.3
#: against 57.5-78.4 ms (cuSOLVER 96.4), fp32-emulated 64.7 against 107.6; 12288^2 fp16
#: 86.0 against 101.0, fp32-emulated 134.8 against 176.6 (cuSOLVER 231.2). fp64-emulated
#: is not listed: the Ozaki engine reads its operands' ranges to the host
REPLAYED = frozenset({"fp16", "fp32-emulated"})
#: the largest input (elements) replayed. H200, float32, alternated in one process,
#: medians of 10 (``python bench/probes/replay_large.py``): 16384^2 fp16 110.1 against
#: 149.4 ms run as it is (its calls 109-153: the host's slow stretches), fp32-emulated 184.9
#: against 188.7, the graph holding 4.6 / 5.2 GiB; past it the GPU's work hides the
#: launches (32768^2 fp32-emulated 991 against 1007 ms for 21.9 GiB held, 65536 x 8192
#: 232.7 against 233.7)
REPLAY_MAX_ELEMENTS = 16384 * 16384


def _householder_recursive(backend, a, *, precision, prec_name, want_q, complete, overwrite):
    from mpqr.policy import active_gemm_options
    from mpqr.policy.trace import tracing
    from mpqr.qr.householder_recursive import householder_recursive, lean_active

    kw = dict(precision=precision, prec_name=prec_name, want_q=want_q, complete=complete)
    if (prec_name not in REPLAYED or a.ndim != 2 or math.prod(a.shape) > REPLAY_MAX_ELEMENTS
            or lean_active() or tracing()):
        return householder_recursive(backend, a, overwrite=overwrite, **kw)

    def run(x, ow):
        with deferred_certificates() as certs:
            q, r = householder_recursive(backend, x, overwrite=ow, **kw)
        return (q, r, *certs)

    from mpqr.qr import memory_plan

    opts = active_gemm_options()
    key = ("householder-recursive", repr(precision), prec_name, want_q, complete,
           certified_allowed(), None if opts is None else repr(opts))
    hold = memory_plan.estimate_bytes("householder-recursive", prec_name, tuple(a.shape),
                                      memory_plan.element_bytes(backend, a), "fast", complete)
    q, r, *certs = backend.replay(key, run, a, overwrite=overwrite, hold_bytes=hold)
    if any(backend.certificate_failed(c) for c in certs):
        raise UncertifiedPanels(f"householder-recursive: a {CERTIFIED_PANEL_MAX_N}-column "
                                "panel failed CholQR2's certificate (cond >= ~1e7)")
    return q, r


def _gram_schmidt_recursive(backend, a, **kw):
    from mpqr.qr.gram_schmidt_recursive import gram_schmidt_recursive

    return gram_schmidt_recursive(backend, a, **kw)


def _cholqr(name):
    def run(backend, a, **kw):
        from mpqr.qr import cholqr as c

        return {"cholqr": c.cholqr, "cholqr2": c.cholqr2,
                "shifted-cholqr3": c.shifted_cholqr3}[name](backend, a, **kw)

    return run


def _preconditioned_cholqr(backend, a, **kw):
    from mpqr.qr.cholqr_precond import preconditioned_cholqr

    return preconditioned_cholqr(backend, a, **kw)


def _sketch_cholqr(backend, a, **kw):
    from mpqr.qr.sketch import sketch_cholqr

    return sketch_cholqr(backend, a, **kw)


def _geqrf(backend, a, *, precision, prec_name, want_q, complete, overwrite):
    # the backend library's blocked Householder QR; it runs in the input's precision
    q, r = backend.library_qr(a, "complete" if complete else ("reduced" if want_q else "r"))
    return q, r[..., :a.shape[-1], :]  # complete: R's zero rows are added by the caller


def _householder_batched(backend, a, **kw):
    from mpqr.qr.batched_small import householder_batched

    return householder_batched(backend, a, **kw)


def _householder_batched_blocked(backend, a, **kw):
    from mpqr.qr.batched_blocked import householder_batched_blocked

    return householder_batched_blocked(backend, a, **kw)


def _geqrf_wy(backend, a, **kw):
    from mpqr.qr.geqrf_wy import geqrf_wy

    return geqrf_wy(backend, a, **kw)


def _cholqr2_batched(backend, a, **kw):
    from mpqr.qr.batched_cholqr import cholqr2_batched

    return cholqr2_batched(backend, a, **kw)


def _svqr(backend, a, **kw):
    from mpqr.qr.svqr import svqr

    return svqr(backend, a, **kw)


#: method name -> implementation ``f(backend, a, *, precision, prec_name, want_q,
#: complete, overwrite) -> (Q or None, R)`` for ``m >= n`` (before sign normalisation).
METHODS: dict[str, Callable[..., tuple[Any, Any]]] = {
    "householder-recursive": _householder_recursive,
    "householder-tiled": _householder_tiled,
    "gram-schmidt-recursive": _gram_schmidt_recursive,
    "cholqr": _cholqr("cholqr"),
    "cholqr2": _cholqr("cholqr2"),
    "shifted-cholqr3": _cholqr("shifted-cholqr3"),
    "preconditioned-cholqr": _preconditioned_cholqr,
    "sketch-cholqr": _sketch_cholqr,
    "svqr": _svqr,
    "geqrf": _geqrf,
    "householder-batched": _householder_batched,
    "householder-batched-blocked": _householder_batched_blocked,
    "geqrf-wy": _geqrf_wy,
    "cholqr2-batched": _cholqr2_batched,
}

#: methods that build an orthonormal basis of the columns only (no complete Q).
THIN_ONLY: set[str] = {"gram-schmidt-recursive", "cholqr", "cholqr2", "shifted-cholqr3",
                        "preconditioned-cholqr", "sketch-cholqr", "svqr", "cholqr2-batched"}


#: methods whose R has a real, positive diagonal by construction (Cholesky factors and
#: their products; householder-batched flips its signs in its own pass): no sign test
#: (a reduction and a host sync; its removal measured within run-to-run noise on an
#: H100, `python -m mpqr bench qr`) and no pass over Q
_POSITIVE_DIAGONAL: frozenset[str] = frozenset({"cholqr", "cholqr2", "shifted-cholqr3",
                                                 "preconditioned-cholqr",
                                                 "sketch-cholqr",
                                                 "householder-batched",
                                                 "householder-batched-blocked",
                                                 "geqrf-wy", "cholqr2-batched"})

#: methods that run the library's geqrf in the input's precision on the unscaled input:
#: queued before the range check, which then reads its one host sync after them
_LIBRARY_FIRST: frozenset[str] = frozenset({"geqrf", "geqrf-wy"})

#: where ``method="auto"``'s certified stack route breaks down (a member beyond its
#: reach), the stack route it continues with
STACK_FALLBACK: dict[str, str] = {"cholqr2-batched": "geqrf-wy"}

#: where ``method="auto"``'s CholQR2 breaks down, the method it continues with (from the
#: Gram matrix CholQR2 computed) before falling back to Householder
RESCUE = "preconditioned-cholqr"

#: where CholQR2's *first* Cholesky failed (cond(x) beyond ~u^-1/2) on a 2-D matrix with
#: at least 2 SKETCH_ROWS n rows and a backend that sketches, ``auto`` continues with this
#: method instead: a CountSketch pass, one substitution and one certified-by-estimate
#: CholQR pass, against the chain's two or three solve-and-Gram passes from CholQR2's
#: Gram matrix (the chain still finishes where the sketch leaves cond(x R0^-1) large)
SKETCH_RESCUE: str | None = "sketch-cholqr"


def register_method(name: str, func: Callable[..., tuple[Any, Any]], *,
                    thin_only: bool = False) -> None:
    """Add a QR method to :data:`METHODS` (used by the method modules)."""
    METHODS[name] = func
    if thin_only:
        THIN_ONLY.add(name)


def run(backend: Any, a: Any, method: str, *, auto: bool, precision: Any, prec_name: str,
        want_q: bool, complete: bool, overwrite: bool) -> tuple[Any, Any]:
    """Factor ``a`` (any shape, stacks too) with ``method``; ``(Q or None, R)``, signs
    normalised. ``auto``: ``method`` was chosen by :func:`~mpqr.qr.choice.choose_method`,
    so a CholQR breakdown falls back to Householder (recorded) instead of raising."""
    *batch, m, n = a.shape
    if m == 0 or n == 0 or math.prod(batch) == 0:
        return empty(backend.xp, a, want_q=want_q, complete=complete)

    kw = dict(precision=precision, prec_name=prec_name, want_q=want_q, complete=complete,
              overwrite=overwrite)
    fallback, fallback_kw = "householder-tiled", kw
    own = precision_of(backend, prec_name, a.dtype, method) if auto else prec_name
    if own != prec_name:
        # the input's own precision (choose_method says why): no scaling pass for an fp16
        # range it will not use; CholQR2's fallback is what the requested precision would
        # have run without the tall-skinny rule
        kw = {**kw, "precision": own, "prec_name": own}
        if n > 32 and "tensor-cores" in backend.capabilities:
            fallback = "householder-recursive"
        tall = (tall_products_precision(backend, prec_name, a.dtype, m, n)
                if method == "cholqr2" and a.ndim == 2 else None)
        if tall is not None:
            # the products over x at the request's own engine where it is the faster
            # (as accurate: the pass's certificate reads float32's roundoff)
            kw["precision"] = tall[0]
            record_event("precision", tall[1], method=method, precision=tall[0])
    if method in STACK_FALLBACK:
        fallback = STACK_FALLBACK[method]
    # auto's CholQR2 checks the range itself (its Gram diagonal holds the squared column
    # norms: overflow or underflow raise BreakdownError), so the pass computing column
    # maxima is saved; the fallback below scales as usual
    unscaled = auto and method == "cholqr2" and kw["prec_name"] in NATIVE_PRECISIONS
    # auto's CholQR2 stops after its first factor where a second pass would not be
    # certified and the sketch route can take over (see cholqr.hand_over_early)
    early = (auto and method == "cholqr2" and _sketchable(backend, a)
             and kw["prec_name"] in NATIVE_PRECISIONS)
    if early:
        from mpqr.qr.cholqr import hand_over_early
        from mpqr.qr.cholqr_precond import estimate_cond
        from mpqr.qr.sketch import prefetch_sketch, sketch_ahead
    with (device_errors(backend, "mpqr.qr"),
          sketch_ahead() if early else contextlib.nullcontext()):
        try:
            with (backend.ignore_fp_warnings() if unscaled else contextlib.nullcontext(),
                  hand_over_early(estimate_cond, prefetch_sketch) if early
                  else contextlib.nullcontext()):
                q, r = factor_any(backend, method, a, scale=not unscaled, **kw)
        except BreakdownError as exc:
            if not auto:
                raise
            if method == "cholqr2":
                rescue = _rescue_method(backend, a, exc)
                try:
                    return _rescue(backend, a, exc, unscaled, kw, rescue)
                except BreakdownError as exc2:
                    method, exc = rescue, exc2
            record_event("fallback", f"qr: {method} broke down (estimated cond(x) >= "
                         f"{exc.cond_estimate:.2e}); falling back to {fallback} at "
                         f"precision={prec_name!r}", method=method, fallback=fallback,
                         cond_estimate=exc.cond_estimate, reason=str(exc))
            q, r = factor_any(backend, fallback, a, **fallback_kw)
    return q, r


def _rescue_method(backend: Any, a: Any, exc: BreakdownError) -> str:
    """:data:`SKETCH_RESCUE` where CholQR2's first Cholesky failed on a matrix the backend
    sketches (2-D, enough rows), else :data:`RESCUE`."""
    first = getattr(exc, "first_gram", None)
    if (first is not None and getattr(exc, "chain", None) is None
            and _sketchable(backend, a)):
        return SKETCH_RESCUE
    return RESCUE


def _sketchable(backend: Any, a: Any) -> bool:
    """Whether :data:`SKETCH_RESCUE` can take over ``a`` (2-D, at least ``2 SKETCH_ROWS n``
    rows, a backend that sketches)."""
    from mpqr.qr.sketch import SKETCH_ROWS

    m, n = a.shape[-2:]
    return bool(SKETCH_RESCUE) and a.ndim == 2 and m >= 2 * SKETCH_ROWS * n and getattr(
        backend, "sketches", False)


def _rescue(backend: Any, a: Any, exc: BreakdownError, unscaled: bool,
            kw: dict[str, Any], rescue: str = RESCUE) -> tuple[Any, Any]:
    """``method="auto"``'s CholQR2 broke down: :data:`RESCUE` from CholQR2's first Gram
    matrix where it was in range (only its conditioning failed), else on columns
    scaled where needed (a Gram matrix that over- or underflowed)."""
    first = getattr(exc, "first_gram", None)
    chain = getattr(exc, "chain", None)
    resume = chain is not None and chain[0] is a and unscaled
    reuse = first is not None and first[0] is a and unscaled
    if rescue == SKETCH_RESCUE:
        record_event("fallback", f"qr: cholqr2 broke down (estimated cond(x) >= "
                     f"{exc.cond_estimate:.2e}); continuing with {rescue} at "
                     f"precision={kw['prec_name']!r}: its first factor failed or showed "
                     "cond(x) beyond CholQR2's reach (~u^-1/2), so a CountSketch "
                     "preconditioner and one CholQR pass replace the preconditioned "
                     "chain's two or three",
                     method="cholqr2", fallback=rescue, cond_estimate=exc.cond_estimate,
                     reason=str(exc))
        with backend.ignore_fp_warnings() if unscaled else contextlib.nullcontext():
            return factor_any(backend, rescue, a, scale=not unscaled, **kw)
    record_event("fallback", f"qr: cholqr2 broke down (estimated cond(x) >= "
                 f"{exc.cond_estimate:.2e}); continuing with {RESCUE} at "
                 f"precision={kw['prec_name']!r}" + (
                     " from CholQR2's first factor and second Gram matrix" if resume else
                     " from CholQR2's Gram matrix" if reuse else
                     " on columns scaled where needed"),
                 method="cholqr2", fallback=RESCUE, cond_estimate=exc.cond_estimate,
                 reason=str(exc))
    if resume:
        from mpqr.qr.cholqr_precond import Resume, resume_chain

        with resume_chain(Resume(*chain)), backend.ignore_fp_warnings():
            return factor_any(backend, RESCUE, a, scale=False, **kw)
    if reuse:
        from mpqr.qr.cholqr import reuse_first_gram

        with reuse_first_gram(a, first[1], first[2]), backend.ignore_fp_warnings():
            return factor_any(backend, RESCUE, a, scale=False, **kw)
    return factor_any(backend, RESCUE, a, **kw)


def factor_any(backend: Any, method: str, a: Any, *, precision: Any, prec_name: str,
            want_q: bool, complete: bool, overwrite: bool, scale: bool = True
            ) -> tuple[Any, Any]:
    """Run one method on any shape; returns sign-normalised ``(Q or None, R)``.

    Columns are first scaled by exact powers of two (see
    :func:`~mpqr.qr._kernels.scale_columns`) and R's columns unscaled at the end;
    at native precisions only when some column's magnitude could over- or
    underflow a Gram matrix or a norm (the scaling pass costs a read and a write
    of ``x``).
    """
    # the library's QR runs natively in the input's precision whatever was asked (fp16 and
    # fp32-emulated take it where it beats their recursion): no fp16 range to respect
    only_if_needed = prec_name in NATIVE_PRECISIONS or method in _LIBRARY_FIRST
    if scale and only_if_needed and method in _LIBRARY_FIRST:
        # The library's QR is queued first and the range checked after it, so one host
        # sync serves both (on a GPU the check alone cost ~0.3 ms per call before the
        # QR could start). Out of range (rare): the unscaled result is dropped and the
        # scaled path below runs, as it would have at once.
        with backend.ignore_fp_warnings():
            q, r = _factor_scaled(backend, method, a, precision=precision,
                                  prec_name=prec_name, want_q=want_q, complete=complete,
                                  overwrite=False,
                                  check_signs=backend.library_qr_positive)
            e = column_exponents(backend, a)
        if in_safe_range(backend.xp, a, e, single=prec_name == "fp32"):
            return q, r
        del q, r
        lim = safe_exponent(backend.xp, a, single=prec_name == "fp32")
        record_event("scale", f"qr: a column's largest entry is above 2^{lim} or below "
                     f"2^-{lim}: the library's QR runs again on columns scaled by powers "
                     "of two", method=method)
    a2, e = scale_columns(backend, a, only_if_needed=only_if_needed,
                          single=prec_name == "fp32") if scale else (a, None)
    kw = dict(precision=precision, prec_name=prec_name, want_q=want_q, complete=complete,
              check_signs=method != "geqrf" or backend.library_qr_positive)
    # columns at unit magnitude, or checked within float32's safe range at "fp32": the
    # factors' entries stay in float32's range, so FP32 products of float64 data need no
    # scaling of their own
    in_range = operands_in_range if scale and (e is not None or prec_name == "fp32") \
        else contextlib.nullcontext
    # certified panels only where the input survives to be factored again
    redo = not (overwrite and a2 is a)
    try:
        with certified_panels(redo), in_range():
            q, r = _factor_scaled(backend, method, a2,
                                  overwrite=overwrite or a2 is not a,  # a scaled copy is ours
                                  **kw)
    except UncertifiedPanels as exc:
        record_event("panel", f"qr: {exc}; factored again with geqrf panels",
                     method=method, reason=str(exc))
        if a2 is not a:  # the scaled copy was overwritten
            a2, e = scale_columns(backend, a, only_if_needed=only_if_needed,
                                  single=prec_name == "fp32")
        with certified_panels(False), in_range():
            q, r = _factor_scaled(backend, method, a2, overwrite=a2 is not a, **kw)
    # R is the call's own array (of the scaled copy): scaled back in place, so that no
    # second R is alive beside Q and R at the call's end
    return q, (r if e is None else pow2_scale(backend, r, e, in_place=True))


def _factor_scaled(backend: Any, method: str, a: Any, *, precision: Any, prec_name: str,
                   want_q: bool, complete: bool, overwrite: bool, check_signs: bool = True
                   ) -> tuple[Any, Any]:
    """One method on the (scaled) input, signs normalised; ``check_signs=False`` for
    the library's QR, whose diagonal signs are mixed (see ``normalize_signs``)."""
    xp = backend.xp
    func = METHODS[method]
    *batch, m, n = a.shape

    def signs(q: Any, r: Any) -> tuple[Any, Any]:
        if method in _POSITIVE_DIAGONAL or (method == "geqrf" and backend.library_qr_signed):
            return q, r
        # the recursion's factors are its own arrays (R the input itself only where the
        # caller allowed overwriting it)
        return normalize_signs(xp, q, r, check=check_signs,
                               in_place=method == "householder-recursive", backend=backend)

    if m < n:
        # wide: factor the leading m x m block, then R2 = Q^H A2
        q, r1 = signs(*func(backend, a[..., :, :m], precision=precision,
                            prec_name=prec_name, want_q=True, complete=False,
                            overwrite=False))
        # R's storage first, R2 = Q^H A2 written into it: no R2 and concatenation beside
        # R1 and R (the wide route's bound in docs/memory.md)
        r = xp.empty((*batch, m, n), dtype=r1.dtype, device=device(r1))
        r[..., :, :m] = r1
        r1 = None
        gemm_into(r[..., :, m:], ct(xp, q), a[..., :, m:], precision=precision,
                  label="qr-wide-QhA2", backend=backend)
        return q, r
    if complete and method in THIN_ONLY:
        q, r = _complete_from_thin(backend, func, a, precision, prec_name)
    else:
        q, r = func(backend, a, precision=precision, prec_name=prec_name, want_q=want_q,
                    complete=complete, overwrite=overwrite)
    if complete and m > n and r.shape[-2] < m:  # (the lean route's R has its zero rows)
        r = xp.concat([r, xp.zeros((*batch, m - n, n), dtype=r.dtype, device=device(r))],
                      axis=-2)
    return signs(q, r)


def empty(xp: Any, a: Any, *, want_q: bool, complete: bool) -> tuple[Any, Any]:
    """``(Q or None, R)`` of an input with no rows, no columns or an empty stack."""
    *batch, m, n = a.shape
    k = min(m, n)
    dev = device(a)
    if complete:
        q = eye_like(xp, tuple(batch), m, m, a.dtype, dev) if math.prod(batch) else \
            xp.zeros((*batch, m, m), dtype=a.dtype, device=dev)
        return q, xp.zeros((*batch, m, n), dtype=a.dtype, device=dev)
    r = xp.zeros((*batch, k, n), dtype=a.dtype, device=dev)
    if not want_q:
        return None, r
    return xp.zeros((*batch, m, k), dtype=a.dtype, device=dev), r


def _complete_from_thin(backend: Any, func: Callable[..., Any], a: Any, precision: Any,
                        prec_name: str) -> tuple[Any, Any]:
    """Complete Q for methods that only give an orthonormal basis of the columns.

    Factor ``[Q1 | 0]`` completed by Householder: the complement of ``Q1`` comes
    from the complete Householder QR of ``Q1`` itself.
    """
    from mpqr.qr.householder_tiled import householder_tiled

    xp = backend.xp
    q1, r = func(backend, a, precision=precision, prec_name=prec_name, want_q=True,
                 complete=False, overwrite=False)
    qc, _ = householder_tiled(backend, q1, precision=precision, prec_name=prec_name,
                              want_q=True, complete=True)
    n = a.shape[-1]
    return xp.concat([q1, qc[..., :, n:]], axis=-1), r
