"""``scipy.linalg`` front ends: ``lstsq`` and ``qr`` with SciPy's exact signatures.

Array-likes are converted with NumPy (as SciPy does); arrays of any Array API
library (CuPy...) stay where they are. What mpqr does not do natively
(``qr(pivoting=True)``, ``qr(mode="raw")``) is delegated to SciPy with a
one-time warning. :func:`patch` routes existing ``scipy.linalg`` callers here.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mpqr.compat import _scipy_args as _args
from mpqr.compat._patch import current_precision, original, patch, warn_once

import mpqr
from mpqr._validation import plain_array
from mpqr.lstsq import _scipy_rules as rules

__all__ = ["lstsq", "patch", "qr"]


def _as_array(x: Any, name: str) -> Any:
    from mpqr._array_api import _compat

    if _compat.is_array_api_obj(x) and not isinstance(x, np.ndarray):
        return x  # CuPy & co. stay on their device
    arr = np.asarray(plain_array(x, name))  # masked arrays refused, numpy.matrix as ndarray
    if arr.dtype == np.dtype("O"):
        raise ValueError(f"object arrays are not supported (`{name}`)")
    return arr


def _is_numpy(x: Any) -> bool:
    return isinstance(x, np.ndarray)


def lstsq(a, b, cond=None, overwrite_a=False, overwrite_b=False, check_finite=True,
          lapack_driver=None):
    """:func:`scipy.linalg.lstsq` computed by :func:`mpqr.lstsq`.

    Same parameters, results and errors as SciPy (``residues`` for 1-D ``b``
    is a NumPy scalar for NumPy input). The precision is that of the active
    :func:`patch` block, else the ``mpqr.precision`` setting.

    Parameters
    ----------
    a, b, cond, overwrite_a, overwrite_b, check_finite, lapack_driver
        As :func:`scipy.linalg.lstsq`.

    Returns
    -------
    x, residues, rank, s
        As :func:`scipy.linalg.lstsq`.

    Raises
    ------
    ValueError
        As SciPy; also a NaN or infinite ``cond`` (SciPy's drivers would silently
        count every singular value or use their default).
    TypeError
        As SciPy: ``overwrite_a``/``overwrite_b`` true but no integer with
        ``lapack_driver="gelss"``.

    Examples
    --------
    >>> import numpy as np
    >>> from mpqr.compat.scipy import lstsq
    >>> x, res, rank, s = lstsq([[1, 0], [0, 1], [1, 1]], [1, 1, 2])
    >>> np.round(x, 12).tolist(), rank
    ([1.0, 1.0], 2)
    """
    a1, b1 = _as_array(a, "a"), _as_array(b, "b")
    if lapack_driver is None:
        lapack_driver = getattr(original("lstsq"), "default_lapack_driver", "gelsd")
    if _reaches_lapack(a1, b1, lapack_driver):  # SciPy reads the flags there; gelss takes them
        for flag in (overwrite_a, overwrite_b):
            _args.check_flag(flag, to_lapack=False)
        for flag in (overwrite_a, overwrite_b):
            _args.check_flag(flag, to_lapack=lapack_driver == "gelss")
    x, res, rank, s = mpqr.lstsq(a1, b1, cond, overwrite_a, overwrite_b, check_finite,
                                 lapack_driver, precision=current_precision())
    if _is_numpy(x):
        x = np.asarray(x)
        res = np.asarray(res)
        if res.ndim == 0:
            res = res[()]  # SciPy gives a NumPy scalar for 1-D b
        if s is not None:
            s = np.asarray(s)
        if not isinstance(rank, int):
            rank = np.asarray(rank)
        elif 0 not in np.shape(a1)[-2:] and rules.scipy_1_18_results():  # SciPy >= 1.18
            rank = np.int64(rank)
    return x, res, rank, s


lstsq.default_lapack_driver = "gelsd"  # SciPy's body reads this off the module global


def _reaches_lapack(a: Any, b: Any, driver: Any) -> bool:
    """Whether SciPy's lstsq gets past its shape, empty-problem and driver checks."""
    if a.ndim < 2 or b.ndim < 1 or driver not in rules.DRIVERS:
        return False
    m, n = a.shape[-2:]
    return m > 0 and n > 0 and (b.shape[0] if b.ndim == 1 else b.shape[-2]) == m


_QR_MODES = ("full", "qr", "r", "economic", "raw")


