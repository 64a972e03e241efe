"""Backend plugins: chosen from the input array's namespace, never by a string.

Built-in: NumPy (reference, emulates the tensor-core engines), CuPy (cuBLAS),
and a portable Array-API backend (native engines only) for any other
conforming namespace such as ``array_api_strict``. Third parties register a
backend class in the entry-point group ``mpqr.backends``; it must subclass
:class:`ArrayAPIBackend` and implement ``matches(xp)``.
"""

from __future__ import annotations

import importlib
import threading
from importlib.metadata import entry_points
from typing import Any

from mpqr.backends._base import ArrayAPIBackend, EngineRates

from mpqr import _aliases
from mpqr._array_api import namespace_name

__all__ = ["ArrayAPIBackend", "EngineRates", "get_backend", "register_backend"]

_lock = threading.Lock()
_registered: list[type[ArrayAPIBackend]] = []
_loaded_entry_points = False
_cache: dict[int, ArrayAPIBackend] = {}


def register_backend(cls: type[ArrayAPIBackend]) -> type[ArrayAPIBackend]:
    """Register a backend class (usable as a decorator); later ones win."""
    if not (isinstance(cls, type) and issubclass(cls, ArrayAPIBackend)):
        raise TypeError(f"a backend must subclass mpqr.backends.ArrayAPIBackend, got {cls!r}")
    with _lock:
        if cls not in _registered:
            _registered.insert(0, cls)
        _cache.clear()
    return cls


def _load_builtin_and_entry_points() -> None:
    global _loaded_entry_points
    if _loaded_entry_points:
        return
    from mpqr.backends.cupy.backend import CupyBackend
    from mpqr.backends.numpy.backend import NumpyBackend

    found: list[type[ArrayAPIBackend]] = [NumpyBackend, CupyBackend]
    for ep in entry_points(group="mpqr.backends"):
        try:
            cls = ep.load()
        except Exception:  # a broken third-party plugin must not break mpqr
            continue
        if isinstance(cls, type) and issubclass(cls, ArrayAPIBackend) and cls not in found:
            found.append(cls)
    with _lock:
        for cls in found:
            if cls not in _registered:
                _registered.append(cls)
        _loaded_entry_points = True


def get_backend(xp: Any) -> ArrayAPIBackend:
    """The backend for namespace ``xp`` (cached per namespace)."""
    _load_builtin_and_entry_points()
    key = id(xp)
    be = _cache.get(key)
    if be is not None and be.xp is xp:
        return be
    with _lock:
        classes = list(_registered)
    for cls in classes:
        if cls.matches(xp):
            be = cls(xp)
            break
    else:
        if not ArrayAPIBackend.matches(xp):
            raise TypeError(
                f"no mpqr backend for namespace {namespace_name(xp)!r}: it lacks the Array API "
                "linalg extension; register one in the 'mpqr.backends' entry-point group"
            )
        be = ArrayAPIBackend(xp)
    _cache[key] = be
    return be


#: the built-in backend classes, by name, in the modules that define them
_BUILTIN = {"NumpyBackend": "mpqr.backends.numpy.backend",
            "CupyBackend": "mpqr.backends.cupy.backend"}


def __getattr__(name: str) -> Any:
    # looked up late: the built-in classes (their modules import NumPy or CuPy) and the
    # module paths of earlier releases (mpqr.backends.numpy_backend, ...)
    if name in _BUILTIN:
        return getattr(importlib.import_module(_BUILTIN[name]), name)
    if f"{__name__}.{name}" in _aliases.ALIASES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
