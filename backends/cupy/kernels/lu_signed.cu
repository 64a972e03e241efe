// Householder reconstruction from an explicit orthonormal Q (Ballard et al. 2014, LAPACK
// orhr_col): the unpivoted LU with a signed diagonal, L U = W - diag(s),
// s_i = -sign(pivot_i), of Q's top block, and the rows of the reflectors it gives.
//
// lu_signed_block: one n x n block, n <= NMAX, held in shared memory by one thread block.
// The column loop is the textbook right-looking one (pivot, scale the column, rank-1
// update), each step separated by a barrier: at n <= 64 that is ~200 barriers,
// microseconds, where a host round trip costs ~0.2 ms. W is overwritten by L\U (unit
// diagonal of L implied), row stride ld.
//
// reconstruct_rows: the whole reconstruction of an m x n panel (n <= B) in one launch.
// Every block repeats the LU of Q's top n x n block in shared memory (microseconds, and
// no second launch), then each thread makes one row of
//   Y = [L; Q2 U^-1]               (unit lower trapezoidal, explicit zeros and ones)
//   W = ([I; 0] - Q S) L^-T        (= Y T, T = -U S L^-T: the compact WY pair)
// by substitution with the shared factors; block 0 also writes tau = diag(T) = -u_ii s_i
// and diag(s) R (the R of the reflectors: A = Q R = H[:, :n] diag(s) R).

template <typename T, int NMAX>
__device__ __forceinline__ void lu_signed_shared(T (*t)[NMAX + 1], T* sv, int n) {
  for (int k = 0; k < n; ++k) {
    // every thread reads the pivot itself: no extra barrier for a broadcast
    const T d = t[k][k];
    const T sk = d < T(0) ? T(1) : T(-1);  // d - sk has |.| >= 1 (d = 0 gives +1)
    const T piv = d - sk;
    __syncthreads();  // all have read t[k][k] before it is overwritten
    if (threadIdx.x == 0) {
      t[k][k] = piv;
      sv[k] = sk;
    }
    for (int r = k + 1 + threadIdx.x; r < n; r += blockDim.x) t[r][k] /= piv;
    __syncthreads();
    const int m = n - k - 1;
    for (int idx = threadIdx.x; idx < m * m; idx += blockDim.x) {
      const int r = k + 1 + idx / m, c = k + 1 + (idx - (idx / m) * m);
      t[r][c] -= t[r][k] * t[k][c];
    }
    __syncthreads();
  }
}

template <typename T, int NMAX>
__global__ void lu_signed_block(T* __restrict__ w, long long ld, T* __restrict__ s, int n) {
  __shared__ T t[NMAX][NMAX + 1];  // +1: a column walk falls in different banks
  __shared__ T sv[NMAX];
  for (int idx = threadIdx.x; idx < n * n; idx += blockDim.x) {
    const int i = idx / n, j = idx - (idx / n) * n;
    t[i][j] = w[i * ld + j];
  }
  __syncthreads();
  lu_signed_shared<T, NMAX>(t, sv, n);
  for (int idx = threadIdx.x; idx < n * n; idx += blockDim.x) {
    const int i = idx / n, j = idx - (idx / n) * n;
    w[i * ld + j] = t[i][j];
  }
  for (int i = threadIdx.x; i < n; i += blockDim.x) s[i] = sv[i];
}

// q: m x n (row stride n), r: n x n; outputs y, w: m x n, tau: n, rout: n x n (all
// contiguous). The register rows are indexed by unrolled loops over B, so they stay in
// registers; columns j >= n are zero.
template <typename T, int B>
__global__ void __launch_bounds__(256)
reconstruct_rows(const T* __restrict__ q, const T* __restrict__ r, long long m, int n,
                 T* __restrict__ y, T* __restrict__ w, T* __restrict__ tau,
                 T* __restrict__ rout) {
  __shared__ T t[B][B + 1];
  __shared__ T sv[B];
  for (int idx = threadIdx.x; idx < n * n; idx += blockDim.x) {
    const int i = idx / n, j = idx - (idx / n) * n;
    t[i][j] = q[i * n + j];
  }
  __syncthreads();
  lu_signed_shared<T, B>(t, sv, n);  // ends with a barrier
  if (blockIdx.x == 0) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) tau[i] = -t[i][i] * sv[i];
    for (int idx = threadIdx.x; idx < n * n; idx += blockDim.x) {
      const int i = idx / n, j = idx - (idx / n) * n;
      rout[idx] = j >= i ? sv[i] * r[idx] : T(0);
    }
  }
  const long long row = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= m) return;
  const T* qr = q + row * n;
  T a[B], b[B];
#pragma unroll
  for (int j = 0; j < B; ++j) a[j] = j < n ? qr[j] : T(0);
  if (row >= n) {  // Y2 = Q2 U^-1: y_j = (q_j - sum_{i<j} y_i u_ij) / u_jj
#pragma unroll
    for (int j = 0; j < B; ++j) {
      T acc = a[j];
#pragma unroll
      for (int i = 0; i < j; ++i) acc -= b[i] * t[i][j];
      b[j] = j < n ? acc / t[j][j] : T(0);
    }
  } else {  // Y1 = L
#pragma unroll
    for (int j = 0; j < B; ++j) b[j] = j < row ? t[row][j] : (j == row ? T(1) : T(0));
  }
  T* yr = y + row * n;
#pragma unroll
  for (int j = 0; j < B; ++j) {
    if (j < n) yr[j] = b[j];
  }
  // W L^T = [I; 0] - Q S: w_j = z_j - sum_{i<j} l_ji w_i, in place of q's row
#pragma unroll
  for (int j = 0; j < B; ++j) {
    T acc = (row == j ? T(1) : T(0)) - a[j] * (j < n ? sv[j] : T(0));
#pragma unroll
    for (int i = 0; i < j; ++i) acc -= t[j][i] * a[i];
    a[j] = acc;
  }
  T* wr = w + row * n;
#pragma unroll
  for (int j = 0; j < B; ++j) {
    if (j < n) wr[j] = a[j];
  }
}
