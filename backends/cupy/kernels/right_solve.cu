// Q = A R^{-1} for upper-triangular R (n x n, n = N <= 64), one row of A per thread:
// the textbook row-wise forward substitution q_j = (a_j - sum_{i<j} q_i r_ij) / r_jj,
// which is backward stable row by row (what CholQR's error analysis assumes).
// A tile of ROWS rows is staged through shared memory so global loads and stores
// are coalesced; each thread then keeps its row in registers (the loops unroll).
// R comes transposed with an even row stride NP (rt[j * NP + i] = r_ij), so one load
// fetches two entries of a column of R; every thread reads the same address (an L1
// broadcast). The division by r_jj is a multiplication by its reciprocal (dinv): one
// more rounding, inside the row-wise backward-error bound. MINB (blocks per SM asked
// of the register allocator) was picked by measurement (H100, `python -m mpqr bench qr
// --shapes 16777216x32 --precisions fp64`): 3 for
// float64, none for float32; the right-looking order of the same sums was slower.

template <typename T> struct Pair;
template <> struct Pair<double> { using type = double2; };
template <> struct Pair<float> { using type = float2; };

// x <- x R^{-1} for one row held in registers (rt, dinv as above). (Splitting each sum
// into two FMA chains did not speed it up: H100, 2^24 x 32.)
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

// TWICE: Q = (A R^{-1}) R2^{-1} from A, two substitutions per row (the intermediate is
// rounded as the plain solve rounds it).
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

// --- CholQR's fused passes (float64, N <= 64) ---------------------------------------
// A tile of ROWS rows sits in shared memory as ROWS x N16 doubles, element (r, c) at
// r * N16 + (c ^ swz(r)), swz(r) = ((r & 3) << 2) | ((r >> 2) & 3): conflict-free both
// for a thread reading its row and for MMA fragments (lanes read 4 rows x 4 columns).
// Columns past N and rows past m hold zeros. R comes padded to N8 x N8 with an identity
// tail (so padded columns solve to zero), row-major in shared memory with a row stride
// RS = 4 (mod 16) (conflict-free B fragments), with its reciprocal diagonal.
__device__ __forceinline__ int swz(int r) { return ((r & 3) << 2) | ((r >> 2) & 3); }

template <int N> struct Blk {
  static constexpr int N16 = (N + 15) & ~15;
  static constexpr int N8 = (N + 7) & ~7;
  static constexpr int RS = N8 + ((20 - (N8 & 15)) & 15);
};

// D = A B + C on the fp64 tensor cores (m8n8k4, float64 arithmetic): A 8 x 4 (lane:
// row lane / 4, column lane % 4), B 4 x 8 (row lane % 4, column lane / 4), C and D
// 8 x 8 (row lane / 4, columns 2 (lane % 4) + {0, 1}).
__device__ __forceinline__ void dmma(double (&c)[2], double av, double bv) {
  asm("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0,%1}, {%2}, {%3}, {%4,%5};"
      : "=d"(c[0]), "=d"(c[1]) : "d"(av), "d"(bv), "d"(c[0]), "d"(c[1]));
}

// The tile's elements are fetched by cp.async (8 bytes each, so the swizzle above is
// kept; zero-filled past m and past N): the loads of the next tile fly while the block
// solves the current one, without holding registers (a register prefetch spilled).
// Commit and wait as for any cp.async group.
template <int N, int ROWS>
__device__ __forceinline__ void load_tile_async(double* tile, const double* __restrict__ a,
                                                long long lda, long long row0, int rows) {
  constexpr int N16 = Blk<N>::N16;
#pragma unroll
  for (int t = 0; t < N16; ++t) {
    const int idx = threadIdx.x + t * ROWS;
    const int i = idx / N16, j = idx - (idx / N16) * N16;
    const bool ok = i < rows && j < N;
    unsigned dst;
    asm("{ .reg .u64 p; cvta.to.shared.u64 p, %1; cvt.u32.u64 %0, p; }"
        : "=r"(dst) : "l"(tile + i * N16 + (j ^ swz(i))));
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;"
                 :: "r"(dst), "l"(ok ? a + (row0 + i) * lda + j : a), "r"(ok ? 8 : 0)
                 : "memory");
  }
}

