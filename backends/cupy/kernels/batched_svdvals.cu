// Singular values of a stack of small matrices by one-sided (Hestenes) Jacobi, one block
// per matrix, one launch for the stack (batched_svdvals.py).
//
// The block holds its m x n matrix (m >= n) in shared memory column by column, scaled by a
// power of two so that its largest |entry| lies in [1/2, 1) (no over- or underflow of the
// column dot products). A sweep pairs every two columns once in n' - 1 rounds of the
// round-robin ("circle") tournament (n' = n rounded up to even, the extra player a dummy);
// each round's n'/2 disjoint pairs go to the block's warps, each pair's three dot products
// are butterfly warp sums (bit-identical in every lane, so every branch is warp-uniform)
// and the pair is rotated where |a_p . a_q| > tol ||a_p|| ||a_q||. Sweeps stop when one
// rotates nothing (or after max_sweeps). The singular values are the column norms, sorted
// descending (rank by counting), times the power of two.
//
//   a: member b at a + b * m * n, row-major (C-contiguous); s: member b at s + b * n.

// float/double overloads spelled out (the f-suffixed functions for float)
__device__ __forceinline__ float m_abs(float x) { return fabsf(x); }
__device__ __forceinline__ double m_abs(double x) { return fabs(x); }
__device__ __forceinline__ float m_max(float x, float y) { return fmaxf(x, y); }
__device__ __forceinline__ double m_max(double x, double y) { return fmax(x, y); }
__device__ __forceinline__ float m_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double m_sqrt(double x) { return sqrt(x); }
__device__ __forceinline__ float m_copysign(float x, float y) { return copysignf(x, y); }
__device__ __forceinline__ double m_copysign(double x, double y) { return copysign(x, y); }
__device__ __forceinline__ float m_ldexp(float x, int e) { return ldexpf(x, e); }
__device__ __forceinline__ double m_ldexp(double x, int e) { return ldexp(x, e); }
__device__ __forceinline__ int m_exponent(float x) {
  int e;
  frexpf(x, &e);
  return e;
}
__device__ __forceinline__ int m_exponent(double x) {
  int e;
  frexp(x, &e);
  return e;
}

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// max that keeps a NaN (fmax drops it)
template <typename T>
__device__ __forceinline__ T nan_max(T x, T y) {
  return x != x ? x : (y != y ? y : m_max(x, y));
}

template <typename T>
__device__ __forceinline__ T warp_max(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = nan_max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

template <typename T>
__global__ void batched_svdvals(const T* __restrict__ a, long long batch, int m, int n,
                                T* __restrict__ s, T tol, int max_sweeps,
                                int* __restrict__ sweeps) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* A = reinterpret_cast<T*>(smem_raw);  // column j: A[j * m + i]
  T* sv = A + (long long)m * n;           // column norms
  __shared__ T red[32];
  __shared__ int rotated;
  const long long b = blockIdx.x;
  if (b >= batch) return;
  const T* src = a + b * (long long)m * n;
  const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, warp = tid >> 5;
  const int nwarps = nt >> 5;
  const int mn = m * n;

  T mx = T(0);
  for (int idx = tid; idx < mn; idx += nt) {  // coalesced reads of the row-major member
    const int i = idx / n, j = idx - i * n;
    const T v = src[idx];
    A[j * m + i] = v;
    mx = nan_max(mx, m_abs(v));
  }
  mx = warp_max(mx);
  if (lane == 0) red[warp] = mx;
  __syncthreads();
  if (warp == 0) {
    T v = warp_max(lane < nwarps ? red[lane] : T(0));
    if (lane == 0) red[0] = v;
  }
  __syncthreads();
  mx = red[0];
  T* out = s + b * (long long)n;
  if (!(mx - mx == T(0))) {  // NaN or Inf in the member: no finite singular values
    const T nan = mx - mx;
    for (int j = tid; j < n; j += nt) out[j] = nan;
    if (tid == 0 && sweeps != nullptr) sweeps[b] = 0;
    return;
  }
  int e = 0;
  if (mx > T(0)) {
    e = m_exponent(mx);
    for (int idx = tid; idx < mn; idx += nt) A[idx] = m_ldexp(A[idx], -e);
  }
  __syncthreads();

  const int np = n + (n & 1);  // players; index n (odd n) is the dummy
  const int pairs = np / 2;
  int sweep = 0;
  for (; sweep < max_sweeps && np > 1; ++sweep) {
    if (tid == 0) rotated = 0;
    __syncthreads();
    for (int r = 0; r < np - 1; ++r) {
      for (int k = warp; k < pairs; k += nwarps) {
        int p, q;
        if (k == 0) {
          p = r;
          q = np - 1;
        } else {
          p = (r + k) % (np - 1);
          q = (r - k + (np - 1)) % (np - 1);
        }
        if (p >= n || q >= n) continue;
        T* ap = A + p * m;
        T* aq = A + q * m;
        T al = T(0), be = T(0), ga = T(0);
        for (int i = lane; i < m; i += 32) {
          const T x = ap[i], y = aq[i];
          al += x * x;
          be += y * y;
          ga += x * y;
        }
        al = warp_sum(al);
        be = warp_sum(be);
        ga = warp_sum(ga);
        if (m_abs(ga) > tol * m_sqrt(al) * m_sqrt(be)) {
          // the rotation that zeroes a_p . a_q, its smaller angle (Rutishauser)
          const T zeta = (be - al) / (T(2) * ga);
          const T t = m_copysign(T(1), zeta) / (m_abs(zeta) + m_sqrt(T(1) + zeta * zeta));
          const T c = T(1) / m_sqrt(T(1) + t * t), sn = c * t;
          for (int i = lane; i < m; i += 32) {
            const T x = ap[i], y = aq[i];
            ap[i] = c * x - sn * y;
            aq[i] = sn * x + c * y;
          }
          if (lane == 0) rotated = 1;
        }
      }
      __syncthreads();
    }
    const int any = rotated;
    __syncthreads();
    if (!any) break;
  }

  for (int j = warp; j < n; j += nwarps) {
    const T* aj = A + j * m;
    T ss = T(0);
    for (int i = lane; i < m; i += 32) ss += aj[i] * aj[i];
    ss = warp_sum(ss);
    if (lane == 0) sv[j] = m_sqrt(ss);
  }
  __syncthreads();
  for (int j = tid; j < n; j += nt) {
    const T v = sv[j];
    int rank = 0;
    for (int k = 0; k < n; ++k) {
      const T w = sv[k];
      rank += (w > v) || (w == v && k < j);
    }
    out[rank] = m_ldexp(v, e);
  }
  if (tid == 0 && sweeps != nullptr) sweeps[b] = sweep;
}
