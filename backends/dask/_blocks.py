"""What runs on a worker for one row block: mpqr's in-core functions on the block's own
backend (NumPy on a CPU worker, CuPy on a GPU worker), every product through the policy.

Each function is a plain module-level function of its block and small operands, so it
pickles to a process or remote worker; none modifies its input block.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

from mpqr.backends import get_backend

from mpqr._array_api import array_namespace
from mpqr.policy import active_gemm_options, gemm, gemm_options
from mpqr.qr._kernels import ct

__all__ = [
    "apply_inverses",
    "axpy",
    "bind",
    "block_backend",
    "column_max",
    "column_sq",
    "gram_block",
    "leaf_qr",
    "node_qr",
    "pow2",
    "product",
    "qh_times",
    "run_with",
    "times",
]


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
    it (substitution, or a GEMM by the inverse where it is well conditioned)."""
    from mpqr.qr.cholqr import _apply_inverse

    backend = block_backend(a)
    q = a
    with _guard(backend, quiet):
        for r, inverse in rs:
            q = _apply_inverse(backend, block_backend(r), q, r, method, prec_name,
                               inverse=inverse)
    return q


def gram_block(a: Any, rs: tuple[Any, ...], method: str, precision: Any, prec_name: str,
               quiet: bool = False) -> Any:
    """``(1, n, n)``: the Gram matrix of ``a R1^-1 ...`` (of ``a`` itself for no ``rs``),
    the product through the policy; the leading axis is summed over the blocks."""
    from mpqr.qr.gram_blocked import gram

    backend = block_backend(a)
    q = apply_inverses(a, rs, method, prec_name, quiet) if rs else a
    with _guard(backend, quiet):
        g = gram(backend, q, precision, f"{method}-gram")
    return backend.xp.expand_dims(g, axis=0)


def qh_times(q: Any, b: Any, precision: str, label: str) -> Any:
    """``(1, n, k)``: ``q^H b`` of one block pair."""
    backend = block_backend(q)
    return backend.xp.expand_dims(
        gemm(ct(backend.xp, q), b, precision=precision, label=label, backend=backend), axis=0)


def times(a: Any, x: Any, precision: str, label: str) -> Any:
    """``a @ x`` for a block ``a`` and a small ``x`` (moved to the block's device)."""
    backend = block_backend(a)
    return gemm(a, backend.from_small(x, a), precision=precision, label=label,
                backend=backend)


def product(a: Any, x: Any, precision: str, label: str) -> Any:
    """``a @ x`` of two small factors on one worker (the TSQR tree's updates)."""
    backend = block_backend(a)
    return gemm(a, x, precision=precision, label=label, backend=backend)


def axpy(r: Any, q: Any, alpha: Any) -> Any:
    """``r - q * alpha`` (``alpha``: one value per column)."""
    backend = block_backend(r)
    return r - q * backend.from_small(alpha, r)


def column_sq(v: Any) -> Any:
    """``(1, k)``: the squared 2-norms of one block's columns (summed over the blocks)."""
    xp = block_backend(v).xp
    return xp.sum(xp.real(v * xp.conj(v)), axis=0, keepdims=True)


def leaf_qr(a: Any, precision: Any, method: str) -> tuple[Any, Any]:
    """The in-core QR of a leaf block (``mpqr.qr``, reduced): ``(Q, R)``."""
    from mpqr.qr.api import qr

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
