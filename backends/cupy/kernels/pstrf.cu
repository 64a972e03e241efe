// Pivoted Cholesky of a symmetric positive semidefinite matrix in LAPACK ?pstrf's order
// (the largest diagonal entry of the Schur complement each step, the first of equals), a
// panel of nb <= 64 steps a launch (backends/cupy/pstrf.py); the trailing update between
// panels is a GEMM through the precision policy.
//
// w: n x n, column-major (stride ld), both triangles. On entry to the panel at j0,
// w[j0:, j0:] is the Schur complement after j0 steps. Step k: the pivot p is the first
// argmax of d[k:] (d: the Schur complement's diagonal, reloaded from w at the panel's
// start, downdated each step); below or at `stop` (or not a number) the factorization
// ends: state = {k, 1}. Otherwise rows, then columns k and p are exchanged (from j0 on:
// the panel's L rows and the trailing block; earlier columns are not needed again), and
// column k of L is w[k+1:, k] minus the panel's earlier columns times row k, over
// sqrt(d[k]), with d downdated by its squares. A launch after the end returns at once.

template <typename T>
__device__ __forceinline__ void better(T& v, int& i, T v2, int i2) {
  if (v2 > v || (v2 == v && i2 < i)) { v = v2; i = i2; }
}

template <typename T>
__global__ void __launch_bounds__(1024)
pstrf_panel(T* __restrict__ w, long long ld, int n, int j0, int nb, T* __restrict__ d,
            int* __restrict__ perm, T stop, int* __restrict__ state) {
  __shared__ T s_val[32];
  __shared__ int s_idx[32];
  __shared__ T s_lk[64];
  __shared__ int s_piv;
  __shared__ T s_pv;
  const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, warp = tid >> 5;
  const T ninf = T(-__longlong_as_double(0x7ff0000000000000LL));
  if (state[1]) return;
  const int jend = min(j0 + nb, n);
  for (int i = j0 + tid; i < n; i += nt) d[i] = w[i + i * ld];
  __syncthreads();
  for (int k = j0; k < jend; ++k) {
    T best = ninf;
    int bi = n;
    for (int i = k + tid; i < n; i += nt) {
      const T v = d[i];
      if (v > best) { best = v; bi = i; }
    }
    for (int off = 16; off > 0; off >>= 1) {
      const T v2 = __shfl_down_sync(0xffffffffu, best, off);
      const int i2 = __shfl_down_sync(0xffffffffu, bi, off);
      better(best, bi, v2, i2);
    }
    if (lane == 0) { s_val[warp] = best; s_idx[warp] = bi; }
    __syncthreads();
    if (warp == 0) {
      const int nw = (nt + 31) >> 5;
      best = lane < nw ? s_val[lane] : ninf;
      bi = lane < nw ? s_idx[lane] : n;
      for (int off = 16; off > 0; off >>= 1) {
        const T v2 = __shfl_down_sync(0xffffffffu, best, off);
        const int i2 = __shfl_down_sync(0xffffffffu, bi, off);
        better(best, bi, v2, i2);
      }
      if (lane == 0) { s_piv = bi; s_pv = best; }
    }
    __syncthreads();
    const int p = s_piv;
    const T pv = s_pv;
    if (!(pv > stop) || p >= n) {
      if (tid == 0) { state[0] = k; state[1] = 1; }
      return;
    }
    if (p != k) {
      for (int c = j0 + tid; c < n; c += nt) {
        const T x = w[k + c * ld];
        w[k + c * ld] = w[p + c * ld];
        w[p + c * ld] = x;
      }
      __syncthreads();
      for (int r = j0 + tid; r < n; r += nt) {
        const T x = w[r + k * ld];
        w[r + k * ld] = w[r + p * ld];
        w[r + p * ld] = x;
      }
      if (tid == 0) {
        const T x = d[k]; d[k] = d[p]; d[p] = x;
        const int q = perm[k]; perm[k] = perm[p]; perm[p] = q;
      }
      __syncthreads();
    }
    const T ljj = sqrt(pv);
    for (int c = j0 + tid; c < k; c += nt) s_lk[c - j0] = w[k + c * ld];
    __syncthreads();
    if (tid == 0) w[k + k * ld] = ljj;
    const T inv = T(1) / ljj;
    for (int i = k + 1 + tid; i < n; i += nt) {
      T v = w[i + k * ld];
      for (int c = j0; c < k; ++c) v -= w[i + c * ld] * s_lk[c - j0];
      v *= inv;
      w[i + k * ld] = v;
      d[i] -= v * v;
    }
    __syncthreads();
  }
  if (tid == 0) state[0] = jend;
}

