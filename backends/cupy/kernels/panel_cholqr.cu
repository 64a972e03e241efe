// Householder QR of an m x n panel (n <= 32) by CholQR2 and the reconstruction of its
// reflectors, in three launches whatever m is. All arithmetic is double, for float and
// double storage.
//
//   pass 1 (panel_pass, pass = 1): G = A^T A; the last block to finish sums the blocks'
//          partial Grams (sum_partials' order) and computes R1 = chol(G), X1 = R1^-1.
//   pass 2 (panel_pass, pass = 2): G2 = Q1^T Q1 with the rows of Q1 = A X1 made on the fly
//          (never stored); the last block computes R2 = chol(G2), X2 = R2^-1 (to first
//          order where ||G2 - I||_F^2 <= 2^-53: R2 = I + F, X2 = I - F), R = R2 R1,
//          Q's top block (A[:n] X1) X2, the signed LU L U = Q[:n] - S (Ballard et al.
//          2014; s_i = -sign(pivot_i), so every |u_ii| >= 1), T = -U S L^-T, and writes the
//          panel's top n rows (S R on and above the diagonal, L below), W's (L T), L and
//          tau = diag(T). P = X2 U^-1 and P T go to the workspace.
//   apply  (panel_apply): every row i >= n: q1 = a_i X1 (the same arithmetic as pass 2),
//          y_i = q1 P written over a_i, w_i = q1 (P T).
//
// The panel is then A = (I - W Y^T)[:, :n] (S R) with Y = [L; Q2 U^-1] unit lower and
// W = Y T. The certificate: pass 1's Cholesky must find positive finite pivots and
// ||G2 - I||_F <= 1/2 (CholQR2's condition for an orthonormal Q to working precision);
// otherwise cert[0] is incremented and the caller factors the matrix again by another
// route (the panel's contents are then meaningless and must not be used).
//
// Layout: rows go through shared memory in tiles of 32 (one coalesced load each); each
// thread owns four entries of every 32 x 32 product of tiles (entry_row / entry_col), so the
// sums run in parallel (a warp per row with shuffles was latency-bound: ~0.5 ms per panel,
// H100). From sm_80 those products run on the FP64 tensor cores (mma.m8n8k4), also the
// n x n ones (R2 R1, X2 U^-1, P T: triangular factors, their other terms exact zeros). The
// Cholesky and LU factorizations run in one warp of the last block, lane j owning column j
// (a barrier-separated loop of the whole block per column took ~0.1 ms per panel); each
// triangular inverse in one warp, by substitution. Partial Grams are summed in a fixed
// order (sum_partials'), so results do not depend on scheduling.

#define PANEL_B 32
#define PANEL_WARPS 8
#define PANEL_THREADS (PANEL_B * PANEL_WARPS)
#define FULL_MASK 0xffffffffu
#define TILE_ENTRIES (PANEL_B * PANEL_B / PANEL_THREADS)  // entries (i, j) per thread
// ||Q1^T Q1 - I||_F^2 at or below which pass 2 takes R2 and its inverse to first order
// (2^-53, float64's unit roundoff)
#define PANEL_NEAR_IDENTITY 1.1102230246251565e-16

// workspace (double), each PANEL_B x PANEL_B row-major: X1, R1, P, PT, R, the one launch's
// second Gram matrix, then the partials
#define WS_X1 0
#define WS_R1 (PANEL_B * PANEL_B)
#define WS_P (2 * PANEL_B * PANEL_B)
#define WS_PT (3 * PANEL_B * PANEL_B)
#define WS_R (4 * PANEL_B * PANEL_B)
#define WS_G2 (5 * PANEL_B * PANEL_B)
#define WS_PART (6 * PANEL_B * PANEL_B)

// this thread's entries (i, j) of a 32 x 32 matrix
#define FOR_IJ(i, j) \
  for (int idx_ = threadIdx.x, i = idx_ / PANEL_B, j = idx_ % PANEL_B; idx_ < PANEL_B * PANEL_B; \
       idx_ += PANEL_THREADS, i = idx_ / PANEL_B, j = idx_ % PANEL_B)

