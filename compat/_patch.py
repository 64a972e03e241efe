"""One mechanism for every drop-in patch (SciPy, CuPy, PyTorch): a target list per front
end.

A :class:`Frontend` names the functions it replaces (the module that defines each and
its public name) and the module of mpqr's replacements. Installing swaps the function
objects wherever they are bound: the attributes of the defining modules and every
module global in ``sys.modules`` that is bound to the original object (``from
scipy.linalg import lstsq`` or ``from torch.linalg import qr`` done before the patch).
A module first imported inside the block binds mpqr's function itself; on exit such
globals of the modules loaded since the block began are set back to the originals.
Entering is counted per front end under one lock, so nested and concurrent blocks
install once and restore once, when the last exits. The precision of the routed calls
(and a front end's options) are per thread/task (ContextVars): the innermost active
patch of the thread wins.

:func:`routing` marks the thread as inside mpqr: mpqr's backends call the array
libraries' own ``linalg`` (``cupy.linalg.qr`` for a panel, ``svd`` of a small factor),
and a patched name must reach the library there, not come back to mpqr.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import os
import sys
import threading
import warnings
from collections.abc import Iterator
from typing import Any, ClassVar

from mpqr.policy import validate_precision

__all__ = ["Frontend", "Patch", "all_finite", "called_from_mpqr", "current_precision", "inside",
           "original", "patch", "routing", "warn_once"]

_LOCK = threading.RLock()
_precision: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "mpqr_compat_precision", default=None)
_inside: contextvars.ContextVar[bool] = contextvars.ContextVar("mpqr_compat_inside",
                                                              default=False)
_WARNED: set[str] = set()
_WARN_LOCK = threading.Lock()


def all_finite(ns: Any, *arrays: Any) -> bool:
    """Whether every entry of ``arrays`` is finite, through namespace ``ns`` (``torch``,
    ``cupy``, an Array-API namespace). A finite sum means every entry is finite (NaN and
    +-Inf propagate), in one read pass where the elementwise test writes a mask of the
    whole input; a sum that merely overflowed is settled by the elementwise test."""
    return all(bool(ns.isfinite(ns.sum(a))) or bool(ns.all(ns.isfinite(a))) for a in arrays)


def current_precision() -> str | None:
    """The precision of the innermost patch of this thread/task (None: default)."""
    return _precision.get()


def inside() -> bool:
    """True while this thread/task runs a call a patch routed to mpqr."""
    return _inside.get()


def called_from_mpqr(depth: int) -> bool:
    """True when the frame ``depth`` levels up from here (1: the caller) runs mpqr's own
    code (its backends call the array libraries' ``linalg`` by attribute, e.g.
    ``cupy.linalg.qr`` for ``method="geqrf"``): such calls go to the library. Judged by
    the code's file, so that doctests and programs run in a module's namespace count
    as callers; the command-line tools (benchmarks, demo) are callers too."""
    try:
        filename = sys._getframe(depth).f_code.co_filename
    except ValueError:  # no such frame
        return False
    inner, tools = _mpqr_dirs()
    return filename.startswith(inner) and not filename.startswith(tools)


@functools.cache
def _mpqr_dirs() -> tuple[tuple[str, ...], tuple[str, ...]]:
    import mpqr.backends
    import mpqr.compat

    import mpqr

    dirs = tuple(os.path.dirname(m.__file__) + os.sep
                 for m in (mpqr, mpqr.backends, mpqr.compat))
    top = os.path.dirname(mpqr.__file__)
    return dirs, tuple(os.path.join(top, d) + os.sep for d in ("bench", "cli"))


@contextlib.contextmanager
def routing() -> Iterator[None]:
    """Mark the thread as inside mpqr: patched names reached from here go to the
    library's own function (see :meth:`Frontend.original`)."""
    token = _inside.set(True)
    try:
        yield
    finally:
        _inside.reset(token)


def warn_once(key: str, message: str) -> None:
    """A ``UserWarning`` the first time ``key`` is seen in this process."""
    with _WARN_LOCK:
        if key in _WARNED:
            return
        _WARNED.add(key)
    warnings.warn(message, UserWarning, stacklevel=3)


def _module_globals(skip: set[str] | frozenset[str] = frozenset()) -> list[dict[str, Any]]:
    """The global namespaces of the loaded modules not in ``skip``, ours excepted (they
    keep the originals for delegation and define the front ends)."""
    out = []
    for modname, mod in list(sys.modules.items()):
        if mod is None or modname in skip or modname.startswith(("mpqr", "compat")):
            continue
        try:
            out.append(vars(mod))
        except TypeError:
            continue
    return out