// The same steps with the row exchanges deferred (pstrf_panel's row exchange reads a row
// of a column-major matrix: a strided access an element, serial in one thread block).
// Columns are exchanged at once (contiguous); rows through rho (logical row -> physical
// row, the identity from j0 at the panel's start): logical entry (i, c) is w[rho[i], c],
// the columns of L included. The panel's exchanges (sk[t], sp[t]) are recorded, and
// pstrf_rows then moves the rows they touched into place, a thread block a column.
template <typename T>
__global__ void __launch_bounds__(1024)
pstrf_panel_rows(T* __restrict__ w, long long ld, int n, int j0, int nb,
                 T* __restrict__ d, int* __restrict__ perm, int* __restrict__ rho,
                 int* __restrict__ sk, int* __restrict__ sp, T stop,
                 int* __restrict__ state) {
  __shared__ T s_val[32];
  __shared__ int s_idx[32];
  __shared__ T s_lk[64];
  __shared__ int s_piv;
  __shared__ T s_pv;
  const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, warp = tid >> 5;
  const T ninf = T(-__longlong_as_double(0x7ff0000000000000LL));
  if (state[1]) return;
  const int jend = min(j0 + nb, n);
  for (int i = j0 + tid; i < n; i += nt) { d[i] = w[i + i * ld]; rho[i] = i; }
  for (int t = tid; t < nb; t += nt) { sk[t] = j0; sp[t] = j0; }
  __syncthreads();
  for (int k = j0; k < jend; ++k) {
    T best = ninf;
    int bi = n;
    for (int i = k + tid; i < n; i += nt) {
      const T v = d[i];
      if (v > best) { best = v; bi = i; }
    }
    for (int off = 16; off > 0; off >>= 1) {
      const T v2 = __shfl_down_sync(0xffffffffu, best, off);
      const int i2 = __shfl_down_sync(0xffffffffu, bi, off);
      better(best, bi, v2, i2);
    }
    if (lane == 0) { s_val[warp] = best; s_idx[warp] = bi; }
    __syncthreads();
    if (warp == 0) {
      const int nw = (nt + 31) >> 5;
      best = lane < nw ? s_val[lane] : ninf;
      bi = lane < nw ? s_idx[lane] : n;
      for (int off = 16; off > 0; off >>= 1) {
        const T v2 = __shfl_down_sync(0xffffffffu, best, off);
        const int i2 = __shfl_down_sync(0xffffffffu, bi, off);
        better(best, bi, v2, i2);
      }
      if (lane == 0) { s_piv = bi; s_pv = best; }
    }
    __syncthreads();
    const int p = s_piv;
    const T pv = s_pv;
    if (!(pv > stop) || p >= n) {
      if (tid == 0) { state[0] = k; state[1] = 1; }
      return;
    }
    if (p != k) {
      for (int r = j0 + tid; r < n; r += nt) {
        const T x = w[r + k * ld];
        w[r + k * ld] = w[r + p * ld];
        w[r + p * ld] = x;
      }
      if (tid == 0) {
        const T x = d[k]; d[k] = d[p]; d[p] = x;
        int q = perm[k]; perm[k] = perm[p]; perm[p] = q;
        q = rho[k]; rho[k] = rho[p]; rho[p] = q;
        sk[k - j0] = k; sp[k - j0] = p;
      }
      __syncthreads();
    }
    const int rk = rho[k];
    const T ljj = sqrt(pv);
    for (int c = j0 + tid; c < k; c += nt) s_lk[c - j0] = w[rk + c * ld];
    __syncthreads();
    if (tid == 0) w[rk + k * ld] = ljj;
    const T inv = T(1) / ljj;
    for (int i = k + 1 + tid; i < n; i += nt) {
      const long long ri = rho[i];
      T v = w[ri + k * ld];
      for (int c = j0; c < k; ++c) v -= w[ri + c * ld] * s_lk[c - j0];
      v *= inv;
      w[ri + k * ld] = v;
      d[i] -= v * v;
    }
    __syncthreads();
  }
  if (tid == 0) state[0] = jend;
}

