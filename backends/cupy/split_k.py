"""Native float64 products with a long inner dimension and a small output, split along it.

A tall matrix's Gram matrix ``A^T A`` (``2^22 x 64``: ``k = 2^22``, a ``64 x 64`` output)
as one cuBLAS GEMM reads ``A`` at 2.4-2.7 TB/s on an H200. The same product as ``P``
products over consecutive chunks of ``k`` (one strided-batched call) and a sum of the
``P`` partial blocks reads it at ~3 TB/s, near the copy rate. Every entry is still a sum
of the same products, in chunks; the error bound is the single GEMM's (it has ``k / P +
P`` terms in a row instead of ``k``).

It is also the more accurate (``bench/probes/split_k_accuracy.py``, H200, against a
double-double product): the diagonal of ``A^T A`` at ``2^24 x 64`` off by 13 units in the
last place (rms) in the single GEMM, by 1.2 in 1024 chunks; CholQR2's Q at ``2^22 x 64``
has ``||Q^T Q - I||_F`` 1.5e-15 against 6.3e-15 (double-double check). Timed
(``gram_splitk.py``): ``2^22 x 64`` 0.71-0.72 against 0.79-0.89 ms (the single GEMM varies
from machine to machine); CholQR2 (``split_k_ab.py``, alternated in one process)
``2^22 x 64`` 4.65 against 5.00 ms, ``2^24 x 64`` 16.1 against 17.7. float32, and outputs
of 128 columns, gained nothing.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CHUNK", "MAX_OUT", "MAX_PARTS", "MAX_WORKSPACE", "MIN_K", "MIN_OUT",
           "gemm_split_k", "parts"]

#: the inner dimension from which a product is split
MIN_K = 2**21
#: the output's dimensions at most this (and at least :data:`MIN_OUT`) for a split
MAX_OUT = 64
MIN_OUT = 32
#: rows of ``k`` a chunk holds at least, and the most chunks (H200, CholQR2 at 2^22 x 64:
#: 256 chunks 5.33 ms, 1024 5.39, 4096 5.58; 1024 halves the rounding of 256)
CHUNK = 2048
MAX_PARTS = 1024
#: the partial blocks at most this fraction of the operand ``a``'s bytes
MAX_WORKSPACE = 1 / 64


def parts(m: int, n: int, k: int, dtype: Any, cp: Any) -> int:
    """How many chunks of ``k`` an ``m x n`` product splits into (0: not split)."""
    if dtype != cp.float64 or k < MIN_K or not (MIN_OUT <= min(m, n) and max(m, n) <= MAX_OUT):
        return 0
    return min(MAX_PARTS, k // CHUNK, int(MAX_WORKSPACE * k / n))


def gemm_split_k(backend: Any, a: Any, b: Any, out: Any, p: int, alpha: float,
                 types: tuple[Any, Any, Any, Any]) -> Any:
    """``out = alpha a b`` (2-D, ``out`` row-major) as ``p`` products over chunks of the
    inner dimension, one strided-batched call, and their sum; the rows of ``k`` past
    ``p`` whole chunks by one more product added to it."""
    cp = backend._cp
    from cupy.lib.stride_tricks import as_strided

    m, k = a.shape
    n = b.shape[1]
    kc = k // p
    a3 = as_strided(a, shape=(p, m, kc), strides=(kc * a.strides[1], *a.strides))
    b3 = as_strided(b, shape=(p, kc, n), strides=(kc * b.strides[0], *b.strides))
    partial = cp.empty((p, m, n), dtype=out.dtype)
    in_type, out_type, compute, scalar = types
    if not backend._gemm_strided_batched(a3, b3, partial, alpha, 0.0, in_type, out_type,
                                         compute, scalar):
        return None
    if out.flags.c_contiguous:
        cp.sum(partial, axis=0, out=out)
    else:  # a block of a larger matrix
        out[...] = cp.sum(partial, axis=0)
    if p * kc < k:  # the tail: out += alpha a_tail b_tail
        backend._gemm_ex(a[:, p * kc:], b[p * kc:], out, alpha, 1.0, *types)
    return out
