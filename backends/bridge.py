"""PyTorch tensors and JAX arrays on mpqr's own backends, through DLPack.

A tensor on a CUDA device is viewed as a CuPy array and a CPU tensor as a NumPy
array (no copy: the view shares the tensor's memory); the call runs on the CuPy
or NumPy backend with its kernels and engines, and every array it returns goes
back to the caller's library, device and stream, again without a copy.

Streams. PyTorch: the call runs on the caller's current stream
(``torch.cuda.current_stream()``, entered as a ``cupy.cuda.ExternalStream``), so
it is ordered after the work already queued there and the work queued after it
is ordered after the call, with no host synchronization. JAX: the arrays are
exchanged with ``stream=`` set (the DLPack protocol), so JAX's stream and CuPy's
current stream wait for each other through events.

Views are read-only for the call where the library can mark them so (NumPy);
the algorithms write into an input only when ``overwrite_a=True`` asks for it
(PyTorch; JAX arrays are immutable, so it is ignored there).

The framework modules are never imported here unless an argument is one of
their arrays: the test is on the type's module name.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from mpqr.policy import record_event

__all__ = ["call", "framework_of", "is_foreign"]

_FRAMEWORKS = {"torch": "torch", "jax": "jax", "jaxlib": "jax"}


def framework_of(x: Any) -> str | None:
    """``"torch"`` or ``"jax"`` for a PyTorch tensor or a JAX array, else ``None``."""
    return _FRAMEWORKS.get(type(x).__module__.partition(".")[0])


def is_foreign(*arrays: Any) -> bool:
    """True when an argument is a PyTorch tensor or a JAX array (or their tracers)."""
    return any(framework_of(a) is not None for a in arrays)


def call(name: str, func: Callable[..., Any], arrays: tuple[Any, ...],
         names: tuple[str, ...], **kwargs: Any) -> Any:
    """``func(*arrays, **kwargs)`` on the arrays' views, results in the caller's library.

    ``name`` is the public function's name (``"qr"``, ``"lstsq"``, ...) for the
    messages, the trace and the choice of gradient.
    """
    fw = _common_framework(arrays, names)
    if fw == "torch":
        from mpqr.backends import bridge_torch

        return bridge_torch.call(name, func, arrays, names, kwargs)
    return _jax_call(name, func, arrays, names, kwargs)


def _common_framework(arrays: tuple[Any, ...], names: tuple[str, ...]) -> str:
    kinds = []
    for n, a in zip(names, arrays):
        if a is None or isinstance(a, (bool, int, float, complex)):
            continue  # the function's own validation names them
        kinds.append((n, framework_of(a) or type(a).__module__.partition(".")[0]))
    libs = {k for _, k in kinds}
    if len(libs) > 1:
        desc = ", ".join(f"`{n}` is {k}" for n, k in kinds)
        raise TypeError(f"arrays from different libraries cannot be mixed ({desc}); "
                        "move them to one library and device first")
    fw = libs.pop()
    assert fw in ("torch", "jax")
    return fw


def describe(fw: str, device: str, backend: str, n: int, copied: list[str]) -> str:
    """The trace line of one bridged call."""
    what = "tensor" if fw == "torch" else "array"
    plural = "s" if n > 1 else ""
    how = "copied: " + "; ".join(copied) if copied else "viewed through DLPack, no copy"
    return (f"{fw} {what}{plural} on {device} run on the {backend} backend "
            f"({how}); results returned as {fw} {what}s on {device}")


def to_native(out: Any, convert: Callable[[Any], Any], is_native: Callable[[Any], bool]) -> Any:
    """``out`` with every backend array replaced by ``convert(array)`` (tuples, named
    tuples and ``None``/Python numbers kept as they are)."""
    if isinstance(out, tuple):
        items = [to_native(o, convert, is_native) for o in out]
        return type(out)(*items) if hasattr(out, "_fields") else tuple(items)
    if is_native(out):
        return convert(out)
    return out


# --- JAX ----------------------------------------------------------------------

def _jax_call(name: str, func: Callable[..., Any], arrays: tuple[Any, ...],
              names: tuple[str, ...], kwargs: dict[str, Any]) -> Any:
    import jax
    import numpy as np

    for n, a in zip(names, arrays):
        if isinstance(a, jax.core.Tracer):
            raise TypeError(
                f"mpqr.{name} cannot be traced by JAX: `{n}` is a {type(a).__name__} (inside "
                "jax.jit, jax.grad, jax.vmap or another transformation). mpqr runs its own "
                "kernels on concrete arrays: call it outside the transformed function")
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
    kwargs = {k: (False if k.startswith("overwrite_") else v) for k, v in kwargs.items()}
    if dev.platform == "cpu":
        def view(a: Any) -> Any:
            v = np.from_dlpack(a)
            v.flags.writeable = False
            return v

        def back(x: Any) -> Any:
            # DLPack takes compact, writable arrays only; anything else is copied
            x = np.ascontiguousarray(x)
            if x.flags.writeable:
                return jax.dlpack.from_dlpack(x)
            return jax.device_put(x, dev)

        backend, is_native, ctx = "numpy", (lambda x: isinstance(x, np.ndarray)), \
            contextlib.nullcontext()
    elif dev.platform in ("gpu", "cuda"):
        import cupy

        def view(a: Any) -> Any:
            return cupy.from_dlpack(a)

        def back(x: Any) -> Any:
            return jax.dlpack.from_dlpack(cupy.ascontiguousarray(x))

        backend, is_native = "cupy", (lambda x: isinstance(x, cupy.ndarray))
        ctx = cupy.cuda.Device(dev.local_hardware_id if dev.local_hardware_id is not None
                               else dev.id)
    else:
        raise TypeError(f"mpqr runs JAX arrays on CPU and CUDA devices, got {dev} "
                        f"({dev.platform}); move them with jax.device_put")
    native = tuple(view(a) if framework_of(a) == "jax" else a for a in arrays)
    record_event("bridge", describe("jax", str(dev), backend, len(devices), []),
                 framework="jax", backend=backend, device=str(dev))
    with ctx:
        out = func(*native, **kwargs)
        return to_native(out, back, is_native)