// Rows into place after pstrf_panel_rows: for each column c >= j0 (a thread block), each
// row i the panel exchanged takes w[rho[i], c]; all reads before any write. 2 nb threads.
template <typename T>
__global__ void pstrf_rows(T* __restrict__ w, long long ld, int n, int j0, int nb,
                           const int* __restrict__ rho, const int* __restrict__ sk,
                           const int* __restrict__ sp) {
  const int c = j0 + blockIdx.x;
  const int t = threadIdx.x;
  if (c >= n) return;
  int i = -1;
  T v = T(0);
  if (t < 2 * nb) {
    i = t < nb ? sk[t] : sp[t - nb];
    v = w[rho[i] + c * ld];
  }
  __syncthreads();
  if (i >= 0) w[i + c * ld] = v;
}

// ---------------------------------------------------------------------------------------
// "grid": a panel of nb steps in one launch over many thread blocks (pstrf.py's
// pivoted_cholesky_grid). Block b owns the physical rows [r0, r0 + R) of the trailing
// Schur complement S = w[j0:, j0:] (physical = logical at the panel's start) and keeps
// their diagonal d, their logical positions and their rows of the panel's L (nb x R in
// shared memory). Nothing is exchanged inside the panel: step t takes pivot p (physical)
// and computes l[i] = (S[i, p] - sum_{s<t} L[i, s] L[p, s]) / sqrt(d[p]) for the rows
// not taken (S[:, p] is contiguous in the column-major view), d[i] -= l[i]^2. The pivot
// is the largest d, the first in LAPACK's logical order among equals: each block's
// candidate (d, position, row) goes to global memory, one grid barrier a step, and every
// block reduces the candidates the same way. The logical order follows LAPACK's
// exchanges (position k <-> the pivot's position pp): rho (position -> physical row) in
// global memory, written for pp only (position k is not read again), by block 0.
// After the panel, the rows and columns at the positions >= j0 + nb that now hold other
// rows are moved into place (pstrf_grid_cols_*, pstrf_grid_rows) and the trailing block
// is updated by one product through the precision policy.

__device__ __forceinline__ unsigned long long pstrf_now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// The barrier's fences: sequentially consistent (__threadfence), or with `acq_rel`
// release/acquire only (what the barrier needs: the writes before it seen after it)
__device__ __forceinline__ void pstrf_fence(int acq_rel) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  if (acq_rel) {
    asm volatile("fence.acq_rel.gpu;" ::: "memory");
    return;
  }
#endif
  __threadfence();
}

// All blocks of the grid (co-resident: at most one per multiprocessor) reach the
// barrier: a counter that only grows; `target` barriers passed so far including this
// one. A wait over 2 s (blocks not co-resident) sets state[3] and every block leaves.
// lean: bit 0 the timeout checked every 32nd poll only, bit 1 acq_rel fences.
__device__ __forceinline__ bool pstrf_grid_sync(unsigned* bar, unsigned target,
                                                int* state, int* s_err, int lean = 0) {
  __syncthreads();
  if (threadIdx.x == 0) {
    pstrf_fence(lean & 2);
    atomicAdd(bar, 1u);
    const unsigned want = target * gridDim.x;
    const unsigned long long t0 = pstrf_now();
    int err = 0;
    unsigned spins = 0;
    while (*(volatile unsigned*)bar < want) {
      // lean: the timeout's two reads every 32nd poll only (a poll is one read then)
      if ((lean & 1) && (++spins & 31u)) continue;
      if (*(volatile int*)(state + 3)) { err = 1; break; }
      if (pstrf_now() - t0 > 2000000000ull) { atomicExch(state + 3, 1); err = 1; break; }
    }
    pstrf_fence(lean & 2);
    *s_err = err;
  }
  __syncthreads();
  return *s_err != 0;
}

// Entry (i, j) of the symmetric matrix in the column-major view: where only the lower
// triangle is kept up to date ("lower"), the one of (i, j) and (j, i) inside it.
template <typename T>
__device__ __forceinline__ T pstrf_sym(const T* w, long long ld, int i, int j, int lower) {
  return (!lower || i >= j) ? w[i + j * ld] : w[j + i * ld];
}

template <typename T>
__device__ __forceinline__ void pstrf_better(T& v, int& pos, int& idx, T v2, int pos2,
                                             int idx2) {
  if (v2 > v || (v2 == v && pos2 < pos)) { v = v2; pos = pos2; idx = idx2; }
}

