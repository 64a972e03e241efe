"""``scipy.linalg`` front ends: ``lstsq``, ``qr``, ``qr_multiply`` and ``rq`` with SciPy's
exact signatures.

Array-likes are converted with NumPy (as SciPy does); arrays of any Array API
library (CuPy...) stay where they are. Every mode runs on mpqr, ``pivoting=True`` and
``mode="raw"`` included. Batched calls (more than two dimensions) hand their results
back as the installed SciPy does (a list of stacked outputs, a lone output bare).
:func:`patch` routes existing ``scipy.linalg`` callers here.
"""

from __future__ import annotations

import functools
import numbers
import warnings
from typing import Any

import numpy as np
from mpqr.compat import _scipy_args as _args
from mpqr.compat._patch import current_precision, original, patch

import mpqr
from mpqr._validation import plain_array
from mpqr.lstsq import _scipy_rules as rules

__all__ = ["lstsq", "patch", "qr", "qr_multiply", "rq"]


def _as_array(x: Any, name: str, *, real_objects: bool = False) -> Any:
    from mpqr._array_api import _compat

    if _compat.is_array_api_obj(x) and not isinstance(x, (np.ndarray, np.generic)):
        return x  # CuPy & co. stay on their device
    arr = np.asarray(plain_array(x, name))  # masked arrays refused, numpy.matrix as ndarray
    if arr.dtype == np.dtype("O"):
        # SciPy's QR functions take an object array of real numbers as float64 (its lstsq
        # refuses every object array); None (which SciPy turns into NaN), text or complex
        # entries are refused
        if real_objects and all(isinstance(v, numbers.Real) for v in arr.flat):
            return arr.astype(np.float64)
        raise ValueError(f"object arrays are not supported (`{name}`)")
    return arr


def _is_numpy(x: Any) -> bool:
    return isinstance(x, np.ndarray)


@functools.cache
def _batch_packing(name: str) -> tuple[type, bool]:
    """How the installed SciPy's ``name`` hands back a batched call's results: the
    container of several outputs, and whether a lone output comes back bare. SciPy's
    batched linear algebra (``_apply_over_batch``, 1.15 on) gives a list, and one array
    where a 2-D call gives ``(R,)``; read once from SciPy itself on a 2 x 2 x 2 problem,
    so a release that changes it is followed."""
    f = original(name)
    a = np.stack([np.eye(2), 2 * np.eye(2)])
    try:
        if name == "lstsq":
            several, lone = f(a, np.ones((2, 2, 1))), None
        elif name == "qr_multiply":
            several, lone = f(a, np.ones((2, 2, 2))), None
        else:
            several, lone = f(a), f(a, mode="r")
    except Exception:  # a SciPy without batched calls: mpqr's own tuples
        return tuple, False
    container = type(several) if isinstance(several, (list, tuple)) else tuple
    return container, lone is not None and not isinstance(lone, (list, tuple))


