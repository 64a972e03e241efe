"""Device faults turned into clear errors, in one place.

The public entry points run their work inside :func:`device_errors`. A backend
may translate library-specific failures through its ``translate_error`` hook
(the CuPy backend turns device out-of-memory into a ``MemoryError`` saying how
much was needed and how to need less, and NVRTC compilation failures into a
``RuntimeError`` naming the kernel and the GPU architecture). The original
exception's frames are cleared so the device memory its locals held returns
to the pool before the caller sees the error.

The same block runs inside the backend's ``host_blas_scope`` (where it has one): the
CuPy backend keeps host BLAS on one thread there, for the n x n steps it runs on the
host (``backend.small``).
"""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Iterator
from typing import Any

__all__ = ["as_device_error", "device_errors"]


@contextlib.contextmanager
def device_errors(backend: Any, what: str) -> Iterator[None]:
    """Run a block, translating the backend's device faults for the call ``what``."""
    scope = getattr(backend, "host_blas_scope", None)
    try:
        with scope() if scope is not None else contextlib.nullcontext():
            yield
    except Exception as exc:
        new = as_device_error(backend, exc, what)
        if new is exc:
            raise
        # the failed call's temporaries live in the traceback's frames: free them now
        traceback.clear_frames(exc.__traceback__)
        exc.__traceback__ = None
        raise new from None


def as_device_error(backend: Any, exc: BaseException, what: str) -> BaseException:
    """``exc`` (an error mpqr raises itself, e.g. the memory plan's refusal) as the
    backend raises its device faults, or ``exc`` unchanged: a caller catching the array
    library's out-of-memory error catches mpqr's too."""
    translate = getattr(backend, "translate_error", None)
    new = translate(exc, what) if translate is not None else None
    return exc if new is None else new