// The block's best (d, position, row) over its rows not taken -> the candidate arrays'
// half `half` (two halves: a block may write the next step's candidate while another
// still reads this step's). pcol (not null): the candidate's column of the column-major
// view, rows lo .. n - 1, prefetched into L2 by the first warp (the next step's pivot
// column is one of the blocks' candidates: read from L2 rather than memory then).
template <typename T>
__device__ void pstrf_block_best(const T* ds, const int* lpos, int nr, int r0, int n,
                                 T* cval, int* cpos, int* cidx, int half, T* s_val,
                                 int* s_pos, int* s_idx, const T* pcol = nullptr,
                                 long long ld = 0, int lo = 0) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const T ninf = T(-__longlong_as_double(0x7ff0000000000000LL));
  T best = ninf;
  int bp = 0x7fffffff, bi = n;
  for (int li = tid; li < nr; li += blockDim.x)
    if (ds[li] != ninf) pstrf_better(best, bp, bi, ds[li], lpos[li], r0 + li);
  for (int off = 16; off > 0; off >>= 1) {
    const T v2 = __shfl_down_sync(0xffffffffu, best, off);
    const int p2 = __shfl_down_sync(0xffffffffu, bp, off);
    const int i2 = __shfl_down_sync(0xffffffffu, bi, off);
    pstrf_better(best, bp, bi, v2, p2, i2);
  }
  if (lane == 0) { s_val[warp] = best; s_pos[warp] = bp; s_idx[warp] = bi; }
  __syncthreads();
  if (warp == 0) {
    const int nw = (blockDim.x + 31) >> 5;
    best = lane < nw ? s_val[lane] : ninf;
    bp = lane < nw ? s_pos[lane] : 0x7fffffff;
    bi = lane < nw ? s_idx[lane] : n;
    for (int off = 16; off > 0; off >>= 1) {
      const T v2 = __shfl_down_sync(0xffffffffu, best, off);
      const int p2 = __shfl_down_sync(0xffffffffu, bp, off);
      const int i2 = __shfl_down_sync(0xffffffffu, bi, off);
      pstrf_better(best, bp, bi, v2, p2, i2);
    }
    if (lane == 0) {
      const int c = half * gridDim.x + blockIdx.x;
      cval[c] = best; cpos[c] = bp; cidx[c] = bi;
    }
    if (pcol != nullptr) {
      const int pb = __shfl_sync(0xffffffffu, bi, 0);
      if (pb < n) {
        const char* base = reinterpret_cast<const char*>(pcol + (size_t)pb * ld + lo);
        const size_t bytes = (size_t)(n - lo) * sizeof(T);
        for (size_t off = (size_t)lane * 128; off < bytes; off += 32 * 128)
          asm volatile("prefetch.global.L2 [%0];" ::"l"(base + off));
      }
    }
  }
}

