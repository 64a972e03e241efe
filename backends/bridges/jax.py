"""The JAX side of the bridge: DLPack views, streams, and gradients.

Imported only when an argument is a JAX array. Arrays on a CUDA device run on
the CuPy backend, CPU arrays on the NumPy backend. They are exchanged with
``stream=`` set (the DLPack protocol), so the call waits for the input on CuPy's
current stream and JAX's stream waits for the results, through events.

Gradients (``jax.custom_vjp``, reverse mode): :func:`mpqr.qr` for ``m >= n`` with
``mode="reduced"`` or ``"r"`` (``"complete"`` when square), :func:`mpqr.lstsq` for a
full-column-rank 2-D ``a`` (``M >= N``) through ``x`` and ``residues``, and
:func:`mpqr.matmul`, with the formulas of :mod:`mpqr.backends.bridges.torch`.
``jax.grad`` works on concrete arrays; inside ``jax.jit``, ``jax.vmap`` or
forward-mode transformations the call gets a clear error (it runs its own
kernels, which JAX cannot trace).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.linalg import solve_triangular
from mpqr.backends.bridges._common import describe, framework_of, to_native

from mpqr.policy import record_event

__all__ = ["call", "compact", "run"]

#: the tracers of reverse-mode differentiation (``jax.grad``, ``jax.vjp``)
_GRAD_TRACERS = ("JVPTracer", "LinearizeTracer")


def call(name: str, func: Callable[..., Any], arrays: tuple[Any, ...],
         names: tuple[str, ...], kwargs: dict[str, Any]) -> Any:
    """Run ``func`` on views of the arrays; gradients under ``jax.grad``."""
    tracers = [type(a).__name__ for a in arrays if isinstance(a, jax.core.Tracer)]
    if tracers and name in _GRADIENTS and all(t in _GRAD_TRACERS for t in tracers):
        return _GRADIENTS[name](name, func, arrays, names, kwargs)
    return run(name, func, arrays, names, kwargs)


def run(name: str, func: Callable[..., Any], arrays: tuple[Any, ...],
        names: tuple[str, ...], kwargs: dict[str, Any]) -> Any:
    """``func`` on DLPack views of the JAX arrays in ``arrays``; results as JAX arrays."""
    for n, a in zip(names, arrays):
        if isinstance(a, jax.core.Tracer):
            raise TypeError(
                f"mpqr.{name} cannot be traced by JAX: `{n}` is a {type(a).__name__} (inside "
                "jax.jit, jax.vmap, forward-mode differentiation or another transformation"
                f"{'' if name in _GRADIENTS else ', or jax.grad: it has no gradient'}). mpqr "
                "runs its own kernels on concrete arrays: call it outside the transformed "
                "function")
    devices = []
    for n, a in zip(names, arrays):
        if framework_of(a) != "jax":
            continue
        ds = a.devices()
        if len(ds) != 1:
            raise ValueError(f"`{n}` is sharded over {len(ds)} devices; mpqr factors arrays "
                             "on one device (gather it first)")
        devices.append((n, next(iter(ds))))
    if len({d for _, d in devices}) > 1:
        desc = ", ".join(f"`{n}` on {d}" for n, d in devices)
        raise ValueError(f"arrays must be on one device, got {desc}; nothing is moved silently")
    dev = devices[0][1]
    # JAX arrays are immutable: nothing is ever written into them
    kwargs = {k: (False if k.startswith("overwrite_") else v) for k, v in kwargs.items()}
    if dev.platform == "cpu":
        def view(a: Any) -> Any:
            v = np.from_dlpack(a)
            v.flags.writeable = False
            return v

        def back(x: Any) -> Any:
            x = np.asarray(x)
            if not compact(x):  # JAX takes dense DLPack tensors (any order of dimensions)
                x = np.ascontiguousarray(x)
            return jax.dlpack.from_dlpack(x) if x.flags.writeable else jax.device_put(x, dev)

        def is_native(x: Any) -> bool:
            return isinstance(x, (np.ndarray, np.generic))

        backend, ctx = "numpy", contextlib.nullcontext()
    elif dev.platform in ("gpu", "cuda"):
        import cupy

        def view(a: Any) -> Any:
            return cupy.from_dlpack(a)

        def back(x: Any) -> Any:
            # JAX takes dense DLPack tensors (any order of dimensions)
            return jax.dlpack.from_dlpack(x if compact(x) else cupy.ascontiguousarray(x))

        def is_native(x: Any) -> bool:
            return isinstance(x, cupy.ndarray)

        index = getattr(dev, "local_hardware_id", None)
        backend, ctx = "cupy", cupy.cuda.Device(dev.id if index is None else index)
    else:
        raise TypeError(f"mpqr runs JAX arrays on CPU and CUDA devices, got {dev} "
                        f"({dev.platform}); move them with jax.device_put")
    with ctx:
        native = tuple(view(a) if framework_of(a) == "jax" else a for a in arrays)
        record_event("bridge", describe("jax", str(dev), backend, len(devices), []),
                     framework="jax", backend=backend, device=str(dev))
        out = func(*native, **kwargs)
        return to_native(out, back, is_native)


def compact(x: Any) -> bool:
    """``x`` fills its memory without gaps or repeats (C, F or any order of dimensions)."""
    if x.size == 0:
        return False
    step = x.itemsize
    for stride, size in sorted((st, sh) for st, sh in zip(x.strides, x.shape) if sh != 1):
        if stride != step:
            return False
        step *= size
    return True


# --- gradients: JAX's cotangents are the conjugates of PyTorch's gradients --------

def _mh(x: Any) -> Any:
    return jnp.conj(jnp.swapaxes(x, -1, -2))


def _no_gradient(name: str, names: tuple[str, ...], why: str) -> TypeError:
    return TypeError(f"{why}; call mpqr.{name} outside jax.grad (on concrete arrays, "
                     f"jax.lax.stop_gradient({', '.join(names)}) to keep it in the function)")


def _qr_cotangent(gq: Any, gr: Any, q: Any, r: Any) -> Any:
    # PyTorch's convention on conjugated cotangents (bridge_torch.qr_backward), conjugated
    gq, gr = jnp.conj(jnp.asarray(gq)), jnp.conj(jnp.asarray(gr))
    m_ = jnp.triu(gr @ _mh(r) - _mh(q) @ gq)
    half = jnp.real(jnp.diagonal(m_, axis1=-2, axis2=-1))
    eye = jnp.eye(m_.shape[-1], dtype=m_.dtype)
    sym = m_ + _mh(m_) - half[..., None, :].astype(m_.dtype) * eye
    ga = gq + q @ sym
    # ga R^-H: solve R X^H = ga^H
    return jnp.conj(_mh(solve_triangular(r, _mh(ga), lower=False)))


def _qr_grad(name, func, arrays, names, kwargs):
    (x,) = arrays
    mode = kwargs.get("mode", "reduced")
    if x.ndim < 2 or mode not in ("reduced", "r", "complete"):
        return run(name, func, arrays, names, kwargs)  # the function's own error
    m, n = x.shape[-2:]
    if m < n or (mode == "complete" and m != n):
        raise _no_gradient(name, names, (
            "the gradient of mpqr.qr is implemented for m >= n with mode 'reduced' or 'r' "
            f"(or 'complete' when square); got shape {tuple(x.shape)}, mode {mode!r}"))
    kw = {**kwargs, "mode": "reduced"}
    kind: list[type] = []

    @jax.custom_vjp
    def f(x):
        out = run(name, func, (x,), names, kw)
        return tuple(out)

    def fwd(x):
        out = run(name, func, (x,), names, kw)
        kind.append(type(out))
        return tuple(out), (out.Q, out.R)

    def bwd(res, g):
        q, r = res
        return (_qr_cotangent(g[0], g[1], q, r).astype(x.dtype),)

    f.defvjp(fwd, bwd)
    q, r = f(x)
    return r if mode == "r" else kind[0](q, r)


def _lstsq_grad(name, func, arrays, names, kwargs):
    a, b = arrays
    if getattr(a, "ndim", 0) < 2 or getattr(b, "ndim", 0) < 1:
        return run(name, func, arrays, names, kwargs)  # the function's own error
    if a.ndim > 2 or b.ndim > 2:
        raise _no_gradient(name, names, (
            "the gradient of mpqr.lstsq is implemented for 2-D `a` and 1-D or 2-D `b`; got "
            f"shapes {tuple(a.shape)} and {tuple(b.shape)}"))
    if b.shape[0] != a.shape[0]:
        return run(name, func, arrays, names, kwargs)  # the function's own error
    if a.shape[0] < a.shape[1]:
        raise _no_gradient(name, names, (
            "the gradient of mpqr.lstsq is implemented for M >= N (overdetermined or "
            f"square); got `a` of shape {tuple(a.shape)}"))
    # integers are differentiated through their cast (JAX gives them float0 cotangents)
    a, b = (v if jnp.issubdtype(v.dtype, jnp.inexact) else v.astype(float) for v in (a, b))
    extra: dict[str, Any] = {}

    @jax.custom_vjp
    def f(a, b):
        x, res, _, _ = run(name, func, (a, b), names, kwargs)
        return x, res

    def fwd(a, b):
        x, res, rank, s = run(name, func, (a, b), names, kwargs)
        extra.update(rank=rank, s=s)
        return (x, res), (a, b, x)

    def bwd(saved, g):
        a, b, x = saved
        rank = int(extra["rank"])
        n = a.shape[1]
        if rank < n:
            raise ValueError(f"the gradient of mpqr.lstsq needs `a` of full column rank; "
                             f"it has rank {rank} < {n}")
        gx, gres = jnp.conj(jnp.asarray(g[0])), jnp.asarray(g[1])
        vec = b.ndim == 1
        aw, bw = a.astype(x.dtype), b.astype(x.dtype)
        bb, xx = (bw[:, None], x[:, None]) if vec else (bw, x)
        gxx = gx[:, None] if vec else gx
        r = bb - aw @ xx
        import mpqr

        # (A^H A)^-1 gx through R, from a QR of A at the call's precision
        rr = mpqr.qr(aw, mode="r", precision=kwargs.get("precision"))
        z = solve_triangular(rr, solve_triangular(_mh(rr), gxx, lower=True), lower=False)
        az = aw @ z
        ga = r @ _mh(z) - az @ _mh(xx)
        gb = az
        if gres.size > 0:
            # residues = ||b - A x||^2 per column: d = 2 Re(r^H (db - dA x)) as A^H r = 0
            w = 2 * jnp.real(gres).reshape(1, -1).astype(r.dtype)
            ga = ga - (r * w) @ _mh(xx)
            gb = gb + r * w
        gb = gb[:, 0] if vec else gb
        return jnp.conj(ga).astype(a.dtype), jnp.conj(gb).astype(b.dtype)

    f.defvjp(fwd, bwd)
    x, res = f(a, b)
    return x, res, extra["rank"], extra["s"]


def _matmul_grad(name, func, arrays, names, kwargs):
    a, b = arrays
    if getattr(a, "ndim", 0) != 2 or getattr(b, "ndim", 0) != 2:
        return run(name, func, arrays, names, kwargs)  # the function's own error
    a, b = (v if jnp.issubdtype(v.dtype, jnp.inexact) else v.astype(float) for v in (a, b))

    @jax.custom_vjp
    def f(a, b):
        return run(name, func, (a, b), names, kwargs)

    def fwd(a, b):
        return run(name, func, (a, b), names, kwargs), (a, b)

    def bwd(saved, gc):
        a, b = saved
        gc = jnp.asarray(gc)
        import mpqr

        kw = {"precision": kwargs.get("precision"), "options": kwargs.get("options")}
        # transposes, not conjugates: JAX's cotangents of a bilinear map
        ga = mpqr.matmul(gc, jnp.swapaxes(b, 0, 1).astype(gc.dtype), **kw)
        gb = mpqr.matmul(jnp.swapaxes(a, 0, 1).astype(gc.dtype), gc, **kw)
        return ga.astype(a.dtype), gb.astype(b.dtype)

    f.defvjp(fwd, bwd)
    return f(a, b)


_GRADIENTS: dict[str, Callable[..., Any]] = {
    "qr": _qr_grad, "lstsq": _lstsq_grad, "matmul": _matmul_grad,
}
