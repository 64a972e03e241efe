// QR with column pivoting of a small sketch Y (rows x ncols, rows of a few dozen to a
// few hundred, row-major with stride ld), for the pivots of a randomized blocked QRCP.
// LAPACK's geqp3 steps, two launches a step and no host synchronisation:
//
// qrcp_pick (one thread block): the column of largest remaining norm among i..ncols-1
// (the first of equals, as LAPACK's idamax), swapped into column i with its norm and its
// index in perm; then the Householder reflector of Y[i:, i] (LAPACK's dlarfg: beta =
// -sign(alpha) ||x||, tau = (beta - alpha) / beta, v = x / (alpha - beta) below the
// diagonal), written in place, tau into tau[i].
//
// qrcp_update (a thread block of 32 columns c > i and RG row groups): Y[i:, c] -= tau v
// (v^T Y[i:, c]), then the remaining norm of column c over rows i+1.. recomputed from
// its entries in the same pass (rows is small: no downdating, so no cancellation to
// guard against). The row groups split each column's sums (partial sums in shared
// memory): with one thread a column the GPU held ~4 warps per SM, latency-bound.
//
// NaN norms are never picked (a NaN compares false); the caller checks finiteness.

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
  if (p != i && p < ncols) {
    for (int r = t; r < rows; r += blockDim.x) {
      const T a = y[r * ld + i];
      y[r * ld + i] = y[r * ld + p];
      y[r * ld + p] = a;
    }
    if (t == 0) {
      const T a = nrm2[i];
      nrm2[i] = nrm2[p];
      nrm2[p] = a;
      const int q = perm[i];
      perm[i] = perm[p];
      perm[p] = q;
    }
  }
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
  if (t == 0) {
    const T sigma = sval[0];
    const T alpha = i < rows ? y[i * ld + i] : T(0);
    if (sigma == T(0) || i >= rows) {
      tau[i] = T(0);  // nothing below the diagonal: H = I (dlarfg)
      scale = T(1);
    } else {
      const T beta = -copysign(sqrt(alpha * alpha + sigma), alpha);
      tau[i] = (beta - alpha) / beta;
      scale = T(1) / (alpha - beta);
      y[i * ld + i] = beta;
    }
  }
  __syncthreads();
  const T sc = scale;
  for (int r = i + 1 + t; r < rows; r += blockDim.x) y[r * ld + i] *= sc;
}

template <typename T, int RG>
__global__ void __launch_bounds__(32 * RG)
qrcp_update(T* __restrict__ y, T* __restrict__ nrm2, const T* __restrict__ tau,
            int rows, int ncols, long long ld, int i) {
  extern __shared__ unsigned char smem_raw[];
  T* v = reinterpret_cast<T*>(smem_raw);  // the reflector below the diagonal, rows i+1..
  __shared__ T part[RG][33];
  __shared__ T wsh[32];
  const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * 32 + tx;
  if (i >= rows) return;  // uniform over the grid
  for (int r = i + 1 + tid; r < rows; r += 32 * RG) v[r - i - 1] = y[r * ld + i];
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
  __syncthreads();  // part's dot products are read
  part[ty][tx] = sq;
  __syncthreads();
  if (ty == 0 && ok) {
    T s = T(0);
    for (int g = 0; g < RG; ++g) s += part[g][tx];
    nrm2[c] = s;
  }
}
