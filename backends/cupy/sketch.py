"""CountSketch ``S @ a`` on the GPU: one pass over ``a``, atomics into the ``k x n``
result (float64 atomics are native from sm_60); the hash is
:mod:`mpqr.backends.sketch_hash`'s, so the NumPy backend's sketch is the same ``S``.
Where ``k n`` values fit in a block's shared memory (:data:`PRIVATE_MAX_BYTES`), each
block adds into its own copy there and flushes it to the result once."""

from __future__ import annotations

import functools
from typing import Any

import cupy as cp
from mpqr.backends.sketch_hash import CUDA_SOURCE, CUDA_SOURCE_PRIVATE

__all__ = ["PRIVATE_MAX_BYTES", "PRIVATE_MIN_ROWS", "count_sketch"]

#: largest sketch (``k n`` values, bytes) that takes the kernel with a private copy per
#: block in shared memory (2^22 x 64 float64: 128 KiB, one block per SM)
PRIVATE_MAX_BYTES = 160 * 1024
#: ... from this many rows of ``a`` per value of the sketch's row count ``k`` (each block
#: clears and flushes its copy: that pays only over many rows)
PRIVATE_MIN_ROWS = 64

_REAL = {"float32": "float", "float64": "double", "complex64": "float",
         "complex128": "double"}


@functools.cache
def _kernel(t: str) -> Any:
    return cp.RawKernel(CUDA_SOURCE % {"T": t}, f"mpqr_count_sketch_{t}")


@functools.cache
def _private_kernel(t: str, smem: int) -> Any:
    fn = cp.RawKernel(CUDA_SOURCE_PRIVATE % {"T": t}, f"mpqr_count_sketch_private_{t}")
    fn.max_dynamic_shared_size_bytes = smem
    return fn


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
    smem = k * n * item
    if m and n and smem <= PRIVATE_MAX_BYTES and m >= PRIVATE_MIN_ROWS * k:
        from mpqr.backends.cupy.right_solve import _resident_blocks

        kernel = _private_kernel(_REAL[name], smem)
        blocks = min(_resident_blocks(kernel, 1024, smem), -(-m // 32))
        kernel((blocks,), (32, 32), (a, cp.int64(m), cp.int64(n), cp.int64(rs),
                                     cp.int64(cs), cp.int32(sh), cp.uint32(k),
                                     cp.uint64(seed), out), shared_mem=smem)
    elif m and n:
        _kernel(_REAL[name])((blocks,), (32, rows_per_block),
                             (a, cp.int64(m), cp.int64(n), cp.int64(rs), cp.int64(cs),
                              cp.int32(sh), cp.uint32(k), cp.uint64(seed), out))
    return out