class Frontend:
    """The functions one patch replaces and where mpqr's replacements live.

    Parameters
    ----------
    name : str
        The library, for messages (``"scipy"``, ``"torch"``, ``"cupy"``).
    targets : tuple of (str, str)
        ``(module defining the function, public name)`` for each replaced function.
    replacements : str
        The module whose attribute ``name`` replaces each target.
    requires : str
        The module that must be imported before installing (its import loads the
        targets' modules).
    """

    def __init__(self, name: str, targets: tuple[tuple[str, str], ...], replacements: str,
                 requires: str):
        self.name, self.targets = name, targets
        self.names = tuple(n for _, n in targets)
        self.replacements_module, self.requires = replacements, requires
        self.depth = 0
        self._originals: dict[str, Any] = {}
        self._swapped: list[tuple[dict[str, Any], str, Any]] = []  # (namespace, name, orig)
        self._loaded_before: set[str] = set()  # sys.modules when the patch was installed
        self.options: contextvars.ContextVar[dict[str, Any] | None] = \
            contextvars.ContextVar(f"mpqr_compat_{name}_options", default=None)

    def original(self, name: str) -> Any:
        """The library's own function (never the patched one)."""
        with _LOCK:
            if name not in self._originals:
                mod = dict((n, m) for m, n in self.targets)[name]
                self._originals[name] = getattr(importlib.import_module(mod), name)
            return self._originals[name]

    def _replacements(self) -> dict[int, tuple[str, Any]]:
        mod = importlib.import_module(self.replacements_module)
        return {id(self.original(n)): (n, getattr(mod, n)) for n in self.names}

    def install(self) -> None:
        repl = self._replacements()
        originals = {id(self.original(n)): self.original(n) for n in self.names}
        self._loaded_before.update(sys.modules)
        for ns in _module_globals():
            for key, val in list(ns.items()):
                if id(val) in repl and val is originals[id(val)]:
                    ns[key] = repl[id(val)][1]
                    self._swapped.append((ns, key, val))

    def restore(self) -> None:
        while self._swapped:
            ns, key, val = self._swapped.pop()
            ns[key] = val
        # globals that modules imported inside the block bound to the front ends
        back = {id(f): self.original(name) for name, f in self._replacements().values()}
        for ns in _module_globals(skip=self._loaded_before):
            for key, val in list(ns.items()):
                if id(val) in back:
                    ns[key] = back[id(val)]
        self._loaded_before.clear()

    def enter(self) -> None:
        importlib.import_module(self.requires)  # the modules to patch must be loaded
        with _LOCK:
            if self.depth == 0:
                try:
                    self.install()
                except BaseException:
                    self.restore()
                    raise
            self.depth += 1

    def exit(self) -> None:
        with _LOCK:
            self.depth -= 1
            if self.depth == 0:
                self.restore()

    def current_options(self) -> dict[str, Any] | None:
        """The options of the innermost patch of this front end in this thread/task."""
        return self.options.get()


class Patch:
    """A front end's patch: context manager and decorator, thread-safe and re-entrant.

    Subclasses set ``frontend`` and may take keyword options (stored per thread/task
    for the front end's functions, :meth:`Frontend.current_options`).
    """

    frontend: ClassVar[Frontend]

    def __init__(self, precision: str | None = None, **options: Any):
        if precision is not None:
            validate_precision(precision)
        self.precision = precision
        self.options = options
        self._tokens: list[tuple[contextvars.Token, contextvars.Token]] = []

    def __enter__(self) -> Patch:
        self.frontend.enter()
        self._tokens.append((_precision.set(self.precision),
                             self.frontend.options.set(self.options)))
        return self

    def __exit__(self, *exc: object) -> None:
        tp, to = self._tokens.pop()
        self.frontend.options.reset(to)
        _precision.reset(tp)
        self.frontend.exit()

    def __call__(self, func: Any) -> Any:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with type(self)(self.precision, **self.options):
                return func(*args, **kwargs)

        return wrapper


#: (module holding the definition, public name): every QR-based function a program may
#: mix with ``qr``, so each Q it sees comes from mpqr's factorization and sign convention
_SCIPY = Frontend("scipy", (("scipy.linalg._basic", "lstsq"),
                            ("scipy.linalg._decomp_qr", "qr"),
                            ("scipy.linalg._decomp_qr", "qr_multiply"),
                            ("scipy.linalg._decomp_qr", "rq")),
                  replacements="mpqr.compat.scipy", requires="scipy.linalg")


def original(name: str) -> Any:
    """SciPy's own function (never the patched one)."""
    return _SCIPY.original(name)


class patch(Patch):
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

    frontend = _SCIPY

    def __init__(self, precision: str | None = None):
        super().__init__(precision)


def is_patched() -> bool:
    """True while some SciPy :class:`patch` block is active."""
    with _LOCK:
        return _SCIPY.depth > 0