// One panel (steps j0 .. j0 + nb - 1). lp: nb x n, lp[t * n + i] the panel's column t
// at physical row i. cval, cpos, cidx: two halves of gridDim.x candidates. rho:
// position -> physical row for [j0, n). moved[0 .. state[2]): the positions >= j0 + nb
// whose row changed. state = {steps done, ended, moved count,
// barrier timeout}. bar: this launch's own zeroed counter. Dynamic shared memory:
// (nb + 1) R + nb values of T, then R ints. lower: only the lower triangle (rows >=
// columns of the column-major view) is up to date (pstrf_grid_sym_*).
template <typename T>
__global__ void __launch_bounds__(512)
pstrf_grid_panel(const T* __restrict__ w, long long ld, int n, int j0, int nb, int R,
                 T* __restrict__ lp, T* __restrict__ cval, int* __restrict__ cpos,
                 int* __restrict__ cidx, int* __restrict__ perm, int* __restrict__ rho,
                 int* __restrict__ moved, T stop, int* __restrict__ state,
                 unsigned* __restrict__ bar, int lower, int spread, int lean) {
  extern __shared__ __align__(16) unsigned char pstrf_smem[];
  T* ls = reinterpret_cast<T*>(pstrf_smem);  // nb x R: ls[t * R + li]
  T* ds = ls + (size_t)nb * R;                 // R
  T* lrow = ds + R;                            // nb: L[p, 0:t]
  int* lpos = reinterpret_cast<int*>(lrow + nb);  // R
  __shared__ T s_val[32];
  __shared__ int s_pos[32], s_idx[32];
  __shared__ int s_p, s_pp, s_err, s_nmoved;
  __shared__ T s_pv;
  if (state[1] || state[3]) return;
  const int tid = threadIdx.x, nt = blockDim.x, b = blockIdx.x;
  const T ninf = T(-__longlong_as_double(0x7ff0000000000000LL));
  const int r0 = j0 + b * R, nr = max(min(r0 + R, n) - r0, 0);
  const int jend = min(j0 + nb, n), j2 = j0 + nb;
  for (int li = tid; li < nr; li += nt) {
    const int i = r0 + li;
    ds[li] = w[i + i * ld];
    lpos[li] = i;
    rho[i] = i;
  }
  if (tid == 0) s_nmoved = 0;
  __syncthreads();
  // lean bit 2: the candidates' columns prefetched into L2 where the blocks' columns
  // together are at most 4 MiB (the memory is otherwise idle during the panel)
  const bool pf = (lean & 4) && !lower &&
                  (size_t)gridDim.x * (size_t)(n - j0) * sizeof(T) <= ((size_t)4 << 20);
  pstrf_block_best(ds, lpos, nr, r0, n, cval, cpos, cidx, 0, s_val, s_pos, s_idx,
                   pf ? w : nullptr, ld, j0);
  unsigned target = 0;
  if (pstrf_grid_sync(bar, ++target, state, &s_err, lean)) return;
  for (int k = j0; k < jend; ++k) {
    const int t = k - j0;
    if (tid < 32) {  // every block reduces the candidates alike
      T best = ninf;
      int bp = 0x7fffffff, bi = n;
      for (int c = (t & 1) * gridDim.x + tid; c < ((t & 1) + 1) * gridDim.x; c += 32)
        pstrf_better(best, bp, bi, __ldcg(cval + c), __ldcg(cpos + c), __ldcg(cidx + c));
      for (int off = 16; off > 0; off >>= 1) {
        const T v2 = __shfl_down_sync(0xffffffffu, best, off);
        const int p2 = __shfl_down_sync(0xffffffffu, bp, off);
        const int i2 = __shfl_down_sync(0xffffffffu, bi, off);
        pstrf_better(best, bp, bi, v2, p2, i2);
      }
      if (tid == 0) { s_pv = best; s_pp = bp; s_p = bi; }
    }
    __syncthreads();
    const int p = s_p, pp = s_pp;
    const T pv = s_pv;
    if (!(pv > stop) || p >= n) {
      if (b == 0 && tid == 0) { state[0] = k; state[1] = 1; }
      return;
    }
    // S[i, p] of this thread's first row, loaded while the bookkeeping runs
    const T s0 = tid < nr ? pstrf_sym(w, ld, r0 + tid, p, lower) : T(0);
    // spread: the exchange's reads on the last thread (rho) and, in block 0, the one
    // before it (perm), apart from the threads that load the pivot's row of L (tid < t):
    // three dependent memory round trips on one thread become one a thread
    const int bk = spread ? nt - 1 : 0, bperm = spread ? nt - 2 : 0;
    if (tid == bk) {
      // LAPACK's exchange of positions k and pp: the row at k (q) goes to pp
      const int q = __ldcg(rho + k);
      if (q >= r0 && q < r0 + nr) lpos[q - r0] = pp;
      if (p >= r0 && p < r0 + nr) ds[p - r0] = ninf;  // taken
      if (b == 0 && pp != k) rho[pp] = q;
    }
    if (tid == bperm && b == 0 && pp != k) {
      const int x = perm[k]; perm[k] = perm[pp]; perm[pp] = x;
      if (pp >= j2) moved[s_nmoved++] = pp;
    }
    for (int s = tid; s < t; s += nt) lrow[s] = __ldcg(lp + (size_t)s * n + p);
    __syncthreads();
    const T inv = T(1) / sqrt(pv);
    for (int li = tid; li < nr; li += nt) {
      if (ds[li] == ninf) continue;
      const int i = r0 + li;
      // four partial sums: a shorter chain of dependent multiply-adds
      T v0 = li == tid ? s0 : pstrf_sym(w, ld, i, p, lower), v1 = T(0), v2 = T(0),
        v3 = T(0);
      int s = 0;
      for (; s + 4 <= t; s += 4) {
        v0 -= ls[s * R + li] * lrow[s];
        v1 -= ls[(s + 1) * R + li] * lrow[s + 1];
        v2 -= ls[(s + 2) * R + li] * lrow[s + 2];
        v3 -= ls[(s + 3) * R + li] * lrow[s + 3];
      }
      for (; s < t; ++s) v0 -= ls[s * R + li] * lrow[s];
      T v = (v0 + v1) + (v2 + v3);
      v *= inv;
      ls[t * R + li] = v;
      lp[(size_t)t * n + i] = v;
      ds[li] -= v * v;
    }
    __syncthreads();
    pstrf_block_best(ds, lpos, nr, r0, n, cval, cpos, cidx, (t + 1) & 1, s_val, s_pos,
                     s_idx, pf ? w : nullptr, ld, j0);
    if (pstrf_grid_sync(bar, ++target, state, &s_err, lean)) return;
  }
  if (b == 0 && tid == 0) { state[0] = jend; state[2] = s_nmoved; }
}

