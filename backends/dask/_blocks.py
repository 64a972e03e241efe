"""What runs on a worker for one row block: mpqr's in-core functions on the block's own
backend (NumPy on a CPU worker, CuPy on a GPU worker), every product through the policy.

Each function is a plain module-level function of its block and small operands, so it
pickles to a process or remote worker; none modifies its input block.
"""

from __future__ import annotations

import collections
import contextlib
import functools
from typing import Any

from mpqr.backends import get_backend

from mpqr._array_api import array_namespace
from mpqr.policy import active_gemm_options, gemm, gemm_options
from mpqr.qr._kernels import ct

__all__ = [
    "Small",
    "apply_inverses",
    "bind",
    "block_backend",
    "column_max",
    "column_max_leaf",
    "gram_leaf",
    "host_backend",
    "leaf_qr",
    "lstsq_leaf",
    "node_qr",
    "on_device",
    "on_gpu",
    "pow2",
    "product",
    "qh_leaf",
    "r_combine",
    "r_leaf",
    "residual_leaf",
    "run_with",
    "to_host",
]


class Small:
    """A leaf's small operands as one argument of each block task (a plain object, so
    that dask never reads a tuple of them as a task or a key)."""

    __slots__ = ("key", "value")

    def __init__(self, value: Any, key: str | None = None):
        self.value = value
        # where set, a worker keeps its device copy of ``value`` under this key for the
        # call's later block tasks (:func:`on_device`)
        self.key = key

    def __dask_tokenize__(self) -> Any:
        from dask.base import tokenize

        return ("mpqr-small", tokenize(self.value))


def bind(func: Any) -> Any:
    """``func`` carrying the caller's ``mpqr.gemm_options`` context to the worker (a
    context variable of the client's thread, which a worker process does not see)."""
    opts = active_gemm_options()
    return func if opts is None else functools.partial(run_with, func, opts)


def run_with(func: Any, opts: Any, *args: Any, **kw: Any) -> Any:
    with gemm_options(opts):
        return func(*args, **kw)


def block_backend(a: Any) -> Any:
    return get_backend(array_namespace(a))


def _guard(backend: Any, quiet: bool) -> Any:
    # auto's CholQR2 runs on unscaled blocks and reads over- or underflow from its Gram
    # matrix (a BreakdownError on the client), as the in-core driver does
    return backend.ignore_fp_warnings() if quiet else contextlib.nullcontext()


def apply_inverses(a: Any, rs: tuple[Any, ...], method: str, prec_name: str,
                   quiet: bool = False) -> Any:
    """``a R1^-1 R2^-1 ...`` for the factors ``rs``, each ``(R, (R^-1, cond_1(R)))`` as
    the client made them once (in order), each step as the in-core CholQR pass applies
    it (substitution, or a GEMM by the inverse where it is well conditioned). ``rs`` may
    come wrapped in a :class:`Small`."""
    from mpqr.qr.cholqr import _apply_inverse

    backend = block_backend(a)
    if isinstance(rs, Small):
        rs = on_device(rs, a, backend)
    q = a
    with _guard(backend, quiet):
        for r, inverse in rs:
            q = _apply_inverse(backend, block_backend(r), q, r, method, prec_name,
                               inverse=inverse)
    return q


#: device copies of small operands, by the key the client gave them, for the block
#: tasks of one call on this worker process (a few calls' worth; each is n x n)
_ON_DEVICE: collections.OrderedDict[tuple[str, str], Any] = collections.OrderedDict()
_ON_DEVICE_KEEP = 4


def on_device(small: Any, a: Any, backend: Any) -> Any:
    """``small.value`` (nested tuples; their host arrays moved) on ``a``'s device, made
    once per worker process and key: a copy from pageable host memory first waits for
    the work the previous block queued on the GPU, so one copy per block would keep the
    host from running ahead of the device."""
    if small.key is None:
        return _moved(small.value, a, backend)
    key = (small.key, str(getattr(a, "device", "")))
    hit = _ON_DEVICE.get(key)
    if hit is None:
        hit = _ON_DEVICE[key] = _moved(small.value, a, backend)
        while len(_ON_DEVICE) > _ON_DEVICE_KEEP:
            _ON_DEVICE.popitem(last=False)
    return hit