// A row of a shared 32 x 32 matrix, padded to PANEL_LD doubles. With 36 (4 mod 16), a
// half-warp's doubles fall in 16 distinct bank pairs for the tensor-core products' operand
// loads (lane 4 g + t: row g, column t, or the transpose) and for a warp along a row; with
// 33 (the usual +1) those operand loads were 4-way conflicts. A warp down a column (lane i:
// row i) meets 4-way conflicts instead; only the three-launch form's one-warp steps do that.
#define PANEL_LD 36
typedef double Mat[PANEL_LD];

// ---- one warp, lane j owning column j of shared matrices --------------------------------
// Runtime loops, small code: fully unrolled register versions overflowed the instruction
// cache (pass 2 took ~0.15 ms at n = 8, H100). Each step's row comes from its owner lane
// by shuffles and each loop stages four loads before its stores, so that the updates of a
// column overlap instead of waiting on one another (shared-memory aliasing); one division
// per step (a reciprocal), the rest multiplications.

#define STAGE 4

// Upper Cholesky G = R^T R in place (R on and above the diagonal; below is left alone);
// false on a pivot not positive and finite. By LDL^T's steps, G = L D L^T: step k divides
// row k by its pivot d_k and subtracts its outer product with the undivided row, so no
// square root is on the chain of steps (the block's 5.0 against 6.6 us with one a step, the
// panel ~1 us faster, H200, bench/probes/panel_floors.py, panel_variants.py);
// R = D^1/2 L^T after the steps.
__device__ bool chol_warp(Mat* __restrict__ g, int n) {
  const int j = threadIdx.x & 31;
  bool ok = true;
  for (int k = 0; k < n; ++k) {
    const double d = g[k][k];
    ok = ok && d > 0.0 && isfinite(d);
    const double dinv = 1.0 / d;
    const double gkj = g[k][j];
    const double lkj = j == k ? d : (j > k && j < n ? gkj * dinv : 0.0);
    __syncwarp();  // every lane has read row k
    if (j >= k && j < n) g[k][j] = lkj;
    for (int i0 = k + 1; i0 < n; i0 += STAGE) {  // G[i][j] -= G[k][i] L[j][k], k < i <= j
      double rv[STAGE], gv[STAGE];
#pragma unroll
      for (int u = 0; u < STAGE; ++u) {
        rv[u] = __shfl_sync(FULL_MASK, gkj, (i0 + u) & 31);
        gv[u] = g[(i0 + u) & 31][j];
      }
#pragma unroll
      for (int u = 0; u < STAGE; ++u)
        if (i0 + u < n && i0 + u <= j) g[i0 + u][j] = fma(-rv[u], lkj, gv[u]);
    }
    __syncwarp();
  }
  // R = D^1/2 L^T: row i times the square root of its pivot (chol_block's operations)
  const double sj = j < n ? sqrt(fmax(g[j][j], 0.0)) : 0.0;
  for (int i = 0; i < n; ++i) {
    const double si = __shfl_sync(FULL_MASK, sj, i);
    if (i <= j && j < n) g[i][j] = i == j ? si : si * g[i][j];
  }
  __syncwarp();
  return ok;
}

// Signed LU without pivoting, L U = C - S, in place (L\U, L's unit diagonal implied);
// s_k = 1 if the pivot's entry d is negative, else -1 (lu_signed.cu's rule), so that
// |d - s_k| >= 1.
__device__ void lu_signed_warp(Mat* __restrict__ c, double* s, int n) {
  const int j = threadIdx.x & 31;
  for (int k = 0; k < n; ++k) {
    const double d = c[k][k];
    const double sk = d < 0.0 ? 1.0 : -1.0;
    const double piv = d - sk;
    // lane i > k: its row's multiplier L[i][k]
    const double lik = (j > k && j < n) ? c[j][k] * (1.0 / piv) : 0.0;
    const double ukj = c[k][j];
    __syncwarp();  // every lane has read column k and row k
    if (j == 0) s[k] = sk;
    if (j == k) c[k][k] = piv;
    if (j > k && j < n) c[j][k] = lik;
    for (int i0 = k + 1; i0 < n; i0 += STAGE) {  // C[i][j] -= L[i][k] U[k][j], i, j > k
      double lv[STAGE], cv[STAGE];
#pragma unroll
      for (int u = 0; u < STAGE; ++u) {
        lv[u] = __shfl_sync(FULL_MASK, lik, (i0 + u) & 31);
        cv[u] = c[(i0 + u) & 31][j];
      }
#pragma unroll
      for (int u = 0; u < STAGE; ++u)
        if (i0 + u < n && j > k && j < n) c[i0 + u][j] = fma(-lv[u], ukj, cv[u]);
    }
    __syncwarp();
  }
}

