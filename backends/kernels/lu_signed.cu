// Unpivoted LU with the signed diagonal of Householder reconstruction (Ballard et al.
// 2014): L U = W - diag(s), s_i = -sign(pivot_i), for one n x n block, n <= NMAX, held in
// shared memory by one thread block. The column loop is the textbook right-looking one
// (pivot, scale the column, rank-1 update), each step separated by a barrier: at
// n <= 64 that is ~200 barriers, microseconds, where a host round trip costs ~0.2 ms.
// W is overwritten by L\U (unit diagonal of L implied), row stride ld.

template <typename T, int NMAX>
__global__ void lu_signed_block(T* __restrict__ w, long long ld, T* __restrict__ s, int n) {
  __shared__ T t[NMAX][NMAX + 1];  // +1: a column walk falls in different banks
  for (int idx = threadIdx.x; idx < n * n; idx += blockDim.x) {
    const int i = idx / n, j = idx - (idx / n) * n;
    t[i][j] = w[i * ld + j];
  }
  __syncthreads();
  for (int k = 0; k < n; ++k) {
    // every thread reads the pivot itself: no extra barrier for a broadcast
    const T d = t[k][k];
    const T sk = d < T(0) ? T(1) : T(-1);  // d - sk has |.| >= 1 (d = 0 gives +1)
    const T piv = d - sk;
    __syncthreads();  // all have read t[k][k] before it is overwritten
    if (threadIdx.x == 0) {
      t[k][k] = piv;
      s[k] = sk;
    }
    for (int r = k + 1 + threadIdx.x; r < n; r += blockDim.x) t[r][k] /= piv;
    __syncthreads();
    const int m = n - k - 1;
    for (int idx = threadIdx.x; idx < m * m; idx += blockDim.x) {
      const int r = k + 1 + idx / m, c = k + 1 + (idx - (idx / m) * m);
      t[r][c] -= t[r][k] * t[k][c];
    }
    __syncthreads();
  }
  for (int idx = threadIdx.x; idx < n * n; idx += blockDim.x) {
    const int i = idx / n, j = idx - (idx / n) * n;
    w[i * ld + j] = t[i][j];
  }
}