def _batched(name: str, out: Any) -> Any:
    """A batched call's results packed as the installed SciPy packs them."""
    if not isinstance(out, tuple):
        return out
    container, bare = _batch_packing(name)
    return out[0] if bare and len(out) == 1 else container(out)


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
        As SciPy up to 1.17: ``overwrite_a``/``overwrite_b`` true but no integer with
        ``lapack_driver="gelss"`` (SciPy 1.18 hands no flag to LAPACK).

    Examples
    --------
    >>> import numpy as np
    >>> from mpqr.compat.scipy import lstsq
    >>> x, res, rank, s = lstsq([[1, 0], [0, 1], [1, 1]], [1, 1, 2])
    >>> np.round(x, 12).tolist(), int(rank)
    ([1.0, 1.0], 2)
    """
    if lapack_driver is None:
        lapack_driver = getattr(original("lstsq"), "default_lapack_driver", "gelsd")
    if rules.scipy_1_18_results():  # SciPy >= 1.18 reads the driver before anything else
        rules.check_driver(lapack_driver)
    a1, b1 = _as_array(a, "a"), _as_array(b, "b")
    if rules.scipy_1_18_results():
        # SciPy >= 1.18 warns of dtypes beyond LAPACK's (after its finiteness check),
        # reads overwrite_a's truth value with its dtype cast (before the shape checks),
        # overwrite_b's where the problem reaches LAPACK; neither goes to LAPACK as an
        # integer
        if lapack_driver in rules.DRIVERS and a1.ndim >= 2:
            if (_deprecated_dtype(a1) or _deprecated_dtype(b1)) and not (
                    check_finite and _has_non_finite(a1, b1)):
                _deprecate_dtypes_1_18("linalg.lstsq", a1, b1)
            _args.check_flag(overwrite_a, to_lapack=False)
        if _reaches_lapack(a1, b1, lapack_driver):
            _args.check_flag(overwrite_b, to_lapack=False)
    elif _reaches_lapack(a1, b1, lapack_driver):  # SciPy reads the flags there; gelss takes them
        for flag in (overwrite_a, overwrite_b):
            _args.check_flag(flag, to_lapack=False)
        for flag in (overwrite_a, overwrite_b):
            _args.check_flag(flag, to_lapack=lapack_driver == "gelss")
    # text arrays go to LAPACK's dtype as SciPy's wrappers take them: numbers written as
    # text converted, other text refused with NumPy's ValueError
    a1, b1 = (v.astype(np.float64) if _is_numpy(v) and v.dtype.kind in "US" else v
              for v in (a1, b1))
    x, res, rank, s = mpqr.lstsq(a1, b1, cond, overwrite_a, overwrite_b, check_finite,
                                 lapack_driver, precision=current_precision())
    if rules.scipy_1_18_results() and (overwrite_a or overwrite_b):
        x = _overwrite_as_scipy(a, b, a1, b1, x, overwrite_a, overwrite_b)
    if _is_numpy(x):
        x = np.asarray(x)
        res = np.asarray(res)
        if res.ndim == 0 and (0 in np.shape(a1)[-2:] or not rules.scipy_1_18_results()):
            # a NumPy scalar for 1-D b (SciPy 1.18: a 0-d array, but for an empty a still
            # the scalar of its early return)
            res = res[()]
        if s is not None:
            s = np.asarray(s)
        if not isinstance(rank, (int, np.integer)):
            rank = np.asarray(rank)
        elif 0 not in np.shape(a1)[-2:] and rules.scipy_1_18_results():  # SciPy >= 1.18
            rank = np.int64(rank)
    if a1.ndim > 2 or b1.ndim > 2:  # a batch from either argument
        if s is None and _is_numpy(x) and _batch_packing("lstsq")[0] is list:
            batch = np.broadcast_shapes(np.shape(a1)[:-2], np.shape(b1)[:-2])
            s = np.full(batch, None, dtype=object)  # SciPy stacks gelsy's Nones
        return _batched("lstsq", (x, res, rank, s))
    return x, res, rank, s


lstsq.default_lapack_driver = "gelsd"  # SciPy's body reads this off the module global


def _has_non_finite(*arrays: Any) -> bool:
    """Whether a floating array among ``arrays`` holds NaN or Inf (SciPy's check comes
    before its dtype warning)."""
    for x in arrays:
        xp = mpqr._array_api.array_namespace(x)
        if xp.isdtype(x.dtype, ("real floating", "complex floating")) and \
                not bool(xp.all(xp.isfinite(x))):
            return True
    return False


def _reaches_lapack(a: Any, b: Any, driver: Any) -> bool:
    """Whether SciPy's lstsq gets past its shape, empty-problem and driver checks."""
    if a.ndim < 2 or b.ndim < 1 or driver not in rules.DRIVERS:
        return False
    m, n = a.shape[-2:]
    return m > 0 and n > 0 and (b.shape[0] if b.ndim == 1 else b.shape[-2]) == m


_QR_MODES = ("full", "qr", "r", "economic", "raw")


def _scipy_default(name: str, param: str) -> Any:
    """The installed SciPy's default of ``name``'s parameter ``param`` (SciPy 1.18's
    ``lwork`` is a sentinel that tells "not given" from None), None where it has none."""
    import inspect

    try:
        return inspect.signature(original(name)).parameters[param].default
    except (KeyError, TypeError, ValueError):  # pragma: no cover - a SciPy without it
        return None