// ---- one warp: triangular inverses --------------------------------------------------

// x = A^-1 by one warp: lane j holds column j of x in registers and solves for it by
// substitution (upper: back, from the diagonal's reciprocals; unit lower: forward), four
// partial sums a row so that the FMA chains overlap (the whole block by recursive doubling,
// ten barriers, took ~5 us an inverse in the one-launch panel, H200,
// bench/probes/panel_timeline.py); pass 2's two inverses run at once on two warps. Beyond n
// the diagonal is taken as 1 and x is zero outside n x n; upper reads A's upper triangle
// only, unit lower its strict lower triangle. dinv: PANEL_B doubles of scratch (upper).
// Not inlined: one copy of its ~20 KB of unrolled code. The one launch's ~125 KB of code runs
// each phase once, fetched cold, and its four inlined copies ran at half speed (an inverse
// 4.1 us in the panel, 2.0 alone; not inlined 2.7, the panel ~2 us faster, H200,
// bench/probes/panel_timeline.py, panel_variants.py). A's entries two a load (shared Mats
// are declared 16-byte aligned, rows 288 bytes): 1.8 us alone.
template <bool LOWER>
__device__ __noinline__ void inv_triangular_warp(const Mat* __restrict__ a,
                                                 Mat* __restrict__ x,
                                                 double* __restrict__ dinv, int n) {
  const int j = threadIdx.x & 31;
  if (!LOWER) {
    dinv[j] = j < n ? 1.0 / a[j][j] : 1.0;
    __syncwarp();
  }
  double c[PANEL_B];
#pragma unroll
  for (int t = 0; t < PANEL_B; ++t) {
    const int i = LOWER ? t : PANEL_B - 1 - t;
    double s[4] = {0.0, 0.0, 0.0, 0.0};
    const int lo = LOWER ? 0 : i + 1, hi = LOWER ? i : PANEL_B;
    double odd = 0.0;  // a[i][l] for an odd l, from the pair loaded at l - 1
#pragma unroll
    for (int l = lo; l < hi; ++l) {
      double al;
      if ((l & 1) == 0 && l + 1 < hi) {  // two of A's entries a load (rows 16-byte aligned)
        const double2 p = *reinterpret_cast<const double2*>(&a[i][l]);
        al = p.x;
        odd = p.y;
      } else {
        al = (l & 1) && l > lo ? odd : a[i][l];
      }
      s[l & 3] = fma(al, c[l], s[l & 3]);
    }
    const double v = (i == j ? 1.0 : 0.0) - ((s[0] + s[1]) + (s[2] + s[3]));
    c[i] = (LOWER ? i < j : i > j) ? 0.0 : (LOWER ? v : v * dinv[i]);
  }
#pragma unroll
  for (int i = 0; i < PANEL_B; ++i) x[i][j] = (i < n && j < n) ? c[i] : 0.0;
}

// ---- the block: tiles and products ----------------------------------------------------

// tile[r][j] = a[row0 + r][j] (zero beyond m rows and n columns); every thread calls
template <typename T>
__device__ __forceinline__ void load_tile(const T* a, long long lda, long long m, int n,
                                          long long row0, Mat* tile) {
  const int j = threadIdx.x & 31;
#pragma unroll
  for (int e = 0; e < TILE_ENTRIES; ++e) {
    const int r = (threadIdx.x >> 5) + 8 * e;
    const long long row = row0 + r;
    tile[r][j] = (row < m && j < n) ? static_cast<double>(a[row * lda + j]) : 0.0;
  }
}

