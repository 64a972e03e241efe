"""``numpy.linalg`` front ends: ``lstsq`` and ``qr`` following NumPy's rules.

Differences from SciPy that NumPy users rely on, and that these keep: the
default ``rcond`` is ``eps * max(M, N)``; single-precision input is computed
in double precision and returned in single; ``residuals`` is ``(1,)``-shaped
for 1-D ``b`` and empty unless ``rank == N < M`` (real dtype); errors are
:class:`numpy.linalg.LinAlgError` with NumPy's messages.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import numpy as np
from mpqr.compat._patch import current_precision

import mpqr
from mpqr._array_api import array_namespace, device
from mpqr._validation import check_cutoff, plain_array
from mpqr.qr import QRResult

__all__ = ["lstsq", "qr"]


def _as_array(x: Any, name: str) -> Any:
    from mpqr._array_api import _compat

    if _compat.is_array_api_obj(x) and not isinstance(x, (np.ndarray, np.generic)):
        return x
    return np.asarray(plain_array(x, name))  # a masked array's mask would be ignored


def _wrap(x: Any) -> Any:
    """NumPy's ``_makearray`` wrap: results take the type of an ndarray subclass
    (``numpy.matrix`` in, ``numpy.matrix`` out)."""
    if isinstance(x, np.ndarray) and type(x) is not np.ndarray:
        return x.__array_wrap__
    return lambda y: y


def _types(xp: Any, *arrays: Any) -> tuple[Any, Any]:
    """NumPy's ``_commonType``: (computation dtype, result dtype)."""
    is_c = False
    single = True
    for a in arrays:
        dt = a.dtype
        if xp.isdtype(dt, ("real floating", "complex floating")) and dt not in (
                xp.float32, xp.float64, xp.complex64, xp.complex128):
            # float16, longdouble, clongdouble
            raise TypeError(f"array type {getattr(dt, 'name', dt)} is unsupported in linalg")
        if xp.isdtype(dt, "complex floating"):
            is_c = True
            single &= dt == xp.complex64
        elif xp.isdtype(dt, "real floating"):
            single &= dt == xp.float32
        else:
            single = False
    t = xp.complex128 if is_c else xp.float64
    r = (xp.complex64 if is_c else xp.float32) if single else t
    return t, r


def _no_loop(v: Any) -> bool:
    """Whether NumPy's linalg gufuncs have no loop for ``v``'s dtype (object, strings,
    dates, records: neither bool nor a number)."""
    return isinstance(v, np.ndarray) and v.dtype.kind not in "biufc"


def _check_loop(ufunc: str, *arrays: Any) -> None:
    """NumPy's ``TypeError`` for the first input its gufunc ``ufunc`` has no loop for, with
    the target dtype NumPy names (complex where another input is), and the argument."""
    bad = [i for i, v in enumerate(arrays) if _no_loop(v)]
    if not bad:
        return
    cplx = any(v.dtype.kind == "c" for v in arrays if not _no_loop(v) and hasattr(v, "dtype"))
    i = bad[0]
    to = "complex128" if cplx else "float64"
    raise TypeError(f"Cannot cast ufunc '{ufunc}' input {i} from {arrays[i].dtype!r} to "
                    f"dtype('{to}') with casting rule 'same_kind' (`{'ab'[i]}`)")


def _real(xp: Any, dt: Any) -> Any:
    return {xp.complex128: xp.float64, xp.complex64: xp.float32}.get(dt, dt)


