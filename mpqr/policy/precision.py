"""Precision names and how a setting is resolved.

Order, most specific first (like JAX's matmul-precision settings):
per-call ``precision=`` > ``with mpqr.precision(...)`` > ``mpqr.set_precision`` >
environment variable ``MPQR_PRECISION`` > ``"auto"``.

The context manager stores its value in a :class:`contextvars.ContextVar`, so
threads and asyncio tasks each see their own setting.
"""

from __future__ import annotations

import contextvars
import os
import threading
from typing import Any

__all__ = [
    "PRECISIONS",
    "get_precision",
    "precision",
    "resolve_precision",
    "set_precision",
    "validate_precision",
]

#: Every precision name mpqr accepts.
PRECISIONS: tuple[str, ...] = (
    "auto",
    "fp16",
    "fp32",
    "fp32-emulated",
    "fp64",
    "fp64-emulated",
)

ENV_VAR = "MPQR_PRECISION"

_context: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "mpqr_precision", default=None
)
_default_lock = threading.Lock()
_process_default: str | None = None


def validate_precision(value: Any, argname: str = "precision") -> str:
    """Return ``value`` if it is a precision name, else raise a ValueError listing them."""
    if not isinstance(value, str):
        raise TypeError(
            f"`{argname}` must be a string, one of {', '.join(map(repr, PRECISIONS))}; "
            f"got {type(value).__name__} {value!r}"
        )
    if value not in PRECISIONS:
        raise ValueError(
            f"`{argname}` must be one of {', '.join(map(repr, PRECISIONS))}; got {value!r}"
        )
    return value


def set_precision(value: str | None) -> None:
    """Set the process-wide default precision (``None`` clears it)."""
    global _process_default
    if value is not None:
        validate_precision(value)
    with _default_lock:
        _process_default = value


def get_precision() -> str:
    """The precision a call without ``precision=`` would use here and now."""
    return resolve_precision(None)[0]


class precision:
    """Context manager (and decorator) that sets the precision for the calls inside it.

    Examples
    --------
    >>> import mpqr
    >>> with mpqr.precision("fp32-emulated"):
    ...     mpqr.get_precision()
    'fp32-emulated'
    """

    def __init__(self, value: str):
        self.value = validate_precision(value)
        self._tokens: list[contextvars.Token] = []

    def __enter__(self) -> precision:
        self._tokens.append(_context.set(self.value))
        return self

    def __exit__(self, *exc: object) -> None:
        _context.reset(self._tokens.pop())

    def __call__(self, func):
        import functools

        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            with precision(self.value):
                return func(*args, **kwargs)

        return wrapper


def resolve_precision(explicit: str | None) -> tuple[str, str]:
    """Return ``(name, source)`` where source says which setting won."""
    if explicit is not None:
        return validate_precision(explicit), "argument"
    ctx = _context.get()
    if ctx is not None:
        return ctx, "context"
    with _default_lock:
        dflt = _process_default
    if dflt is not None:
        return dflt, "set_precision"
    env = os.environ.get(ENV_VAR)
    if env:
        return validate_precision(env.strip(), argname=f"environment variable {ENV_VAR}"), "env"
    return "auto", "builtin default"
