// QR with column pivoting of a small sketch Y (rows x ncols, a few hundred rows, row-major
// with stride ld), for the pivots of a randomized blocked QRCP: LAPACK geqp3's choices
// (the largest remaining norm, the first of equals by position after geqp3's swaps), one
// launch a step, no host synchronisation and no serial tail.
//
// The columns never move: a column's position (pos) and the column at each position
// (col_at) are bookkept instead of swapped, so nothing a step reads is written by another
// thread block in the same launch. Every thread block of step i first makes the step's
// pick itself, from the previous launch's per-block maxima: the pivot p, its column's
// reflector (LAPACK's dlarfg: beta = -sign(alpha) ||x||, tau = (beta - alpha) / beta,
// v = x / (alpha - beta) below the pivot row) in shared memory. Then it updates its own
// 32 columns over rows i.. (RG row groups, partial sums in shared memory), recomputes
// their remaining norms over rows i+1.. from the entries (few rows: nothing downdated,
// nothing to cancel), and writes the largest (the first of equals by position) for the
// next launch. Per-block maxima alternate between two buffers by step parity, since a
// launch reads all of one while its blocks write the other.
//
// A chosen column is marked by a negative norm and never updated or read again, except
// as the pivot in its own step. NaN norms are never picked (a NaN compares false); with
// no valid candidate the column at position i is taken (the order stays).

// (v, q, c) beats (bv, bq, bc): a larger norm; on a tie the smaller position.
template <typename T>
__device__ __forceinline__ void better(T& bv, int& bq, int& bc, T v, int q, int c) {
  if (v > bv || (v == bv && q < bq)) {
    bv = v;
    bq = q;
    bc = c;
  }
}

template <typename T>
__device__ __forceinline__ void warp_best(T& bv, int& bq, int& bc) {
  for (int off = 16; off > 0; off >>= 1) {
    const T ov = __shfl_down_sync(0xffffffffu, bv, off);
    const int oq = __shfl_down_sync(0xffffffffu, bq, off);
    const int oc = __shfl_down_sync(0xffffffffu, bc, off);
    better(bv, bq, bc, ov, oq, oc);
  }
}

// The warp's best (one warp: a block's 32 columns) into slot b of the per-block maxima.
template <typename T>
__device__ __forceinline__ void put_block_best(T* __restrict__ pval, int* __restrict__ ppos,
                                               int* __restrict__ pcol, int b, T bv, int bq,
                                               int bc) {
  warp_best(bv, bq, bc);
  if (threadIdx.x == 0) {
    pval[b] = bv;
    ppos[b] = bq;
    pcol[b] = bc;
  }
}

// Norms over all rows, positions, and the per-block maxima for step 0 (buffer 0).
template <typename T, int RG>
__global__ void __launch_bounds__(32 * RG)
qrcp_init(const T* __restrict__ y, T* __restrict__ nrm2, int* __restrict__ pos,
                int* __restrict__ col_at, T* __restrict__ pval, int* __restrict__ ppos,
                int* __restrict__ pcol, int rows, int ncols, long long ld) {
  __shared__ T part[RG][33];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int c = blockIdx.x * 32 + tx;
  const bool ok = c < ncols;
  T sq = T(0);
  if (ok)
    for (int r = ty; r < rows; r += RG) {
      const T v = y[r * ld + c];
      sq += v * v;
    }
  part[ty][tx] = sq;
  __syncthreads();
  if (ty == 0) {
    T bv = T(-1);
    int bq = ncols, bc = ncols;
    if (ok) {
      T s2 = T(0);
      for (int g = 0; g < RG; ++g) s2 += part[g][tx];
      nrm2[c] = s2;
      pos[c] = c;
      col_at[c] = c;
      bv = s2;
      bq = c;
      bc = c;
    }
    put_block_best(pval, ppos, pcol, blockIdx.x, bv, bq, bc);
  }
}