def lstsq(a, b, rcond=None):
    """:func:`numpy.linalg.lstsq` computed by :func:`mpqr.lstsq`.

    Parameters
    ----------
    a : (M, N) array_like
    b : (M,) or (M, K) array_like
    rcond : float, optional
        Cutoff ratio for small singular values (default ``eps * max(M, N)``). As in
        NumPy, whose LAPACK driver (gelsd) reads it: ``rcond <= 0`` (``-1`` included)
        and ``rcond >= 1`` cut at the unit roundoff of double precision, ``2**-53``
        times the largest singular value, also for single-precision input (computed
        in double precision).

    Returns
    -------
    x, residuals, rank, s
        As :func:`numpy.linalg.lstsq`.

    Raises
    ------
    numpy.linalg.LinAlgError
        Non-2-D input, incompatible dimensions, NaN/Inf in ``a``.
    ValueError
        ``rcond`` NaN or ±Inf (NumPy would silently count every singular value or
        none).
    TypeError
        ``rcond`` not a real number.

    Examples
    --------
    >>> import numpy as np
    >>> from mpqr.compat.numpy import lstsq
    >>> x, res, rank, s = lstsq(np.array([[1.0, 0], [0, 1], [1, 1]]), np.array([1.0, 1, 2]))
    >>> np.round(x, 12).tolist(), res.shape, int(rank)
    ([1.0, 1.0], (1,), 2)
    """
    rcond = check_cutoff(rcond, "rcond")
    a1, b1 = _as_array(a, "a"), _as_array(b, "b")
    _check_loop("lstsq", a1, b1)
    wrap = _wrap(b)
    xp = array_namespace(a1, b1, names=("a", "b"))
    is_1d = b1.ndim == 1
    b2 = xp.reshape(b1, (b1.shape[0], 1)) if is_1d else b1
    for v in (a1, b2):
        if v.ndim != 2:
            raise np.linalg.LinAlgError(
                f"{v.ndim}-dimensional array given. Array must be two-dimensional")
    m, n = a1.shape
    if m != b2.shape[0]:
        raise np.linalg.LinAlgError("Incompatible dimensions")
    t, result_t = _types(xp, a1, b2)
    real_t = _real(xp, result_t)
    if rcond is None:
        rcond = float(xp.finfo(t).eps) * max(n, m)
    dev = device(a1)
    k = b2.shape[1]
    if m == 0 or n == 0:
        x = xp.zeros((n, k), dtype=result_t, device=dev)
        s = xp.zeros((0,), dtype=real_t, device=dev)
        if m > n:  # rank 0 == n < m: NumPy reports the residuals ||b||^2
            bt = xp.astype(b2, t)
            res = xp.astype(xp.sum(xp.real(bt * xp.conj(bt)), axis=0), real_t)
        else:
            res = xp.zeros((0,), dtype=real_t, device=dev)
        return wrap(x[:, 0] if is_1d else x), wrap(res), _rank(0), s
    try:
        # NumPy's driver is gelsd, which sets the cut of rcond <= 0 and rcond >= 1; a
        # negative rcond goes on as 0, which gelsd reads the same (newer SciPy refuses < 0)
        x, res, rank, s = mpqr.lstsq(xp.astype(a1, t), xp.astype(b2, t), max(rcond, 0.0),
                                     check_finite=False, lapack_driver="gelsd",
                                     precision=current_precision())
    except mpqr.LinAlgError as exc:
        raise np.linalg.LinAlgError("SVD did not converge in Linear Least Squares") from exc
    if rank == n and m > n:  # the solver's squared residual norms, as SciPy's front end's
        res = xp.astype(xp.real(res) if xp.isdtype(res.dtype, "complex floating") else res,
                        real_t)
    else:
        res = xp.zeros((0,), dtype=real_t, device=dev)
    x = xp.astype(x, result_t)
    return wrap(x[:, 0] if is_1d else x), wrap(res), _rank(int(rank)), xp.astype(s, real_t)


@functools.cache
def _rank_type() -> type:
    """The type of ``rank`` the installed NumPy's lstsq returns (``numpy.int32`` in
    NumPy 2, a Python ``int`` before), read once from NumPy itself."""
    return type(np.linalg.lstsq(np.eye(1), np.ones(1), rcond=None)[2])


def _rank(r: int) -> Any:
    return _rank_type()(r)


_MODES = ("reduced", "complete", "r", "raw")


