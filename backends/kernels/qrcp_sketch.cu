// QR with column pivoting of a small sketch Y (rows x ncols, rows of a few dozen to a
// few hundred, row-major with stride ld), for the pivots of a randomized blocked QRCP.
// LAPACK's geqp3 steps, one launch a step and no host synchronisation:
//
// qrcp_pick (one thread block; the first step's): the column of largest remaining norm
// among i..ncols-1 (the first of equals, as LAPACK's idamax), swapped into column i with
// its norm and its index in perm; then the Householder reflector of Y[i:, i] (LAPACK's dlarfg: beta =
// -sign(alpha) ||x||, tau = (beta - alpha) / beta, v = x / (alpha - beta) below the
// diagonal), written in place, tau into tau[i].
//
// qrcp_step (thread blocks of 32 columns c > i and RG row groups): Y[i:, c] -= tau v
// (v^T Y[i:, c]), then the remaining norm of column c over rows i+1.. recomputed from
// its entries in the same pass (rows is small: no downdating, so no cancellation to
// guard against); then the next step's pick, by the last block to finish (below). The
// row groups split each column's sums (partial sums in shared memory): with one thread
// a column the GPU held ~4 warps per SM, latency-bound.
//
// NaN norms are never picked (a NaN compares false); the caller checks finiteness.

// The first of equals among two candidates (largest value; on a tie the smaller index;
// NaN never wins).
template <typename T>
__device__ __forceinline__ void better(T& bv, int& bi, T v, int idx) {
  if (v > bv || (v == bv && idx < bi)) {
    bv = v;
    bi = idx;
  }
}

// Column p swapped into column i (every row), with its norm and its index in perm (a
// thread block: thread t of nt). Reads go around L1: in qrcp_step another block wrote
// them in this launch.
template <typename T>
__device__ __forceinline__ void swap_in(T* __restrict__ y, T* __restrict__ nrm2,
                                        int* __restrict__ perm, int rows, long long ld, int i,
                                        int p, int t, int nt) {
  for (int r = t; r < rows; r += nt) {
    const T a = __ldcg(y + r * ld + i);
    y[r * ld + i] = __ldcg(y + r * ld + p);
    y[r * ld + p] = a;
  }
  if (t == 0) {
    const T a = __ldcg(nrm2 + i);
    nrm2[i] = __ldcg(nrm2 + p);
    nrm2[p] = a;
    const int q = perm[i];
    perm[i] = perm[p];
    perm[p] = q;
  }
}

// dlarfg on column i (one thread), sigma = ||Y[i+1:, i]||^2: tau[i] and beta on the
// diagonal; returns the factor that scales the entries below it into v.
template <typename T>
__device__ __forceinline__ T householder(T* __restrict__ y, T* __restrict__ tau, int rows,
                                         long long ld, int i, T sigma) {
  const T alpha = i < rows ? __ldcg(y + i * ld + i) : T(0);
  if (sigma == T(0) || i >= rows) {
    tau[i] = T(0);  // nothing below the diagonal: H = I (dlarfg)
    return T(1);
  }
  const T beta = -copysign(sqrt(alpha * alpha + sigma), alpha);
  tau[i] = (beta - alpha) / beta;
  y[i * ld + i] = beta;
  return T(1) / (alpha - beta);
}

template <typename T>
__global__ void qrcp_pick(T* __restrict__ y, T* __restrict__ nrm2, int* __restrict__ perm,
                          T* __restrict__ tau, int rows, int ncols, long long ld, int i) {
  __shared__ T sval[1024];
  __shared__ int sidx[1024];
  __shared__ T scale;
  const int t = threadIdx.x;
  T best = T(-1);
  int bi = ncols;
  for (int c = i + t; c < ncols; c += blockDim.x) {
    const T v = nrm2[c];
    if (v > best) {  // strict: the first of equal norms in this thread's stride
      best = v;
      bi = c;
    }
  }
  sval[t] = best;
  sidx[t] = bi;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (t < s) {
      const T o = sval[t + s];
      const int oi = sidx[t + s];
      if (o > sval[t] || (o == sval[t] && oi < sidx[t])) {
        sval[t] = o;
        sidx[t] = oi;
      }
    }
    __syncthreads();
  }
  const int p = sidx[0];
  __syncthreads();
  if (p != i && p < ncols) swap_in(y, nrm2, perm, rows, ld, i, p, t, (int)blockDim.x);
  __syncthreads();
  T part = T(0);
  for (int r = i + 1 + t; r < rows; r += blockDim.x) {
    const T v = y[r * ld + i];
    part += v * v;
  }
  sval[t] = part;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (t < s) sval[t] += sval[t + s];
    __syncthreads();
  }
  if (t == 0) scale = householder(y, tau, rows, ld, i, sval[0]);
  __syncthreads();
  const T sc = scale;
  for (int r = i + 1 + t; r < rows; r += blockDim.x) y[r * ld + i] *= sc;
}