// The 32 x 32 products of tiles (a tile times X1, P or P T; a tile's Gram matrix) on the
// FP64 tensor cores where the GPU has them (sm_80 on: mma.m8n8k4, each thread four entries
// of the warp's 8 x 16 block; the one launch's second Gram pass over 16384 x 32 took 13.2
// against the loop's 19.4 us, H200, bench/probes/panel_mma.py), else by one FMA chain an
// entry (thread t, entries (t / 32 + 8 e, t % 32)).
// Every kernel of this file and panel_fused.cu takes these, so their factors stay the same
// bits. entry_row / entry_col: where this thread's entry e sits.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define PANEL_MMA 1
#else
#define PANEL_MMA 0
#endif

__device__ __forceinline__ int entry_row(int e) {
#if PANEL_MMA
  return 8 * (threadIdx.x >> 6) + ((threadIdx.x & 31) >> 2);
#else
  return (threadIdx.x >> 5) + 8 * e;
#endif
}

__device__ __forceinline__ int entry_col(int e) {
#if PANEL_MMA
  return 16 * ((threadIdx.x >> 5) & 1) + 8 * (e >> 1) + 2 * (threadIdx.x & 3) + (e & 1);
#else
  return threadIdx.x & 31;
#endif
}

#if PANEL_MMA
// d (8 x 8, two entries a lane) += a (8 x 4) b (4 x 8), FP64 tensor cores
__device__ __forceinline__ void dmma(double* d, double a, double b) {
  asm("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0, %1}, {%2}, {%3}, {%0, %1};"
      : "+d"(d[0]), "+d"(d[1])
      : "d"(a), "d"(b));
}

// out += op(A) B over k = 0..31, op(A) = A^T where TA (this thread's entries)
template <bool TA>
__device__ __forceinline__ void mma_acc(const Mat* am, const Mat* bm, double* out) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int r = 8 * (warp >> 1) + g;
  const int c = 16 * (warp & 1) + g;
#pragma unroll
  for (int k0 = 0; k0 < PANEL_B; k0 += 4) {
    const double av = TA ? am[k0 + t][r] : am[r][k0 + t];
    dmma(out, av, bm[k0 + t][c]);
    dmma(out + 2, av, bm[k0 + t][c + 8]);
  }
}
#endif

// out += tile x, this thread's entries (one FMA an entry a term, the terms in order)
__device__ __forceinline__ void tile_times_acc(const Mat* tile, const Mat* x, double* out) {
#if PANEL_MMA
  mma_acc<false>(tile, x, out);
#else
  const int j = threadIdx.x & 31;
#pragma unroll 8
  for (int l = 0; l < PANEL_B; ++l) {
    const double xl = x[l][j];
#pragma unroll
    for (int e = 0; e < TILE_ENTRIES; ++e)
      out[e] = fma(tile[(threadIdx.x >> 5) + 8 * e][l], xl, out[e]);
  }
#endif
}

// out = tile x, this thread's entries
__device__ __forceinline__ void tile_times(const Mat* tile, const Mat* x, double* out) {
#pragma unroll
  for (int e = 0; e < TILE_ENTRIES; ++e) out[e] = 0.0;
  tile_times_acc(tile, x, out);
}

// acc += src^T src (a tile's Gram matrix), this thread's entries
__device__ __forceinline__ void gram_acc(const Mat* src, double* acc) {
#if PANEL_MMA
  mma_acc<true>(src, src, acc);
#else
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll 8
  for (int r = 0; r < PANEL_B; ++r) {
    const double v = src[r][lane];
#pragma unroll
    for (int e = 0; e < TILE_ENTRIES; ++e) acc[e] = fma(src[r][warp + 8 * e], v, acc[e]);
  }
#endif
}

// out's entries from this thread's (tile_times's layout)
__device__ __forceinline__ void store_entries(const double* q, Mat* out) {
#pragma unroll
  for (int e = 0; e < TILE_ENTRIES; ++e) out[entry_row(e)][entry_col(e)] = q[e];
}