def _raw(xp: Any, a: Any) -> tuple[Any, Any]:
    """NumPy's raw ``(h, tau)`` of a stack ``a``: mpqr's reflectors (:mod:`mpqr.qr.raw`),
    each matrix's array transposed as NumPy returns it."""
    from mpqr.backends import get_backend

    from mpqr.policy import resolve_precision
    from mpqr.qr.raw import householder_raw

    backend = get_backend(xp)
    prec = current_precision()
    *batch, m, n = a.shape
    k = min(m, n)
    h = xp.empty((*batch, n, m), dtype=a.dtype, device=device(a))
    tau = xp.empty((*batch, k), dtype=a.dtype, device=device(a))
    for idx in np.ndindex(*batch):
        hi, ti = householder_raw(backend, a[idx], precision=prec,
                                 prec_name=resolve_precision(prec)[0])
        h[idx] = xp.matrix_transpose(hi)
        tau[idx] = ti
    return h, tau


def qr(a, mode="reduced"):
    """:func:`numpy.linalg.qr` computed by :func:`mpqr.qr` (stacks supported).

    Every mode runs on mpqr, ``mode="raw"`` too: NumPy's ``(h, tau)``, ``h`` the
    transpose of LAPACK's reflectors-and-R array (``(..., N, M)``), from mpqr's
    reflectors. Signs follow mpqr's ``diag(R) >= 0`` (the raw reflectors' too, so LAPACK's
    ``orgqr`` of them gives the ``Q`` of the other modes).

    Parameters
    ----------
    a : (..., M, N) array_like
    mode : {"reduced", "complete", "r", "raw"}
        NumPy's deprecated ``"full"``/``"f"`` (``"reduced"``) and ``"economic"``/``"e"``
        (LAPACK's reflectors-and-R array, ``(..., M, N)``) too, with its
        ``DeprecationWarning``.

    Returns
    -------
    QRResult(Q, R), or R for ``mode="r"``, or ``(h, tau)`` for ``"raw"``, or the
    reflectors-and-R array for ``"economic"``.

    Raises
    ------
    ValueError
        Unknown mode.
    numpy.linalg.LinAlgError
        Input with fewer than two dimensions.

    Examples
    --------
    >>> import numpy as np
    >>> from mpqr.compat.numpy import qr
    >>> q, r = qr(np.array([[3.0, 1.0], [4.0, 2.0]]))
    >>> bool(np.allclose(q @ r, [[3, 1], [4, 2]]))
    True
    """
    if mode not in _MODES:
        # NumPy's deprecated spellings, with its warnings: "full" is "reduced", "economic"
        # LAPACK's reflectors-and-R array itself (the transpose of raw's ``h``); the
        # installed NumPy says which it still takes (its ValueError where it does not)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            np.linalg.qr(np.zeros((1, 1)), mode=mode)
        if mode in ("f", "full"):
            warnings.warn("The 'full' option is deprecated in favor of 'reduced'.\n"
                          "For backward compatibility let mode default.",
                          DeprecationWarning, stacklevel=2)
            mode = "reduced"
        elif mode in ("e", "economic"):
            warnings.warn("The 'economic' option is deprecated.", DeprecationWarning,
                          stacklevel=2)
            mode = "economic"
        else:
            raise ValueError(f"Unrecognized mode '{mode}'")
    a1, wrap = _as_array(a, "a"), _wrap(a)
    xp = array_namespace(a1, names=("a",))
    if a1.ndim < 2:
        raise np.linalg.LinAlgError(
            f"{a1.ndim}-dimensional array given. Array must be at least two-dimensional")
    t, result_t = _types(xp, a1)
    if mode in ("raw", "economic"):
        with np.errstate(all="ignore"):  # NaN/Inf pass through as NumPy's LAPACK call does
            h, tau = _raw(xp, xp.astype(a1, t))
        if mode == "economic":
            return wrap(xp.astype(xp.matrix_transpose(h), result_t))
        return wrap(xp.astype(h, result_t)), xp.astype(tau, result_t)
    out = mpqr.qr(xp.astype(a1, t), mode=mode, precision=current_precision())
    if mode == "r":
        return wrap(xp.astype(out, result_t))
    return QRResult(wrap(xp.astype(out.Q, result_t)), wrap(xp.astype(out.R, result_t)))
