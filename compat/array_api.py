"""mpqr as a plugin for code written against the Array API standard.

Programs that take their functions from an array namespace (``xp =
array_namespace(x)``; ``xp.linalg.qr``, ``xp.linalg.svd``, ``xp.matmul``), such as
scikit-learn with ``array_api_dispatch=True``, reach mpqr through either

* :func:`namespace`: ``namespace(xp)`` is ``xp`` with mpqr's functions in place of
  the ones below, for code that takes the namespace as an argument; or
* :class:`patch`: a context manager and decorator that installs them into the
  namespaces array-api-compat hands out (``<copy>.numpy``, ``.cupy``, ``.torch``),
  into every copy of array-api-compat in the process (scikit-learn and SciPy vendor
  their own; every module named ``*.array_api_compat`` is found, loaded before the
  block or inside it) and into ``array_api_strict``, and restores them on exit.

What is replaced (each hands the calls it does not take to the namespace's own
function, so arguments, errors, dtypes, devices and result types stay ``xp``'s;
see :mod:`mpqr.compat._xp_functions`):

========================  ===============================================================
``linalg.qr``             :func:`mpqr.qr`, both modes, stacks
``linalg.svd``            :func:`mpqr.svd` (QR, then the SVD of R) for tall and wide
                          inputs (one side at least twice the other); ``full_matrices``
                          both ways
``linalg.svdvals``        the singular values of the R of :func:`mpqr.qr` (tall, wide)
``linalg.pinv``           from :func:`mpqr.svd` (tall, wide; ``rtol`` a number or None)
``linalg.matrix_rank``    from the singular values of R (tall, wide)
``linalg.lstsq``          :func:`mpqr.compat.numpy.lstsq` (NumPy and CuPy namespaces)
``matmul``, ``tensordot``,  through the precision policy, only under an explicit
``vecdot`` (also in       precision other than ``"auto"``: ``"auto"`` leaves every
``linalg``)               product native
``mean`` (CuPy)           ``axis=0`` of a tall C-ordered matrix (at least 4096 rows, 8
                          a column): the sum of blocks of 1024 rows' sums, divided by
                          the rows (CuPy's own runs such a reduction on a few thread
                          blocks)
========================  ===============================================================

``mpqr.explain()`` records each plugged call (``array-api`` events: namespace,
function, shape, dtype, the mpqr route and the engines its products ran on) and the
calls handed back to the namespace for their shape.
"""

from __future__ import annotations

import contextvars
import functools
import importlib.abc
import sys
import threading
from typing import Any

from mpqr.compat import _xp_functions
from mpqr.compat._xp_functions import SVD_ASPECT, functions, library

from mpqr.policy import validate_precision

__all__ = ["SVD_ASPECT", "is_patched", "namespace", "patch", "patched_namespaces"]

_LINALG = ("qr", "svd", "svdvals", "lstsq", "pinv", "matrix_rank")
_PRODUCTS = ("matmul", "tensordot", "vecdot")


def _names(ns: Any, *, products: bool) -> dict[str, Any]:
    """The functions of ``ns`` mpqr stands in for: ``{"linalg.qr": f, "matmul": g, ...}``."""
    lin = getattr(ns, "linalg", None)
    out: dict[str, Any] = {}
    if lin is not None and not products:
        for n in _LINALG:
            if n == "lstsq" and library(ns) not in ("numpy", "cupy"):
                continue  # torch's lstsq has other arguments and results: left native
            if callable(getattr(lin, n, None)):
                out[f"linalg.{n}"] = getattr(lin, n)
        if library(ns) in _xp_functions.BLOCKED_MEAN and callable(getattr(ns, "mean", None)):
            out["mean"] = ns.mean
    if products:
        for n in _PRODUCTS:
            if callable(getattr(ns, n, None)):
                out[n] = getattr(ns, n)
            if lin is not None and callable(getattr(lin, n, None)):
                out[f"linalg.{n}"] = getattr(lin, n)
    return out


