"""The Array-API functions mpqr stands in for, built for one namespace.

:func:`functions` returns, for a namespace ``ns`` and a way to read the precision,
replacements of ``ns.linalg.qr``, ``svd``, ``svdvals``, ``lstsq`` (NumPy and CuPy
namespaces), ``pinv`` and ``matrix_rank``, of the products ``matmul``,
``linalg.matmul``, ``tensordot`` and ``vecdot``, and of ``mean`` (namespaces in
:data:`BLOCKED_MEAN`: CuPy's). Each takes the standard's
arguments, runs mpqr where it applies and hands every other call to the namespace's
own function unchanged, so arguments, errors and edge cases stay the namespace's:

* inputs mpqr does not take (not an array of floating dtype with at least two
  dimensions, an empty one, a tensor that records gradients, a keyword outside the
  standard) go to the namespace's function;
* a non-finite result (NaN or Inf in the input) is computed again by the namespace,
  which raises or propagates exactly as it does without mpqr;
* the SVD family takes the QR route only where one side is at least
  :data:`SVD_ASPECT` times the other (LAPACK's ``gesdd`` starts with a QR itself
  from about 1.8; there the QR is the bulk of the work and mpqr's is faster);
* the products run through the precision policy only under an explicit precision
  other than ``"auto"``.

While mpqr runs, calls it makes into the namespace (its backends use the same
namespace objects) go straight to the original functions.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import sys
from collections.abc import Callable, Iterator
from typing import Any

from mpqr.backends import bridge, get_backend
from mpqr.compat import _patch

import mpqr
from mpqr._array_api import array_namespace, device
from mpqr.policy import explain, gemm, record_event
from mpqr.policy.trace import tracing

__all__ = ["BLOCKED_MEAN", "MEAN_BLOCK", "MEAN_ROWS_MIN", "SVD_ASPECT", "functions",
           "inside_mpqr"]

#: the QR-SVD route needs ``max(m, n) >= SVD_ASPECT * min(m, n)``
SVD_ASPECT = 2.0

#: namespaces whose ``mean(x, axis=0)`` of a tall C-ordered matrix is replaced by a sum of
#: row blocks' sums: CuPy's reduction kernel gives a thread block 32 output columns and
#: no block a share of the rows, so 256 columns of 2^20 rows ran on 8 blocks (H200:
#: 25.5 ms for 2^20 x 256 float64, against 0.5 ms for one read of it)
BLOCKED_MEAN = frozenset({"cupy"})
#: rows a block of that sum takes; the mean is replaced from ``MEAN_ROWS_MIN`` rows and
#: at least 8 rows a column
MEAN_BLOCK = 1024
MEAN_ROWS_MIN = 4096

_inside: contextvars.ContextVar[bool] = contextvars.ContextVar("mpqr_xp_inside", default=False)

_LINALG = ("qr", "svd", "svdvals", "lstsq", "pinv", "matrix_rank")
_PRODUCTS = ("matmul", "tensordot", "vecdot")


def inside_mpqr() -> bool:
    """True while a plugged call is running mpqr (its own namespace calls go native)."""
    return _inside.get()


def library(ns: Any) -> str:
    """``numpy``, ``cupy``, ``torch``, ``array_api_strict``... from the namespace's name
    (array-api-compat's copies are ``<vendor>.array_api_compat.<library>``)."""
    name = getattr(ns, "__name__", type(ns).__name__)
    return name.split(".")[-1]


@contextlib.contextmanager
def _running(lib: str, func: str, x: Any, route: str) -> Iterator[None]:
    token = _inside.set(True)
    try:
        if not tracing():
            yield
            return
        with explain() as inner:
            yield
        engines = inner.engines()
        shown = ", ".join(f"{k} x{v}" for k, v in engines.items()) or "no GEMM"
        record_event("array-api", f"{lib}.{func} {tuple(x.shape)} {x.dtype} -> "
                     f"{route} ({shown})", namespace=lib, function=func, route=route,
                     engines=engines)
    finally:
        _inside.reset(token)


def _native(lib: str, func: str, why: str) -> None:
    if tracing():
        record_event("array-api", f"{lib}.{func} -> native ({why})", namespace=lib,
                     function=func, route="native")


def functions(ns: Any, originals: dict[str, Any], precision: Callable[[], str | None]
              ) -> dict[str, Any]:
    """Replacements for ``ns``: ``{"linalg.qr": f, ..., "matmul": g, ...}`` for the names
    in ``originals`` (``"linalg.<name>"`` or a product's name, bound to the namespace's
    function)."""
    lib = library(ns)
    floating = tuple(getattr(ns, d) for d in ("float32", "float64", "complex64", "complex128")
                     if hasattr(ns, d))
    result_types: dict[str, Any] = {}

    def takes(*xs: Any) -> bool:
        for x in xs:
            if getattr(x, "dtype", None) not in floating or getattr(x, "ndim", 0) < 1:
                return False
            if getattr(x, "requires_grad", False) or 0 in tuple(x.shape):
                return False  # autograd stays with the framework; empty: nothing to gain
            np_mod = sys.modules.get("numpy")
            if np_mod is not None and isinstance(x, np_mod.ndarray) and \
                    type(x) is not np_mod.ndarray:
                return False  # masked arrays, numpy.matrix: the namespace's own rules
        return True

    def matrix(x: Any) -> bool:
        return takes(x) and x.ndim >= 2

    def qr_wins(x: Any) -> bool:
        m, n = x.shape[-2:]
        return max(m, n) >= SVD_ASPECT * min(m, n)

    def finite(*ys: Any) -> bool:
        return _patch.all_finite(ns, *ys)

    def packed(func: str, *parts: Any) -> Any:
        """The namespace's own result type (a named tuple, a torch structseq), read once
        from its function on a 1 x 1 matrix."""
        if func not in result_types:
            token = _inside.set(True)
            try:
                one = ns.ones((1, 1), dtype=ns.float64 if hasattr(ns, "float64") else None)
                result_types[func] = type(originals[f"linalg.{func}"](one))
            finally:
                _inside.reset(token)
        cls = result_types[func]
        return cls(*parts) if hasattr(cls, "_fields") else cls(parts)

    def qr(x, /, *, mode="reduced", **kwargs):
        orig = originals["linalg.qr"]
        if _inside.get() or kwargs or mode not in ("reduced", "complete") or not matrix(x):
            return orig(x, mode=mode, **kwargs)
        with _running(lib, "linalg.qr", x, "mpqr.qr"):
            q, r = mpqr.qr(x, mode=mode, precision=precision())
        if not finite(r):
            return orig(x, mode=mode)
        return packed("qr", q, r)

    def svd(x, /, *, full_matrices=True, **kwargs):
        orig = originals["linalg.svd"]
        if _inside.get() or kwargs or not matrix(x) or not isinstance(full_matrices, bool):
            return orig(x, full_matrices=full_matrices, **kwargs)
        if not qr_wins(x):
            _native(lib, "linalg.svd", "no tall or wide shape")
            return orig(x, full_matrices=full_matrices)
        with _running(lib, "linalg.svd", x, "mpqr.svd"):
            u, s, vh = mpqr.svd(x, full_matrices=full_matrices, precision=precision())
        if not finite(s):
            return orig(x, full_matrices=full_matrices)
        return packed("svd", u, s, vh)

    def svdvals_of(x: Any) -> Any:
        """Singular values from the R of a QR (tall or wide ``x``)."""
        m, n = x.shape[-2:]
        a = x if m >= n else ns.conj(ns.matrix_transpose(x)) if ns.isdtype(
            x.dtype, "complex floating") else ns.matrix_transpose(x)
        r = mpqr.qr(a, mode="r", precision=precision())
        return originals["linalg.svdvals"](r) if "linalg.svdvals" in originals else \
            originals["linalg.svd"](r, full_matrices=False)[1]

    def svdvals(x, /, **kwargs):
        orig = originals["linalg.svdvals"]
        if _inside.get() or kwargs or not matrix(x):
            return orig(x, **kwargs)
        if not qr_wins(x):
            _native(lib, "linalg.svdvals", "no tall or wide shape")
            return orig(x)
        with _running(lib, "linalg.svdvals", x, "mpqr.qr + svdvals(R)"):
            s = svdvals_of(x)
        return s if finite(s) else orig(x)

    def pinv(x, /, *, rtol=None, **kwargs):
        orig = originals["linalg.pinv"]
        plain_rtol = rtol is None or (isinstance(rtol, (int, float)) and not
                                      isinstance(rtol, bool))
        if _inside.get() or kwargs or not plain_rtol or not matrix(x) or not qr_wins(x):
            return orig(x, rtol=rtol, **kwargs)
        with _running(lib, "linalg.pinv", x, "mpqr.svd"):
            u, s, vh = mpqr.svd(x, full_matrices=False, precision=precision())
            if not finite(s):
                return orig(x, rtol=rtol)
            tol = max(x.shape[-2:]) * ns.finfo(x.dtype).eps if rtol is None else rtol
            cutoff = tol * ns.max(s, axis=-1, keepdims=True)
            keep = s > cutoff
            inv = ns.where(keep, 1 / ns.where(keep, s, ns.ones_like(s)), ns.zeros_like(s))
            v = _ct(ns, vh) * ns.astype(inv, x.dtype)[..., None, :]
            return _gemm(v, _ct(ns, u), precision(), "array-api pinv: V S^+ U^H")

    def matrix_rank(x, /, *, rtol=None, **kwargs):
        orig = originals["linalg.matrix_rank"]
        if _inside.get() or kwargs or not matrix(x) or not qr_wins(x):
            return orig(x, rtol=rtol, **kwargs)
        with _running(lib, "linalg.matrix_rank", x, "mpqr.qr + svdvals(R)"):
            s = svdvals_of(x)
        if not finite(s):
            return orig(x, rtol=rtol)
        smax = ns.max(s, axis=-1, keepdims=True)
        if rtol is None:
            tol = smax * (max(x.shape[-2:]) * ns.finfo(s.dtype).eps)
        else:
            tol = smax * ns.asarray(rtol, device=device(s))[..., None]
        return ns.count_nonzero(s > tol, axis=-1)

    def lstsq(a, b, rcond=None):
        orig = originals["linalg.lstsq"]
        if _inside.get() or not (matrix(a) and takes(b)) or a.ndim != 2 or b.ndim > 2:
            return orig(a, b, rcond)
        from mpqr.compat import numpy as cnp  # NumPy's lstsq rules (CuPy shares them)

        p = precision()
        with _running(lib, "linalg.lstsq", a, "mpqr.lstsq"), \
                (mpqr.precision(p) if p is not None else contextlib.nullcontext()):
            x = cnp.lstsq(a, b, rcond)
        return x if finite(x[0]) else orig(a, b, rcond)

    def mean(x, /, *, axis=None, keepdims=False, **kwargs):
        orig = originals["mean"]
        if _inside.get() or kwargs or not takes(x) or x.ndim != 2 or not _leading(axis) \
                or not isinstance(keepdims, bool) or not _tall_c_order(x):
            return orig(x, axis=axis, keepdims=keepdims, **kwargs)
        m, n = x.shape
        q = m // MEAN_BLOCK
        with _running(lib, "mean", x, "sum of row blocks' sums"):
            # (q, b, n) -> (q, n) partial rows, each a contiguous block's sum: q n outputs
            # keep every block busy, where n outputs alone could not
            s = ns.sum(ns.reshape(x[:q * MEAN_BLOCK, :], (q, MEAN_BLOCK, n)), axis=1)
            s = ns.sum(s, axis=0)
            if q * MEAN_BLOCK < m:
                s = s + ns.sum(x[q * MEAN_BLOCK:, :], axis=0)
            out = s / m
        return ns.reshape(out, (1, n)) if keepdims else out

    def explicit() -> str | None:
        p = precision()
        return None if p in (None, "auto") else p

    def make_matmul(orig: Any) -> Callable[..., Any]:
        def matmul(x1, x2, /, **kwargs):
            p = explicit()
            if p is None or _inside.get() or kwargs or not takes(x1, x2) \
                    or x1.dtype != x2.dtype or x1.shape[-1] != x2.shape[-2 if x2.ndim > 1 else 0]:
                return orig(x1, x2, **kwargs)
            a = x1[None, :] if x1.ndim == 1 else x1
            b = x2[:, None] if x2.ndim == 1 else x2
            try:
                batch = _broadcast_shape(a.shape[:-2], b.shape[:-2])
            except ValueError:
                return orig(x1, x2)
            with _running(lib, "matmul", x1, "mpqr.policy.gemm"):
                a = ns.broadcast_to(a, (*batch, *a.shape[-2:]))
                b = ns.broadcast_to(b, (*batch, *b.shape[-2:]))
                c = _gemm(a, b, p, "array-api matmul")
            if x2.ndim == 1:
                c = c[..., 0]
            if x1.ndim == 1:
                c = c[..., 0, :] if x2.ndim > 1 else c[..., 0]
            return c
        return matmul

    def make_tensordot(orig: Any) -> Callable[..., Any]:
        def tensordot(x1, x2, /, *, axes=2, **kwargs):
            p = explicit()
            pair = _axes(axes, x1, x2) if takes(x1, x2) else None
            if p is None or _inside.get() or kwargs or pair is None or x1.dtype != x2.dtype:
                return orig(x1, x2, axes=axes, **kwargs)
            ax1, ax2 = pair
            free1 = [i for i in range(x1.ndim) if i not in ax1]
            free2 = [i for i in range(x2.ndim) if i not in ax2]
            k = math.prod(x1.shape[i] for i in ax1)
            with _running(lib, "tensordot", x1, "mpqr.policy.gemm"):
                a = ns.reshape(ns.permute_dims(x1, (*free1, *ax1)), (-1, k))
                b = ns.reshape(ns.permute_dims(x2, (*ax2, *free2)), (k, -1))
                c = _gemm(a, b, p, "array-api tensordot")
            return ns.reshape(c, (*(x1.shape[i] for i in free1),
                                  *(x2.shape[i] for i in free2)))
        return tensordot

    def make_vecdot(orig: Any) -> Callable[..., Any]:
        def vecdot(x1, x2, /, *, axis=-1, **kwargs):
            p = explicit()
            # the standard's axis is negative (counted from the broadcast shape's end)
            if p is None or _inside.get() or kwargs or not takes(x1, x2) \
                    or x1.dtype != x2.dtype or isinstance(axis, bool) \
                    or not isinstance(axis, int) or not -min(x1.ndim, x2.ndim) <= axis < 0 \
                    or x1.shape[axis] != x2.shape[axis]:
                return orig(x1, x2, axis=axis, **kwargs)
            try:
                shape = _broadcast_shape(tuple(x1.shape), tuple(x2.shape))
            except ValueError:
                return orig(x1, x2, axis=axis)
            with _running(lib, "vecdot", x1, "mpqr.policy.gemm"):
                a = _last(ns, ns.broadcast_to(x1, shape), axis)
                b = _last(ns, ns.broadcast_to(x2, shape), axis)
                if ns.isdtype(a.dtype, "complex floating"):
                    a = ns.conj(a)
                c = _gemm(a[..., None, :], b[..., :, None], p, "array-api vecdot")
            return c[..., 0, 0]
        return vecdot

    linalg = {"qr": qr, "svd": svd, "svdvals": svdvals, "pinv": pinv,
              "matrix_rank": matrix_rank, "lstsq": lstsq}
    reductions = {"mean": mean}
    products = {"matmul": make_matmul, "tensordot": make_tensordot, "vecdot": make_vecdot}
    out: dict[str, Any] = {}
    for name, orig in originals.items():
        base = name.split(".")[-1]
        if name.startswith("linalg.") and base in linalg:
            f = linalg[base]
        elif base in products:
            f = products[base](orig)
        elif name in reductions:
            f = reductions[name]
        else:
            continue
        f.__doc__ = f"``{name}`` through mpqr where it applies (:mod:`mpqr.compat.array_api`)."
        out[name] = f
    return out


def _leading(axis: Any) -> bool:
    """``axis`` names the first of two axes only (``0``, ``-2`` or a 1-tuple of one)."""
    if isinstance(axis, tuple) and len(axis) == 1:
        axis = axis[0]
    return isinstance(axis, int) and not isinstance(axis, bool) and axis in (0, -2)


def _tall_c_order(x: Any) -> bool:
    """Enough rows for the blocked mean, and rows contiguous where the array says (an
    F-ordered array's column reduction is contiguous already)."""
    m, n = x.shape
    flags = getattr(x, "flags", None)
    c_order = bool(getattr(flags, "c_contiguous", True)) if flags is not None else True
    return c_order and m >= MEAN_ROWS_MIN and m >= 8 * n


def _ct(ns: Any, x: Any) -> Any:
    t = ns.matrix_transpose(x)
    return ns.conj(t) if ns.isdtype(x.dtype, "complex floating") else t


def _gemm(a: Any, b: Any, precision: str | None = None, label: str = "") -> Any:
    """``a @ b`` (2-D or equal stacks) through the precision policy; PyTorch and JAX
    arrays through the DLPack bridge."""
    if bridge.is_foreign(a, b):
        return bridge.call("matmul", _gemm, (a, b), ("a", "b"), precision=precision,
                           label=label)
    return gemm(a, b, precision=precision, label=label,
                backend=get_backend(array_namespace(a, b)))


def _broadcast_shape(s1: tuple[int, ...], s2: tuple[int, ...]) -> tuple[int, ...]:
    n = max(len(s1), len(s2))
    s1, s2 = (1,) * (n - len(s1)) + tuple(s1), (1,) * (n - len(s2)) + tuple(s2)
    out = []
    for x, y in zip(s1, s2):
        if x != y and 1 not in (x, y):
            raise ValueError(f"shapes {s1} and {s2} do not broadcast")
        out.append(y if x == 1 else x)
    return tuple(out)


def _last(ns: Any, x: Any, axis: int) -> Any:
    """``x`` with ``axis`` moved to the end."""
    order = [i for i in range(x.ndim) if i != axis % x.ndim] + [axis % x.ndim]
    return ns.permute_dims(x, tuple(order))


def _axes(axes: Any, x1: Any, x2: Any) -> tuple[list[int], list[int]] | None:
    """The contracted axes of ``tensordot`` as two lists, or None where the namespace
    should judge (a malformed or mismatching ``axes``)."""
    try:
        if isinstance(axes, int) and not isinstance(axes, bool):
            if not 0 <= axes <= min(x1.ndim, x2.ndim):
                return None
            ax1 = list(range(x1.ndim - axes, x1.ndim))
            ax2 = list(range(axes))
        else:
            a1, a2 = axes
            a1 = [a1] if isinstance(a1, int) else list(a1)
            a2 = [a2] if isinstance(a2, int) else list(a2)
            if len(a1) != len(a2):
                return None
            ax1 = [i % x1.ndim for i in a1]
            ax2 = [i % x2.ndim for i in a2]
    except (TypeError, ValueError, ZeroDivisionError):
        return None
    if len(set(ax1)) != len(ax1) or len(set(ax2)) != len(ax2) or not ax1:
        return None  # no contraction (an outer product): the namespace's own
    if any(x1.shape[i] != x2.shape[j] for i, j in zip(ax1, ax2)):
        return None
    return ax1, ax2