// the same with a row-major PANEL_B x PANEL_B array in global memory (the workspace)
__device__ __forceinline__ void store_entries_global(const double* q, double* out) {
#pragma unroll
  for (int e = 0; e < TILE_ENTRIES; ++e) out[entry_row(e) * PANEL_B + entry_col(e)] = q[e];
}

// this thread's entries (tile_times's layout) of such an array, written earlier in the launch
__device__ __forceinline__ void load_entries_global(const double* src, double* q) {
#pragma unroll
  for (int e = 0; e < TILE_ENTRIES; ++e) q[e] = __ldcg(&src[entry_row(e) * PANEL_B + entry_col(e)]);
}

// T = -U S L^-T into t, and W's top rows L T (L's unit diagonal) into wtop, this thread's
// entries: both as tile products (a loop an entry, T's and W's: ~4.5 us of the one launch's
// block 0, as products 1.5, H200, bench/probes/panel_timeline.py) with each entry's terms in
// the loop's order (the same bits: the FP64 tensor cores' steps are the FMAs'), the
// products' other terms exact zeros: T[i][j] from l = i up, (L T)[i][j] from T[i][j] then
// l = 0 up. lu: L\U; linv: L^-1 (zero above the diagonal and outside n x n); tmp: scratch.
// Every thread calls; the block is synced after t is written.
__device__ __forceinline__ void t_and_w_top(const Mat* lu, const double* sv, const Mat* linv,
                                            Mat* t, Mat* tmp, int n, double* wtop) {
  FOR_IJ(i, j) {
    tmp[i][j] = (i <= j && j < n) ? lu[i][j] * sv[j] : 0.0;  // U S
    t[i][j] = linv[j][i];                                    // L^-T
  }
  __syncthreads();
  double q[TILE_ENTRIES];
  tile_times(tmp, t, q);
  __syncthreads();
  FOR_IJ(i, j) tmp[i][j] = (j < i && i < n) ? lu[i][j] : 0.0;  // L below its diagonal
#pragma unroll
  for (int e = 0; e < TILE_ENTRIES; ++e) {
    q[e] = -q[e];
    wtop[e] = q[e];
  }
  store_entries(q, t);
  __syncthreads();
  tile_times_acc(tmp, t, wtop);
}

// W's top rows from t_and_w_top's entries
template <typename T>
__device__ __forceinline__ void store_w_top(const double* wtop, int n, T* w, long long ldw) {
  if (w == nullptr) return;
#pragma unroll
  for (int e = 0; e < TILE_ENTRIES; ++e) {
    const int i = entry_row(e), j = entry_col(e);
    if (i < n && j < n) w[i * ldw + j] = static_cast<T>(wtop[e]);
  }
}

// The panel's top rows (S R on and above the diagonal, L below), L with its unit diagonal
// and tau = diag(T) = -u_ii s_i. lu: L\U; r: this thread's entries of R (tile_times's
// layout, read back from the workspace); t: T.
template <typename T>
__device__ __forceinline__ void store_top(const Mat* lu, const double* sv, const double* r,
                                          const Mat* t, int n, T* a, long long lda, T* ltop,
                                          T* tau) {
#pragma unroll
  for (int e = 0; e < TILE_ENTRIES; ++e) {
    const int i = entry_row(e), j = entry_col(e);
    if (i < n && j < n) {
      const double v = j >= i ? sv[i] * r[e] : lu[i][j];
      a[i * lda + j] = static_cast<T>(v);
      ltop[i * n + j] = static_cast<T>(j < i ? lu[i][j] : (i == j ? 1.0 : 0.0));
      if (i == j) tau[i] = static_cast<T>(t[i][i]);
    }
  }
}

