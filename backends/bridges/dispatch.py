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

from mpqr.backends.bridges._common import framework_of

__all__ = ["call", "framework_of", "is_foreign"]

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
        from mpqr.backends.bridges import torch as bridge_torch

        return bridge_torch.call(name, func, arrays, names, kwargs)
    from mpqr.backends.bridges import jax as bridge_jax

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
