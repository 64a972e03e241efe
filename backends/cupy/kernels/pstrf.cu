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
