"""The small-input fast path of :func:`mpqr.qr` and :func:`mpqr.lstsq`.

A call on a small matrix costs the general route ~0.1-0.5 ms of validation, namespace
lookup, method choice, range checks and trace bookkeeping before LAPACK's few tens of
microseconds (profile: bench/NOTES.md). Here, for an input of the backend's exact array
type (``backend.small_type``: ``numpy.ndarray``, not a subclass), 2-D, float32/float64/
complex64/complex128, of at most ``backend.small_max`` elements (for QR, where the
route choice gives the library's QR, up to ``backend.direct_qr_max`` if larger: the
direct call saves the general route's checks there too), with default options
and a precision request that the input dtype's own arithmetic meets (every request on
float64 and complex128 but the tensor-core ones, which keep their own rules; ``"fp32"``
on float32 and complex64: :func:`mpqr.qr.choice.small_library_route`), the backend's
:meth:`small_qr` / :meth:`small_lstsq` run LAPACK directly with mpqr's conventions
(``diag(R) >= 0``; SciPy's ``lstsq`` results). The decision is pure and cached per
backend, dtype, shape and precision; :func:`mpqr.qr.choice.choose_method` applies the
same rule (:func:`mpqr.qr.choice.small_library_route`), so the general route (and
``explain()``) names the same method. NaN/Inf and columns the general route would
rescale take the general route (the backend returns None), so their contract is the
general route's. No trace bookkeeping unless an ``explain()`` is collecting.
"""

from __future__ import annotations

from typing import Any

from mpqr._array_api import device
from mpqr.backends import get_backend
from mpqr.lstsq import _scipy_rules as rules
from mpqr.policy import record_event, resolve_precision
from mpqr.policy.trace import tracing
from mpqr.qr import in_memory as qr_in_memory
from mpqr.qr.choice import factor_precision, own_precision_meets, precision_of
from mpqr.qr.in_memory import MODES, QRResult

__all__ = ["MISS", "lstsq", "qr"]

#: returned when the call must take the general route
MISS: Any = object()
_UNSEEN: Any = object()
#: exact array type -> its backend where that has a fast path, else None
_BACKENDS: dict[type, Any] = {}
#: (backend, dtype, shape, precision) -> float32 range flag, or None: no fast path
_DECISIONS: dict[tuple[Any, ...], Any] = {}
_DRIVERS = (None, "gelsd", "gelsy", "gelss")
_DECISIONS_MAX = 4096


def _backend(x: Any) -> Any:
    """The backend of ``x``'s exact type if it has a fast path (cached per type)."""
    t = type(x)
    be = _BACKENDS.get(t, _UNSEEN)
    if be is not _UNSEEN:
        return be
    be = None
    try:
        from mpqr._validation import namespace_of

        cand = get_backend(namespace_of(x, names=("x",)))
        if cand.small_max and cand.small_type is t:
            be = cand
    except Exception:  # not an array mpqr takes: the general route names the error
        be = None
    _BACKENDS[t] = be
    return be


def _decide(be: Any, dtype: Any, shape: tuple[int, ...], prec: str) -> Any:
    """None (no fast path) or whether the range check uses float32's limits."""
    choose = qr_in_memory.choose_method  # where the in-memory route looks it up
    key = (be, dtype, shape, prec, choose)
    d = _DECISIONS.get(key, _UNSEEN)
    if d is _UNSEEN:
        xp = be.xp
        m, n = shape
        d = None
        if (dtype in (xp.float32, xp.float64, xp.complex64, xp.complex128)
                and 0 < m * n <= max(be.small_max, getattr(be, "direct_qr_max", 0))
                and choose(be, prec, dtype, m, n)[0] == "geqrf"):
            # the general route's range check: float32's limits where it factors at fp32
            d = precision_of(be, prec, dtype, "geqrf") == "fp32"
        if len(_DECISIONS) >= _DECISIONS_MAX:
            _DECISIONS.clear()
        _DECISIONS[key] = d
    return d


def _lstsq_above_small(be: Any, dtype: Any, m: int, n: int, k: int, prec: str) -> bool:
    """Whether a least-squares problem above ``small_max`` takes the fast path: tall
    (``m >= n``), at most ``backend.small_lstsq_max`` elements and
    ``backend.small_lstsq_max_n`` columns, at most ``n`` right-hand sides (the QR of
    ``[A | b]`` also factors b's trailing ``(m - n) x k`` block), a request the dtype's
    own arithmetic meets (that QR is backward stable in it, as the library's QR route
    ``gels``)."""
    if not (n <= m and k <= n and m * n <= getattr(be, "small_lstsq_max", 0)
            and n <= getattr(be, "small_lstsq_max_n", 0)):
        return False
    key = (be, dtype, "lstsq", prec)
    d = _DECISIONS.get(key, _UNSEEN)
    if d is _UNSEEN:
        xp = be.xp
        d = (dtype in (xp.float32, xp.float64, xp.complex64, xp.complex128)
             and own_precision_meets(be, prec, dtype))
        if len(_DECISIONS) >= _DECISIONS_MAX:
            _DECISIONS.clear()
        _DECISIONS[key] = d
    return d


