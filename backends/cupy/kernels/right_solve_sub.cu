// The fused solve-and-Gram kernel of right_solve.cu on the rows of A - T: a blocked
// solve's leaf, whose off-diagonal update T (m x N, ldsub) is subtracted as the tile is
// solved, each difference rounded once as a separate subtraction would round it, so
// A - T is never written. Compiled appended to right_solve.cu (its helpers; that file
// stays byte-identical, so its prebuilt binaries still match). Otherwise as
// right_solve_gram_rows: persistent blocks, Q written to q where STORE, the warps'
// partial Gram matrices to partial.

template <int N, int ROWS, int MINB, bool STORE>
__global__ void __launch_bounds__(ROWS, MINB)
right_solve_gram_sub_rows(const double* __restrict__ a, long long lda,
                          const double* __restrict__ rp, const double* __restrict__ dp,
                          double* __restrict__ partial, long long m,
                          double* __restrict__ q, long long ldq,
                          const double* __restrict__ sub, long long ldsub) {
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
    {  // the tile becomes A - T, each difference rounded once
      const long long row0 = tb * ROWS;
      const int rows = (int)min((long long)ROWS, m - row0);
#pragma unroll 8
      for (int e = 0; e < N; ++e) {
        const int idx = threadIdx.x + e * ROWS;
        const int i = idx / N, j = idx - (idx / N) * N;
        if (i < rows) tile[i * N16 + (j ^ swz(i))] -= sub[(row0 + i) * ldsub + j];
      }
      __syncthreads();
    }
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

