// A certified panel in one launch: panel_cholqr.cu's three launches (pass 1, pass 2, apply)
// as phases of one persistent grid, separated by grid barriers, with no host step between.
// Appended to panel_cholqr.cu (its helpers).
//
//   phase 1: every block's partial Gram of its tiles (pass 1: A^T A)        | barrier
//   phase 2: the partials summed by the whole grid (sum_partials' order; each
//            block its share of the entries, all its loads at once; the
//            last-block sum read 96 partials through one SM, ~10 us)        | barrier
//   phase 3: every block: R1 = chol(G), X1 = R1^-1 (the same bits in each;
//            no barrier: each goes on with its own X1)
//   phases 4-6: the same for pass 2 (Q1 = A X1 on the fly); every block then
//            does the certificate, R2, the signed LU, T, P and P T (the same
//            bits in each; Q's top rows read before pass 2's first barrier,
//            when no block writes A), block 0 alone writes the panel's top
//            rows, R, L and tau
//   phase 7: every block: y_i and w_i of its rows (panel_apply's loop), with
//            its own P and P T
//
// Same tiles, same block count and the same summation order as the three launches, so
// the factors are the same to the last bit. A block's first tiles stay in shared memory
// from pass 1 to the rows (as many as the launch's dynamic shared memory holds, in float64):
// pass 1 loads them all at once, pass 2 turns each into Q1's rows in place, and the rows
// phase multiplies those by P and P T without reading A again; each further tile is read
// from A in every pass, the next one loaded into registers while the current one is
// multiplied. STEPS, the Cholesky and signed LU factorizations:
// 0 one warp's loops in shared memory (~0.45 us a step, H100); 1 the whole block (each
// thread its four entries; a barrier a step, the LU's a pair of steps). Same operations on
// every entry, same results.
//
// The grid barrier needs every block resident at once: the caller launches at most one
// block per SM (the kernel's resources allow one). It counts arrivals cumulatively in
// cert[1] (the pass counter of panel_pass, zero between launches): barrier k waits for
// k * gridDim.x arrivals; leaving, each block arrives once more and the last one resets the
// counter to zero. `stop` > 0 returns after barrier `stop` (the stages' timing); 0 runs all.

#define FUSED_G1 WS_P   // the reduced Gram of pass 1 (P is written after its last read)
#define FUSED_G2 WS_G2  // the reduced Gram of pass 2 (every block reads it while block 0
                        // writes P and P T)
// the partials' loads a thread issues at once in the grid's sum (up to 1280 = 256 x 5: 1024
// entries summed over up to 96 blocks, 11 entries a block)
#define SUM_LOADS 5

// The block's writes are ordered before thread 0's arrival by the block barrier and made
// visible to the grid by the arrival's release (cumulative); the acquire of the count,
// then the block barrier, order every thread's later reads after the other blocks' writes.
// Release and acquire instead of a fence by every thread: 0.89 against 0.94 us a barrier,
// the panel ~0.7 us faster (H200, bench/probes/panel_floors.py, panel_variants.py).
__device__ __forceinline__ void grid_sync(unsigned int* bar, unsigned int k) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned int target = k * gridDim.x;
#if __CUDA_ARCH__ >= 700
    unsigned int v;
    asm volatile("atom.add.release.gpu.u32 %0, [%1], 1;" : "=r"(v) : "l"(bar) : "memory");
    do {
      asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(v) : "l"(bar) : "memory");
    } while (v < target);
#else  // no release / acquire before sm_70: fences
    __threadfence();
    atomicAdd(bar, 1u);
    while (*reinterpret_cast<volatile unsigned int*>(bar) < target) {
    }
    __threadfence();
#endif
  }
  __syncthreads();
}

// after barrier k, for good: the last block out resets the counter
__device__ __forceinline__ void grid_leave(unsigned int* bar, unsigned int k) {
  if (threadIdx.x == 0 && atomicAdd(bar, 1u) == (k + 1) * gridDim.x - 1) atomicExch(bar, 0u);
}

