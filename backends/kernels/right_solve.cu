// Q = A R^{-1} for upper-triangular R (n x n, n = N <= 64), one row of A per thread:
// the textbook row-wise forward substitution q_j = (a_j - sum_{i<j} q_i r_ij) / r_jj,
// which is backward stable row by row (what CholQR's error analysis assumes).
// A tile of ROWS rows is staged through shared memory so global loads and stores
// are coalesced; each thread then keeps its row in registers (the loops unroll).
// R comes transposed with an even row stride NP (rt[j * NP + i] = r_ij), so one load
// fetches two entries of a column of R; every thread reads the same address (an L1
// broadcast). The division by r_jj is a multiplication by its reciprocal (dinv): one
// more rounding, inside the row-wise backward-error bound. MINB (blocks per SM asked
// of the register allocator) was picked by measurement (H100, bench/NOTES.md): 3 for
// float64, none for float32; the right-looking order of the same sums was slower.

template <typename T> struct Pair;
template <> struct Pair<double> { using type = double2; };
template <> struct Pair<float> { using type = float2; };

template <typename T, int N, int ROWS, int MINB>
__global__ void __launch_bounds__(ROWS, MINB)
right_solve_upper_rows(const T* __restrict__ a, long long lda, const T* __restrict__ rt,
                       const T* __restrict__ dinv, T* __restrict__ q, long long ldq,
                       long long m) {
  constexpr int NP = (N + 1) & ~1;  // row stride of rt
  using P = typename Pair<T>::type;
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
      const T* col = rt + j * NP;  // column j of R
      T s = x[j];
#pragma unroll
      for (int i = 0; i + 1 < j; i += 2) {
        const P v = __ldg(reinterpret_cast<const P*>(col + i));
        s = fma(-x[i], v.x, s);
        s = fma(-x[i + 1], v.y, s);
      }
      if (j & 1) s = fma(-x[j - 1], __ldg(col + j - 1), s);
      x[j] = s * __ldg(dinv + j);
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
