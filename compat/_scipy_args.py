"""SciPy's checks of the LAPACK-level arguments of ``qr`` and ``lstsq``.

``scipy.linalg.qr`` hands ``lwork`` and ``overwrite_a`` to its f2py wrappers of
``?geqrf`` and ``?orgqr``/``?ungqr``, and ``scipy.linalg.lstsq`` hands the overwrite
flags to ``?gelss``: the wrappers convert them to C ``int`` and check
``lwork >= n or lwork == -1``. mpqr calls no LAPACK, so the front ends repeat those
conversions and checks here, with SciPy's exception types and messages. Only
:func:`lapack_error` imports SciPy.
"""

from __future__ import annotations

import functools
import operator
from typing import Any

__all__ = ["check_flag", "check_qr_lwork", "lapack_error", "lapack_prefix"]

_INT_MIN, _INT_MAX = -(2**31), 2**31 - 1


@functools.cache
def lapack_error() -> type[Exception]:
    """The exception class of SciPy's f2py LAPACK wrappers (``_flapack.error``), taken
    from one rejected call on a 1 x 2 matrix (the class is not public)."""
    import numpy as np
    from scipy.linalg import get_lapack_funcs

    (geqrf,) = get_lapack_funcs(("geqrf",), dtype=np.float64)
    try:
        geqrf(np.ones((1, 2)), lwork=0)
    except Exception as exc:
        return type(exc)
    return ValueError  # pragma: no cover - a wrapper without the check


def check_flag(value: Any, *, to_lapack: bool) -> None:
    """SciPy's reading of ``overwrite_a``/``overwrite_b``: its truth value (``ValueError``
    for an array of several elements), then, where the flag reaches an f2py wrapper
    (``to_lapack``), a true value must be an integer (``TypeError``: ``'str' object
    cannot be interpreted as an integer``)."""
    if value and to_lapack:
        operator.index(value)


def _c_int(v: int) -> int:
    if not _INT_MIN <= v <= _INT_MAX:
        raise OverflowError("Python int too large to convert to C int")
    return v


def _is_sequence(value: Any) -> bool:
    """CPython's ``PySequence_Check`` for what reaches it here: not a string, bytes, dict
    or NumPy scalar (those index as mappings), and indexable."""
    import numpy as np

    if isinstance(value, (str, bytes, dict, np.generic)):
        return False
    return hasattr(type(value), "__getitem__")


def _f2py_int(value: Any, errmess: str) -> int:
    """f2py's ``int_from_pyobj``: ``int(value)`` (floats truncate, numeric strings
    parse), else the real part of a complex or the first item of a sequence; failing
    that, the last error's type with f2py's message."""
    if isinstance(value, int):
        return _c_int(int(value))
    try:
        return _c_int(int(value))
    except OverflowError as exc:
        if "C int" in str(exc):  # converted, but out of C int's range
            raise
        err: type[BaseException] = type(exc)
    except Exception as exc:
        err = type(exc)
    item: Any = None
    if isinstance(value, complex):
        item = (value.real,)
    elif _is_sequence(value):
        try:
            item = (value[0],)
        except Exception as exc:
            err = type(exc)
    if item is not None:
        try:
            return _f2py_int(item[0], errmess)
        except Exception as exc:
            err = type(exc)
    raise err(errmess)


def lapack_prefix(xp: Any, dtype: Any) -> str:
    """LAPACK's letter for one of the four LAPACK dtypes of namespace ``xp``."""
    return {xp.float32: "s", xp.float64: "d", xp.complex64: "c", xp.complex128: "z"}[dtype]


def check_qr_lwork(lwork: Any, prefix: str, m: int, n: int, mode: str,
                   pivoting: bool = False) -> None:
    """``scipy.linalg.qr``'s checks of ``lwork`` for one non-empty ``m x n`` matrix of the
    LAPACK type ``prefix`` (:func:`lapack_prefix`): ``None`` and ``-1`` ask for the optimal size;
    otherwise ``?geqrf`` needs ``lwork >= n`` (without pivoting: ``?geqp3`` takes no
    ``lwork``), then ``?orgqr``/``?ungqr``, which forms Q (not for ``mode="r"``/``"raw"``),
    ``lwork >=`` Q's column count."""
    if lwork is None or lwork == -1:  # SciPy's `lwork in (None, -1)`: a workspace query
        return
    p = prefix
    cplx = p in ("c", "z")
    checks = [] if pivoting else [("geqrf", n)]
    if mode not in ("r", "raw"):
        checks.append(("ungqr" if cplx else "orgqr", m if mode in ("full", "qr") else
                       min(m, n)))
    for routine, need in checks:
        v = _f2py_int(lwork, f"_flapack.{p}{routine}() 1st keyword (lwork) can't be "
                             "converted to int")
        if not (v >= need or v == -1):
            raise lapack_error()("(lwork>=n||lwork==-1) failed for 1st keyword lwork: "
                                 f"{p}{routine}:lwork={v}")
