"""The blocked substitution's leaf kernels at 64 columns: occupancy variants.

``python bench/probes/leaf_occupancy.py`` times ``right_solve_upper_rows`` and
``right_solve_upper_sub_rows`` (float64, N = 64, one thread a row) on a 64-column leaf
of a 2^20 x 256 C-ordered array, as the blocked solve of the sketch route calls them,
with more blocks per SM asked of the register allocator (MINB) and with larger tiles
in dynamic shared memory (ROWS threads a block), against today's instantiation
(ROWS 64, MINB 3). Every variant's output is checked bitwise against today's. Medians
of 20 launches (CUDA events). Writes ``$OUT/leaf_occupancy.json``.
"""

import json
import os

import cupy as cp
import numpy as np
from mpqr.backends.cupy import right_solve as rs
from mpqr.backends.cupy.modules import KERNELS

from mpqr.bench._timing import time_it

DYN = r"""
template <typename T, int N, int ROWS, int MINB, bool SUB>
__global__ void __launch_bounds__(ROWS, MINB)
leaf_dyn(const T* __restrict__ a, long long lda, const T* __restrict__ rt,
         const T* __restrict__ dinv, T* __restrict__ q, long long ldq,
         long long m, const T* __restrict__ sub, long long ldsub) {
  extern __shared__ unsigned char smem_raw[];
  T (*tile)[N + 1] = reinterpret_cast<T (*)[N + 1]>(smem_raw);
  const long long row0 = (long long)blockIdx.x * ROWS;
  const int rows = (int)min((long long)ROWS, m - row0);
  for (int idx = threadIdx.x; idx < rows * N; idx += ROWS) {
    const int i = idx / N, j = idx - (idx / N) * N;
    T v = a[(row0 + i) * lda + j];
    if (SUB) v = v - sub[(row0 + i) * ldsub + j];
    tile[i][j] = v;
  }
  __syncthreads();
  if (threadIdx.x < rows) {
    T x[N];
#pragma unroll
    for (int j = 0; j < N; ++j) x[j] = tile[threadIdx.x][j];
    solve_row<T, N>(x, rt, dinv);
#pragma unroll
    for (int j = 0; j < N; ++j) tile[threadIdx.x][j] = x[j];
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < rows * N; idx += ROWS) {
    const int i = idx / N, j = idx - (idx / N) * N;
    q[(row0 + i) * ldq + j] = tile[i][j];
  }
}
"""


def timed(fn, repeat=20):
    """Median milliseconds of ``fn`` (CUDA events, after one warm-up call)."""
    return time_it(cp, fn, repeat=repeat) * 1e3


def main():
    m, n = 2**20, 64
    rng = cp.random.default_rng(0)
    big = rng.standard_normal((m, 256))
    a = big[:, 64:128]
    t = rng.standard_normal((m, 64)) * 0.1
    r = cp.triu(rng.standard_normal((n, n))) + 8 * cp.eye(n)
    rt, dinv = rs._factor(r, cp.float64)
    lda, ldt = np.int64(256), np.int64(64)
    src = "".join((KERNELS / f).read_text() for f in ("right_solve.cu",
                                                      "right_solve_rows_sub.cu")) + DYN
    names, confs = [], []
    for minb in (2, 3, 4, 5, 6):
        confs.append(("rows", 64, minb, False))
        confs.append(("rows", 64, minb, True))
    for rows, minb in ((128, 1), (128, 2), (128, 3), (256, 1), (32, 6), (32, 8)):
        confs.append(("dyn", rows, minb, False))
        confs.append(("dyn", rows, minb, True))
    for kind, rows, minb, sub in confs:
        if kind == "rows":
            names.append(f"right_solve_upper_sub_rows<double, 64, {rows}, {minb}>" if sub
                         else f"right_solve_upper_rows<double, 64, {rows}, {minb}, false>")
        else:
            names.append(f"leaf_dyn<double, 64, {rows}, {minb}, {'true' if sub else 'false'}>")
    mod = cp.RawModule(code=src, options=("--std=c++17",), name_expressions=names)
    res = []
    ref = {}
    for (kind, rows, _minb, sub), name in zip(confs, names):
        try:
            fn = mod.get_function(name)
            smem = rows * 65 * 8 if kind == "dyn" else 0
            if smem > 48 * 1024:
                fn.max_dynamic_shared_size_bytes = smem
            out = cp.empty((m, 256))
            q = out[:, 64:128]
            # every parameter is passed (the plain kernel's second factor unused)
            tail = (t, ldt) if sub or kind == "dyn" else (rt, dinv)
            args = (a, lda, rt, dinv, q, lda, np.int64(m), *tail)

            def go(fn=fn, args=args, rows=rows, smem=smem):
                fn((-(-m // rows),), (rows,), args, shared_mem=smem)

            ms = timed(go)
            got = cp.asnumpy(q)
            key = "sub" if sub else "plain"
            if key not in ref:
                ref[key] = got
            same = bool(np.array_equal(got, ref[key]))
            gbs = (3 if sub else 2) * m * 64 * 8 / ms / 1e6
            res.append({"kernel": name, "sub": sub, "ms": ms, "GB/s": gbs, "bitwise": same,
                        "regs": fn.num_regs, "local_bytes": fn.local_size_bytes})
            print(f"{name:60s} {ms:7.3f} ms {gbs:7.0f} GB/s regs {fn.num_regs} local "
                  f"{fn.local_size_bytes} {'same' if same else 'DIFFERENT'}", flush=True)
        except Exception as exc:
            print(name, "ERROR", repr(exc)[:200], flush=True)
            res.append({"kernel": name, "error": repr(exc)})
    with open(os.path.join(os.environ.get("OUT", "/tmp"), "leaf_occupancy.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
