// The n x n steps of one CholQR pass in one launch (n <= NMAX), for
// mpqr.qr.cholqr: R = chol(G) (upper), X = R^-1, and the numbers its checks read.
//
// One thread block holds G in shared memory as doubles (float32 input is factored in
// double arithmetic; R is rounded to T before X is made from it, so X inverts the R that
// is returned). The Cholesky is the right-looking column loop; X is made by row-wise
// substitution on I (row i of X solves x R = e_i), which is the form whose residual
// |X R - I| <= gamma_n |X| |R| the inverse-by-GEMM bound of cholqr._apply_inverse uses
// (every entry is the sum of a row-by-row substitution, in four partial sums). Entry
// X[i][j] needs X[i][i..j-1] only, so the columns go one by one, their rows in
// parallel. X[i][l] (l > i) lives at t[l][i], the strict lower triangle; R's upper
// triangle is only read there.
//
// st[8] (float64): 0 any non-finite entry of G (0/1), 1 min diag(G), 2 ||G - I||_F,
// 3 a pivot not positive and finite (0/1), 4 max |diag R|, 5 min |diag R|,
// 6 ||R||_1, 7 ||X||_1 (1-norms: largest column sum).

template <int NT>
__device__ __forceinline__ double block_reduce(double v, double* buf, int op) {
  // op 0: sum, 1: max, 2: min; every thread gets the result
  buf[threadIdx.x] = v;
  __syncthreads();
  for (int s = NT / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      const double o = buf[threadIdx.x + s];
      double& m = buf[threadIdx.x];
      m = op == 0 ? m + o : op == 1 ? fmax(m, o) : fmin(m, o);
    }
    __syncthreads();
  }
  const double r = buf[0];
  __syncthreads();
  return r;
}

template <typename T, int NMAX, int NT>
__global__ void __launch_bounds__(NT) chol_steps(const T* __restrict__ g, int n,
                                                 T* __restrict__ r, T* __restrict__ x,
                                                 double* __restrict__ st) {
  __shared__ double t[NMAX][NMAX + 1];  // +1: column walks fall in different banks
  __shared__ double dinv[NMAX];
  __shared__ double buf[NT];
  __shared__ int bad;
  const int tid = threadIdx.x;
  const double inf = __longlong_as_double(0x7ff0000000000000LL);
  if (tid == 0) bad = 0;
  double nonfinite = 0.0, dmin = inf, dist2 = 0.0;
  for (int idx = tid; idx < n * n; idx += NT) {
    const int i = idx / n, j = idx - i * n;
    const double v = (double)g[idx];
    t[i][j] = v;
    if (!isfinite(v)) nonfinite = 1.0;
    if (i == j) dmin = fmin(dmin, v);
    const double e = v - (i == j ? 1.0 : 0.0);
    dist2 += e * e;
  }
  nonfinite = block_reduce<NT>(nonfinite, buf, 1);
  dmin = block_reduce<NT>(dmin, buf, 2);
  dist2 = block_reduce<NT>(dist2, buf, 0);
  for (int k = 0; k < n; ++k) {
    const double d = t[k][k];
    const double s = sqrt(d);
    __syncthreads();  // all have read t[k][k] before it is overwritten
    if (tid == 0) {
      if (!(d > 0.0) || !isfinite(d)) bad = 1;
      t[k][k] = s;
    }
    for (int j = k + 1 + tid; j < n; j += NT) t[k][j] /= s;
    __syncthreads();
    // trailing update of the upper triangle, a 16 x 16 grid of threads over it (no
    // integer division per entry: this loop is most of the kernel's time)
    for (int i = k + 1 + tid / 16; i < n; i += NT / 16) {
      const double rki = t[k][i];
      for (int j = i + (tid % 16); j < n; j += 16) t[i][j] -= rki * t[k][j];
    }
    __syncthreads();
  }
  // R as returned (rounded to T); X is made from exactly that R
  for (int idx = tid; idx < n * n; idx += NT) {
    const int i = idx / n, j = idx - i * n;
    if (j >= i) t[i][j] = (double)(T)t[i][j];
  }
  __syncthreads();
  if (tid < n) dinv[tid] = (double)(T)(1.0 / t[tid][tid]);
  __syncthreads();
  // column j of X needs columns < j only: one barrier a column, rows in parallel
  for (int j = 1; j < n; ++j) {
    for (int i = tid; i < j; i += NT) {
      // four partial sums: the chain of dependent FMAs, not the flops, sets the time
      double acc[4] = {dinv[i] * t[i][j], 0.0, 0.0, 0.0};
      int l = i + 1;
      for (; l + 3 < j; l += 4) {
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[q] += t[l + q][i] * t[l + q][j];
      }
      for (; l < j; ++l) acc[0] += t[l][i] * t[l][j];
      t[j][i] = (double)(T)(-((acc[0] + acc[1]) + (acc[2] + acc[3])) / t[j][j]);
    }
    __syncthreads();
  }
  double dhi = 0.0, dlo = inf, colr = 0.0, colx = 0.0;
  if (tid < n) {
    const int j = tid;
    for (int i = 0; i <= j; ++i) colr += fabs(t[i][j]);
    colx = fabs(dinv[j]);
    for (int i = 0; i < j; ++i) colx += fabs(t[j][i]);
    dhi = fabs(t[j][j]);
    dlo = dhi;
  }
  // NaN in R must reach the checks: fmax/fmin drop NaN, so flag it here
  if (tid < n && !(isfinite(colr) && isfinite(colx))) bad = 1;
  dhi = block_reduce<NT>(dhi, buf, 1);
  dlo = block_reduce<NT>(dlo, buf, 2);
  colr = block_reduce<NT>(colr, buf, 1);
  colx = block_reduce<NT>(colx, buf, 1);
  for (int idx = tid; idx < n * n; idx += NT) {
    const int i = idx / n, j = idx - i * n;
    r[idx] = j >= i ? (T)t[i][j] : T(0);
    x[idx] = j > i ? (T)t[j][i] : (j == i ? (T)dinv[i] : T(0));
  }
  if (tid == 0) {
    st[0] = nonfinite;
    st[1] = dmin;
    st[2] = sqrt(dist2);
    st[3] = bad ? 1.0 : 0.0;
    st[4] = dhi;
    st[5] = dlo;
    st[6] = colr;
    st[7] = colx;
  }
}