def _explicit(precision: str | None) -> bool:
    return precision not in (None, "auto")


class _Plugged:
    """``base`` with some attributes replaced; everything else read from ``base``."""

    def __init__(self, base: Any, replaced: dict[str, Any]):
        self.__dict__["_base"] = base
        self.__dict__.update(replaced)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_base"], name)

    def __dir__(self) -> list[str]:
        return sorted(set(dir(self.__dict__["_base"])) | set(self.__dict__) - {"_base"})

    def __repr__(self) -> str:
        return f"<mpqr namespace over {getattr(self._base, '__name__', self._base)!r}>"


def namespace(xp: Any, precision: str | None = None) -> Any:
    """``xp`` with mpqr's QR, SVD, pseudo-inverse, rank, lstsq (and products).

    Parameters
    ----------
    xp : namespace
        An Array API namespace (``array_api_compat.array_namespace(x)``,
        ``array_api_strict``...), with a ``linalg`` extension.
    precision : str, optional
        Precision of mpqr's calls (see :func:`mpqr.qr`); ``None`` reads the
        ``mpqr.precision`` setting at each call. Given and not ``"auto"``,
        ``matmul``, ``tensordot`` and ``vecdot`` (top level and ``linalg``) run
        through the precision policy too.

    Returns
    -------
    namespace
        Reads every attribute from ``xp`` except the replaced functions (see
        :mod:`mpqr.compat.array_api`); ``namespace(xp).linalg`` likewise.

    Raises
    ------
    TypeError
        ``xp`` has no ``linalg`` extension.
    ValueError
        An unknown precision name.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> from mpqr.compat.array_api import namespace
    >>> mx = namespace(xp)
    >>> a = xp.reshape(xp.arange(12.0), (6, 2)) + xp.eye(6, 2)
    >>> q, r = mx.linalg.qr(a)
    >>> type(q) is type(a), q.shape, r.shape
    (True, (6, 2), (2, 2))
    """
    if precision is not None:
        validate_precision(precision)
    lin = getattr(xp, "linalg", None)
    if lin is None:
        raise TypeError(f"`xp` must be an Array API namespace with a `linalg` extension; got "
                        f"{getattr(xp, '__name__', type(xp).__name__)!r} without one")
    originals = _names(xp, products=False)
    if _explicit(precision):
        originals.update(_names(xp, products=True))
    funcs = functions(xp, originals, lambda: precision)
    top = {k: v for k, v in funcs.items() if "." not in k}
    linalg = _Plugged(lin, {k.split(".", 1)[1]: v for k, v in funcs.items() if "." in k})
    return _Plugged(xp, {**top, "linalg": linalg})


# ---------------------------------------------------------------------------- patch

_LOCK = threading.RLock()
_depth = 0  # active patch blocks (all threads)
_explicit_depth = 0  # those with an explicit precision: the products are installed
_swaps: dict[str, list[tuple[Any, str, Any]]] = {"linalg": [], "products": []}
_plugged: list[str] = []  # the namespace modules plugged, in order
_precision: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "mpqr_array_api_precision", default=None)


def _watched(name: str) -> bool:
    """A namespace module to plug: ``array_api_strict`` or ``<...>array_api_compat.<lib>``
    for NumPy, CuPy and PyTorch."""
    if name == "array_api_strict":
        return True
    parent, _, lib = name.rpartition(".")
    return lib in ("numpy", "cupy", "torch") and parent.rpartition(".")[2] == "array_api_compat"


def patched_namespaces() -> list[str]:
    """The names of the namespace modules a :class:`patch` has plugged right now."""
    with _LOCK:
        return list(dict.fromkeys(_plugged))


def _plug(ns: Any, group: str) -> None:
    originals = _names(ns, products=group == "products")
    funcs = functions(ns, originals, _precision.get)
    if group == "linalg":
        _plugged.append(ns.__name__)
    lin = getattr(ns, "linalg", None)
    for name, f in funcs.items():
        obj, attr = (lin, name.split(".", 1)[1]) if name.startswith("linalg.") else (ns, name)
        _swaps[group].append((obj, attr, getattr(obj, attr)))
        setattr(obj, attr, f)