__device__ __forceinline__ void async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
// all but the most recent committed group have landed (this thread's copies)
__device__ __forceinline__ void async_wait_prev() {
  asm volatile("cp.async.wait_group 1;" ::: "memory");
}

// Starts the copy of row tile tb (when it exists) into dst and commits the group; past
// the last tile the group is empty, so async_wait_prev's count still holds.
template <int N, int ROWS>
__device__ __forceinline__ void prefetch_tile(double* dst, const double* __restrict__ a,
                                              long long lda, long long tb, long long ntiles,
                                              long long m) {
  if (tb < ntiles)
    load_tile_async<N, ROWS>(dst, a, lda, tb * ROWS, (int)min((long long)ROWS, m - tb * ROWS));
  async_commit();
}

// The fused kernels' dynamic shared memory: two tiles, then NR copies of (R, 1/diag R).
// The launch passes _fused_smem(n, NR) bytes (backends/cupy_right_solve.py); a
// smaller allocation traps rather than writing past it.
template <int N, int ROWS, int NR>
__device__ __forceinline__ double* fused_smem(double* base, int which) {
  constexpr int N16 = Blk<N>::N16, N8 = Blk<N>::N8, RS = Blk<N>::RS;
  constexpr unsigned need = (2 * ROWS * N16 + NR * (N8 * RS + N8)) * 8;
  if (which == 0) {
    unsigned got;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(got));
    if (got < need) __trap();
  }
  return which < 2 ? base + which * ROWS * N16
                   : base + 2 * ROWS * N16 + (which - 2) * (N8 * RS + N8);
}

template <int N>
__device__ __forceinline__ void load_r(double* rsh, double* dsh, const double* __restrict__ rp,
                                       const double* __restrict__ dp) {
  constexpr int N8 = Blk<N>::N8, RS = Blk<N>::RS;
  for (int idx = threadIdx.x; idx < N8 * N8; idx += blockDim.x)
    rsh[(idx / N8) * RS + idx % N8] = rp[idx];
  for (int idx = threadIdx.x; idx < N8; idx += blockDim.x) dsh[idx] = dp[idx];
}

// X R = T in place for the tile's first N8 columns, by column blocks of 8: block jb is
// first updated by the solved blocks on the MMA (each warp its 8-row slices), then each
// thread solves its row's 8 x 8 triangle. Every x_j is (t_j - sum_i x_i r_ij) / r_jj with
// the sum in some order, so each row keeps substitution's backward-error bound. Call
// with the tile and R in place and synchronized; returns synchronized.
template <int N, int ROWS>
__device__ __forceinline__ void solve_tile(double* tile, const double* rsh, const double* dsh) {
  constexpr int N16 = Blk<N>::N16, N8 = Blk<N>::N8, RS = Blk<N>::RS;
  constexpr int W = ROWS / 32, MPW = ROWS / 8 / W;  // 8-row slices per warp
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3, r = threadIdx.x;
#pragma unroll
  for (int jb = 0; jb < N8 / 8; ++jb) {
    if (jb > 0) {
      const int c0 = jb * 8 + 2 * t;
      double c[MPW][2];
#pragma unroll
      for (int u = 0; u < MPW; ++u) {
        const int rr = (warp * MPW + u) * 8 + g;
        c[u][0] = tile[rr * N16 + (c0 ^ swz(rr))];
        c[u][1] = tile[rr * N16 + ((c0 + 1) ^ swz(rr))];
      }
#pragma unroll
      for (int k0 = 0; k0 < jb * 8; k0 += 4) {
        const double bv = rsh[(k0 + t) * RS + jb * 8 + g];  // one B fragment, MPW products
#pragma unroll
        for (int u = 0; u < MPW; ++u) {
          const int rr = (warp * MPW + u) * 8 + g;
          dmma(c[u], -tile[rr * N16 + ((k0 + t) ^ swz(rr))], bv);
        }
      }
#pragma unroll
      for (int u = 0; u < MPW; ++u) {
        const int rr = (warp * MPW + u) * 8 + g;
        tile[rr * N16 + (c0 ^ swz(rr))] = c[u][0];
        tile[rr * N16 + ((c0 + 1) ^ swz(rr))] = c[u][1];
      }
      __syncthreads();
    }
    double x[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] = tile[r * N16 + ((jb * 8 + i) ^ swz(r))];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      double s = x[j];
#pragma unroll
      for (int i = 0; i < j; ++i) s = fma(-x[i], rsh[(jb * 8 + i) * RS + jb * 8 + j], s);
      x[j] = s * dsh[jb * 8 + j];
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) tile[r * N16 + ((jb * 8 + i) ^ swz(r))] = x[i];
    __syncthreads();
  }
}

