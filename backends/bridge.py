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

from collections.abc import Callable
from typing import Any

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
    from mpqr.backends import bridge_jax

    return bridge_jax.call(name, func, arrays, names, kwargs)


def _common_framework(arrays: tuple[Any, ...], names: tuple[str, ...]) -> str:
    kinds = []
    for n, a in zip(names, arrays):
        if framework_of(a) is None and not hasattr(a, "__array_namespace__") \
                and not hasattr(a, "__dlpack__"):
            continue  # not an array (None, a scalar, a list): the function's check names it
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
