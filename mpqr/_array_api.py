"""The one import point for array-api-compat.

Everything in ``mpqr`` that needs to know which array library it is talking to
goes through here, so the dispatch rules live in one place.
"""

from __future__ import annotations

from typing import Any

import array_api_compat as _compat

__all__ = [
    "array_namespace",
    "ct",
    "device",
    "is_array_api_obj",
    "is_complex",
    "is_cupy_namespace",
    "is_numpy_namespace",
    "is_strict_namespace",
    "namespace_name",
    "to_device",
]

is_array_api_obj = _compat.is_array_api_obj
is_numpy_namespace = _compat.is_numpy_namespace
is_cupy_namespace = _compat.is_cupy_namespace
is_strict_namespace = _compat.is_array_api_strict_namespace
to_device = _compat.to_device


def array_namespace(*arrays: Any, names: tuple[str, ...] | None = None) -> Any:
    """Return the common Array API namespace of ``arrays``.

    Python scalars and ``None`` are ignored. Arrays from different libraries
    raise ``TypeError`` naming the arguments: nothing is moved silently.
    """
    present = [(i, a) for i, a in enumerate(arrays) if a is not None and not _is_scalar(a)]
    if not present:
        raise TypeError("expected at least one array argument, got none")
    for i, a in present:
        if not _compat.is_array_api_obj(a):
            label = names[i] if names else f"argument {i}"
            raise TypeError(
                f"`{label}` must be an array of an Array API library (NumPy, CuPy, ...), "
                f"got {type(a).__module__}.{type(a).__qualname__}"
            )
    try:
        return _compat.array_namespace(*(a for _, a in present))
    except TypeError as exc:
        libs = ", ".join(
            f"`{names[i] if names else f'argument {i}'}` is {type(a).__module__.split('.')[0]}"
            for i, a in present
        )
        raise TypeError(
            f"arrays from different libraries cannot be mixed ({libs}); "
            "move them to one library and device first"
        ) from exc


def device(x: Any) -> Any:
    """The device ``x`` lives on (a stand-in object for NumPy)."""
    return _compat.device(x)


def namespace_name(xp: Any) -> str:
    """A short human name for a namespace: ``numpy``, ``cupy``, ``array_api_strict``..."""
    if is_numpy_namespace(xp):
        return "numpy"
    if is_cupy_namespace(xp):
        return "cupy"
    if is_strict_namespace(xp):
        return "array_api_strict"
    return getattr(xp, "__name__", type(xp).__name__).split(".")[-1]


def _is_scalar(a: Any) -> bool:
    return isinstance(a, (bool, int, float, complex))


def is_complex(xp: Any, x: Any) -> bool:
    return xp.isdtype(x.dtype, "complex floating")


def ct(xp: Any, a: Any) -> Any:
    """Conjugate transpose of the last two axes (a view for real input)."""
    t = xp.matrix_transpose(a)
    return xp.conj(t) if is_complex(xp, a) else t