// G = (A R^{-1})^T (A R^{-1}) without writing A R^{-1}: CholQR2's second Gram matrix in
// one read of A. Persistent blocks walk the tiles, the next one loading while the
// current one is solved (solve_tile); then each warp adds the upper 8 x 8 tiles of G over
// its ROWS / W rows of the tile on the MMA (a lane's A and B fragments of column block c
// are the same values, so TB loads serve TB (TB + 1) / 2 products). Each warp writes its
// partial G (N16 x N16, upper tiles only) to partial[blockIdx.x * W + warp]; the caller
// sums them (a fixed order: deterministic). STORE: the solved rows are also written to q
// (ldq; unused and null otherwise), so that the Gram matrix is that of the stored A R^{-1}.
template <int N, int ROWS, int MINB, bool STORE = false>
__global__ void __launch_bounds__(ROWS, MINB)
right_solve_gram_rows(const double* __restrict__ a, long long lda,
                      const double* __restrict__ rp, const double* __restrict__ dp,
                      double* __restrict__ partial, long long m,
                      double* __restrict__ q, long long ldq) {
  constexpr int N16 = Blk<N>::N16, N8 = Blk<N>::N8, RS = Blk<N>::RS;
  constexpr int TB = N16 / 8, TS = ROWS * N16;  // 8 x 8 tiles per side of G; tile size
  constexpr int W = ROWS / 32, KW = ROWS / W;  // warps, tile rows per warp
  extern __shared__ double smem[];
  double* const buf = fused_smem<N, ROWS, 1>(smem, 0);  // tile k at buf + (k & 1) * TS
  double* rsh = fused_smem<N, ROWS, 1>(smem, 2);
  double* dsh = rsh + N8 * RS;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  double acc[TB][TB][2];
#pragma unroll
  for (int i = 0; i < TB; ++i)
#pragma unroll
    for (int j = 0; j < TB; ++j) acc[i][j][0] = acc[i][j][1] = 0.0;
  load_r<N>(rsh, dsh, rp, dp);
  const long long ntiles = (m + ROWS - 1) / ROWS;
  long long tb = blockIdx.x;
  prefetch_tile<N, ROWS>(buf, a, lda, tb, ntiles, m);
  for (int k = 0; tb < ntiles; tb += gridDim.x, ++k) {
    double* tile = buf + (k & 1) * TS;
    // the next tile, into the buffer the last iteration released
    prefetch_tile<N, ROWS>(buf + ((k + 1) & 1) * TS, a, lda, tb + gridDim.x, ntiles, m);
    async_wait_prev();
    __syncthreads();  // every thread's copies of this tile (and R, the first time)
    solve_tile<N, ROWS>(tile, rsh, dsh);
    if (STORE) {
      const long long row0 = tb * ROWS;
      const int rows = (int)min((long long)ROWS, m - row0);
#pragma unroll
      for (int t = 0; t < N; ++t) {
        const int idx = threadIdx.x + t * ROWS;
        const int i = idx / N, j = idx - (idx / N) * N;
        if (i < rows) q[(row0 + i) * ldq + j] = tile[i * N16 + (j ^ swz(i))];
      }
    }
#pragma unroll 2
    for (int k0 = warp * KW; k0 < (warp + 1) * KW; k0 += 4) {
      const int r = k0 + t;
      double f[TB];
#pragma unroll
      for (int c = 0; c < TB; ++c) f[c] = tile[r * N16 + ((c * 8 + g) ^ swz(r))];
#pragma unroll
      for (int i = 0; i < TB; ++i)
#pragma unroll
        for (int j = i; j < TB; ++j) dmma(acc[i][j], f[i], f[j]);
    }
    __syncthreads();  // the tile's reads are done before the next load reuses its buffer
  }
  double* out = partial + ((long long)blockIdx.x * W + warp) * N16 * N16;
#pragma unroll
  for (int i = 0; i < TB; ++i)
#pragma unroll
    for (int j = i; j < TB; ++j) {
      const int row = i * 8 + g, col = j * 8 + 2 * t;
      out[row * N16 + col] = acc[i][j][0];
      out[row * N16 + col + 1] = acc[i][j][1];
    }
}