// ||G - I||_F^2 over G's leading n x n block by the whole block, in a fixed order: each
// thread its entries, each warp's by a butterfly (every lane the same sum), the warps' in
// order (one warp over the rows took ~1 us of the one launch's block 0, H200,
// bench/probes/panel_timeline.py). sums: PANEL_WARPS doubles of scratch.
__device__ double dist_identity_sq(const Mat* g, int n, double* sums) {
  double e = 0.0;
  FOR_IJ(i, j) {
    const double d = g[i][j] - (i == j ? 1.0 : 0.0);
    if (i < n && j < n) e = fma(d, d, e);
  }
  for (int o = 16; o > 0; o >>= 1) e += __shfl_xor_sync(FULL_MASK, e, o);
  __syncthreads();  // sums free
  if ((threadIdx.x & 31) == 0) sums[threadIdx.x >> 5] = e;
  __syncthreads();
  double s = 0.0;
  for (int w = 0; w < PANEL_WARPS; ++w) s += sums[w];
  __syncthreads();  // sums read
  return s;
}

// The blocks' partial Gram matrices are summed in one order by every kernel of these files:
// an entry's partials b = g, g + 8, g + 16, ... in that order into group g's sum, then the
// eight groups' sums pairwise, ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7)): a chain of
// nb / 8 + 3 additions instead of nb (in block order, each of the one launch's two sums took
// 2.7 against 2.3 us, H200, bench/probes/panel_timeline.py).
#define SUM_GROUPS 8
__device__ __forceinline__ double sum_of_groups(const double* s) {
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

// the sum of p[b * stride] over b < nb, in that order
__device__ __forceinline__ double sum_partials(const double* p, int stride, int nb) {
  double s[SUM_GROUPS];
#pragma unroll
  for (int g = 0; g < SUM_GROUPS; ++g) s[g] = 0.0;
#pragma unroll 1
  for (int b0 = 0; b0 < nb; b0 += SUM_GROUPS) {
    double v[SUM_GROUPS];
#pragma unroll
    for (int g = 0; g < SUM_GROUPS; ++g)
      v[g] = b0 + g < nb ? __ldcg(p + (b0 + g) * stride) : 0.0;
#pragma unroll
    for (int g = 0; g < SUM_GROUPS; ++g)
      if (b0 + g < nb) s[g] += v[g];
  }
  return sum_of_groups(s);
}

// Whether this block is the last of the grid to get here (after its partial is written).
__device__ bool last_block(int* counter) {
  __shared__ int last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const int prev = atomicAdd(counter, 1);
    last = prev == static_cast<int>(gridDim.x) - 1;
  }
  __syncthreads();
  if (last) __threadfence();
  return last;
}

