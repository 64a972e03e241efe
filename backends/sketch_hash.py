"""The row hash of the CountSketch (``backend.sketch_rows``), the same on every backend.

Row ``i`` goes to bucket ``h mod k`` with sign ``+1`` or ``-1`` from the top bit of
``h = splitmix64(i + seed * golden)``: no random arrays are stored or read, and a GPU
kernel computes the same hash per row (:data:`CUDA_SOURCE`).
"""

from __future__ import annotations

from typing import Any

__all__ = ["CUDA_SOURCE", "row_hash"]

_GOLDEN = 0x9E3779B97F4A7C15
_M1, _M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_MASK = (1 << 64) - 1


def row_hash(i: Any, k: int, seed: int) -> tuple[Any, Any]:
    """``(bucket, sign)`` of rows ``i`` (an unsigned 64-bit integer array of any Array API
    library whose integer products wrap): buckets in ``[0, k)``, signs ``+-1`` (int8)."""
    h = i + ((seed * _GOLDEN) & _MASK)
    h = (h ^ (h >> 30)) * _M1
    h = (h ^ (h >> 27)) * _M2
    h = h ^ (h >> 31)
    bucket = h % k
    sign = 1 - 2 * (h >> 63)
    return bucket.astype("int64"), sign.astype("int8")


#: ``sketch_rows`` as one CUDA kernel: a thread per entry of ``a`` (row-major index
#: over ``m x n`` with element strides), atomically added into ``out`` (``k x n``,
#: C order); complex entries as two real atomics (``T`` is the real type, ``cpx``
#: 1 or 2 real values per entry)
CUDA_SOURCE = r"""
extern "C" __global__ void mpqr_count_sketch_%(T)s(
    const %(T)s* __restrict__ a, long long m, long long n, long long rs, long long cs,
    int cpx, long long k, unsigned long long seed, %(T)s* __restrict__ out)
{
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long total = m * n * cpx;
    for (; t < total; t += (long long)gridDim.x * blockDim.x) {
        long long part = t %% cpx;
        long long e = t / cpx;
        long long i = e / n, j = e %% n;
        unsigned long long h = (unsigned long long)i + seed * 0x9E3779B97F4A7C15ULL;
        h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ULL;
        h = (h ^ (h >> 27)) * 0x94D049BB133111EBULL;
        h = h ^ (h >> 31);
        long long b = (long long)(h %% (unsigned long long)k);
        %(T)s v = a[(i * rs + j * cs) * cpx + part];
        if (h >> 63) v = -v;
        atomicAdd(out + (b * n + j) * cpx + part, v);
    }
}
"""
