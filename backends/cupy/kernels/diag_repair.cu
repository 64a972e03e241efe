// |diag(R)| made non-increasing by adjacent column exchanges restored with Givens rotations
// (mpqr/qr/pivoted_repair.py), on the device without host round trips.
//
// diag_swaps: one thread block, a persistent loop over the exchanges. R is row-major
// (stride ld), real, diag >= 0. Each pass finds the first increase beyond tol at or after
// the resume point (a block-wide minimum), exchanges the two columns (rows 0..i+1, threads
// across rows), rotates rows i, i+1 over columns i.. (threads across columns), flips row
// i+1's sign so that its diagonal entry is >= 0, and records the rotation (i, c, s, sign).
// Past `limit` exchanges it stops with status 1; a non-finite diagonal: nothing done.
// info = {exchanges, status}.
//
// apply_rotations: the recorded list applied to Q's columns (column-major, stride ldq), a
// thread a row (rows are independent), in order.

template <typename T>
__global__ void __launch_bounds__(1024)
diag_swaps(T* __restrict__ r, long long ld, int kk, int n, int* __restrict__ perm,
           T* __restrict__ dg, T tolf, int limit, int* __restrict__ rot_i,
           T* __restrict__ rot_c, T* __restrict__ rot_s, T* __restrict__ rot_g,
           int* __restrict__ info) {
  __shared__ int s_first;
  __shared__ int s_bad;
  const int tid = threadIdx.x, nt = blockDim.x;
  if (tid == 0) s_bad = 0;
  __syncthreads();
  for (int j = tid; j < kk; j += nt) {
    const T v = fabs(r[j * ld + j]);
    dg[j] = v;
    if (!isfinite(v)) s_bad = 1;
  }
  __syncthreads();
  if (s_bad) {
    if (tid == 0) { info[0] = 0; info[1] = 0; }
    return;
  }
  const T tol = tolf * dg[0];
  int swaps = 0, start = 0;
  for (;;) {
    if (tid == 0) s_first = kk;
    __syncthreads();
    int mine = kk;
    for (int j = start + tid; j + 1 < kk; j += nt) {
      if (dg[j + 1] > dg[j] + tol) { mine = j; break; }
    }
    if (mine < kk) atomicMin(&s_first, mine);
    __syncthreads();
    const int i = s_first;
    if (i >= kk) break;
    if (swaps == limit) {
      if (tid == 0) { info[0] = swaps; info[1] = 1; }
      return;
    }
    // exchange columns i, i+1 (rows below i+1 are zero in both)
    for (int t = tid; t <= i + 1; t += nt) {
      const T x = r[t * ld + i];
      r[t * ld + i] = r[t * ld + i + 1];
      r[t * ld + i + 1] = x;
    }
    __syncthreads();
    const T a = r[i * ld + i], b = r[(i + 1) * ld + i];
    const T x = r[i * ld + i + 1], y = r[(i + 1) * ld + i + 1];
    const T h = hypot(a, b);
    const T c = a / h, s = b / h;  // h > 0: b is the larger diagonal entry
    const T y2 = -s * x + c * y;
    const T g = y2 < 0 ? T(-1) : T(1);
    __syncthreads();  // every thread has read before any writes
    for (int j = i + tid; j < n; j += nt) {
      const T ri = r[i * ld + j], rj = r[(i + 1) * ld + j];
      T ni = c * ri + s * rj, nj = g * (-s * ri + c * rj);
      if (j == i) { ni = h; nj = T(0); }
      if (j == i + 1) nj = fabs(y2);
      r[i * ld + j] = ni;
      r[(i + 1) * ld + j] = nj;
    }
    if (tid == 0) {
      rot_i[swaps] = i;
      rot_c[swaps] = c;
      rot_s[swaps] = s;
      rot_g[swaps] = g;
      dg[i] = h;
      dg[i + 1] = fabs(y2);
      const int pi = perm[i];
      perm[i] = perm[i + 1];
      perm[i + 1] = pi;
    }
    ++swaps;
    start = i > 0 ? i - 1 : 0;
    __syncthreads();
  }
  if (tid == 0) { info[0] = swaps; info[1] = 0; }
}

template <typename T>
__global__ void apply_rotations(T* __restrict__ q, long long ldq, int m,
                                const int* __restrict__ rot_i, const T* __restrict__ rot_c,
                                const T* __restrict__ rot_s, const T* __restrict__ rot_g,
                                const int* __restrict__ info) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= m || info[1] != 0) return;
  const int count = info[0];
  for (int k = 0; k < count; ++k) {
    const int i = rot_i[k];
    const T c = rot_c[k], s = rot_s[k], g = rot_g[k];
    T* qi = q + (long long)i * ldq + t;
    T* qj = qi + ldq;
    const T a = *qi, b = *qj;
    *qi = c * a + s * b;
    *qj = g * (-s * a + c * b);
  }
}