template <typename T>
// one block an SM at most (96 blocks): the registers it lets the kernel take keep the
// last block's sums out of local memory
__global__ void __launch_bounds__(PANEL_THREADS, 1)
panel_pass(T* __restrict__ a, long long lda, long long m, int n, int pass,
           double* __restrict__ ws, int* __restrict__ cert, T* __restrict__ w, long long ldw,
           T* __restrict__ ltop, T* __restrict__ tau) {
  // cert: [0] failures (the caller's count), [1], [2] the passes' block counters (reset
  // by their last block), [3] pass 1 failed (read and reset by pass 2)
  __shared__ __align__(16) Mat x1[PANEL_B];
  __shared__ __align__(16) Mat red[PANEL_B];
  __shared__ __align__(16) Mat tile[PANEL_B];
  __shared__ __align__(16) Mat qt[PANEL_B];
  __shared__ __align__(16) Mat scratch[PANEL_B];  // the inverses' reciprocals, then P
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (pass == 2) FOR_IJ(i, j) x1[i][j] = ws[WS_X1 + i * PANEL_B + j];
  double acc[TILE_ENTRIES];  // G[warp + 8 e][lane]
#pragma unroll
  for (int e = 0; e < TILE_ENTRIES; ++e) acc[e] = 0.0;
  for (long long row0 = (long long)blockIdx.x * PANEL_B; row0 < m;
       row0 += (long long)gridDim.x * PANEL_B) {
    __syncthreads();  // the previous tile is consumed (and x1 loaded)
    load_tile(a, lda, m, n, row0, tile);
    __syncthreads();
    const Mat* src = tile;
    if (pass == 2) {  // the rows of Q1 = A X1
      double q[TILE_ENTRIES];
      tile_times(tile, x1, q);
      store_entries(q, qt);
      __syncthreads();
      src = qt;
    }
    gram_acc(src, acc);
  }
  double* part = ws + WS_PART;
#pragma unroll
  for (int e = 0; e < TILE_ENTRIES; ++e)
    part[(long long)blockIdx.x * PANEL_B * PANEL_B + entry_row(e) * PANEL_B + entry_col(e)] =
        acc[e];
  if (!last_block(&cert[pass])) return;

  // the last block: G, four entries a thread (sum_partials' order)
#pragma unroll 1
  for (int e = 0; e < TILE_ENTRIES; ++e) {
    const int idx = e * PANEL_THREADS + threadIdx.x;
    red[idx / PANEL_B][idx % PANEL_B] =
        sum_partials(part + idx, PANEL_B * PANEL_B, static_cast<int>(gridDim.x));
  }
  if (threadIdx.x == 0) cert[pass] = 0;
  __syncthreads();
  if (pass == 1) {
    if (warp == 0 && !chol_warp(red, n)) {  // X1 = I keeps pass 2 finite; the caller
      for (int i = 0; i < PANEL_B; ++i)     // factors again
        red[i][lane] = i == lane ? 1.0 : 0.0;
      if (lane == 0) { atomicAdd(&cert[0], 1); cert[3] = 1; }
    }
    __syncthreads();
    if (warp == 0) inv_triangular_warp<false>(red, x1, scratch[0], n);
    __syncthreads();
    FOR_IJ(i, j) {
      ws[WS_X1 + i * PANEL_B + j] = x1[i][j];
      ws[WS_R1 + i * PANEL_B + j] = (i <= j && j < n) ? red[i][j] : 0.0;
    }
    return;
  }

  // pass 2: the certificate, R2, and the reconstruction. Shared memory is reused (48 KB
  // static): X2 in `tile`, R1 and later L^-1 in `qt`, L\U over X1 after X1's last use.
  Mat* x2 = tile;
  Mat* r1 = qt;
  Mat* lu = x1;
  __shared__ double sv[PANEL_B];
  __shared__ int near_identity;
  const double e = dist_identity_sq(red, n, sv);  // ||G2 - I||_F^2
  if (warp == 0) {
    // G2 = I + E with ||E||_F^2 <= u: R2 = I + F and X2 = I - F, F the upper triangle
    // of E with half its diagonal (R2^T R2 and X2 R2 are I to O(||E||^2) <= u)
    const bool near = e <= PANEL_NEAR_IDENTITY;
    bool ok = true;
    if (near) {
      for (int i = 0; i < PANEL_B; ++i) {
        const double g = red[i][lane];
        const bool diag = i == lane && lane < n;
        const double f = diag ? 0.5 * (g - 1.0) : (i < lane && lane < n ? g : 0.0);
        red[i][lane] = diag ? 1.0 + f : f;
        x2[i][lane] = diag ? 1.0 - f : -f;
      }
    } else {
      ok = chol_warp(red, n);
    }
    const bool good = ok && e <= 0.25 && cert[3] == 0;  // a NaN fails e <= 0.25
    __syncwarp();  // every lane has read cert[3]
    if (lane == 0) {
      if (!good && cert[3] == 0) atomicAdd(&cert[0], 1);
      cert[3] = 0;
      near_identity = near && good;
    }
    if (!good) {
      for (int i = 0; i < PANEL_B; ++i) red[i][lane] = i == lane ? 1.0 : 0.0;
      __syncwarp();
    }
    for (int i = lane + 1; i < PANEL_B; ++i) red[i][lane] = 0.0;  // R2: zero below
  }
  FOR_IJ(i, j) r1[i][j] = ws[WS_R1 + i * PANEL_B + j];
  __syncthreads();
  if (!near_identity && warp == 0) inv_triangular_warp<false>(red, x2, scratch[0], n);  // X2
  {  // R = R2 R1 (both upper: the product's other terms are exact zeros), to the workspace
    double q[TILE_ENTRIES];
    tile_times(red, r1, q);
    store_entries_global(q, ws + WS_R);
  }
  __syncthreads();  // R2 and R1 are read, X2 is written
  // Q's top block (A[:n] X1) X2, Q1's rows made as in the passes
  load_tile(a, lda, n, n, 0, r1);
  __syncthreads();
  {
    double q[TILE_ENTRIES];
    tile_times(r1, x1, q);
    store_entries(q, red);
  }
  __syncthreads();  // X1 is read: L\U may take its place
  {
    double q[TILE_ENTRIES];
    tile_times(red, x2, q);
    store_entries(q, lu);
  }
  __syncthreads();
  if (warp == 0) lu_signed_warp(lu, sv, n);
  __syncthreads();
  if (warp == 0) inv_triangular_warp<false>(lu, red, scratch[0], n);  // U^-1 (into red)
  if (warp == 1) inv_triangular_warp<true>(lu, r1, nullptr, n);       // L^-1 (into r1)
  __syncthreads();
  Mat* pm = scratch;  // P, also kept here for P T below
  {  // P = X2 U^-1 (both upper)
    double q[TILE_ENTRIES];
    tile_times(x2, red, q);
    store_entries(q, pm);
#pragma unroll
    for (int e = 0; e < TILE_ENTRIES; ++e)
      ws[WS_P + entry_row(e) * PANEL_B + entry_col(e)] = q[e];
  }
  __syncthreads();  // U^-1 and X2 are read: T (into red) and its operands (x2)
  double wtop[TILE_ENTRIES];
  t_and_w_top(lu, sv, r1, red, x2, n, wtop);
  {  // P T (both upper)
    double q[TILE_ENTRIES];
    tile_times(pm, red, q);
#pragma unroll
    for (int e = 0; e < TILE_ENTRIES; ++e)
      ws[WS_PT + entry_row(e) * PANEL_B + entry_col(e)] = q[e];
  }
  store_w_top(wtop, n, w, ldw);
  double rq[TILE_ENTRIES];
  load_entries_global(ws + WS_R, rq);
  store_top(lu, sv, rq, red, n, a, lda, ltop, tau);
}

