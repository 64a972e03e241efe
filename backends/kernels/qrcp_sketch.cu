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
// qrcp_update (one thread a column c > i): Y[i:, c] -= tau v (v^T Y[i:, c]), then the
// remaining norm of column c over rows i+1.. recomputed from its entries (rows is small:
// no downdating, so no cancellation to guard against).
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

template <typename T>
__global__ void qrcp_update(T* __restrict__ y, T* __restrict__ nrm2, const T* __restrict__ tau,
                            int rows, int ncols, long long ld, int i) {
  const int c = i + 1 + blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= ncols || i >= rows) return;
  const T tv = tau[i];
  if (tv != T(0)) {
    T w = y[i * ld + c];
    for (int r = i + 1; r < rows; ++r) w += y[r * ld + i] * y[r * ld + c];
    w *= tv;
    y[i * ld + c] -= w;
    for (int r = i + 1; r < rows; ++r) y[r * ld + c] -= y[r * ld + i] * w;
  }
  T s = T(0);
  for (int r = i + 1; r < rows; ++r) {
    const T v = y[r * ld + c];
    s += v * v;
  }
  nrm2[c] = s;
}
