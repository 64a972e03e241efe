// Q = A R^{-1} for upper-triangular R (n x n, n = N <= 64), one row of A per thread:
// the textbook row-wise forward substitution q_j = (a_j - sum_{i<j} q_i r_ij) / r_jj,
// which is backward stable row by row (what CholQR's error analysis assumes).
// A tile of ROWS rows is staged through shared memory so global loads and stores
// are coalesced; each thread then keeps its row in registers (the loops unroll).
// R is read by all threads at the same address (an L1 broadcast).

template <typename T, int N, int ROWS>
__global__ void __launch_bounds__(ROWS)
right_solve_upper_rows(const T* __restrict__ a, long long lda, const T* __restrict__ r,
                       T* __restrict__ q, long long ldq, long long m) {
  __shared__ T tile[ROWS][N + 1];  // +1: rows of the tile fall in different banks
  const long long row0 = (long long)blockIdx.x * ROWS;
  const int rows = (int)min((long long)ROWS, m - row0);
  if (rows == ROWS) {
    // full tile: a compile-time trip count, so the loads unroll and are all in flight
#pragma unroll
    for (int t = 0; t < N; ++t) {
      const int idx = threadIdx.x + t * ROWS;
      const int i = idx / N, j = idx - (idx / N) * N;
      tile[i][j] = a[(row0 + i) * lda + j];
    }
  } else {
    for (int idx = threadIdx.x; idx < rows * N; idx += ROWS) {
      const int i = idx / N, j = idx - (idx / N) * N;
      tile[i][j] = a[(row0 + i) * lda + j];
    }
  }
  __syncthreads();
  if (threadIdx.x < rows) {
    T x[N];
#pragma unroll
    for (int j = 0; j < N; ++j) x[j] = tile[threadIdx.x][j];
#pragma unroll
    for (int j = 0; j < N; ++j) {
      T s = x[j];
#pragma unroll
      for (int i = 0; i < j; ++i) s -= x[i] * __ldg(r + i * N + j);
      x[j] = s / __ldg(r + j * N + j);
    }
#pragma unroll
    for (int j = 0; j < N; ++j) tile[threadIdx.x][j] = x[j];
  }
  __syncthreads();
  if (rows == ROWS) {
#pragma unroll
    for (int t = 0; t < N; ++t) {
      const int idx = threadIdx.x + t * ROWS;
      const int i = idx / N, j = idx - (idx / N) * N;
      q[(row0 + i) * ldq + j] = tile[i][j];
    }
  } else {
    for (int idx = threadIdx.x; idx < rows * N; idx += ROWS) {
      const int i = idx / N, j = idx - (idx / N) * N;
      q[(row0 + i) * ldq + j] = tile[i][j];
    }
  }
}
