"""``cupy.linalg`` front ends: ``qr``, ``lstsq`` and ``svd`` with CuPy's signatures and
results, computed by mpqr on the GPU.

:class:`patch` routes existing ``cupy.linalg`` callers here (``from cupy.linalg import
qr`` done before the patch included). A call is routed when its arrays are CuPy
arrays of dtype float32, float64, complex64 or complex128 holding data; anything else
(``mode="raw"``, other dtypes, empty input, NaN/Inf for ``lstsq``/``svd``, ``svd``
with ``full_matrices=True`` or of a shape where the QR-SVD does not pay) keeps CuPy's
own path, so its errors are CuPy's. The results are computed in the input's dtype, as
CuPy's are. ``mpqr.explain()`` records each routed call.
"""

from __future__ import annotations

import functools
import math
from typing import Any

from mpqr.compat import _patch

import mpqr
from mpqr.policy import record_event
from mpqr.policy.trace import tracing

__all__ = ["lstsq", "patch", "qr", "svd"]

_CUPY = _patch.Frontend("cupy", (("cupy.linalg", "qr"), ("cupy.linalg", "lstsq"),
                                 ("cupy.linalg", "svd")),
                        replacements="mpqr.compat.cupy", requires="cupy.linalg")
_DEFAULTS: dict[str, Any] = {"svd_min_aspect": 2.0}
_DTYPES = ("float32", "float64", "complex64", "complex128")


def original(name: str) -> Any:
    """CuPy's own ``cupy.linalg`` function (never the patched one)."""
    return _CUPY.original(name)


class patch(_patch.Patch):
    """Route ``cupy.linalg.qr``, ``lstsq`` and ``svd`` to mpqr inside a block.

    Usable as a context manager or a decorator; thread-safe and re-entrant. Everything
    is restored when the outermost block exits, exceptions included.

    Parameters
    ----------
    precision : str, optional
        Precision of the routed calls (see :func:`mpqr.qr`); ``None`` uses the
        ``mpqr.precision`` setting (``"auto"``: the input's working accuracy).
    svd_min_aspect : float
        ``svd(full_matrices=False)`` is routed (QR-SVD) only for
        ``max(m, n) >= svd_min_aspect * min(m, n)``; ``1`` routes every shape.

    Raises
    ------
    ValueError
        An unknown ``precision`` or ``svd_min_aspect`` below 1.

    Examples
    --------
    >>> import mpqr.compat.cupy as mcc
    >>> with mcc.patch(precision="fp32"):  # doctest: +SKIP
    ...     q, r = cupy.linalg.qr(a)
    """

    frontend = _CUPY

    def __init__(self, precision: str | None = None, *, svd_min_aspect: float = 2.0):
        if isinstance(svd_min_aspect, bool) or not isinstance(svd_min_aspect, (int, float)) \
                or not svd_min_aspect >= 1:
            raise ValueError(f"`svd_min_aspect` must be a number >= 1; got {svd_min_aspect!r}")
        super().__init__(precision, svd_min_aspect=float(svd_min_aspect))


def _options() -> dict[str, Any]:
    return _CUPY.current_options() or _DEFAULTS


def _kept(arrays: dict[str, Any]) -> str | None:
    """Why a call keeps CuPy's path (None: route it)."""
    if _patch.inside() or _patch.called_from_mpqr(3):  # the caller of qr/lstsq/...
        return "called from inside mpqr"
    import cupy

    for n, a in arrays.items():
        if type(a) is not cupy.ndarray:
            return f"`{n}` is a {type(a).__name__}"
        if a.dtype.name not in _DTYPES:
            return f"`{n}` has dtype {a.dtype.name}"
        if a.size == 0:
            return f"`{n}` is empty"
    return None


def _keep(name: str, reason: str, *args: Any, **kwargs: Any) -> Any:
    if tracing():
        record_event("compat", f"cupy.linalg.{name} kept on CuPy's path: {reason}",
                     frontend="cupy", function=name, routed=False)
    with _patch.routing():  # CuPy's own body (lstsq calls svd) stays CuPy's
        return original(name)(*args, **kwargs)


def _route(name: str, to: str, a: Any, **args: Any) -> None:
    desc = ", ".join(f"{k}={v!r}" for k, v in args.items())
    record_event("compat", f"cupy.linalg.{name} routed to {to}: {tuple(a.shape)} "
                           f"{a.dtype.name}{', ' + desc if desc else ''}",
                 frontend="cupy", function=name, routed=True,
                 precision=_patch.current_precision())


def _finite(*arrays: Any) -> bool:
    import cupy

    return _patch.all_finite(cupy, *arrays)


def qr(a, mode="reduced"):
    """:func:`cupy.linalg.qr` computed by :func:`mpqr.qr`.

    Parameters
    ----------
    a : cupy.ndarray, shape (..., M, N)
    mode : {"reduced", "complete", "r", "raw"}
        ``"raw"`` (cuSOLVER's reflectors) keeps CuPy's path.

    Returns
    -------
    tuple or cupy.ndarray
        ``(Q, R)``; ``R`` for ``mode="r"``; in ``a``'s dtype, ``diag(R) >= 0``.

    Raises
    ------
    ValueError, numpy.linalg.LinAlgError
        CuPy's own errors, on its path.
    """
    reason = _kept({"a": a})
    if reason is None and (mode not in ("reduced", "complete", "r") or a.ndim < 2):
        reason = "CuPy's own mode or error"
    if reason is not None:
        return _keep("qr", reason, a, mode=mode)
    _route("qr", "mpqr.qr", a, mode=mode)
    with _patch.routing():
        out = mpqr.qr(a, mode=mode, precision=_patch.current_precision())
    return out if mode == "r" else tuple(out)