// Columns (contiguous in the column-major view) at the moved positions a take those of
// rho[a], rows j0 .. n - 1: copied out to tmp (cnt x (n - j0)), then in. A block a
// moved position (gridDim.x >= the count; the rest return).
template <typename T>
__global__ void pstrf_grid_cols_out(const T* __restrict__ w, long long ld, int n, int j0,
                                    const int* __restrict__ rho,
                                    const int* __restrict__ moved,
                                    const int* __restrict__ state, T* __restrict__ tmp) {
  const int e = blockIdx.x;
  if (state[1] || state[3] || e >= state[2]) return;
  const long long x = rho[moved[e]];
  const int len = n - j0;
  for (int r = threadIdx.x; r < len; r += blockDim.x)
    tmp[(size_t)e * len + r] = w[j0 + r + x * ld];
}

template <typename T>
__global__ void pstrf_grid_cols_in(T* __restrict__ w, long long ld, int n, int j0,
                                   const int* __restrict__ moved,
                                   const int* __restrict__ state,
                                   const T* __restrict__ tmp) {
  const int e = blockIdx.x;
  if (state[1] || state[3] || e >= state[2]) return;
  const long long a = moved[e];
  const int len = n - j0;
  for (int r = threadIdx.x; r < len; r += blockDim.x)
    w[j0 + r + a * ld] = tmp[(size_t)e * len + r];
}

// Rows: for each column c >= j2 (a block; after the column moves), each moved position
// a takes row rho[a]; all reads before any write. blockDim.x >= the count.
template <typename T>
__global__ void pstrf_grid_rows(T* __restrict__ w, long long ld, int n, int j2,
                                const int* __restrict__ rho, const int* __restrict__ moved,
                                const int* __restrict__ state) {
  const long long c = j2 + blockIdx.x;
  if (state[1] || state[3] || c >= n) return;
  const int e = threadIdx.x;
  int a = -1;
  T v = T(0);
  if (e < state[2]) {
    a = moved[e];
    v = w[rho[a] + c * ld];
  }
  __syncthreads();
  if (a >= 0) w[a + c * ld] = v;
}

// The "lower" storage's moves: each moved position a takes, for every position b >= j2,
// the entry (rho[a], rho[b]) of the symmetric matrix (read through its lower triangle),
// copied out to tmp (cnt x (n - j2)), then written to (max(a, b), min(a, b)). A block a
// moved position.
template <typename T>
__global__ void pstrf_grid_sym_out(const T* __restrict__ w, long long ld, int n, int j2,
                                   const int* __restrict__ rho,
                                   const int* __restrict__ moved,
                                   const int* __restrict__ state, T* __restrict__ tmp) {
  const int e = blockIdx.x;
  if (state[1] || state[3] || e >= state[2]) return;
  const int x = rho[moved[e]];
  const int len = n - j2;
  for (int c = threadIdx.x; c < len; c += blockDim.x)
    tmp[(size_t)e * len + c] = pstrf_sym(w, ld, x, rho[j2 + c], 1);
}

template <typename T>
__global__ void pstrf_grid_sym_in(T* __restrict__ w, long long ld, int n, int j2,
                                  const int* __restrict__ moved,
                                  const int* __restrict__ state,
                                  const T* __restrict__ tmp) {
  const int e = blockIdx.x;
  if (state[1] || state[3] || e >= state[2]) return;
  const int a = moved[e];
  const int len = n - j2;
  for (int c = threadIdx.x; c < len; c += blockDim.x) {
    const long long b = j2 + c;
    w[(a >= b ? a + b * ld : b + a * ld)] = tmp[(size_t)e * len + c];
  }
}