#: ``lwork``'s default as the installed SciPy has it: None up to 1.17, its "no value"
#: sentinel from 1.18 (where giving ``lwork`` at all is deprecated)
_LWORK = _scipy_default("qr", "lwork")
_RQ_LWORK = _scipy_default("rq", "lwork")


def _check_lwork_1_18(lwork: Any, m: int) -> None:
    """SciPy 1.18's ``qr`` with ``lwork`` given: a ``ValueError`` below ``M + 1`` but
    ``None`` and ``-1``, else its ``DeprecationWarning`` (it no longer uses it)."""
    if lwork is _LWORK:
        return
    if lwork is not None and lwork != -1 and lwork <= m:
        raise ValueError(f"lwork should be None, -1 or > M, got {lwork}")
    warnings.warn("scipy.linalg: the `lwork` keyword is deprecated and no longer in use"
                  " as of SciPy 1.18.0 and will be removed in SciPy 1.20.0",
                  DeprecationWarning, stacklevel=3)


def _dtype_char(x: Any) -> str:
    """NumPy's character code of ``x``'s dtype (also CuPy's); for a library whose dtypes
    NumPy cannot read (array-api-strict), the one of the dtype of the same name."""
    try:
        return np.dtype(x.dtype).char
    except TypeError:
        return np.dtype(str(x.dtype).rpartition(".")[2]).char


def _deprecated_dtype(x: Any) -> bool:
    """Whether SciPy 1.18 deprecates ``x``'s dtype for its linalg functions: neither an
    integer nor one of LAPACK's four (bool, float16, longdouble and the like)."""
    return _dtype_char(x) not in np.typecodes["AllInteger"] + "fdFD"


def _deprecate_dtypes_1_18(func_name: str, *arrays: Any) -> None:
    """SciPy 1.18's warning for the first array of a deprecated dtype."""
    for x in arrays:
        if _deprecated_dtype(x):
            char = _dtype_char(x)
            warnings.warn(f"Calling {func_name} with arguments of dtype={np.dtype(char)} "
                          f"(a.dtype.char = {char!r}) is deprecated in SciPy 1.18.0 and will "
                          "be removed in SciPy 1.20.0. Please cast array inputs to one of "
                          "np.float{32,64} or np.complex{64,128} manually.",
                          DeprecationWarning, stacklevel=3)
            return