def _moved(v: Any, a: Any, backend: Any) -> Any:
    import numpy as np

    if isinstance(v, tuple):
        return tuple(_moved(e, a, backend) for e in v)
    return backend.from_small(v, a) if isinstance(v, np.ndarray) and v.ndim else v


def product(a: Any, x: Any, precision: str, label: str) -> Any:
    """``a @ x`` of two small factors on one worker (the TSQR tree's updates)."""
    backend = block_backend(a)
    return gemm(a, x, precision=precision, label=label, backend=backend)


def leaf_qr(a: Any, precision: Any, method: str) -> tuple[Any, Any]:
    """The in-core QR of a leaf block (``mpqr.qr``, reduced): ``(Q, R)``."""
    from mpqr.qr.in_memory import qr

    return tuple(qr(a, mode="reduced", precision=precision, method=method))


def node_qr(rs: list[Any], precision: Any, method: str) -> tuple[Any, Any]:
    """The in-core QR of the children's stacked R factors: ``(Q, R)``."""
    xp = block_backend(rs[0]).xp
    return leaf_qr(xp.concat(rs, axis=0), precision, method)


def pow2(v: Any, e: Any) -> Any:
    """``v * 2**e`` exactly; ``e`` an int or int32 exponents broadcasting against ``v``
    (one per column)."""
    from mpqr.qr._kernels import pow2_scale

    backend = block_backend(v)
    xp = backend.xp
    e = xp.asarray(e, dtype=xp.int32) if isinstance(e, int) else backend.from_small(e, v)
    return pow2_scale(backend, v, e)


def column_max(a: Any) -> Any:
    """``(1, n)``: the largest finite ``|entry|`` of each column of a block (as
    :func:`mpqr.qr._kernels.column_exponents` reads it), for a max over the blocks."""
    backend = block_backend(a)
    xp = backend.xp
    if xp.isdtype(a.dtype, "complex floating"):
        return xp.max(xp.abs(a), axis=-2, keepdims=True)
    return backend.max_abs_finite(a, -2)


# --- the leaves of one pass (mpqr.backends.dask._graph): small results -----------------

def host_backend() -> Any:
    """The NumPy backend: the client's ``n x n`` steps and the trees' sums run on the host."""
    from mpqr.backends.numpy.backend import host_namespace

    return get_backend(host_namespace())


def on_gpu(v: Any) -> bool:
    """Whether ``v`` is a CuPy array (a GPU worker's block or result)."""
    return hasattr(v, "get") and type(v).__module__.startswith("cupy")


def to_host(v: Any) -> Any:
    """A small device array as a NumPy array (one transfer; NumPy arrays as they are)."""
    if on_gpu(v):
        return v.get()
    import numpy as np

    return np.asarray(v)


def _finite(backend: Any, a: Any, g: Any, native: bool) -> bool:
    """Whether block ``a`` is finite, read from its Gram matrix ``g`` where that is exact:
    with IEEE products ``diag(A^H A)`` holds a NaN or Inf iff ``A`` does, or iff a
    square overflows; only then (or for an emulated engine) ``a`` itself is read."""
    xp = backend.xp
    if native and bool(xp.all(xp.isfinite(xp.real(xp.linalg.diagonal(g))))):
        return True
    return bool(backend.all_finite(a))


def gram_leaf(small: tuple[Any, ...], a: Any) -> dict[str, Any]:
    """``{"g": (A R1^-1 ...)^H (A R1^-1 ...), "ok": A finite}`` of one block (``small``:
    ``(rs, method, precision, prec_name, quiet, check)``, ``rs`` as
    :func:`apply_inverses` takes them; ``ok`` only with ``check``)."""
    from mpqr.qr.choice import NATIVE_PRECISIONS
    from mpqr.qr.gram_blocked import gram

    rs, method, precision, prec_name, quiet, check = small
    backend = block_backend(a)
    q = apply_inverses(a, rs, method, prec_name, quiet) if rs else a
    with _guard(backend, quiet):
        g = gram(backend, q, precision, f"{method}-gram")
    ok = _finite(backend, a, g, prec_name in NATIVE_PRECISIONS) if check else True
    return {"g": g, "ok": ok}


