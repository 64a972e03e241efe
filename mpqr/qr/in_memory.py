"""QR of an array in memory, where it is (NumPy, CuPy, any Array API library): validate,
choose a method, run it (:mod:`mpqr.qr.driver`). The in-memory route of :func:`mpqr.qr`
(:mod:`mpqr._route` decides the route), and the QR every other route factors its pieces
with: the out-of-core drivers (:mod:`mpqr.ooc`) and the Dask blocks
(:mod:`mpqr.backends.dask`) import it, never the public front :mod:`mpqr.qr.api`."""

from __future__ import annotations

import math
import operator
from typing import Any, NamedTuple

from mpqr._array_api import device
from mpqr._errors import DeviceMemoryError
from mpqr._gpu_errors import as_device_error, device_errors
from mpqr._validation import check_choice, check_dtype, check_ndim, namespace_of
from mpqr._validation import check_finite as _check_finite
from mpqr.backends import get_backend
from mpqr.policy import record_event, resolve_precision, validate_precision
from mpqr.qr import driver, memory_plan
from mpqr.qr.choice import choose_method
from mpqr.qr.driver import METHODS

__all__ = ["MODES", "MODE_HINTS", "PivotedQRResult", "QRResult", "qr"]

MODES = ("reduced", "complete", "r")
#: SciPy's names of the modes, answered with mpqr's (mpqr.compat.scipy.qr takes SciPy's)
_SCIPY_MODES = ("SciPy's 'economic' is mpqr's 'reduced' and SciPy's 'full' is 'complete'; "
                "mpqr.compat.scipy.qr takes SciPy's names")
MODE_HINTS = {"economic": _SCIPY_MODES, "full": _SCIPY_MODES}


class QRResult(NamedTuple):
    """``Q`` with orthonormal columns and upper-triangular ``R`` with ``A = Q @ R``."""

    Q: Any
    R: Any


class PivotedQRResult(NamedTuple):
    """``Q``, ``R`` and the column order ``P`` with ``A[..., :, P] = Q @ R``."""

    Q: Any
    R: Any
    P: Any


def qr(x: Any, mode: str = "reduced", precision: str | None = None, method: str = "auto", *,
       check_finite: bool = False, overwrite_a: bool = False, pivoting: bool | str = False,
       max_rank: int | None = None, rtol: float | None = None) -> Any:
    """:func:`mpqr.qr` of an array in memory (see there; ``pivoting``, ``max_rank`` and
    ``rtol`` already checked by :func:`mpqr.qr.api.check_pivoting` where they are given)."""
    xp = namespace_of(x, names=("x",))
    check_ndim(x, "x", minimum=2, what="2-D or a stack of matrices")
    check_choice(mode, "mode", MODES, MODE_HINTS)
    check_choice(method, "method", ("auto", *sorted(METHODS)))
    if precision is not None:
        validate_precision(precision)
    prec_name, _ = resolve_precision(precision)
    a = check_dtype(xp, x, "x")
    overwrite = bool(overwrite_a) and a is x
    backend = get_backend(xp)
    if check_finite:
        _check_finite(backend, a, "x",
                      message="`x` must not contain infs or NaNs (check_finite=True)")
    *batch, m, n = a.shape
    complete = mode == "complete"
    want_q = mode != "r"
    if prec_name in ("fp16", "fp32-emulated") and "fp16" not in backend.capabilities:
        # checked up front: a single-panel QR would run no GEMM to notice it
        raise NotImplementedError(
            f"precision={prec_name!r} needs a float16 GEMM engine, which the {backend.name} "
            "backend does not provide (it has no float16 GEMM); use 'fp32' or 'fp64'")

    if rtol is not None and batch:
        raise ValueError("`rtol` needs a single matrix (the rank it finds differs across a "
                         f"stack); got x of shape {tuple(a.shape)}: use `max_rank`")
    if pivoting:
        return _qr_pivoted(backend, a, mode=mode, method=method, precision=precision,
                           prec_name=prec_name, max_rank=max_rank, rtol=rtol,
                           ordering="randomized" if pivoting == "randomized" else "greedy")

    auto = method == "auto"
    if auto:
        method, why = choose_method(backend, prec_name, a.dtype, m, n, batch=math.prod(batch),
                                    complete=complete)
        record_event("method", f"qr: {method} ({why})", method=method, shape=(m, n),
                     batch=math.prod(batch), precision=prec_name)
    else:
        record_event("method", f"qr: {method} (requested)", method=method, shape=(m, n),
                     batch=math.prod(batch), precision=prec_name)

    if m == 0 or n == 0 or math.prod(batch) == 0:
        q, r = driver.empty(xp, a, want_q=want_q, complete=complete)
    else:
        try:
            plan = memory_plan.check_fits(backend, a, method, prec_name, complete, want_q)
        except DeviceMemoryError as exc:
            raise as_device_error(backend, exc, "mpqr.qr") from None
        again = False
        try:
            with memory_plan.workspace_scope(backend, a, prec_name, method, plan, complete):
                q, r = driver.run(backend, a, method, auto=auto, precision=precision,
                                  prec_name=prec_name, want_q=want_q, complete=complete,
                                  overwrite=overwrite)
        except MemoryError as exc:
            # the estimate of a faster plan fell short (the pool's cached blocks, or memory
            # taken meanwhile): once more on the lean plan, where the input is intact
            if plan not in ("fast", "tiled") or overwrite or \
                    method != "householder-recursive":
                if isinstance(exc, DeviceMemoryError) or backend.device_memory_free() is None:
                    raise
                # never the device library's raw error: what was needed and is free
                raise as_device_error(backend, memory_plan.out_of_memory(
                    backend, a, method, prec_name, plan, complete), "mpqr.qr") from exc
            again = True
        if again:  # outside the handler: the failed attempt's arrays are gone by now
            record_event("memory", f"qr: out of device memory on the {plan} plan; "
                         "factored again on the lean plan", plan="lean")
            backend.release_cached_memory()
            with memory_plan.workspace_scope(backend, a, prec_name, method, "lean",
                                            complete):
                q, r = driver.run(backend, a, method, auto=auto, precision=precision,
                                  prec_name=prec_name, want_q=want_q, complete=complete,
                                  overwrite=overwrite)
    return QRResult(q, r) if want_q else r




