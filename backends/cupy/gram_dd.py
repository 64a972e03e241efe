"""``[A | B]^T [A | B]`` in double-double arithmetic on the GPU (``kernels/gram_dd.cu``).

The portable version (:func:`mpqr.lstsq.double_double.gram`) splits every product with
Dekker's algorithm on ``chunk x N x N`` temporaries; here each product is one ``fma`` and
the sums live in registers. An out-of-core least-squares pass is bound by the host link
(~0.9 s for 34 GB), so a kernel of a few milliseconds per gigabyte hides behind it.
"""

from __future__ import annotations

import functools

import cupy as cp
import numpy as np
from mpqr.backends.cupy.modules import functions

__all__ = ["MAX_N", "gram_dd_update"]

#: widest ``[A | B]`` the kernel takes (a thread then holds 17 entries' sums)
MAX_N = 128

_THREADS = 512
_TILE = 32  # rows staged in shared memory at a time (as kernels/gram_dd.cu)


@functools.cache
def _pairs(n_total: int):
    i, j = np.triu_indices(n_total)
    return cp.asarray(i.astype(np.int32)), cp.asarray(j.astype(np.int32))


@functools.cache
def _kernels(ppt: int):
    return functions("gram_dd.cu", (f"gram_dd_part<{ppt}>", "gram_dd_reduce"))


def _rows_operand(x):
    # unit column stride; the row stride is passed to the kernel
    if x.ndim == 2 and x.strides[1] == x.itemsize and x.strides[0] % x.itemsize == 0:
        return x, x.strides[0] // x.itemsize
    x = cp.ascontiguousarray(x)
    return x, x.shape[1]


def gram_dd_update(a, b, acc):
    """``acc + [a | b]^T [a | b]`` (double-double: ``acc[0] + acc[1]``, ``2 x N x N``
    float64 on the device) for float64 ``a`` (``h x n``) and ``b`` (``h x k``)."""
    h, n = a.shape
    k = b.shape[1]
    nt = n + k
    if h == 0:
        return acc
    pi, pj = _pairs(nt)
    npairs = int(pi.shape[0])
    ppt = -(-npairs // _THREADS)
    part_k, reduce_k = _kernels(ppt)
    a, lda = _rows_operand(a)
    b, ldb = _rows_operand(b)
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    grid = max(1, min(2 * sms, -(-h // (8 * _TILE))))
    rows_per_block = -(-h // grid)
    part = cp.empty((grid, npairs, 2), dtype=cp.float64)
    out = cp.array(acc, dtype=cp.float64, order="C", copy=True)
    part_k((grid,), (_THREADS,), (a, cp.int64(lda), cp.int32(n), b, cp.int64(ldb),
                                  cp.int32(k), cp.int64(h), cp.int64(rows_per_block), pi, pj,
                                  cp.int32(npairs), part),
           shared_mem=_TILE * nt * 8)
    reduce_k((-(-npairs // 128),), (128,), (part, cp.int32(grid), cp.int32(npairs), pi, pj,
                                            cp.int32(nt), out))
    return out
