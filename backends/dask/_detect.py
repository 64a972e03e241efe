"""Recognise a dask array without importing dask (mpqr imports dask only for one)."""

from __future__ import annotations

from typing import Any

__all__ = ["is_dask_array"]


def is_dask_array(x: Any) -> bool:
    """Whether ``x`` is a ``dask.array.Array`` (or a subclass), judged by its type's
    module and name, so that ``dask`` is never imported for other inputs."""
    return any(c.__name__ == "Array" and c.__module__.startswith("dask.array")
               for c in type(x).__mro__)