// This thread's entries of the tile at row0, in registers: the next tile's loads are issued
// before the current tile is multiplied (load_tile's values: zero beyond m rows, n columns).
template <typename T>
__device__ __forceinline__ void fetch_tile(const T* a, long long lda, long long m, int n,
                                           long long row0, T* v) {
  const int j = threadIdx.x & 31;
#pragma unroll
  for (int e = 0; e < TILE_ENTRIES; ++e) {
    const long long row = row0 + (threadIdx.x >> 5) + 8 * e;
    v[e] = (row < m && j < n) ? a[row * lda + j] : static_cast<T>(0);
  }
}

template <typename T>
__device__ __forceinline__ void store_tile(const T* v, Mat* tile) {
#pragma unroll
  for (int e = 0; e < TILE_ENTRIES; ++e)
    tile[(threadIdx.x >> 5) + 8 * e][threadIdx.x & 31] = static_cast<double>(v[e]);
}

// The threads that read a tile's rows in tile_times and write them in store_entries: the
// pair of warps of an 8-row band (tensor cores), else the warp itself. A tile turned into
// its product in place needs only them to wait for one another.
__device__ __forceinline__ void row_band_sync() {
#if PANEL_MMA
  asm volatile("bar.sync %0, 64;" : : "r"(1 + static_cast<int>(threadIdx.x >> 6)) : "memory");
#else
  __syncwarp();
#endif
}

// Rows row0 .. row0 + 31 of Y = Q1 P (over A) and W = Q1 (P T), rows n and below only;
// q1: those rows of Q1 = A X1 (panel_apply's arithmetic)
template <typename T>
__device__ __forceinline__ void rows_out(const Mat* q1, const Mat* p, const Mat* pt,
                                         long long row0, long long m, int n, T* a,
                                         long long lda, T* w, long long ldw) {
  double q[TILE_ENTRIES];
  tile_times(q1, p, q);
#pragma unroll
  for (int e = 0; e < TILE_ENTRIES; ++e) {
    const long long row = row0 + entry_row(e);
    const int col = entry_col(e);
    if (row >= n && row < m && col < n) a[row * lda + col] = static_cast<T>(q[e]);
  }
  if (w != nullptr) {
    tile_times(q1, pt, q);
#pragma unroll
    for (int e = 0; e < TILE_ENTRIES; ++e) {
      const long long row = row0 + entry_row(e);
      const int col = entry_col(e);
      if (row >= n && row < m && col < n) w[row * ldw + col] = static_cast<T>(q[e]);
    }
  }
}

// Upper Cholesky G = R^T R in place by the whole block (chol_warp's operations on every
// entry: LDL^T's steps, then R = D^1/2 L^T): step k's row of L^T is written at step k + 1,
// when no thread reads it any more.
// Not inlined, here and in lu_signed_block: compiled apart from the kernel's tile loops,
// each step's chain is scheduled as on its own (inlined, 8.5 and 10.4 us a panel against
// 7.3 and 8.0, H200, bench/probes/panel_timeline.py).
__device__ __noinline__ bool chol_block(Mat* __restrict__ g, int n) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  bool ok = true;
  double prev = 0.0;  // L^T[k - 1][lane] (D on the diagonal)
  for (int k = 0; k < n; ++k) {
    // the step reads row k and rows below it and writes rows below it (and row k - 1,
    // which it does not read): every load first, so that they are in flight together
    // beside the division (the same operations on every entry)
    const double d = g[k][k], gkl = g[k][lane];
    double gki[TILE_ENTRIES], gil[TILE_ENTRIES];
#pragma unroll
    for (int e = 0; e < TILE_ENTRIES; ++e) {
      gki[e] = g[k][warp + 8 * e];
      gil[e] = g[warp + 8 * e][lane];
    }
    if (k > 0 && ((k - 1) & 7) == warp && lane >= k - 1 && lane < n) g[k - 1][lane] = prev;
    ok = ok && d > 0.0 && isfinite(d);
    const double dinv = 1.0 / d;
    const double lkj = lane == k ? d : (lane > k && lane < n ? gkl * dinv : 0.0);
#pragma unroll
    for (int e = 0; e < TILE_ENTRIES; ++e) {
      const int i = warp + 8 * e;
      if (i > k && i < n && i <= lane && lane < n) g[i][lane] = fma(-gki[e], lkj, gil[e]);
    }
    prev = lkj;
    __syncthreads();
  }
  if (n > 0 && ((n - 1) & 7) == warp && lane == n - 1) g[n - 1][lane] = prev;
  __syncthreads();
  // R = D^1/2 L^T: row i times the square root of its pivot
  double v[TILE_ENTRIES];
