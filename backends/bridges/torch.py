"""The PyTorch side of the bridge: DLPack views, the caller's stream, and gradients.

Imported only when an argument is a PyTorch tensor. CUDA tensors run on the CuPy
backend on the caller's current stream; CPU tensors on the NumPy backend.

Gradients (``torch.autograd.Function``): :func:`mpqr.qr` for ``m >= n`` with
``mode="reduced"`` or ``"r"`` (and ``"complete"`` when square), with the standard
QR backward formula; :func:`mpqr.lstsq` for a full-column-rank 2-D ``a``
(``M >= N``) with respect to ``a`` and ``b`` through ``x`` and ``residues``;
:func:`mpqr.matmul`. Anything else that requires grad is refused with a message
saying how to detach.

``torch.compile`` runs the call as an opaque function (a graph break, see
``torch.compiler.disable``); tracers that hold no data (``torch.export``,
``make_fx``, ``torch.func`` transforms) get a clear error.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from mpqr.backends.bridges._common import describe, framework_of, to_native

from mpqr.policy import record_event

__all__ = ["call", "qr_backward", "run"]


def call(name: str, func: Callable[..., Any], arrays: tuple[Any, ...],
         names: tuple[str, ...], kwargs: dict[str, Any]) -> Any:
    """Run ``func`` on views of the tensors; gradients where the inputs require them."""
    if "torch._dynamo" in sys.modules:
        # torch.compile may be tracing: an opaque call (a graph break). Without Dynamo
        # loaded nothing traces, and its import (~1 s) is not paid
        global _opaque
        if _opaque is None:
            _opaque = torch.compiler.disable(_call)
        return _opaque(name, func, arrays, names, kwargs)
    return _call(name, func, arrays, names, kwargs)


_opaque: Callable[..., Any] | None = None


def _call(name: str, func: Callable[..., Any], arrays: tuple[Any, ...],
          names: tuple[str, ...], kwargs: dict[str, Any]) -> Any:
    for n, t in zip(names, arrays):
        if framework_of(t) == "torch":
            _check_concrete(name, n, t)
    if torch.is_grad_enabled() and any(
            isinstance(t, torch.Tensor) and t.requires_grad for t in arrays):
        return _GRADIENTS.get(name, _no_gradient)(name, func, arrays, names, kwargs)
    return run(name, func, arrays, names, kwargs)


def run(name: str, func: Callable[..., Any], arrays: tuple[Any, ...],
        names: tuple[str, ...], kwargs: dict[str, Any]) -> Any:
    """``func`` on DLPack views of the tensors in ``arrays``; results as tensors."""
    tensors = [(n, t) for n, t in zip(names, arrays) if isinstance(t, torch.Tensor)]
    devices = {t.device for _, t in tensors}
    if len(devices) > 1:
        desc = ", ".join(f"`{n}` on {t.device}" for n, t in tensors)
        raise ValueError(f"arrays must be on one device, got {desc}; nothing is moved silently")
    dev = devices.pop()
    # the algorithms write into the input only when asked to (qr's overwrite_a)
    writable = name == "qr" and bool(kwargs.get("overwrite_a"))
    copied: list[str] = []
    if dev.type == "cuda":
        import cupy

        def view(t: torch.Tensor, n: str) -> Any:
            return cupy.from_dlpack(_exportable(t, n, copied))

        backend, back = "cupy", torch.from_dlpack

        def is_native(x: Any) -> bool:
            return isinstance(x, cupy.ndarray)

        ctx = _on_caller_stream(cupy, dev)
    elif dev.type == "cpu":
        def view(t: torch.Tensor, n: str) -> Any:
            v = _exportable(t, n, copied).numpy()
            if not writable:
                v.flags.writeable = False  # this view only: a stray write raises
            return v

        backend, back = "numpy", _from_numpy

        def is_native(x: Any) -> bool:
            return isinstance(x, (np.ndarray, np.generic))

        ctx = contextlib.nullcontext()
    else:
        raise TypeError(f"mpqr runs PyTorch tensors on CPU and CUDA devices, got "
                        f"{dev}; move them with .cpu() or .cuda()")
    with ctx:
        native = tuple(view(a, n) if isinstance(a, torch.Tensor) else a
                       for n, a in zip(names, arrays))
        record_event("bridge", describe("torch", str(dev), backend, len(tensors), copied),
                     framework="torch", backend=backend, device=str(dev))
        out = func(*native, **kwargs)
        return to_native(out, back, is_native)


@contextlib.contextmanager
def _on_caller_stream(cupy: Any, dev: torch.device) -> Iterator[None]:
    # CuPy's current stream becomes the caller's: the DLPack exchanges need no events
    # and the call is ordered between the caller's work before and after it
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    ptr = torch.cuda.current_stream(index).cuda_stream
    with cupy.cuda.Device(index):
        stream = cupy.cuda.Stream.null if ptr == 0 else _external_stream(cupy, ptr, index)
        with stream:
            yield


def _external_stream(cupy: Any, ptr: int, index: int) -> Any:
    # CuPy 14 deprecates ExternalStream for Stream.from_external, which takes an object
    # with the CUDA stream protocol; a raw pointer still needs ExternalStream there
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return cupy.cuda.ExternalStream(ptr, index)


def _exportable(t: torch.Tensor, n: str, copied: list[str]) -> torch.Tensor:
    """``t`` without autograd history, in a dtype NumPy/CuPy hold (copies noted)."""
    if t.layout != torch.strided:
        raise TypeError(f"`{n}` must be a dense tensor, got layout {t.layout}; convert it "
                        "with .to_dense()")
    t = t.detach()
    if t.dtype == torch.bfloat16:  # computed in float32, as mpqr computes float16
        copied.append(f"`{n}` bfloat16 to float32")
        t = t.to(torch.float32)
    elif t.dtype == torch.complex32:
        copied.append(f"`{n}` complex32 to complex64")
        t = t.to(torch.complex64)
    if t.is_conj():  # a lazy conjugate (t.conj()) is not exportable as memory
        copied.append(f"`{n}` conjugate view resolved")
        t = t.resolve_conj()
    if t.is_neg():
        copied.append(f"`{n}` negative view resolved")
        t = t.resolve_neg()
    return t


def _from_numpy(x: Any) -> torch.Tensor:
    x = np.asarray(x)
    if not x.flags.writeable or any(s < 0 for s in x.strides):
        x = x.copy()  # torch.from_numpy takes writable, positively strided arrays
    return torch.from_numpy(x)


def _check_concrete(name: str, n: str, t: Any) -> None:
    from torch._subclasses.fake_tensor import is_fake
    from torch.fx.experimental import proxy_tensor

    # both are internal helpers: their absence (another PyTorch release) means no check
    get_proxy_mode = getattr(proxy_tensor, "get_proxy_mode", lambda: None)
    wrapped = getattr(torch._C._functorch, "is_functorch_wrapped_tensor", lambda _: False)
    if not isinstance(t, torch.Tensor):
        what = f"a {type(t).__name__}"
    elif t.is_meta or is_fake(t):
        what = "a tensor without data (fake or meta)"
    elif wrapped(t):
        what = "a tensor inside a torch.func transform"
    elif get_proxy_mode() is not None:
        what = "a tensor being traced into a graph (make_fx, torch.export)"
    else:
        return
    raise TypeError(
        f"mpqr.{name} cannot be traced by PyTorch: `{n}` is {what}. mpqr runs its own "
        "kernels on concrete tensors: torch.compile runs it as an opaque call (a graph "
        "break); call it outside torch.export, make_fx and torch.func transforms")


def _no_gradient(name: str, func: Callable[..., Any], arrays: tuple[Any, ...],
                 names: tuple[str, ...], kwargs: dict[str, Any]) -> Any:
    raise NotImplementedError(_detach_hint(name, names, arrays, f"mpqr.{name} has no gradient"))


def _detach_hint(name: str, names: tuple[str, ...], arrays: tuple[Any, ...], why: str) -> str:
    req = [n for n, t in zip(names, arrays) if isinstance(t, torch.Tensor) and t.requires_grad]
    det = ", ".join(f"{n}.detach()" for n in req)
    return (f"{why}; `{'`, `'.join(req)}` require{'s' if len(req) == 1 else ''} grad. To "
            f"compute without gradients pass {det} or call mpqr.{name} under torch.no_grad()")


# --- gradients -----------------------------------------------------------------

def qr_backward(gq: torch.Tensor | None, gr: torch.Tensor | None, q: torch.Tensor,
                r: torch.Tensor) -> torch.Tensor:
    """Gradient of ``A = Q R`` (reduced, ``m >= n``, real diagonal of R):
    ``gA = (gQ + Q sym(triu(gR R^H - Q^H gQ))) R^{-H}``, ``sym(X) = X + X^H`` with its
    diagonal's real part halved (Walter & Lehmann 2018; PyTorch's linalg_qr_backward)."""
    m_ = torch.zeros_like(r)
    if gr is not None:
        m_ = m_ + gr @ r.mH
    if gq is not None:
        m_ = m_ - q.mH @ gq
    m_ = m_.triu()
    half = torch.diagonal(m_, dim1=-2, dim2=-1).real
    sym = m_ + m_.mH - torch.diag_embed(half).to(m_.dtype)
    ga = q @ sym
    if gq is not None:
        ga = ga + gq
    return torch.linalg.solve_triangular(r.mH, ga, upper=False, left=False)


class _Spec:
    """The non-tensor arguments of one call, passed through ``Function.apply``."""

    def __init__(self, name, func, names, kwargs):
        self.name, self.func, self.names, self.kwargs = name, func, names, kwargs
        self.result_type: type = tuple
        self.rank: Any = None


class _QR(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, spec):
        ctx.set_materialize_grads(False)
        out = run(spec.name, spec.func, (x,), spec.names, spec.kwargs)
        spec.result_type = type(out)
        q, r = out
        ctx.save_for_backward(q, r)
        ctx.x_dtype = x.dtype
        return q, r

    @staticmethod
    def backward(ctx, gq, gr):
        q, r = ctx.saved_tensors
        if gq is None and gr is None:
            return None, None
        return qr_backward(gq, gr, q, r).to(ctx.x_dtype), None


def _qr_grad(name, func, arrays, names, kwargs):
    (x,) = arrays
    mode = kwargs.get("mode", "reduced")
    m, n = x.shape[-2:] if x.ndim >= 2 else (0, 1)
    if x.ndim < 2 or mode not in ("reduced", "r", "complete"):
        return run(name, func, arrays, names, kwargs)  # the function's own error
    if m < n or (mode == "complete" and m != n):
        raise NotImplementedError(_detach_hint(
            name, names, arrays,
            f"the gradient of mpqr.qr is implemented for m >= n with mode 'reduced' or 'r' "
            f"(or 'complete' when square); got shape {tuple(x.shape)}, mode {mode!r}"))
    # mode="r" forms Q too: the gradient needs it; inputs are never overwritten here
    spec = _Spec(name, func, names, {**kwargs, "mode": "reduced", "overwrite_a": False})
    q, r = _QR.apply(x, spec)
    return r if mode == "r" else spec.result_type(q, r)


class _Lstsq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, spec):
        ctx.set_materialize_grads(False)
        x, res, rank, s = run(spec.name, spec.func, (a, b), spec.names, spec.kwargs)
        ctx.save_for_backward(a.detach(), b.detach(), x)
        ctx.rank, ctx.spec = int(rank), spec
        ctx.dtypes = (a.dtype, b.dtype)
        if s is not None:
            ctx.mark_non_differentiable(s)
        return x, res, rank, s

    @staticmethod
    def backward(ctx, gx, gres, _grank, _gs):
        a, b, x = ctx.saved_tensors
        n = a.shape[1]
        if ctx.rank < n:
            raise RuntimeError(f"the gradient of mpqr.lstsq needs `a` of full column rank; "
                               f"it has rank {ctx.rank} < {n}")
        vec = b.ndim == 1
        a, b = a.to(x.dtype), b.to(x.dtype)
        bb, xx = (b[:, None], x[:, None]) if vec else (b, x)
        r = bb - a @ xx
        ga = torch.zeros_like(a)
        gb = torch.zeros_like(bb)
        if gx is not None:
            import mpqr

            gxx = gx[:, None] if vec else gx
            # (A^H A)^-1 gx through R, from a QR of A at the call's precision
            rr = mpqr.qr(a, mode="r", precision=ctx.spec.kwargs.get("precision"))
            w = torch.linalg.solve_triangular(rr.mH, gxx, upper=False)
            z = torch.linalg.solve_triangular(rr, w, upper=True)
            az = a @ z
            ga = ga + r @ z.mH - az @ xx.mH
            gb = gb + az
        if gres is not None and gres.numel() > 0:
            # residues = ||b - A x||^2 per column: d = 2 Re(r^H (db - dA x)) as A^H r = 0
            wres = 2 * (gres.real if gres.is_complex() else gres).reshape(1, -1).to(r.dtype)
            ga = ga - (r * wres) @ xx.mH
            gb = gb + r * wres
        ga = ga.to(ctx.dtypes[0]) if ctx.needs_input_grad[0] else None
        gb = (gb[:, 0] if vec else gb).to(ctx.dtypes[1]) if ctx.needs_input_grad[1] else None
        return ga, gb, None


def _lstsq_grad(name, func, arrays, names, kwargs):
    a, b = arrays
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.ndim < 2 \
            or b.ndim < 1:
        return run(name, func, arrays, names, kwargs)  # the function's own error
    if a.ndim > 2 or b.ndim > 2:
        raise NotImplementedError(_detach_hint(
            name, names, arrays, "the gradient of mpqr.lstsq is implemented for 2-D `a` "
            f"and 1-D or 2-D `b`; got shapes {tuple(a.shape)} and {tuple(b.shape)}"))
    if b.shape[0] != a.shape[0]:
        return run(name, func, arrays, names, kwargs)  # the function's own error
    if a.shape[0] < a.shape[1]:
        raise NotImplementedError(_detach_hint(
            name, names, arrays, "the gradient of mpqr.lstsq is implemented for M >= N "
            f"(overdetermined or square); got `a` of shape {tuple(a.shape)}"))
    return _Lstsq.apply(a, b, _Spec(name, func, names, kwargs))


class _Matmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, spec):
        ctx.set_materialize_grads(False)
        c = run(spec.name, spec.func, (a, b), spec.names, spec.kwargs)
        ctx.save_for_backward(a.detach(), b.detach())
        ctx.spec = spec
        return c

    @staticmethod
    def backward(ctx, gc):
        a, b = ctx.saved_tensors
        if gc is None:
            return None, None, None
        import mpqr

        kw = {"precision": ctx.spec.kwargs.get("precision"),
              "options": ctx.spec.kwargs.get("options")}
        ga = mpqr.matmul(gc, b.mH.to(gc.dtype), **kw).to(a.dtype) \
            if ctx.needs_input_grad[0] else None
        gb = mpqr.matmul(a.mH.to(gc.dtype), gc, **kw).to(b.dtype) \
            if ctx.needs_input_grad[1] else None
        return ga, gb, None


def _matmul_grad(name, func, arrays, names, kwargs):
    a, b = arrays
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.ndim != 2 \
            or b.ndim != 2:
        return run(name, func, arrays, names, kwargs)  # the function's own error
    return _Matmul.apply(a, b, _Spec(name, func, names, kwargs))


_GRADIENTS: dict[str, Callable[..., Any]] = {
    "qr": _qr_grad, "lstsq": _lstsq_grad, "matmul": _matmul_grad,
}
