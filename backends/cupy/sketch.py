"""CountSketch ``S @ a`` on the GPU: one pass over ``a``, atomics into the ``k x n``
result (float64 atomics are native from sm_60); the hash is
:mod:`mpqr.backends.sketch_hash`'s, so the NumPy backend's sketch is the same ``S``."""

from __future__ import annotations

import functools
from typing import Any

import cupy as cp
from mpqr.backends.sketch_hash import CUDA_SOURCE

__all__ = ["count_sketch"]

_REAL = {"float32": "float", "float64": "double", "complex64": "float",
         "complex128": "double"}


@functools.cache
def _kernel(t: str) -> Any:
    return cp.RawKernel(CUDA_SOURCE % {"T": t}, f"mpqr_count_sketch_{t}")


def count_sketch(a: Any, k: int, seed: int) -> Any | None:
    """``S @ a`` (``k x n``) for 2-D ``a`` of a float or complex dtype; None otherwise."""
    name = a.dtype.name
    if a.ndim != 2 or name not in _REAL or not 0 < k < 2**32:
        return None
    m, n = a.shape
    sh = 1 if a.dtype.kind == "c" else 0
    out = cp.zeros((k, n), dtype=a.dtype)
    item = a.dtype.itemsize
    rs, cs = a.strides[0] // item, a.strides[1] // item
    rows_per_block = 8
    blocks = min(max((m + rows_per_block - 1) // rows_per_block, 1), 1 << 20)
    if m and n:
        _kernel(_REAL[name])((blocks,), (32, rows_per_block),
                             (a, cp.int64(m), cp.int64(n), cp.int64(rs), cp.int64(cs),
                              cp.int32(sh), cp.uint32(k), cp.uint64(seed), out))
    return out