#pragma unroll
  for (int e = 0; e < TILE_ENTRIES; ++e) {
    const int i = warp + 8 * e;
    const double si = sqrt(fmax(g[i][i], 0.0));
    v[e] = i == lane ? si : si * g[i][lane];
  }
  __syncthreads();
#pragma unroll
  for (int e = 0; e < TILE_ENTRIES; ++e) {
    const int i = warp + 8 * e;
    if (i <= lane && lane < n) g[i][lane] = v[e];
  }
  __syncthreads();
  return ok;
}

// Signed LU without pivoting by the whole block (lu_signed_warp's operations on every
// entry), two steps a barrier: every thread makes the pair's second pivot and the entries of
// row k + 1 and column k + 1 it needs itself, by the same FMAs in the same order (the same
// bits). The pair's pivots, multipliers and row k + 1 of U are written a pair later, when no
// thread reads them, one predicated store an entry (branches by lane took 9.9 us). Alone
// 5.7 against 6.4 us a step a barrier, the panel ~0.9 us faster (H200,
// bench/probes/panel_floors.py, panel_variants.py); pairs in the Cholesky, 5.7 against 6.6
// alone, were no faster in the panel.
__device__ __noinline__ void lu_signed_block(Mat* __restrict__ c, double* s, int n) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  double piv_prev0 = 0.0, piv_prev1 = 0.0, u_prev = 0.0;  // pivots k - 2, k - 1; U[k - 1][lane]
  double l_prev0[TILE_ENTRIES], l_prev1[TILE_ENTRIES];      // L[i][k - 2], L[i][k - 1]
#pragma unroll
  for (int e = 0; e < TILE_ENTRIES; ++e) l_prev0[e] = l_prev1[e] = 0.0;
  int k = 0;
  // the previous pair's columns of L, its pivots and row k - 1 of U, one predicated store
  // an entry (no branches)
  const auto write_pair = [&]() {
#pragma unroll
    for (int e = 0; e < TILE_ENTRIES; ++e) {
      const int i = warp + 8 * e;
      const bool first = lane == k - 2;
      const double v = first ? (i == k - 2 ? piv_prev0 : l_prev0[e])
                             : (i == k - 1 ? piv_prev1 : l_prev1[e]);
      if ((first || lane == k - 1) && i >= lane && i < n) c[i][lane] = v;
    }
    if (((k - 1) & 7) == warp && lane > k - 1 && lane < n) c[k - 1][lane] = u_prev;
  };
  for (; k + 1 < n; k += 2) {
    // loads first: rows k and k + 1, columns k and k + 1 and this thread's entries
    const double d0 = c[k][k], u01 = c[k][k + 1], c10 = c[k + 1][k], d1r = c[k + 1][k + 1];
    const double ukl = c[k][lane], uk1l = c[k + 1][lane];
    double cik[TILE_ENTRIES], cik1[TILE_ENTRIES], cil[TILE_ENTRIES];
#pragma unroll
    for (int e = 0; e < TILE_ENTRIES; ++e) {
      cik[e] = c[warp + 8 * e][k];
      cik1[e] = c[warp + 8 * e][k + 1];
      cil[e] = c[warp + 8 * e][lane];
    }
    if (k > 0) write_pair();
    // step k
    const double s0 = d0 < 0.0 ? 1.0 : -1.0;
    const double piv0 = d0 - s0;
    const double inv0 = 1.0 / piv0;
    const double l10 = c10 * inv0;                     // L[k + 1][k]
    const double u1l = fma(-l10, ukl, uk1l);           // U[k + 1][lane] (lane > k + 1)
    // step k + 1
    const double d1 = fma(-l10, u01, d1r);             // C[k + 1][k + 1] after step k
    const double s1 = d1 < 0.0 ? 1.0 : -1.0;
    const double piv1 = d1 - s1;
    const double inv1 = 1.0 / piv1;
#pragma unroll
    for (int e = 0; e < TILE_ENTRIES; ++e) {
      const int i = warp + 8 * e;
      const double lik = (i > k && i < n) ? cik[e] * inv0 : 0.0;
      const double lik1 = (i > k + 1 && i < n) ? fma(-lik, u01, cik1[e]) * inv1 : 0.0;
      if (i > k + 1 && i < n && lane > k + 1 && lane < n)
        c[i][lane] = fma(-lik1, u1l, fma(-lik, ukl, cil[e]));
      l_prev0[e] = lik;
      l_prev1[e] = lik1;
    }
    piv_prev0 = piv0;
    piv_prev1 = piv1;
    u_prev = u1l;
    if (threadIdx.x == 0) {
      s[k] = s0;
      s[k + 1] = s1;
    }
    __syncthreads();
  }
  if (k > 0) write_pair();
  if (k < n) {  // n odd: the last pivot alone, no multipliers below it
    const double d = c[k][k];
    const double sk = d < 0.0 ? 1.0 : -1.0;
    if ((k & 7) == warp && lane == k) c[k][k] = d - sk;
    if (threadIdx.x == 0) s[k] = sk;
  }
  __syncthreads();
}

