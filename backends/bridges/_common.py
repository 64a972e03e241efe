"""What both sides of the bridge share: which framework an array belongs to, the trace
line of a bridged call, and the hand-back of results (no framework imported here)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["describe", "framework_of", "to_native"]

_FRAMEWORKS = {"torch": "torch", "jax": "jax", "jaxlib": "jax"}


def framework_of(x: Any) -> str | None:
    """``"torch"`` or ``"jax"`` for a PyTorch tensor or a JAX array, else ``None``."""
    return _FRAMEWORKS.get(type(x).__module__.partition(".")[0])


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