@functools.cache
def _rank_like() -> Any:
    """``rank`` as the installed CuPy's lstsq returns it (a Python int or a 0-d array),
    read once from CuPy itself on a 1 x 1 problem."""
    import cupy

    with _patch.routing():
        r = original("lstsq")(cupy.ones((1, 1)), cupy.ones(1), rcond=None)[2]
    if isinstance(r, cupy.ndarray):
        return lambda v: cupy.asarray(v, dtype=r.dtype)
    return type(r)


def lstsq(a, b, rcond=None):
    """:func:`cupy.linalg.lstsq` computed by :func:`mpqr.lstsq`.

    Parameters
    ----------
    a : cupy.ndarray, shape (M, N)
    b : cupy.ndarray, shape (M,) or (M, K)
    rcond : float, optional
        CuPy's rule: singular values ``<= rcond * s_max`` count as zero; ``None``:
        ``eps * max(M, N)``; ``rcond <= 0`` or ``>= 1``: ``eps``.

    Returns
    -------
    x, residuals, rank, s
        As CuPy: ``residuals`` is ``(K,)`` (``(1,)`` for 1-D ``b``) when ``M > N``
        and ``rank == N``, else empty; ``rank`` of CuPy's own type.

    Raises
    ------
    numpy.linalg.LinAlgError
        CuPy's own errors, on its path.
    """
    reason = _kept({"a": a, "b": b})
    if reason is None and (a.ndim != 2 or b.ndim not in (1, 2) or b.shape[0] != a.shape[0]
                           or a.dtype != b.dtype):
        reason = "CuPy's own shapes, dtypes or error"
    if reason is None and rcond is not None and (
            isinstance(rcond, bool) or not isinstance(rcond, (int, float))
            or not math.isfinite(rcond)):
        reason = "CuPy's own handling of `rcond`"
    if reason is None and not _finite(a, b):
        reason = "non-finite input"
    if reason is not None:
        return _keep("lstsq", reason, a, b, rcond=rcond)
    import cupy

    m, n = a.shape
    eps = float(cupy.finfo(a.dtype).eps)  # the real part's for complex dtypes
    cutoff = eps * max(m, n) if rcond is None else (eps if not 0 < rcond < 1 else rcond)
    _route("lstsq", "mpqr.lstsq", a, rcond=cutoff)
    with _patch.routing():
        x, res, rank, s = mpqr.lstsq(a, b, cutoff, check_finite=False,
                                     lapack_driver="gelsd",
                                     precision=_patch.current_precision())
    real = s.dtype
    if m > n and int(rank) == n:
        # the squared norms are real; a complex-typed result (seen on the GPU's route for
        # complex data) carries a zero imaginary part
        res = cupy.atleast_1d(res.real if res.dtype.kind == "c" else res).astype(
            real, copy=False)
    else:
        res = cupy.empty((0,), dtype=real)
    return x.astype(a.dtype, copy=False), res, _rank_like()(int(rank)), s


def svd(a, full_matrices=True, compute_uv=True):
    """:func:`cupy.linalg.svd` by the QR-SVD for tall or wide ``a``.

    Routed: ``full_matrices=False``, finite ``a`` with ``max(m, n) >= svd_min_aspect *
    min(m, n)`` (see :class:`patch`); other calls keep CuPy's path.

    Parameters
    ----------
    a : cupy.ndarray, shape (..., M, N)
    full_matrices, compute_uv : bool

    Returns
    -------
    tuple or cupy.ndarray
        ``(U, S, Vh)`` (``(..., M, K)``, ``(..., K)``, ``(..., K, N)``), or ``S`` for
        ``compute_uv=False``; singular vectors unique up to a sign/phase each.

    Raises
    ------
    numpy.linalg.LinAlgError
        CuPy's own errors, on its path.
    """
    reason = _kept({"a": a})
    if reason is None and full_matrices is not False:
        reason = "full_matrices is not False"
    if reason is None and a.ndim < 2:
        reason = "CuPy's own error"
    if reason is None:
        m, n = a.shape[-2:]
        aspect = _options()["svd_min_aspect"]
        if max(m, n) < aspect * min(m, n):
            reason = f"{m} x {n} is not {aspect:g} times as tall as wide (or wide as tall)"
    if reason is None and not _finite(a):
        reason = "non-finite input"
    if reason is not None:
        return _keep("svd", reason, a, full_matrices=full_matrices, compute_uv=compute_uv)
    prec = _patch.current_precision()
    m, n = a.shape[-2:]
    with _patch.routing():
        if compute_uv:
            _route("svd", "mpqr.svd", a, full_matrices=False)
            return tuple(mpqr.svd(a, full_matrices=False, precision=prec))
        _route("svd", "mpqr.qr (R) + cupy.linalg.svd of R", a, compute_uv=False)
        t = a if m >= n else a.swapaxes(-1, -2).conj()
        r = mpqr.qr(t, mode="r", precision=prec)
        return original("svd")(r, full_matrices=False, compute_uv=False)
