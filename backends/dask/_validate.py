"""Checks of a dask array's layout and dtype before a distributed factorization."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["as_float", "check_layout", "require_dask"]


def require_dask() -> Any:
    """``dask.array``, or an ImportError saying how to install it."""
    try:
        import dask.array as da
    except ImportError as exc:  # pragma: no cover - the input is a dask array
        raise ImportError("mpqr's distributed QR needs dask: pip install 'mpqr[dask]'") from exc
    return da


def check_layout(x: Any, name: str) -> None:
    """``x`` is 2-D, its chunk sizes are known and its columns are one chunk.

    The messages say how to rechunk, as :mod:`dask.array.linalg`'s do."""
    if x.ndim != 2:
        raise ValueError(f"`{name}` must be a 2-D dask array (a matrix chunked by rows), got "
                         f"ndim={x.ndim}")
    if any(math.isnan(c) for cs in x.chunks for c in cs):
        raise ValueError(
            f"`{name}` has unknown chunk sizes (NaN), so its row blocks cannot be addressed; "
            f"call `{name}.compute_chunk_sizes()` (or `{name}.rechunk(...)` with explicit "
            "sizes) first")
    if len(x.chunks[1]) > 1:
        raise ValueError(
            f"`{name}` must be chunked by rows only (one chunk along the columns), got "
            f"{len(x.chunks[1])} column chunks {x.chunks[1]}; use "
            f"`{name}.rechunk({{1: -1}})` (or `{name}.rechunk(({name}.chunksize[0], -1))`)")


def as_float(x: Any, name: str) -> Any:
    """``x`` cast lazily as ``mpqr.qr`` casts in-core input: integers to float64, float16
    to float32; bool and non-numeric dtypes raise ``TypeError``."""
    kind, size = x.dtype.kind, x.dtype.itemsize
    if kind == "b":
        raise TypeError(f"`{name}` must have a floating or integer dtype, got bool")
    if kind in "iu":
        return x.astype("float64")
    if kind == "f" and size == 2:
        return x.astype("float32")
    if (kind == "f" and size in (4, 8)) or (kind == "c" and size in (8, 16)):
        return x
    raise TypeError(f"`{name}` must have a floating or integer dtype, got {x.dtype}")