// qrcp_step: the update of step i, then qrcp_pick for step i + 1, in one launch. Each
// block updates its 32 columns, writes the largest of their new norms (the first of
// equals) to pval / pidx, and the last block to finish (a counter, reset by it) takes
// the argmax over the blocks and makes step i + 1's swap and reflector, as qrcp_pick
// does. Its reads of other blocks' results bypass L1 (__ldcg) after their fences.
template <typename T, int RG>
__global__ void __launch_bounds__(32 * RG)
qrcp_step(T* __restrict__ y, T* __restrict__ nrm2, int* __restrict__ perm,
          T* __restrict__ tau, T* __restrict__ pval, int* __restrict__ pidx,
          unsigned int* __restrict__ counter, int rows, int ncols, long long ld, int i) {
  extern __shared__ unsigned char smem_raw[];
  T* v = reinterpret_cast<T*>(smem_raw);
  __shared__ T part[RG][33];
  __shared__ int ipart[RG][33];
  __shared__ T wsh[32];
  __shared__ bool last;
  __shared__ T scale;
  const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * 32 + tx, nt = 32 * RG;
  // a single cooperative launch for all steps (grid-wide barriers) measured ~1.5 us a
  // step faster (H200, 136 x 16384), within the pivoted QR's run-to-run spread
  for (int r = i + 1 + tid; r < rows; r += nt) v[r - i - 1] = y[r * ld + i];
  __syncthreads();
  const int c = i + 1 + blockIdx.x * 32 + tx;
  const bool ok = c < ncols;
  const T tv = tau[i];
  T acc = T(0);
  if (ok)
    for (int r = i + 1 + ty; r < rows; r += RG) acc += v[r - i - 1] * y[r * ld + c];
  part[ty][tx] = acc;
  __syncthreads();
  if (ty == 0) {
    T w = T(0);
    if (ok) {
      w = y[i * ld + c];
      for (int g = 0; g < RG; ++g) w += part[g][tx];
      w *= tv;
      y[i * ld + c] -= w;
    }
    wsh[tx] = w;
  }
  __syncthreads();
  const T w = wsh[tx];
  T sq = T(0);
  if (ok)
    for (int r = i + 1 + ty; r < rows; r += RG) {
      const T val = y[r * ld + c] - v[r - i - 1] * w;
      y[r * ld + c] = val;
      sq += val * val;
    }
  __syncthreads();
  part[ty][tx] = sq;
  __syncthreads();
  if (ty == 0) {
    T bv = T(-1);
    int bi = ncols;
    if (ok) {
      T s2 = T(0);
      for (int g = 0; g < RG; ++g) s2 += part[g][tx];
      nrm2[c] = s2;
      bv = s2;
      bi = c;
    }
    for (int off = 16; off > 0; off >>= 1) {  // the block's 32 columns
      const T ov = __shfl_down_sync(0xffffffffu, bv, off);
      const int oi = __shfl_down_sync(0xffffffffu, bi, off);
      better(bv, bi, ov, oi);
    }
    if (tx == 0) {
      pval[blockIdx.x] = bv;
      pidx[blockIdx.x] = bi;
    }
  }
  __threadfence();
  __syncthreads();
  if (tid == 0) last = atomicAdd(counter, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  // step i + 1's pick, by the last block
  const int j = i + 1;
  T bv = T(-1);
  int bi = ncols;
  for (int b = tid; b < (int)gridDim.x; b += nt) better(bv, bi, __ldcg(pval + b), __ldcg(pidx + b));
  for (int off = 16; off > 0; off >>= 1) {  // within the warp, then across the warps
    const T ov = __shfl_down_sync(0xffffffffu, bv, off);
    const int oi = __shfl_down_sync(0xffffffffu, bi, off);
    better(bv, bi, ov, oi);
  }
  if (tx == 0) {
    part[ty][0] = bv;
    ipart[ty][0] = bi;
  }
  __syncthreads();
  if (tid == 0) {
    for (int g = 1; g < RG; ++g) better(bv, bi, part[g][0], ipart[g][0]);
    ipart[0][1] = bi;
    *counter = 0u;  // for the next launch
  }
  __syncthreads();
  const int p = ipart[0][1];
  if (p != j && p < ncols) swap_in(y, nrm2, perm, rows, ld, j, p, tid, nt);
  __syncthreads();
  T sum = T(0);
  for (int r = j + 1 + tid; r < rows; r += nt) {
    const T x = __ldcg(y + r * ld + j);
    sum += x * x;
  }
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_down_sync(0xffffffffu, sum, off);
  if (tx == 0) part[ty][0] = sum;
  __syncthreads();
  if (tid == 0) {
    T sigma = T(0);
    for (int g = 0; g < RG; ++g) sigma += part[g][0];
    scale = householder(y, tau, rows, ld, j, sigma);
  }
  __syncthreads();
  const T sc = scale;
  for (int r = j + 1 + tid; r < rows; r += nt) y[r * ld + j] = __ldcg(y + r * ld + j) * sc;
}