// Step i. pval/ppos/pcol hold 2 x gridDim.x entries: this step reads half i % 2 and
// writes the other. Dynamic shared memory: rows values of T (the reflector).
template <typename T, int RG>
__global__ void __launch_bounds__(32 * RG)
qrcp_step(T* __restrict__ y, T* __restrict__ nrm2, int* __restrict__ pos,
                int* __restrict__ col_at, int* __restrict__ piv, T* __restrict__ pval,
                int* __restrict__ ppos, int* __restrict__ pcol, int rows, int ncols,
                long long ld, int i) {
  extern __shared__ unsigned char smem_raw[];
  T* v = reinterpret_cast<T*>(smem_raw);
  __shared__ T part[RG][33];
  __shared__ int qpart[RG], cpart[RG];
  __shared__ T red[RG];
  __shared__ int sp, spos, scol;
  __shared__ T stau;
  const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * 32 + tx, nt = 32 * RG;
  const int nb = gridDim.x;
  const int rd = (i & 1) * nb, wr = ((i + 1) & 1) * nb;
  // 1. the pick: the best of the previous launch's per-block maxima
  T bv = T(-1);
  int bq = ncols, bc = ncols;
  for (int b = tid; b < nb; b += nt) better(bv, bq, bc, pval[rd + b], ppos[rd + b], pcol[rd + b]);
  warp_best(bv, bq, bc);
  if (tx == 0) {
    red[ty] = bv;
    qpart[ty] = bq;
    cpart[ty] = bc;
  }
  __syncthreads();
  if (tid == 0) {
    for (int g = 1; g < RG; ++g) better(bv, bq, bc, red[g], qpart[g], cpart[g]);
    const int ci = col_at[i];
    const int p = bc < ncols ? bc : ci;  // no valid candidate: the order stays
    sp = p;
    spos = pos[p];
    scol = ci;
  }
  __syncthreads();
  const int p = sp, pos_p = spos, col_i = scol;
  // 2. the reflector of column p over rows i.. (every block, into shared memory)
  const int h = rows - i;  // rows of the reflector (>= 1: i < rows)
  T s = T(0);
  for (int r = tid; r < h; r += nt) {
    const T x = y[(i + r) * ld + p];
    v[r] = x;
    if (r > 0) s += x * x;
  }
  for (int off = 16; off > 0; off >>= 1) s += __shfl_down_sync(0xffffffffu, s, off);
  if (tx == 0) red[ty] = s;
  __syncthreads();
  if (tid == 0) {
    T sigma = T(0);
    for (int g = 0; g < RG; ++g) sigma += red[g];
    const T alpha = v[0];
    T tau = T(0), scale = T(1);
    if (sigma != T(0)) {
      const T beta = -copysign(sqrt(alpha * alpha + sigma), alpha);
      tau = (beta - alpha) / beta;
      scale = T(1) / (alpha - beta);
    }
    stau = tau;
    v[0] = T(1);
    red[0] = scale;
    if (blockIdx.x == 0) {
      piv[i] = p;
      if (pos_p != i) col_at[pos_p] = col_i;
    }
  }
  __syncthreads();
  const T scale = red[0];
  for (int r = 1 + tid; r < h; r += nt) v[r] *= scale;
  __syncthreads();
  // 3. this block's columns: Y[i:, c] -= tau v (v^T Y[i:, c]), norms over rows i+1..
  const int c = blockIdx.x * 32 + tx;
  const bool ok = c < ncols && c != p && nrm2[c] >= T(0);
  const T tau = stau;
  T acc = T(0);
  if (ok && tau != T(0))
    for (int r = ty; r < h; r += RG) acc += v[r] * y[(i + r) * ld + c];
  part[ty][tx] = acc;
  __syncthreads();
  T w = T(0);
  for (int g = 0; g < RG; ++g) w += part[g][tx];
  w *= tau;
  __syncthreads();
  T sq = T(0);
  if (ok)
    for (int r = 1 + ty; r < h; r += RG) {
      T val = y[(i + r) * ld + c];
      if (tau != T(0)) {
        val -= v[r] * w;
        y[(i + r) * ld + c] = val;
      }
      sq += val * val;
    }
  part[ty][tx] = sq;
  __syncthreads();
  if (ty == 0) {
    T cv = T(-1);
    int cq = ncols, cc = ncols;
    if (ok) {
      T s2 = T(0);
      for (int g = 0; g < RG; ++g) s2 += part[g][tx];
      nrm2[c] = s2;
      const int q = c == col_i ? pos_p : pos[c];  // positions after the step's swap
      if (c == col_i) pos[c] = pos_p;
      cv = s2;
      cq = q;
      cc = c;
    } else if (c == p) {
      nrm2[c] = T(-1);  // chosen
    }
    put_block_best(pval, ppos, pcol, wr + blockIdx.x, cv, cq, cc);
  }
}