def qr(a, overwrite_a=False, lwork=None, mode="full", pivoting=False, check_finite=True):
    """:func:`scipy.linalg.qr` computed by :func:`mpqr.qr`.

    Modes ``"full"`` (also ``"qr"``), ``"economic"`` and ``"r"`` run on mpqr;
    ``pivoting=True`` and ``mode="raw"`` are delegated to SciPy (one warning
    per process). ``lwork`` and ``overwrite_a`` are checked as SciPy's LAPACK
    wrappers check them, with their exceptions and messages; ``lwork`` is otherwise
    unused. Results follow mpqr's sign convention (``diag(R) >= 0``); SciPy/LAPACK
    documents none.

    Parameters
    ----------
    a, overwrite_a, lwork, mode, pivoting, check_finite
        As :func:`scipy.linalg.qr`.

    Returns
    -------
    tuple
        ``(Q, R)``, or ``(R,)`` for ``mode="r"``, as SciPy.

    Raises
    ------
    ValueError
        As SciPy: unknown mode, non-2-D input, NaN/Inf with ``check_finite``.
    Exception
        As SciPy: its LAPACK wrappers' error for ``lwork`` below ``N`` (or, where Q
        is formed, below Q's column count) other than ``-1``; ``TypeError`` for an
        ``overwrite_a`` that is true but no integer.

    Examples
    --------
    >>> import numpy as np
    >>> from mpqr.compat.scipy import qr
    >>> q, r = qr(np.array([[3.0, 1.0], [4.0, 2.0]]))
    >>> bool(np.allclose(q @ r, [[3, 1], [4, 2]]))
    True
    """
    if mode not in _QR_MODES:
        raise ValueError("Mode argument should be one of ['full', 'r', 'economic', 'raw']")
    if pivoting or mode == "raw":
        what = "pivoting=True" if pivoting else "mode='raw'"
        warn_once(f"qr-{what}", f"mpqr.compat.scipy.qr: {what} is not supported by mpqr; "
                  "delegating to scipy.linalg.qr (warned once)")
        return original("qr")(a, overwrite_a=overwrite_a, lwork=lwork, mode=mode,
                              pivoting=pivoting, check_finite=check_finite)
    a1 = _as_array(a, "a")
    xp = mpqr._array_api.array_namespace(a1, names=("a",))
    if check_finite:
        fv = a1 if xp.isdtype(a1.dtype, ("real floating", "complex floating")) else \
            xp.astype(a1, xp.float64)
        if not bool(xp.all(xp.isfinite(fv))):
            raise ValueError("array must not contain infs or NaNs")
    if a1.ndim < 2:
        raise ValueError("expected a 2-D array")
    batch = a1.shape[:-2]
    if batch and 0 in batch:
        raise ValueError("`qr` does not support zero-size batches.")
    m, n = a1.shape[-2:]
    if m == 0 or n == 0:
        return _empty_qr(xp, a1, mode)
    wdt = rules.lapack_dtype(xp, a1.dtype)
    # what SciPy's LAPACK wrappers refuse (mpqr calls none): the overwrite flag, lwork
    _args.check_flag(overwrite_a, to_lapack=True)
    _args.check_qr_lwork(lwork, _args.lapack_prefix(xp, wdt), m, n, mode, pivoting)
    aw = a1 if a1.dtype == wdt else xp.astype(a1, wdt)
    prec = current_precision()
    if mode == "r":
        r = mpqr.qr(aw, mode="r", precision=prec, overwrite_a=overwrite_a and aw is a1)
        if m > n:  # SciPy's mode='r' R is (M, N)
            pad = xp.zeros((*batch, m - n, n), dtype=r.dtype, device=mpqr._array_api.device(r))
            r = xp.concat([r, pad], axis=-2)
        return (r,)
    q, r = mpqr.qr(aw, mode="complete" if mode in ("full", "qr") else "reduced",
                   precision=prec, overwrite_a=overwrite_a and aw is a1)
    return q, r


def _empty_qr(xp: Any, a: Any, mode: str) -> tuple[Any, ...]:
    *batch, m, n = a.shape
    dev = mpqr._array_api.device(a)
    k = min(m, n)
    if mode != "economic":
        q = xp.zeros((*batch, m, m), dtype=a.dtype, device=dev) + \
            xp.astype(xp.eye(m, dtype=xp.float64, device=dev), a.dtype)
        r = xp.zeros((*batch, m, n), dtype=a.dtype, device=dev)
    else:
        q = xp.zeros((*batch, m, k), dtype=a.dtype, device=dev)
        r = xp.zeros((*batch, k, n), dtype=a.dtype, device=dev)
    return (r,) if mode == "r" else (q, r)