def _qr_pivoted(backend: Any, a: Any, *, mode: str, method: str, precision: Any,
                prec_name: str, max_rank: Any, rtol: Any, ordering: str = "greedy") -> Any:
    """``qr(pivoting=True)`` after validation (:mod:`mpqr.qr.pivoted`)."""
    from mpqr.qr.pivoted_route import qr_pivoted

    xp = backend.xp
    *batch, m, n = a.shape
    complete = mode == "complete"
    want_q = mode != "r"
    max_rank = None if max_rank is None else operator.index(max_rank)
    rtol = None if rtol is None else float(rtol)
    if m == 0 or n == 0 or math.prod(batch) == 0:
        q, r = driver.empty(xp, a, want_q=want_q, complete=complete)
        if max_rank is not None:
            k = min(m, n, max_rank)
            q = None if q is None else q[..., :, :k]
            r = r[..., :k, :]
        p = xp.broadcast_to(xp.arange(n, dtype=xp.int32, device=device(a)), (*batch, n))
        p = xp.asarray(p, copy=True)
    else:
        def factor(ap: Any) -> tuple[Any, Any]:
            mth, auto = method, method == "auto"
            if auto:
                mth, why = choose_method(backend, prec_name, ap.dtype, m, n,
                                         batch=math.prod(batch), complete=complete)
                record_event("method", f"qr: {mth} ({why}) of the permuted matrix",
                             method=mth, shape=(m, n), batch=math.prod(batch),
                             precision=prec_name)
            return driver.run(backend, ap, mth, auto=auto, precision=precision,
                              prec_name=prec_name, want_q=want_q, complete=complete,
                              overwrite=True)

        # the factor is the library's Householder QR: the Gram route may resume its steps
        # between levels instead (mpqr.qr.pivoted_gram.householder_levels)
        factor.householder = not batch and (method == "geqrf" or (
            method == "auto" and choose_method(backend, prec_name, a.dtype, m, n,
                                               batch=1)[0] == "geqrf"))
        with device_errors(backend, "mpqr.qr"):
            q, r, p = qr_pivoted(backend, a, factor=factor, precision=precision,
                                 prec_name=prec_name, want_q=want_q, complete=complete,
                                 max_rank=max_rank, rtol=rtol, ordering=ordering)
    return PivotedQRResult(q, r, p) if want_q else (r, p)
