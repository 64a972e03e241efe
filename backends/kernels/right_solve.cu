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

// x <- x R^{-1} for one row held in registers (rt, dinv as above). (Splitting each sum
// into two FMA chains did not speed it up: H100, 2^24 x 32, bench/NOTES.md session 11.)
template <typename T, int N>
__device__ __forceinline__ void solve_row(T (&x)[N], const T* __restrict__ rt,
                                          const T* __restrict__ dinv) {
  constexpr int NP = (N + 1) & ~1;  // row stride of rt
  using P = typename Pair<T>::type;
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
}

// TWICE: Q = (A R^{-1}) R2^{-1}, CholQR2's last pass from A itself (the intermediate row
// is the same rounded values right_solve_gram_rows saw), so Q1 never goes to memory.
template <typename T, int N, int ROWS, int MINB, bool TWICE = false>
__global__ void __launch_bounds__(ROWS, MINB)
right_solve_upper_rows(const T* __restrict__ a, long long lda, const T* __restrict__ rt,
                       const T* __restrict__ dinv, T* __restrict__ q, long long ldq,
                       long long m, const T* __restrict__ rt2 = nullptr,
                       const T* __restrict__ dinv2 = nullptr) {
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
    solve_row<T, N>(x, rt, dinv);
    if (TWICE) solve_row<T, N>(x, rt2, dinv2);
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

// G = (A R^{-1})^T (A R^{-1}) for float64 A (m x N, N <= 32) without writing A R^{-1}:
// CholQR2's second Gram matrix in one read of A. Persistent blocks walk tiles of ROWS
// rows; each thread solves its row as right_solve_upper_rows does (the same rounded
// values), the tile goes to shared memory, and the block's warps accumulate the upper
// 8 x 8 tiles of G with fp64 tensor-core MMA (m8n8k4, float64 arithmetic).
// Each block writes its partial G (N16 x N16, upper tiles only) to partial[blockIdx.x];
// the caller sums the partials. Shared layout: element (r, c) at r * N16 + (c ^ swz(r)),
// swz(r) = ((r & 3) << 2) | ((r >> 2) & 3): conflict-free both for a thread reading
// its row and for the MMA fragments (lanes read 4 rows x 4 columns).
__device__ __forceinline__ int swz(int r) { return ((r & 3) << 2) | ((r >> 2) & 3); }

template <int N, int ROWS, int MINB>
__global__ void __launch_bounds__(ROWS, MINB)
right_solve_gram_rows(const double* __restrict__ a, long long lda,
                      const double* __restrict__ rt, const double* __restrict__ dinv,
                      double* __restrict__ partial, long long m) {
  constexpr int N16 = (N + 15) & ~15;
  constexpr int TB = N16 / 8;             // 8 x 8 tiles per side of G
  constexpr int NT = TB * (TB + 1) / 2;   // upper tiles
  constexpr int W = ROWS / 32;
  constexpr int PER = (NT + W - 1) / W;   // upper tiles per warp
  __shared__ double tile[ROWS * N16];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  int ti[PER], tj[PER];
#pragma unroll
  for (int p = 0; p < PER; ++p) {
    int k = warp + p * W, i = 0;
    while (k >= TB - i && i < TB) { k -= TB - i; ++i; }
    ti[p] = i; tj[p] = i + k;  // ti = TB marks "no tile"
  }
  double acc[PER][2];
#pragma unroll
  for (int p = 0; p < PER; ++p) acc[p][0] = acc[p][1] = 0.0;
  const long long ntiles = (m + ROWS - 1) / ROWS;
  for (long long tb = blockIdx.x; tb < ntiles; tb += gridDim.x) {
    const long long row0 = tb * ROWS;
    const int rows = (int)min((long long)ROWS, m - row0);
    __syncthreads();  // the previous tile's MMA reads are done
    if (rows == ROWS) {  // unrolled, so every load of the tile is in flight at once
#pragma unroll
      for (int t2 = 0; t2 < N; ++t2) {
        const int idx = threadIdx.x + t2 * ROWS;
        const int i = idx / N, j = idx - (idx / N) * N;
        tile[i * N16 + (j ^ swz(i))] = a[(row0 + i) * lda + j];
      }
    } else {
      for (int idx = threadIdx.x; idx < rows * N; idx += ROWS) {
        const int i = idx / N, j = idx - (idx / N) * N;
        tile[i * N16 + (j ^ swz(i))] = a[(row0 + i) * lda + j];
      }
    }
    __syncthreads();
    {
      const int r = threadIdx.x;
      double x[N];
      if (r < rows) {
#pragma unroll
        for (int j = 0; j < N; ++j) x[j] = tile[r * N16 + (j ^ swz(r))];
        solve_row<double, N>(x, rt, dinv);
      } else {
#pragma unroll
        for (int j = 0; j < N; ++j) x[j] = 0.0;  // rows past m add nothing to G
      }
      __syncthreads();  // every row is read before any is overwritten
#pragma unroll
      for (int j = 0; j < N16; ++j) tile[r * N16 + (j ^ swz(r))] = j < N ? x[j] : 0.0;
    }
    __syncthreads();
    // k outer, tiles inner: the warp's PER accumulator chains interleave
#pragma unroll 4
    for (int k0 = 0; k0 < ROWS; k0 += 4) {
      const int r = k0 + t;
#pragma unroll
      for (int p = 0; p < PER; ++p) {
        if (ti[p] < TB) {
          const double av = tile[r * N16 + ((ti[p] * 8 + g) ^ swz(r))];
          const double bv = tile[r * N16 + ((tj[p] * 8 + g) ^ swz(r))];
          asm("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0,%1}, {%2}, {%3}, {%4,%5};"
              : "=d"(acc[p][0]), "=d"(acc[p][1])
              : "d"(av), "d"(bv), "d"(acc[p][0]), "d"(acc[p][1]));
        }
      }
    }
  }
  double* out = partial + (long long)blockIdx.x * N16 * N16;
#pragma unroll
  for (int p = 0; p < PER; ++p) {
    if (ti[p] < TB) {
      const int row = ti[p] * 8 + g, col = tj[p] * 8 + 2 * t;
      out[row * N16 + col] = acc[p][0];
      out[row * N16 + col + 1] = acc[p][1];
    }
  }
}