def _precision(precision: Any) -> str:
    return resolve_precision(precision)[0]  # validates an explicit name


def qr(x: Any, mode: str, precision: Any, method: str, check_finite: bool) -> Any:
    """:func:`mpqr.qr`'s result, or :data:`MISS`. ``check_finite``: non-finite input
    always takes the general route, which raises or propagates."""
    be = _BACKENDS.get(type(x), _UNSEEN)
    if be is _UNSEEN:
        be = _backend(x)
    # wide matrices keep the general route: its R's trailing columns come from one
    # product (Q^H A2), as in a stack's members, which must equal the single-matrix result
    if (be is None or method != "auto" or x.ndim != 2 or mode not in MODES
            or x.shape[0] < x.shape[1]):
        return MISS
    prec = _precision(precision)
    single = _decide(be, x.dtype, x.shape, prec)
    if single is None:
        return MISS
    try:
        res = be.small_qr(x, mode, single)
    except MemoryError:
        # the device ran out in the library's call: the general route checks its plan
        # against the free memory first and names what would fit
        return MISS
    if res is None:
        return MISS
    if tracing():  # the general route's record, and that the fast path ran it
        m, n = x.shape
        why = qr_in_memory.choose_method(be, prec, x.dtype, m, n)[1]
        how = "small-input fast path" if m * n <= be.small_max else \
            "the library's QR called directly"
        record_event("method", f"qr: geqrf ({why}; {how})",
                     method="geqrf", shape=(m, n), batch=1, precision=prec, route="small")
    q, r = res
    return r if mode == "r" else QRResult(q, r)


def lstsq(a: Any, b: Any, cond: Any, check_finite: bool, lapack_driver: Any, *,
          precision: Any, refine: Any, tol: Any, maxiter: Any) -> Any:
    """:func:`mpqr.lstsq`'s result, or :data:`MISS` (SciPy's driver, as ``scipy.linalg
    .lstsq`` calls it, for the problems :func:`qr`'s rule takes; refinement is not
    needed: the working precision's direct solution meets the request)."""
    be = _BACKENDS.get(type(a), _UNSEEN)
    if be is _UNSEEN:
        be = _backend(a)
    if (be is None or type(b) is not type(a) or a.ndim != 2 or b.ndim not in (1, 2)
            or a.dtype != b.dtype or tol is not None or maxiter is not None
            or refine not in ("auto", None) or lapack_driver not in _DRIVERS):
        return MISS
    if cond is not None:
        if type(cond) is not float or not 0.0 < cond < 1.0:  # others: mpqr's readings
            return MISS
    m, n = a.shape
    if b.shape[0] != m or (b.ndim == 2 and b.shape[1] == 0):
        return MISS
    prec = _precision(precision)
    if a.size > be.small_max:
        if not _lstsq_above_small(be, a.dtype, m, n, 1 if b.ndim == 1 else b.shape[1],
                                  prec):
            return MISS
    elif _decide(be, a.dtype, a.shape, prec) is None:
        return MISS
    res = be.small_lstsq(a, b, cond, lapack_driver)
    if res is None:
        return MISS
    x, rsq, rank, s = res
    if tracing():  # explain() describes the route that ran: this one
        k = 1 if b.ndim == 1 else b.shape[1]
        own = factor_precision(be, prec, a.dtype, m, n)
        if own != prec:  # as the general route says it (lstsq.solver)
            record_event("precision", f"lstsq: precision={prec!r} on a tall-skinny {m}x{n} "
                         f"matrix: its QR runs in the input's own, at least as accurate "
                         f"precision ({own})", requested=prec, precision=own)
        record_event("method", f"lstsq: small-input fast path ({m}x{n}, {k} right-hand "
                     f"side(s), precision={prec!r}, which the input's own arithmetic meets): "
                     "the backend library's routines called directly (one QR of [A | b] "
                     "and the SVD of R, or SciPy's own driver on the host for the smallest "
                     "inputs) with scipy.linalg.lstsq's results", path="small",
                     precision=prec, rank=int(rank))
    driver = lapack_driver or "gelsd"
    vec = b.ndim == 1
    res = rules.residues(be.xp, rsq, x.dtype, m=m, n=n, rank=rank,
                         driver=driver, vec=vec, k=1 if vec else b.shape[1], dev=device(x))
    return x, res, rules.scipy_rank(x, rank, empty=a.size == 0), s