def _unplug(group: str) -> None:
    swaps = _swaps[group]
    while swaps:
        obj, attr, orig = swaps.pop()
        setattr(obj, attr, orig)


def _loaded() -> list[Any]:
    return [m for n, m in list(sys.modules.items()) if m is not None and _watched(n)
            and getattr(m, "linalg", None) is not None]


class _Loader(importlib.abc.Loader):
    """A watched module's loader, plugging the module once it has run."""

    def __init__(self, loader: Any):
        self._loader = loader

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        with _LOCK:
            if _depth > 0 and getattr(module, "linalg", None) is not None:
                _plug(module, "linalg")
                if _explicit_depth > 0:
                    _plug(module, "products")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class _Finder(importlib.abc.MetaPathFinder):
    """Plugs the namespace modules first imported inside a block."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if not _watched(fullname):
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader)
                return spec
        return None


_FINDER = _Finder()


class patch:
    """Route the Array-API namespaces' QR, SVD and related functions to mpqr in a block.

    Installs the functions listed in :mod:`mpqr.compat.array_api` into every
    array-api-compat copy's NumPy, CuPy and PyTorch namespace and into
    ``array_api_strict``, also those first imported inside the block. Usable as a
    context manager or a decorator; thread-safe and re-entrant: nested and
    concurrent blocks install once and restore when the last exits (exceptions
    included). The precision is per thread/task.

    Parameters
    ----------
    precision : str, optional
        Precision of the routed calls (see :func:`mpqr.qr`); ``None`` uses the
        ``mpqr.precision`` setting. Given and not ``"auto"``, ``matmul``,
        ``tensordot`` and ``vecdot`` run through the precision policy too.

    Raises
    ------
    ValueError
        An unknown precision name.

    Examples
    --------
    >>> import numpy as np, mpqr
    >>> import array_api_compat
    >>> from mpqr.compat.array_api import patch
    >>> a = np.random.default_rng(0).standard_normal((100, 4))
    >>> with mpqr.explain() as trace, patch():
    ...     xp = array_api_compat.array_namespace(a)
    ...     u, s, vh = xp.linalg.svd(a, full_matrices=False)
    >>> [e.data["route"] for e in trace.events if e.kind == "array-api"]
    ['mpqr.svd']
    """

    def __init__(self, precision: str | None = None):
        if precision is not None:
            validate_precision(precision)
        self.precision = precision
        self._tokens: list[contextvars.Token] = []

    def __enter__(self) -> patch:
        global _depth, _explicit_depth
        with _LOCK:
            try:
                if _depth == 0:
                    sys.meta_path.insert(0, _FINDER)
                    for ns in _loaded():
                        _plug(ns, "linalg")
                if _explicit(self.precision) and _explicit_depth == 0:
                    for ns in _loaded():
                        _plug(ns, "products")
            except BaseException:
                if _depth == 0:
                    _teardown()
                raise
            _depth += 1
            _explicit_depth += _explicit(self.precision)
        self._tokens.append(_precision.set(self.precision))
        return self

    def __exit__(self, *exc: object) -> None:
        global _depth, _explicit_depth
        _precision.reset(self._tokens.pop())
        with _LOCK:
            _depth -= 1
            _explicit_depth -= _explicit(self.precision)
            if _explicit_depth == 0:
                _unplug("products")
            if _depth == 0:
                _teardown()

    def __call__(self, func: Any) -> Any:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with patch(self.precision):
                return func(*args, **kwargs)

        return wrapper


def _teardown() -> None:
    _unplug("products")
    _unplug("linalg")
    _plugged.clear()
    while _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)


def is_patched() -> bool:
    """True while some :class:`patch` block is active."""
    with _LOCK:
        return _depth > 0
