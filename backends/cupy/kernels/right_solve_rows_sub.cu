// The row-per-thread solve of right_solve.cu on the rows of A - T: a left-looking blocked
// solve's leaf, whose off-diagonal update T (m x N, ldsub: the earlier columns' product
// with R's block above the leaf) is subtracted as the tile is staged, each difference
// rounded once as a separate subtraction would round it, so A - T is never written.
// Compiled appended to right_solve.cu (its helpers; that file stays byte-identical, so
// its prebuilt binaries still match). Otherwise as right_solve_upper_rows.
template <typename T, int N, int ROWS, int MINB>
__global__ void __launch_bounds__(ROWS, MINB)
right_solve_upper_sub_rows(const T* __restrict__ a, long long lda, const T* __restrict__ rt,
                           const T* __restrict__ dinv, T* __restrict__ q, long long ldq,
                           long long m, const T* __restrict__ sub, long long ldsub) {
  __shared__ T tile[ROWS][N + 1];  // +1: rows of the tile fall in different banks
  const long long row0 = (long long)blockIdx.x * ROWS;
  const int rows = (int)min((long long)ROWS, m - row0);
  if (rows == ROWS) {
#pragma unroll
    for (int t = 0; t < N; ++t) {
      const int idx = threadIdx.x + t * ROWS;
      const int i = idx / N, j = idx - (idx / N) * N;
      tile[i][j] = a[(row0 + i) * lda + j] - sub[(row0 + i) * ldsub + j];
    }
  } else {
    for (int idx = threadIdx.x; idx < rows * N; idx += ROWS) {
      const int i = idx / N, j = idx - (idx / N) * N;
      tile[i][j] = a[(row0 + i) * lda + j] - sub[(row0 + i) * ldsub + j];
    }
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
