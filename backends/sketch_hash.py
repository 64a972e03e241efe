"""The row hash of the CountSketch (``backend.sketch_rows``), the same on every backend.

Row ``i`` goes to bucket ``(h mod 2^32) mod k`` with sign ``+1`` or ``-1`` from the top bit of
``h = splitmix64(i + seed * golden)``: no random arrays are stored or read, and a GPU
kernel computes the same hash per row (:data:`CUDA_SOURCE`).
"""

from __future__ import annotations

from typing import Any

__all__ = ["CUDA_SOURCE", "CUDA_SOURCE_PRIVATE", "row_hash"]

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
    bucket = (h & 0xFFFFFFFF) % k  # 32-bit: the GPU's modulo
    sign = 1 - 2 * (h >> 63)
    return bucket.astype("int64"), sign.astype("int8")


#: ``sketch_rows`` as one CUDA kernel: ``threadIdx.y`` and the blocks over rows (the hash
#: once a row), ``threadIdx.x`` over a row's real values (coalesced for C order),
#: atomically added into ``out`` (``k x n``, C order); complex entries as two real
#: values (``T`` is the real type, ``sh`` 0 for real, 1 for complex)
CUDA_SOURCE = r"""
extern "C" __global__ void mpqr_count_sketch_%(T)s(
    const %(T)s* __restrict__ a, long long m, long long n, long long rs, long long cs,
    int sh, unsigned int k, unsigned long long seed, %(T)s* __restrict__ out)
{
    long long nc = n << sh;
    for (long long i = (long long)blockIdx.x * blockDim.y + threadIdx.y; i < m;
         i += (long long)gridDim.x * blockDim.y) {
        unsigned long long h = (unsigned long long)i + seed * 0x9E3779B97F4A7C15ULL;
        h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ULL;
        h = (h ^ (h >> 27)) * 0x94D049BB133111EBULL;
        h = h ^ (h >> 31);
        long long b = (long long)((unsigned int)(h & 0xFFFFFFFFULL) %% k);
        bool neg = (h >> 63) != 0;
        for (long long c = threadIdx.x; c < nc; c += blockDim.x) {
            long long j = c >> sh;
            long long part = c & ((1 << sh) - 1);
            %(T)s v = a[((i * rs + j * cs) << sh) + part];
            atomicAdd(out + ((b * n + j) << sh) + part, neg ? -v : v);
        }
    }
}
"""


#: the same sketch with a private copy of ``out`` per block in shared memory (``k n``
#: values; dynamic shared memory of that size): the atomics of the row pass stay on the
#: SM, and each block adds its copy's nonzero entries to ``out`` once at the end (the
#: global atomics into few addresses, not the pass over ``a``, bounded the first kernel:
#: ~1.5 TB/s at 2^22 x 64 on an H200)
CUDA_SOURCE_PRIVATE = r"""
extern "C" __global__ void mpqr_count_sketch_private_%(T)s(
    const %(T)s* __restrict__ a, long long m, long long n, long long rs, long long cs,
    int sh, unsigned int k, unsigned long long seed, %(T)s* __restrict__ out)
{
    extern __shared__ unsigned char smem_raw[];
    %(T)s* acc = reinterpret_cast<%(T)s*>(smem_raw);
    const long long nc = n << sh;
    const long long tot = (long long)k * nc;
    const int tid = threadIdx.y * blockDim.x + threadIdx.x;
    const int nt = blockDim.x * blockDim.y;
    for (long long e = tid; e < tot; e += nt) acc[e] = 0;
    __syncthreads();
    for (long long i = (long long)blockIdx.x * blockDim.y + threadIdx.y; i < m;
         i += (long long)gridDim.x * blockDim.y) {
        unsigned long long h = (unsigned long long)i + seed * 0x9E3779B97F4A7C15ULL;
        h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ULL;
        h = (h ^ (h >> 27)) * 0x94D049BB133111EBULL;
        h = h ^ (h >> 31);
        long long b = (long long)((unsigned int)(h & 0xFFFFFFFFULL) %% k);
        bool neg = (h >> 63) != 0;
        for (long long c = threadIdx.x; c < nc; c += blockDim.x) {
            long long j = c >> sh;
            long long part = c & ((1 << sh) - 1);
            %(T)s v = a[((i * rs + j * cs) << sh) + part];
            atomicAdd(acc + b * nc + c, neg ? -v : v);
        }
    }
    __syncthreads();
    for (long long e = tid; e < tot; e += nt) {
        %(T)s v = acc[e];
        if (v != 0) atomicAdd(out + e, v);
    }
}
"""