def qr(a, overwrite_a=False, lwork=_LWORK, mode="full", pivoting=False, check_finite=True):
    """:func:`scipy.linalg.qr` computed by :func:`mpqr.qr`.

    Every mode runs on mpqr: ``"full"`` (also ``"qr"``), ``"economic"``, ``"r"``
    and ``"raw"`` (LAPACK's reflectors and ``tau``; for a stack where the installed SciPy
    gives them, 1.18 on), each with
    ``pivoting=True`` (``mpqr.qr(pivoting=True)``; ``P`` int32, as SciPy's).
    ``lwork`` and ``overwrite_a`` are checked as SciPy's LAPACK wrappers check them,
    with their exceptions and messages; ``lwork`` is otherwise unused. Results follow
    mpqr's sign convention (``diag(R) >= 0``, the raw reflectors too); SciPy/LAPACK
    documents none.

    Parameters
    ----------
    a, overwrite_a, lwork, mode, pivoting, check_finite
        As :func:`scipy.linalg.qr`.

    Returns
    -------
    tuple
        ``(Q, R)``, ``(R,)`` for ``mode="r"``, ``((h, tau), R)`` for
        ``mode="raw"``; ``P`` appended with ``pivoting=True``, as SciPy.

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
    if (type(a) is np.ndarray and a.ndim == 2 and a.dtype.char in "fdFD" and 0 not in a.shape
            and mode != "raw" and not pivoting and lwork is _LWORK and overwrite_a is False):
        # a plain 2-D LAPACK-typed array with default options: none of the checks below
        # applies, so a small call reaches mpqr.qr's fast path without their cost
        if check_finite and not np.isfinite(a).all():
            raise ValueError("array must not contain infs or NaNs")
        if mode == "r":
            r = mpqr.qr(a, mode="r", precision=current_precision())
            m, n = a.shape
            return (np.concatenate([r, np.zeros((m - n, n), dtype=r.dtype)]) if m > n
                    else r,)
        return tuple(mpqr.qr(a, mode="reduced" if mode == "economic" else "complete",
                             precision=current_precision()))
    a1 = _as_array(a, "a", real_objects=True)
    xp = mpqr._array_api.array_namespace(a1, names=("a",))
    if check_finite:
        fv = a1 if xp.isdtype(a1.dtype, ("real floating", "complex floating")) else \
            xp.astype(a1, xp.float64)
        if not bool(xp.all(xp.isfinite(fv))):
            raise ValueError("array must not contain infs or NaNs")
    new = rules.scipy_1_18_results()
    if new:
        _deprecate_dtypes_1_18("linalg.qr", a1)
    if a1.ndim < 2:
        raise ValueError("Expected at least a 2-D array" if new else "expected a 2-D array")
    if new:
        # SciPy >= 1.18: lwork checked (or deprecated), overwrite_a's truth value read with
        # the cast to the LAPACK dtype, then any empty input answered in that dtype
        _check_lwork_1_18(lwork, a1.shape[-2])
        _args.check_flag(overwrite_a, to_lapack=False)
        if 0 in a1.shape:
            wdt = rules.lapack_dtype(xp, a1.dtype)
            return _empty_qr(xp, a1 if a1.dtype == wdt else xp.astype(a1, wdt), mode,
                             pivoting, new=True)
    batch = a1.shape[:-2]
    if batch and 0 in batch:
        raise ValueError("`qr` does not support zero-size batches.")
    m, n = a1.shape[-2:]
    if mode == "raw" and batch and not new:  # SciPy before 1.18 has no stack of these
        raise ValueError(f"mode='raw' needs a 2-D `a` (one set of reflectors); got shape "
                         f"{tuple(a1.shape)}")
    if m == 0 or n == 0:
        return _empty_qr(xp, a1, mode, pivoting)
    wdt = rules.lapack_dtype(xp, a1.dtype)
    if not new:
        # what SciPy's LAPACK wrappers refuse (mpqr calls none): the overwrite flag, lwork
        _args.check_flag(overwrite_a, to_lapack=True)
        _args.check_qr_lwork(lwork, _args.lapack_prefix(xp, wdt), m, n, mode, pivoting)
    aw = a1 if a1.dtype == wdt else xp.astype(a1, wdt)
    prec = current_precision()
    # SciPy >= 1.18 factors a 2-D F-ordered `a` of LAPACK's dtype in place where
    # overwrite_a is set: the raw reflectors, R (modes "r", "full") or Q ("economic")
    # are returned in `a`'s memory
    into_a = (new and bool(overwrite_a) and a1 is a and _is_numpy(a1) and not batch
              and aw is a1 and a1.flags.f_contiguous and a1.flags.writeable)
    # no other result in `a`'s memory (SciPy 1.18 shares none): mpqr.qr gets no
    # permission to overwrite it there
    lend = bool(overwrite_a) and aw is a1 and not new
    if mode == "raw":
        if not batch:
            (h, tau), *rest = _qr_raw(xp, aw, pivoting, prec)
            if _is_numpy(h):  # LAPACK's layout: F-ordered
                h = np.asfortranarray(h)
            if into_a:
                a1[...] = h
                h = a1
            return ((h, tau), *rest)
        # SciPy >= 1.18: each matrix's ((h, tau), R[, P]), stacked over the batch
        outs = [_qr_raw(xp, aw[idx], pivoting, prec) for idx in np.ndindex(*batch)]
        parts = [(o[0][0], o[0][1], *o[1:]) for o in outs]
        h, tau, *rest = (xp.reshape(xp.stack([p[i] for p in parts]), (*batch, *parts[0][i].shape))
                         for i in range(len(parts[0])))
        if _is_numpy(h):  # each matrix F-ordered, as LAPACK leaves it
            h = np.swapaxes(np.ascontiguousarray(np.swapaxes(h, -1, -2)), -1, -2)
        return ((h, tau), *rest)
    if mode == "r":
        r = mpqr.qr(aw, mode="r", precision=prec, overwrite_a=lend, pivoting=bool(pivoting))
        r, extra = (r[0], (r[1],)) if pivoting else (r, ())
        if m > n:  # SciPy's mode='r' R is (M, N)
            pad = xp.zeros((*batch, m - n, n), dtype=r.dtype, device=mpqr._array_api.device(r))
            r = xp.concat([r, pad], axis=-2)
        if into_a:
            a1[...] = r
            r = a1
        return _batched("qr", (r, *extra)) if batch else (r, *extra)
    out = tuple(mpqr.qr(aw, mode="complete" if mode in ("full", "qr") else "reduced",
                        precision=prec, overwrite_a=lend, pivoting=bool(pivoting)))
    if into_a and mode == "economic":  # Q (M x K) in a's first K columns
        k = min(m, n)
        a1[:, :k] = out[0]
        out = (a1[:, :k], *out[1:])
    elif into_a:  # R (M x N)
        a1[...] = out[1]
        out = (out[0], a1, *out[2:])
    return _batched("qr", out) if batch else out


def _overwrite_as_scipy(a: Any, b: Any, a1: Any, b1: Any, x: Any, overwrite_a: Any,
                        overwrite_b: Any) -> Any:
    """SciPy >= 1.18's lstsq side effects: where LAPACK works in the caller's arrays (a
    2-D F-ordered NumPy array of the problem's LAPACK dtype, no batch), ``overwrite_a``
    leaves ``a`` destroyed (zeroed here: LAPACK leaves its factorization's work there,
    no result) and ``overwrite_b`` (``M >= N``) puts ``x`` into ``b``'s first ``N`` rows,
    the ``x`` returned being that view; ``x`` unchanged elsewhere."""
    if not (_is_numpy(a1) and _is_numpy(b1) and _is_numpy(x) and a1.ndim == 2
            and b1.ndim <= 2 and 0 not in a1.shape):
        return x
    m, n = a1.shape
    wdt = x.dtype
    if (overwrite_a and a1 is a and a1.dtype == wdt and a1.flags.f_contiguous
            and a1.flags.writeable):
        a1[...] = 0
    b2 = b1[:, None] if b1.ndim == 1 else b1
    if (overwrite_b and b1 is b and b1.dtype == wdt and b2.flags.f_contiguous
            and b2.flags.writeable and m >= n and b2.shape[0] == m):
        b2[:n] = x if x.ndim == 2 else x[:, None]
        return b2[:n] if b1.ndim == 2 else b1[:n]
    return x


def _qr_raw(xp: Any, a: Any, pivoting: bool, prec: Any) -> tuple[Any, ...]:
    """``((h, tau), R[, P])`` of a 2-D ``a`` in the working dtype: reflectors with
    ``diag(R) >= 0`` (:mod:`mpqr.qr.raw`), of ``a[:, P]`` with pivoting."""
    from mpqr.backends import get_backend

    from mpqr.policy import resolve_precision
    from mpqr.qr.raw import householder_raw

    k = min(a.shape)
    extra: tuple[Any, ...] = ()
    if pivoting:
        _, p = mpqr.qr(a, mode="r", precision=prec, pivoting=True)
        a = xp.take(a, xp.astype(p, xp.int64), axis=-1)
        extra = (p,)
    backend = get_backend(xp)
    h, tau = householder_raw(backend, a, precision=prec,
                             prec_name=resolve_precision(prec)[0])
    if pivoting:  # the same order refactored: rounding may differ, SciPy's promise holds
        from mpqr.qr.pivoted_exact import clamp_diagonal

        h = clamp_diagonal(backend, h)
    return ((h, tau), xp.triu(h[:k, :]), *extra)


def _empty_qr(xp: Any, a: Any, mode: str, pivoting: bool = False, *, new: bool = False
              ) -> tuple[Any, ...]:
    """The factors of an empty ``a`` (or of a stack of empty matrices) in ``mode``, as the
    installed SciPy gives them (``new``: 1.18's rules)."""
    *batch, m, n = a.shape
    dev = mpqr._array_api.device(a)
    k = min(m, n)
    if pivoting and new:  # SciPy >= 1.18: one P of LAPACK's integer, whatever the batch
        from scipy.linalg import lapack

        p = xp.arange(n, dtype=xp.int64 if lapack.HAS_ILP64 else xp.int32, device=dev)
        return (*_empty_qr(xp, a, mode), p)
    if pivoting:  # before: one per matrix of the batch
        p = xp.asarray(xp.broadcast_to(xp.arange(n, dtype=xp.int32, device=dev),
                                       (*batch, n)), copy=True)
        return (*_empty_qr(xp, a, mode), p)
    if mode == "raw":
        return ((xp.zeros((*batch, m, n), dtype=a.dtype, device=dev),
                 xp.zeros((*batch, k), dtype=a.dtype, device=dev)),
                xp.zeros((*batch, k, n), dtype=a.dtype, device=dev))
    if mode != "economic":
        q = xp.zeros((*batch, m, m), dtype=a.dtype, device=dev) + \
            xp.astype(xp.eye(m, dtype=xp.float64, device=dev), a.dtype)
        r = xp.zeros((*batch, m, n), dtype=a.dtype, device=dev)
    else:
        q = xp.zeros((*batch, m, k), dtype=a.dtype, device=dev)
        r = xp.zeros((*batch, k, n), dtype=a.dtype, device=dev)
    return (r,) if mode == "r" else (q, r)


def qr_multiply(a, c, mode="right", pivoting=False, conjugate=False, overwrite_a=False,
                overwrite_c=False):
    """:func:`scipy.linalg.qr_multiply` on :func:`qr`'s factorization.

    ``Q`` is the one :func:`qr` returns (``diag(R) >= 0``), so a program mixing the
    two sees one convention. The product runs through the precision policy
    (:func:`mpqr.matmul`); ``c`` is cast to ``a``'s LAPACK dtype, as SciPy does.

    Parameters
    ----------
    a, c, mode, pivoting, conjugate, overwrite_a, overwrite_c
        As :func:`scipy.linalg.qr_multiply` (the inputs are never modified).

    Returns
    -------
    tuple
        ``(CQ, R)`` or ``(CQ, R, P)``, as SciPy: ``Q @ c`` (``mode="left"``) or
        ``c @ Q`` (``"right"``) with the economic ``Q``, and ``R`` of shape ``(K, N)``.

    Raises
    ------
    ValueError
        As SciPy: unknown ``mode``, incompatible shapes, NaN/Inf in ``a`` or ``c``.

    Examples
    --------
    >>> import numpy as np
    >>> from mpqr.compat.scipy import qr, qr_multiply
    >>> a = np.array([[1.0, 3.0], [2.0, 3.0], [2.0, 4.0]])
    >>> qc, r = qr_multiply(a, np.eye(2), mode="left")
    >>> bool(np.allclose(qc, qr(a, mode="economic")[0]))
    True
    """
    a1, c1 = _as_array(a, "a", real_objects=True), _as_array(c, "c", real_objects=True)
    xp = mpqr._array_api.array_namespace(a1, c1, names=("a", "c"))
    core_c = 2 if c1.ndim > 1 else 1
    if (a1.ndim > 2 or c1.ndim > 2) and 0 in np.broadcast_shapes(
            a1.shape[:-2], c1.shape[:c1.ndim - core_c]):  # SciPy's batch decorator, first
        raise ValueError("`qr_multiply` does not support zero-size batches.")
    if mode not in ("left", "right"):
        raise ValueError(f"Mode argument can only be 'left' or 'right' but not '{mode}'")
    if a1.ndim > 2 or c1.ndim > 2:
        return _batched("qr_multiply", _over_batch(
            xp, lambda x, y: qr_multiply(x, y, mode, pivoting, conjugate, overwrite_a,
                                         overwrite_c), a1, c1, 2, core_c))
    cf = c1 if xp.isdtype(c1.dtype, ("real floating", "complex floating")) else \
        xp.astype(c1, xp.float64)
    if not bool(xp.all(xp.isfinite(cf))):
        raise ValueError("array must not contain infs or NaNs")
    onedim = c1.ndim < 2
    if onedim:
        c1 = xp.reshape(c1, (-1, 1) if mode == "left" else (1, -1))
    if a1.ndim < 2:
        a1 = xp.reshape(a1, (1, -1))
    m, n = a1.shape
    k = min(m, n)
    # SciPy's rule: with overwrite_c, a left c holds all M rows (Q's full columns)
    wide_c = mode == "left" and bool(overwrite_c) and m > n
    if mode == "left" and c1.shape[0] != (m if wide_c else k):
        raise ValueError("Array shapes are not compatible for Q @ c operation: "
                         f"{tuple(a1.shape)} vs {tuple(c1.shape)}")
    if mode == "right" and c1.shape[1] != m:
        raise ValueError("Array shapes are not compatible for c @ Q operation: "
                         f"{tuple(c1.shape)} vs {tuple(a1.shape)}")
    out = qr(a1, mode="full" if wide_c else "economic", pivoting=pivoting)
    q, rest = out[0], tuple(out[1:])
    if wide_c:
        rest = (rest[0][:k, :], *rest[1:])
    if 0 in c1.shape:  # SciPy answers an empty c in its 2-D form, a 1-D c too
        return (xp.empty_like(c1), *rest)
    if n == 0:  # no reflectors: SciPy's LAPACK call refuses them (its wrapper raises)
        raise ValueError(f"qr_multiply: `a` of shape {tuple(a1.shape)} has no columns, no "
                         f"reflectors to apply to `c` of shape {tuple(c1.shape)} (SciPy's "
                         "qr_multiply raises here too)")
    if conjugate:
        q = xp.conj(q)
    cw = c1 if c1.dtype == q.dtype else xp.astype(c1, q.dtype)
    prec = current_precision()
    cq = mpqr.matmul(q, cw, precision=prec) if mode == "left" else \
        mpqr.matmul(cw, q, precision=prec)
    return (xp.reshape(cq, (-1,)) if onedim else cq, *rest)


def rq(a, overwrite_a=False, lwork=_RQ_LWORK, mode="full", check_finite=True):
    """:func:`scipy.linalg.rq` from :func:`mpqr.qr` of the flipped conjugate transpose.

    ``A = R Q`` with ``R`` upper trapezoidal (``R = triu(R, N - M)``) and orthonormal
    rows of ``Q``: with ``J`` the reversal of rows or columns, the QR ``J A^H J = Q1 R1``
    (A's rows taken from the last, as LAPACK's ``gerqf`` takes them) gives
    ``R = J R1^H J`` and ``Q = J Q1^H J``, so ``R``'s diagonal (``R[i, i + N - M]``) is
    real and ``>= 0``, mpqr's convention, and a zero ``A`` gets LAPACK's ``Q`` (the
    identity's last rows).
    ``lwork`` is accepted and unused.

    Parameters
    ----------
    a, overwrite_a, lwork, mode, check_finite
        As :func:`scipy.linalg.rq` (``a`` is never modified).

    Returns
    -------
    R, Q
        As SciPy: ``(M, N)`` and ``(N, N)``; ``mode="economic"``: ``(M, K)`` and
        ``(K, N)``; ``mode="r"``: ``R`` only.

    Raises
    ------
    ValueError
        As SciPy: unknown ``mode``, ``a`` not 2-D, NaN/Inf with ``check_finite``.

    Examples
    --------
    >>> import numpy as np
    >>> from mpqr.compat.scipy import rq
    >>> a = np.arange(6.0).reshape(2, 3) + np.eye(2, 3)
    >>> r, q = rq(a)
    >>> bool(np.allclose(r @ q, a)), r.shape, q.shape
    (True, (2, 3), (3, 3))
    """
    a1 = _as_array(a, "a", real_objects=True)
    xp = mpqr._array_api.array_namespace(a1, names=("a",))
    # SciPy's batch decorator runs first: its dtype warning (1.18), the batch's size
    if rules.scipy_1_18_results() and a1.ndim >= 1 and _deprecated_dtype(a1):
        _deprecate_dtypes_1_18("rq", a1)
    if a1.ndim > 2 and 0 in a1.shape[:-2]:
        raise ValueError("`rq` does not support zero-size batches.")
    if mode not in ("full", "r", "economic"):
        raise ValueError("Mode argument should be one of ['full', 'r', 'economic']")
    if a1.ndim > 2:
        return _batched("rq", _over_batch(
            xp, lambda x: rq(x, mode=mode, check_finite=check_finite), a1, None, 2, None))
    if check_finite:
        fv = a1 if xp.isdtype(a1.dtype, ("real floating", "complex floating")) else \
            xp.astype(a1, xp.float64)
        if not bool(xp.all(xp.isfinite(fv))):
            raise ValueError("array must not contain infs or NaNs")
    if a1.ndim != 2:
        raise ValueError("expected matrix")
    wdt = rules.lapack_dtype(xp, a1.dtype)
    aw = a1 if a1.dtype == wdt else xp.astype(a1, wdt)
    m, n = aw.shape
    k = min(m, n)
    dev = mpqr._array_api.device(aw)
    if m == 0 or n == 0:  # as SciPy: the input's own dtype (no LAPACK call to cast for)
        dt = a1.dtype
        if mode == "economic":
            r, q = xp.zeros((m, k), dtype=dt, device=dev), xp.zeros((k, n), dtype=dt,
                                                                      device=dev)
        else:
            r = xp.zeros((m, n), dtype=dt, device=dev)
            q = xp.astype(xp.eye(n, dtype=xp.float64, device=dev), dt)
        return r if mode == "r" else (r, q)
    econ = mode == "economic" and n >= m
    # B = J A^H J (A conjugate transposed, its rows and columns reversed): B = Q1 R1, the
    # order in which LAPACK's gerqf takes A's rows (from the last): a zero A gets its Q
    b = xp.flip(xp.conj(xp.matrix_transpose(aw)) if xp.isdtype(wdt, "complex floating")
                else xp.matrix_transpose(aw), axis=(-2, -1))
    prec = current_precision()
    if mode == "r":
        r1 = mpqr.qr(b, mode="complete", precision=prec)[1]
        q1 = None
    else:
        q1, r1 = mpqr.qr(b, mode="reduced" if econ else "complete", precision=prec)

    def ht(x):
        t = xp.matrix_transpose(x)
        return xp.conj(t) if xp.isdtype(wdt, "complex floating") else t

    r = xp.flip(ht(r1), axis=(-2, -1))  # J R1^H J
    if mode == "r":
        return r
    return r, xp.flip(ht(q1), axis=(-2, -1))  # J Q1^H J


def _over_batch(xp: Any, func: Any, a: Any, c: Any, core_a: int, core_c: int | None
                ) -> tuple[Any, ...]:
    """``func`` over the broadcast batch dimensions of ``a`` (and ``c``), results stacked
    (SciPy's rule for its batched linear algebra)."""
    ba = a.shape[:a.ndim - core_a]
    bc = () if c is None else c.shape[:c.ndim - core_c]
    batch = np.broadcast_shapes(ba, bc)
    a = xp.broadcast_to(a, (*batch, *a.shape[a.ndim - core_a:]))
    if c is not None:
        c = xp.broadcast_to(c, (*batch, *c.shape[c.ndim - core_c:]))
    outs = [func(a[idx], *(() if c is None else (c[idx],))) for idx in np.ndindex(*batch)]
    single = not isinstance(outs[0], tuple)
    if single:
        return xp.reshape(xp.stack(outs), (*batch, *outs[0].shape))
    return tuple(xp.reshape(xp.stack([o[i] for o in outs]), (*batch, *outs[0][i].shape))
                 for i in range(len(outs[0])))


