"""Routing ``scipy.linalg.lstsq``, ``qr``, ``qr_multiply`` and ``rq`` to mpqr for existing
code.

:class:`patch` swaps the function objects wherever they are bound: the
attributes of ``scipy.linalg``, ``scipy.linalg._basic`` and
``scipy.linalg._decomp_qr``, and every module global in ``sys.modules`` that is
bound to the original object (``from scipy.linalg import lstsq`` done before
the patch). A module first imported inside the block binds mpqr's function
itself; on exit such globals of the modules loaded since the block began are set
back to SciPy's. Entering is counted under a lock, so nested and concurrent
``with patch():`` blocks install once and restore once, when the last exits.
The precision of the routed calls is per thread/task (a ContextVar).
"""

from __future__ import annotations

import contextvars
import functools
import sys
import threading
import warnings
from typing import Any

from mpqr.policy import validate_precision

__all__ = ["current_precision", "front_ends", "original", "patch", "warn_once"]

_LOCK = threading.RLock()
_depth = 0
_swapped: list[tuple[Any, str, Any]] = []  # (namespace dict, name, original object)
_loaded_before: set[str] = set()  # the names in sys.modules when the patch was installed
_precision: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "mpqr_compat_precision", default=None)
_ORIGINALS: dict[str, Any] = {}
_FRONT_ENDS: list[Any] = []  # the module of mpqr's replacements (front_ends)
_WARNED: set[str] = set()
_WARN_LOCK = threading.Lock()

#: (module holding the definition, public name): every QR-based function a program may
#: mix with ``qr``, so each Q it sees comes from mpqr's factorization and sign convention
_TARGETS = (("scipy.linalg._basic", "lstsq"), ("scipy.linalg._decomp_qr", "qr"),
            ("scipy.linalg._decomp_qr", "qr_multiply"), ("scipy.linalg._decomp_qr", "rq"))
_NAMES = tuple(name for _, name in _TARGETS)


def original(name: str) -> Any:
    """SciPy's own function (never the patched one)."""
    with _LOCK:
        if name not in _ORIGINALS:
            import importlib

            mod = dict(_TARGETS_BY_NAME)[name]
            _ORIGINALS[name] = getattr(importlib.import_module(mod), name)
        return _ORIGINALS[name]


_TARGETS_BY_NAME = tuple((n, m) for m, n in _TARGETS)


def current_precision() -> str | None:
    """The precision of the innermost :class:`patch` of this thread/task (None: default)."""
    return _precision.get()


def warn_once(key: str, message: str) -> None:
    """A ``UserWarning`` the first time ``key`` is seen in this process."""
    with _WARN_LOCK:
        if key in _WARNED:
            return
        _WARNED.add(key)
    warnings.warn(message, UserWarning, stacklevel=3)


def front_ends(module: Any) -> None:
    """Register the module whose functions, by SciPy's names, replace SciPy's inside a
    :class:`patch` block; they are looked up as each outermost block starts (so a wrapper
    set on the module later is what gets installed). :mod:`mpqr.compat.scipy` registers
    itself when it is imported."""
    missing = [n for n in _NAMES if not callable(getattr(module, n, None))]
    if missing:
        raise ValueError(f"{getattr(module, '__name__', module)!r} lacks the front ends "
                         f"{missing}")
    with _LOCK:
        _FRONT_ENDS[:] = [module]


def _replacements() -> dict[int, tuple[str, Any]]:
    (module,) = _FRONT_ENDS
    return {id(original(name)): (name, getattr(module, name)) for name in _NAMES}


def _module_globals(skip: set[str] | frozenset[str] = frozenset()) -> list[dict[str, Any]]:
    """The global namespaces of the loaded modules not in ``skip``, ours excepted (they
    keep SciPy's originals for delegation and define the front ends)."""
    out = []
    for modname, mod in list(sys.modules.items()):
        if mod is None or modname in skip or modname.startswith(("mpqr", "compat")):
            continue
        try:
            out.append(vars(mod))
        except TypeError:
            continue
    return out


def _install() -> None:
    repl = _replacements()
    originals = {id(original(n)): original(n) for n in _NAMES}
    _loaded_before.update(sys.modules)
    for ns in _module_globals():
        for key, val in list(ns.items()):
            if id(val) in repl and val is originals[id(val)]:
                ns[key] = repl[id(val)][1]
                _swapped.append((ns, key, val))


def _restore() -> None:
    while _swapped:
        ns, key, val = _swapped.pop()
        ns[key] = val
    # globals that modules imported inside the block bound to the front ends
    back = {id(f): original(name) for name, f in _replacements().values()}
    for ns in _module_globals(skip=_loaded_before):
        for key, val in list(ns.items()):
            if id(val) in back:
                ns[key] = back[id(val)]
    _loaded_before.clear()


class patch:
    """Route ``scipy.linalg.lstsq``, ``qr``, ``qr_multiply`` and ``rq`` to mpqr inside a
    block.

    ``qr`` (every mode, ``pivoting=True`` too), ``qr_multiply`` and ``rq`` then share
    one factorization and one sign convention (``diag(R) >= 0``): the ``Q`` of
    ``qr(a, pivoting=True)``, of ``qr(a[:, P])`` and of ``qr_multiply`` agree.

    Usable as a context manager or a decorator; thread-safe and re-entrant.
    Everything is restored when the outermost block exits, exceptions included.

    Parameters
    ----------
    precision : str, optional
        Precision of the routed calls (see :func:`mpqr.lstsq`); ``None`` uses
        the ``mpqr.precision`` setting (``"auto"`` by default: SciPy's accuracy).

    Examples
    --------
    >>> import numpy as np, scipy.linalg, mpqr, mpqr.compat.scipy as mcs
    >>> with mpqr.explain() as trace, mcs.patch():
    ...     x = scipy.linalg.lstsq(np.eye(3), np.ones(3))[0]
    >>> any("lstsq" in e.message for e in trace.events)
    True
    """

    def __init__(self, precision: str | None = None):
        if precision is not None:
            validate_precision(precision)
        self.precision = precision
        self._tokens: list[contextvars.Token] = []

    def __enter__(self) -> patch:
        global _depth
        import scipy.linalg  # noqa: F401  (the modules to patch must be loaded)

        with _LOCK:
            if _depth == 0:
                try:
                    _install()
                except BaseException:
                    _restore()
                    raise
            _depth += 1
        self._tokens.append(_precision.set(self.precision))
        return self

    def __exit__(self, *exc: object) -> None:
        global _depth
        _precision.reset(self._tokens.pop())
        with _LOCK:
            _depth -= 1
            if _depth == 0:
                _restore()

    def __call__(self, func: Any) -> Any:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with patch(self.precision):
                return func(*args, **kwargs)

        return wrapper


def is_patched() -> bool:
    """True while some :class:`patch` block is active."""
    with _LOCK:
        return _depth > 0
