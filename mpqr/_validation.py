r"""Shared argument validation: one place, one message style.

Messages name the argument, say what was expected and what was got:
``\`a\` must be 2-D, got ndim=1``.
"""

from __future__ import annotations

import math
from typing import Any

from mpqr._array_api import array_namespace, device
from mpqr.backends.numpy.types import plain_array

__all__ = [
    "check_choice",
    "check_cutoff",
    "check_dtype",
    "check_finite",
    "check_ndim",
    "check_same_device",
    "namespace_of",
    "plain_array",
]


def namespace_of(*arrays: Any, names: tuple[str, ...]) -> Any:
    """Common namespace of the arrays; ``TypeError`` naming them otherwise
    (``ValueError`` for a NumPy masked array: see :func:`plain_array`)."""
    for name, a in zip(names, arrays):
        plain_array(a, name)  # a masked array's mask would be ignored: refuse it
        # NumPy scalars are Python floats too; the array-only rule must name them here
        if isinstance(a, (bool, int, float, complex)):
            raise TypeError(
                f"`{name}` must be an array of an Array API library (NumPy, CuPy, ...), "
                f"got scalar {type(a).__module__}.{type(a).__qualname__}"
            )
    xp = array_namespace(*arrays, names=names)
    check_same_device(*arrays, names=names)
    return xp


def check_same_device(*arrays: Any, names: tuple[str, ...]) -> None:
    devs = [(n, device(a)) for n, a in zip(names, arrays) if a is not None]
    if len({repr(d) for _, d in devs}) > 1:
        desc = ", ".join(f"`{n}` on {d!r}" for n, d in devs)
        raise ValueError(f"arrays must be on one device, got {desc}; nothing is moved silently")


def check_ndim(x: Any, name: str, *, exact: int | None = None, minimum: int | None = None,
               what: str | None = None) -> None:
    if exact is not None and x.ndim != exact:
        raise ValueError(f"`{name}` must be {what or f'{exact}-D'}, got ndim={x.ndim}")
    if minimum is not None and x.ndim < minimum:
        raise ValueError(f"`{name}` must be {what or f'at least {minimum}-D'}, got ndim={x.ndim}")


def check_dtype(xp: Any, x: Any, name: str, *, allow_complex: bool = True) -> Any:
    """Return ``x`` cast to the floating dtype it is computed in.

    Integers become float64; float16 becomes float32; extended precision
    (``numpy.longdouble``, ``numpy.clongdouble``) becomes float64/complex128, as
    SciPy's LAPACK wrappers compute it (never dropping an imaginary part); bool and
    anything non-numeric raise ``TypeError``.
    """
    dt = x.dtype
    if dt == xp.bool:
        raise TypeError(f"`{name}` must have a floating or integer dtype, got bool")
    if xp.isdtype(dt, "integral"):
        return xp.astype(x, xp.float64)
    if xp.isdtype(dt, "complex floating"):
        if not allow_complex:
            raise TypeError(f"`{name}` must be real (float32 or float64), got {dt}")
        if dt not in (xp.complex64, xp.complex128):  # clongdouble: no LAPACK type
            return xp.astype(x, xp.complex128)
        return x
    if xp.isdtype(dt, "real floating"):
        if dt in (xp.float32, xp.float64):
            return x
        # float16: compute in float32; longdouble: no LAPACK type, float64
        return xp.astype(x, xp.float32 if xp.finfo(dt).bits < 32 else xp.float64)
    raise TypeError(f"`{name}` must have a floating or integer dtype, got {dt}")


def check_finite(backend: Any, x: Any, name: str, *, message: str | None = None) -> None:
    """SciPy's rule: ``ValueError`` if ``x`` holds NaN or Inf (one pass:
    ``backend.all_finite``); ``message`` replaces SciPy's wording."""
    if not backend.all_finite(x):
        raise ValueError(message or f"array must not contain infs or NaNs (`{name}`)")


def check_cutoff(value: Any, name: str) -> float | None:
    """A rank cutoff (``cond``, ``rcond``) as a float, or None.

    ``TypeError`` for anything but a real number (``bool`` included); ``ValueError`` for
    NaN and ±Inf, which LAPACK would turn silently into rank 0, every singular value
    counted, or its default.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not (isinstance(value, (int, float))
                                       or hasattr(value, "__float__")):
        raise TypeError(f"`{name}` must be a real number or None, got "
                        f"{type(value).__name__} {value!r}")
    v = float(value)
    if not math.isfinite(v):
        raise ValueError(f"`{name}` must be a finite real number or None, got {v!r}: a NaN "
                         "or infinite cutoff does not define a rank")
    return v


def check_choice(value: Any, name: str, choices: tuple[str, ...],
                 hints: dict[str, str] | None = None) -> str:
    """``value`` if it is one of ``choices``; ``ValueError`` listing them otherwise
    (``TypeError`` for a non-string), with ``hints[value]`` appended where there is one
    (another library's name for a choice)."""
    listed = ", ".join(map(repr, choices))
    if not isinstance(value, str):
        raise TypeError(f"`{name}` must be a string, one of {listed}; "
                        f"got {type(value).__name__} {value!r}")
    if value not in choices:
        hint = (hints or {}).get(value)
        raise ValueError(f"`{name}` must be one of {listed}; got {value!r}"
                         + (f" ({hint})" if hint else ""))
    return value