// rows i >= n: y_i = (a_i X1) P over a_i, w_i = (a_i X1) (P T), a tile of 32 rows at a time
template <typename T>
__global__ void __launch_bounds__(PANEL_THREADS)
panel_apply(T* __restrict__ a, long long lda, long long m, int n,
            const double* __restrict__ ws, T* __restrict__ w, long long ldw) {
  __shared__ __align__(16) Mat x1[PANEL_B];
  __shared__ __align__(16) Mat p[PANEL_B];
  __shared__ __align__(16) Mat pt[PANEL_B];
  __shared__ __align__(16) Mat tile[PANEL_B];
  __shared__ __align__(16) Mat qt[PANEL_B];
  FOR_IJ(i, j) {
    x1[i][j] = ws[WS_X1 + i * PANEL_B + j];
    p[i][j] = ws[WS_P + i * PANEL_B + j];
    pt[i][j] = ws[WS_PT + i * PANEL_B + j];
  }
  for (long long row0 = n + (long long)blockIdx.x * PANEL_B; row0 < m;
       row0 += (long long)gridDim.x * PANEL_B) {
    __syncthreads();
    load_tile(a, lda, m, n, row0, tile);
    __syncthreads();
    double q[TILE_ENTRIES];
    tile_times(tile, x1, q);
    store_entries(q, qt);
    __syncthreads();
    tile_times(qt, p, q);
#pragma unroll
    for (int e = 0; e < TILE_ENTRIES; ++e) {
      const long long row = row0 + entry_row(e);
      const int col = entry_col(e);
      if (row < m && col < n) a[row * lda + col] = static_cast<T>(q[e]);
    }
    if (w != nullptr) {
      tile_times(qt, pt, q);
#pragma unroll
      for (int e = 0; e < TILE_ENTRIES; ++e) {
        const long long row = row0 + entry_row(e);
        const int col = entry_col(e);
        if (row < m && col < n) w[row * ldw + col] = static_cast<T>(q[e]);
      }
    }
  }
}