// Q = (A R1^{-1}) R2^{-1} from A by two solve_tile passes per tile: the intermediate is
// rounded exactly as right_solve_gram_rows rounds it, so Q1 never goes to memory.
// Persistent blocks as above, R1 and R2 loaded once per block.
template <int N, int ROWS, int MINB>
__global__ void __launch_bounds__(ROWS, MINB)
right_solve_twice_tiles(const double* __restrict__ a, long long lda,
                        const double* __restrict__ rp1, const double* __restrict__ dp1,
                        const double* __restrict__ rp2, const double* __restrict__ dp2,
                        double* __restrict__ q, long long ldq, long long m) {
  constexpr int N16 = Blk<N>::N16, N8 = Blk<N>::N8, RS = Blk<N>::RS, TS = ROWS * N16;
  extern __shared__ double smem[];
  double* const buf = fused_smem<N, ROWS, 2>(smem, 0);  // tile k at buf + (k & 1) * TS
  double* r1sh = fused_smem<N, ROWS, 2>(smem, 2);
  double* r2sh = fused_smem<N, ROWS, 2>(smem, 3);
  load_r<N>(r1sh, r1sh + N8 * RS, rp1, dp1);
  load_r<N>(r2sh, r2sh + N8 * RS, rp2, dp2);
  const long long ntiles = (m + ROWS - 1) / ROWS;
  long long tb = blockIdx.x;
  prefetch_tile<N, ROWS>(buf, a, lda, tb, ntiles, m);
  for (int k = 0; tb < ntiles; tb += gridDim.x, ++k) {
    double* tile = buf + (k & 1) * TS;
    const long long row0 = tb * ROWS;
    const int rows = (int)min((long long)ROWS, m - row0);
    prefetch_tile<N, ROWS>(buf + ((k + 1) & 1) * TS, a, lda, tb + gridDim.x, ntiles, m);
    async_wait_prev();
    __syncthreads();
    solve_tile<N, ROWS>(tile, r1sh, r1sh + N8 * RS);
    solve_tile<N, ROWS>(tile, r2sh, r2sh + N8 * RS);
#pragma unroll
    for (int t = 0; t < N; ++t) {
      const int idx = threadIdx.x + t * ROWS;
      const int i = idx / N, j = idx - (idx / N) * N;
      if (i < rows) q[(row0 + i) * ldq + j] = tile[i * N16 + (j ^ swz(i))];
    }
    __syncthreads();  // the tile's reads are done before the next load reuses its buffer
  }
}