def r_leaf(small: tuple[Any, ...], a: Any) -> dict[str, Any]:
    """``{"r": R, "ok": A finite}``: the in-core ``mpqr.qr(mode="r")`` of one block
    (``small``: ``(precision, method, check)``), the leaf of a TSQR pass for ``R``."""
    from mpqr.qr.in_memory import qr

    precision, method, check = small
    backend = block_backend(a)
    ok = bool(backend.all_finite(a)) if check else True
    r = qr(a, mode="r", precision=precision, method=method)
    return {"r": to_host(r), "ok": ok, "how": (precision, method)}


def r_combine(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """A TSQR node: the ``R`` of the children's stacked ``R`` factors (in-core
    ``mpqr.qr`` on the host, at the precision and method of the leaves)."""
    import numpy as np

    from mpqr.qr.in_memory import qr

    precision, method = parts[0]["how"]
    r = qr(np.concatenate([p["r"] for p in parts], axis=0), mode="r", precision=precision,
           method=method)
    return {"r": r, "ok": all(p["ok"] for p in parts), "how": parts[0]["how"]}


def lstsq_leaf(small: tuple[Any, ...], a: Any, b: Any) -> dict[str, Any]:
    """The first pass of ``lstsq`` on one block pair (``small``: ``(gram precision,
    working precision, check)``): ``A^H A``, ``A^H b``, the squared column norms and the
    largest ``|b|`` of ``b``, and whether ``A`` and ``b`` are finite."""
    from mpqr.qr.gram_blocked import gram

    gprec, wprec, check = small
    backend = block_backend(a)
    xp = backend.xp
    with backend.ignore_fp_warnings():  # an over- or underflowing G is declined on the client
        g = gram(backend, a, gprec, "lstsq:gram")
        c = gemm(ct(xp, a), b, precision=wprec, label="lstsq:AHb", backend=backend)
        bb = backend.column_sumsq(b)
    bmax = xp.max(xp.abs(b)) if b.shape[0] else xp.zeros((), dtype=bb.dtype)
    return {"g": g, "c": c, "bb": bb, "bmax": bmax,
            "aok": _finite(backend, a, g, True) if check else True,
            "bok": xp.all(xp.isfinite(b))}


def residual_leaf(small: tuple[Any, ...], a: Any, b: Any) -> dict[str, Any]:
    """One refinement pass on a block pair: ``V = [b - A X[:, :kx], -A X[:, kx:]]`` and
    ``{"w": A^H V, "vv": squared column norms of V}`` (``w`` only with ``want_w``), the
    products at the working precision. ``small``: ``(X, kx, wprec, ea, eb, want_w)``;
    ``A`` and ``b`` are scaled by ``2^-ea`` and ``2^-eb`` (exactly) when those are
    nonzero. Of the residuals only their norms leave the block."""
    x, kx, wprec, ea, eb, want_w = small
    backend = block_backend(a)
    xp = backend.xp
    if ea:
        a = pow2(a, -ea)
    if eb:
        b = pow2(b, -eb)
    ax = gemm(a, backend.from_small(x, a), precision=wprec, label="lstsq:refine-AX",
              backend=backend)
    if kx == ax.shape[1]:
        v = b - ax
    elif kx == 0:
        v = -ax
    else:
        v = xp.concat([b - ax[:, :kx], -ax[:, kx:]], axis=1)
    out = {"vv": backend.column_sumsq(v)}
    if want_w:
        out["w"] = gemm(ct(xp, a), v, precision=wprec, label="lstsq:refine-AHV",
                        backend=backend)
    return out


def qh_leaf(small: tuple[Any, ...], q: Any, b: Any) -> dict[str, Any]:
    """``{"c": Q_i^H b_i}`` of one block pair (``small``: ``(wprec,)``)."""
    backend = block_backend(q)
    return {"c": gemm(ct(backend.xp, q), b, precision=small[0], label="lstsq:QHb",
                      backend=backend)}


def column_max_leaf(small: Any, a: Any) -> dict[str, Any]:
    """``{"colmax": ...}``: :func:`column_max` of one block, for a max over the blocks."""
    return {"colmax": column_max(a)}
