"""NumPy's types where the core meets them, without the core importing NumPy.

* :data:`LINALG_ERROR` is ``numpy.linalg.LinAlgError`` (``scipy.linalg.LinAlgError``
  is the same class): the base of :class:`mpqr.LinAlgError`, so code written for
  NumPy or SciPy (``except scipy.linalg.LinAlgError:``) catches mpqr's errors.
* :func:`plain_array` takes NumPy's ``ndarray`` subclasses as SciPy's ``linalg`` does:
  ``numpy.matrix`` (and any other subclass) becomes a plain ``ndarray`` view, so the
  results are ndarrays; a masked array is refused, since its mask would be ignored;
  byte-swapped data becomes a copy in native order.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["LINALG_ERROR", "plain_array"]


def _linalg_error() -> type[ValueError]:
    try:
        from numpy.linalg import LinAlgError
    except ImportError:  # pragma: no cover - NumPy is a dependency of mpqr
        return ValueError  # NumPy's LinAlgError is a ValueError too
    return LinAlgError


#: ``numpy.linalg.LinAlgError``, a ``ValueError`` subclass.
LINALG_ERROR: type[ValueError] = _linalg_error()


def plain_array(x: Any, name: str) -> Any:
    """``x`` as a plain ``ndarray`` if it is an instance of an ``ndarray`` subclass, and in
    the machine's byte order if it is not (a native copy: the input is not modified).

    Raises ``ValueError`` for a ``numpy.ma.MaskedArray`` (SciPy's message, naming
    the argument). Anything that is not a NumPy array is returned as it is.
    """
    np = sys.modules.get("numpy")  # a NumPy array implies a loaded NumPy
    if np is None or not isinstance(x, np.ndarray):
        return x
    if type(x) is not np.ndarray:
        ma = sys.modules.get("numpy.ma")
        if ma is not None and isinstance(x, ma.MaskedArray):
            raise ValueError(f"masked arrays are not supported (`{name}` is a "
                             "numpy.ma.MaskedArray, whose mask would be ignored); pass "
                             f"`{name}.filled(value)`, choosing the value of the masked "
                             "entries")
        x = np.asarray(x)  # numpy.matrix & co.: a view, as SciPy's asarray gives
    if not x.dtype.isnative:
        # byte-swapped data (FITS files, network order): NumPy and SciPy compute it in
        # the same dtype in native order, which every dtype test here compares against
        x = x.astype(x.dtype.newbyteorder("="))
    return x