template <typename T, int STEPS>
__global__ void __launch_bounds__(PANEL_THREADS)
panel_fused(T* __restrict__ a, long long lda, long long m, int n, double* __restrict__ ws,
            int* __restrict__ cert, T* __restrict__ w, long long ldw, T* __restrict__ ltop,
            T* __restrict__ tau, int stop) {
  __shared__ __align__(16) Mat x1[PANEL_B];
  __shared__ __align__(16) Mat red[PANEL_B];
  __shared__ __align__(16) Mat tile[PANEL_B];
  __shared__ __align__(16) Mat qt[PANEL_B];
  __shared__ __align__(16) Mat scratch[PANEL_B];
  __shared__ double sv[PANEL_B];
  __shared__ int ok_sh, fail1, near_identity;
  // the block's first tiles (dynamic), PANEL_B rows each
  extern __shared__ __align__(16) Mat cache[];
  unsigned int* bar = reinterpret_cast<unsigned int*>(cert + 1);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  double* part = ws + WS_PART;
  unsigned int k = 0;  // barriers passed
  // this block's tiles: rows first + t * stride, t < ntiles; the first ncache are cached
  const long long first = (long long)blockIdx.x * PANEL_B;
  const long long stride = (long long)gridDim.x * PANEL_B;
  const int ntiles = first < m ? static_cast<int>((m - 1 - first) / stride) + 1 : 0;
  unsigned int dyn_bytes;
  asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn_bytes));
  const int ncache = min(ntiles, static_cast<int>(dyn_bytes / (PANEL_B * sizeof(Mat))));
  // A[:n] X1, Q1's top rows, from block 0's first kept tile, else from A's top rows read
  // at pass 2's start (block 0 writes them after pass 2's last barrier)
  const bool top_cached = blockIdx.x == 0 && ncache > 0;
  T top_v[TILE_ENTRIES];

  for (int pass = 1; pass <= 2; ++pass) {
    // ---- phase 1 / 4: partial Grams (panel_pass's loop, tiles in the same order) ----
    double acc[TILE_ENTRIES];
#pragma unroll
    for (int e = 0; e < TILE_ENTRIES; ++e) acc[e] = 0.0;
    T nxt[TILE_ENTRIES];
    if (ncache < ntiles) fetch_tile(a, lda, m, n, first + ncache * stride, nxt);
    if (pass == 2 && !top_cached) fetch_tile(a, lda, n, n, 0, top_v);
    if (pass == 1) {  // the cached tiles' loads in flight four tiles at a time (two: the
                      // panel ~1 us slower at 16384 rows, 3 at 65536, H200, panel_variants.py)
#pragma unroll 1
      for (int t0 = 0; t0 < ncache; t0 += 4) {
        T v[4][TILE_ENTRIES];
#pragma unroll
        for (int u = 0; u < 4; ++u)
          if (t0 + u < ncache) fetch_tile(a, lda, m, n, first + (t0 + u) * stride, v[u]);
#pragma unroll
        for (int u = 0; u < 4; ++u)
          if (t0 + u < ncache) store_tile(v[u], cache + (t0 + u) * PANEL_B);
      }
    } else if (ncache > 0) {  // each cached tile becomes Q1's rows (A X1) in place
      __syncthreads();  // X1 loaded
#pragma unroll 1
      for (int t = 0; t < ncache; ++t) {
        double q[TILE_ENTRIES];
        tile_times(cache + t * PANEL_B, x1, q);
        row_band_sync();
        store_entries(q, cache + t * PANEL_B);
      }
    }
    __syncthreads();
#pragma unroll 1
    for (int t = 0; t < ncache; ++t) gram_acc(cache + t * PANEL_B, acc);
    for (int t = ncache; t < ntiles; ++t) {
      const long long row0 = first + t * stride;
      __syncthreads();
      store_tile(nxt, tile);
      __syncthreads();
      if (t + 1 < ntiles) fetch_tile(a, lda, m, n, row0 + stride, nxt);
      const Mat* src = tile;
      if (pass == 2) {
        double q[TILE_ENTRIES];
        tile_times(tile, x1, q);
        store_entries(q, qt);
        __syncthreads();
        src = qt;
      }
      gram_acc(src, acc);
    }
#pragma unroll
    for (int e = 0; e < TILE_ENTRIES; ++e)
      part[(long long)blockIdx.x * PANEL_B * PANEL_B + entry_row(e) * PANEL_B + entry_col(e)] =
          acc[e];
    grid_sync(bar, ++k);
    if (stop == static_cast<int>(k)) { grid_leave(bar, k); return; }

    // ---- phase 2 / 5: G, the partials summed (sum_partials' order) ----
    double* g_out = ws + (pass == 1 ? FUSED_G1 : FUSED_G2);
    const int nb = static_cast<int>(gridDim.x);
    const int per = (PANEL_B * PANEL_B + nb - 1) / nb;  // entries a block sums
    if (per * nb <= SUM_LOADS * PANEL_THREADS && per * nb <= PANEL_B * PANEL_LD) {
      // every block its own entries: their partials loaded into shared memory at once
      // (one round trip; a thread an entry over all blocks' partials took six, ~3.9 us at
      // 96 blocks, H200), then summed
      double* buf = &tile[0][0];
      const int e0 = blockIdx.x * per;
      const int cnt = max(0, min(per, PANEL_B * PANEL_B - e0));
      double v[SUM_LOADS];
#pragma unroll
      for (int u = 0; u < SUM_LOADS; ++u) {
        const int q = threadIdx.x + u * PANEL_THREADS;
        const int b = cnt > 0 ? q / cnt : 0;
        v[u] = q < cnt * nb ? __ldcg(part + (long long)b * PANEL_B * PANEL_B + e0 + q - b * cnt)
                            : 0.0;
      }
#pragma unroll
      for (int u = 0; u < SUM_LOADS; ++u) {
        const int q = threadIdx.x + u * PANEL_THREADS;
        if (q < cnt * nb) buf[q] = v[u];
      }
      __syncthreads();
      // sum_partials' order: eight threads an entry, thread g its group's partials, then
      // the groups' sums by a butterfly across those lanes (a + b is b + a, to the bit)
      for (int q0 = 0; q0 < cnt * SUM_GROUPS; q0 += PANEL_THREADS) {
        const int e = (q0 + threadIdx.x) / SUM_GROUPS, g = threadIdx.x % SUM_GROUPS;
        double s = 0.0;
        if (e < cnt) {
          for (int b = g; b < nb; b += SUM_GROUPS) s += buf[b * cnt + e];
        }
        s += __shfl_xor_sync(FULL_MASK, s, 1);
        s += __shfl_xor_sync(FULL_MASK, s, 2);
        s += __shfl_xor_sync(FULL_MASK, s, 4);
        if (e < cnt && g == 0) g_out[e0 + e] = s;
      }
    } else {  // more blocks than that: one thread an entry, over all partials
      for (int idx = blockIdx.x * PANEL_THREADS + threadIdx.x; idx < PANEL_B * PANEL_B;
           idx += gridDim.x * PANEL_THREADS)
        g_out[idx] = sum_partials(part + idx, PANEL_B * PANEL_B, nb);
    }
    grid_sync(bar, ++k);
    if (stop == static_cast<int>(k)) { grid_leave(bar, k); return; }

    // ---- phase 3 / 6: the n x n steps in every block, each its own X1, P and P T (the
    // same operations on the same G: the same bits), so that no barrier and no round trip
    // through the workspace stand between them and what follows; block 0 alone counts a
    // failed certificate and writes what later phases or launches read ----
    {
      FOR_IJ(i, j) red[i][j] = __ldcg(&g_out[i * PANEL_B + j]);
      __syncthreads();
      if (pass == 1) {
        bool ok;
        if (STEPS == 1) {
          ok = chol_block(red, n);
        } else {
          if (warp == 0) {
            const bool okw = chol_warp(red, n);
            if (lane == 0) ok_sh = okw;
          }
          __syncthreads();
          ok = ok_sh != 0;
        }
        if (!ok) {  // X1 = I keeps pass 2 finite; the caller factors again
          FOR_IJ(i, j) red[i][j] = i == j ? 1.0 : 0.0;
          if (blockIdx.x == 0 && threadIdx.x == 0) atomicAdd(&cert[0], 1);
        }
        if (threadIdx.x == 0) fail1 = !ok;
        __syncthreads();
        if (warp == 0) inv_triangular_warp<false>(red, x1, scratch[0], n);
        __syncthreads();
        FOR_IJ(i, j) {  // R1 kept in `scratch` (free until pass 2's tail); X1 for the rows
          scratch[i][j] = (i <= j && j < n) ? red[i][j] : 0.0;
          if (blockIdx.x == 0) ws[WS_X1 + i * PANEL_B + j] = x1[i][j];
        }
      } else {
        // pass 2 (panel_pass's tail): X2 in `tile`, R1 and later L^-1 in `qt`, L\U over X1
        Mat* x2 = tile;
        Mat* r1 = qt;
        Mat* lu = x1;
        const double e = dist_identity_sq(red, n, sv);  // ||G2 - I||_F^2
        const bool near = e <= PANEL_NEAR_IDENTITY;
        bool ok = true;
        if (near) {  // R2 = I + F, X2 = I - F (panel_pass's first order)
          FOR_IJ(i, j) {
            const double g = red[i][j];
            const bool diag = i == j && j < n;
            const double f = diag ? 0.5 * (g - 1.0) : (i < j && j < n ? g : 0.0);
            red[i][j] = diag ? 1.0 + f : f;
            x2[i][j] = diag ? 1.0 - f : -f;
          }
        } else if (STEPS == 1) {
          ok = chol_block(red, n);
        } else {
          if (warp == 0) {
            const bool okw = chol_warp(red, n);
            if (lane == 0) ok_sh = okw;
          }
          __syncthreads();
          ok = ok_sh != 0;
        }
        const bool good = ok && e <= 0.25 && fail1 == 0;  // a NaN fails e <= 0.25
        if (threadIdx.x == 0) {
          if (!good && fail1 == 0 && blockIdx.x == 0) atomicAdd(&cert[0], 1);
          near_identity = near && good;
        }
        __syncthreads();  // every thread's entries of R2 written, fail1 read
        FOR_IJ(i, j) {  // R2: identity on failure, zero below the diagonal
          if (!good) red[i][j] = i == j ? 1.0 : 0.0;
          if (i > j) red[i][j] = 0.0;
          r1[i][j] = scratch[i][j];
        }
        __syncthreads();
        if (!near_identity && warp == 0) inv_triangular_warp<false>(red, x2, scratch[0], n);
        if (blockIdx.x == 0) {  // R = R2 R1 (both upper)
          double q[TILE_ENTRIES];
          tile_times(red, r1, q);
          store_entries_global(q, ws + WS_R);
        }
        __syncthreads();
        if (!top_cached) store_tile(top_v, r1);  // Q's top block (A[:n] X1) X2
        __syncthreads();
        if (!top_cached) {
          double q[TILE_ENTRIES];
          tile_times(r1, x1, q);
          store_entries(q, red);
        } else {  // A[:n] X1: the top rows of block 0's first cached tile
          FOR_IJ(i, j) red[i][j] = i < n ? cache[i][j] : 0.0;
        }
        __syncthreads();
        {
          double q[TILE_ENTRIES];
          tile_times(red, x2, q);
          store_entries(q, lu);
        }
        __syncthreads();
        if (STEPS == 1) {
          lu_signed_block(lu, sv, n);
        } else {
          if (warp == 0) lu_signed_warp(lu, sv, n);
          __syncthreads();
        }
        if (warp == 0) inv_triangular_warp<false>(lu, red, scratch[0], n);  // U^-1 (into red)
        if (warp == 1) inv_triangular_warp<true>(lu, r1, nullptr, n);       // L^-1 (into r1)
        __syncthreads();
        Mat* pm = scratch;
        {  // P = X2 U^-1 (both upper)
          double q[TILE_ENTRIES];
          tile_times(x2, red, q);
          store_entries(q, pm);
          if (blockIdx.x == 0) {  // for the rows in a launch of their own
#pragma unroll
            for (int e = 0; e < TILE_ENTRIES; ++e)
              ws[WS_P + entry_row(e) * PANEL_B + entry_col(e)] = q[e];
          }
        }
        __syncthreads();  // U^-1 and X2 are read: T (into red) and its operands (x2)
        double wtop[TILE_ENTRIES];
        double rq[TILE_ENTRIES];  // R's entries back from the workspace, in flight during T
        if (blockIdx.x == 0) load_entries_global(ws + WS_R, rq);
        t_and_w_top(lu, sv, r1, red, x2, n, wtop);
        double pt[TILE_ENTRIES];  // P T (both upper), into red after T's last read
        tile_times(pm, red, pt);
        if (blockIdx.x == 0) {
#pragma unroll
          for (int e = 0; e < TILE_ENTRIES; ++e)
            ws[WS_PT + entry_row(e) * PANEL_B + entry_col(e)] = pt[e];
          store_w_top(wtop, n, w, ldw);
          store_top(lu, sv, rq, red, n, a, lda, ltop, tau);
        }
        __syncthreads();
        store_entries(pt, red);
      }
    }
  }
  // a stop past the barriers passed: end before the rows (they run in a launch of their own)
  if (stop > static_cast<int>(k)) { grid_leave(bar, k); return; }

  // ---- phase 7: rows i >= n (panel_apply's arithmetic), the Gram passes' tiles ----
  Mat* p = scratch;
  Mat* pt = red;
  T nxt[TILE_ENTRIES];
  if (ncache < ntiles) fetch_tile(a, lda, m, n, first + ncache * stride, nxt);
  if (ncache < ntiles) {  // X1 again (L\U took its place)
    FOR_IJ(i, j) x1[i][j] = __ldcg(&ws[WS_X1 + i * PANEL_B + j]);
  }
  __syncthreads();
#pragma unroll 1
  for (int t = 0; t < ncache; ++t)  // Q1's rows are in shared memory
    rows_out(cache + t * PANEL_B, p, pt, first + t * stride, m, n, a, lda, w, ldw);
  for (int t = ncache; t < ntiles; ++t) {  // Q1's rows again from A
    const long long row0 = first + t * stride;
    __syncthreads();
    store_tile(nxt, tile);
    __syncthreads();
    if (t + 1 < ntiles) fetch_tile(a, lda, m, n, row0 + stride, nxt);
    double q[TILE_ENTRIES];
    tile_times(tile, x1, q);
    store_entries(q, qt);
    __syncthreads();
    rows_out(qt, p, pt, row0, m, n, a, lda, w, ldw);
  }
  grid_leave(bar, k);
}
