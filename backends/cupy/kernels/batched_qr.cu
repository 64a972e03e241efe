// Batched Householder QR of small matrices (mpqr.backends.cupy_batched_qr).
//
// One thread block owns one whole m x n matrix of a stack (m >= n, m <= 32*RPL,
// n <= CPW * warps): the matrix lives in registers in a column-owned layout
// (warp w owns columns w, w+nw, ...; lane l rows l, l+32, ...), every inner
// product is a reduction inside one warp and a Householder step costs one
// __syncthreads(). The factorization, R, and then Q (or Q^T b) are formed in
// the same launch for the whole stack; nothing but the input, the outputs and
// shared memory is touched.
//
// Conventions are LAPACK's (geqrf/larfg/orgqr): H = I - tau v v^T, v(j) = 1,
// beta = -sign(alpha) ||x||, tau = 0 (H = I) for an exactly zero column below
// the diagonal. The public sign convention (diag(R) >= 0) is applied on the way
// out: row j of R and column j of Q (row j of Q^T b) are multiplied by
// s_j = (R_jj < 0 ? -1 : 1), so no further pass is needed.
//
// Modes (template MODE):
//   0  R only
//   1  R and the reduced Q (m x n)
//   2  R and the complete Q (m x m)
//   3  R and Q^T b (b: m x p per matrix, written to out as m x p)
// Q (or Q^T b) is built in chunks of CPW * warps columns held in registers.
//
// No #include: the file is compiled by NVRTC through cupy.RawModule.

#define MPQR_FULL_MASK 0xffffffffu

namespace mpqr_bqr {

__device__ __forceinline__ float m_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double m_sqrt(double x) { return sqrt(x); }
__device__ __forceinline__ float m_hypot(float x, float y) { return hypotf(x, y); }
__device__ __forceinline__ double m_hypot(double x, double y) { return hypot(x, y); }
__device__ __forceinline__ float m_copysign(float x, float y) { return copysignf(x, y); }
__device__ __forceinline__ double m_copysign(double x, double y) { return copysign(x, y); }
__device__ __forceinline__ float m_fabs(float x) { return fabsf(x); }
__device__ __forceinline__ double m_fabs(double x) { return fabs(x); }
__device__ __forceinline__ float m_fmax(float x, float y) { return fmaxf(x, y); }
__device__ __forceinline__ double m_fmax(double x, double y) { return fmax(x, y); }

// Sums of squares outside [lo, hi] may have under- or overflowed: such a
// column is rescaled by its largest entry before the norm is taken.
template <typename T> struct SumSqRange;
template <> struct SumSqRange<float> {
  __device__ static float lo() { return 0x1p-100f; }
  __device__ static float hi() { return 0x1p+100f; }
};
template <> struct SumSqRange<double> {
  __device__ static double lo() { return 0x1p-900; }
  __device__ static double hi() { return 0x1p+900; }
};

// Butterfly reductions: every lane ends with the same (bitwise) value, as
// IEEE addition and max are commutative.
template <typename T>
__device__ __forceinline__ T warp_sum(T x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(MPQR_FULL_MASK, x, o);
  return x;
}

template <typename T>
__device__ __forceinline__ T warp_max(T x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = m_fmax(x, __shfl_xor_sync(MPQR_FULL_MASK, x, o));
  return x;
}

// Coalesced copy of nrows x n contiguous elements into the shared tile (row
// stride ld); U loads are issued before their stores to keep bytes in flight.
template <typename T>
__device__ __forceinline__ void load_tile(T* tile, const T* g, int nrows, int n, int ld) {
  constexpr int U = 8;
  const int total = nrows * n;
  const int step = blockDim.x;
  for (int i0 = threadIdx.x; i0 < total; i0 += U * step) {
    T buf[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int i = i0 + u * step;
      buf[u] = i < total ? g[i] : T(0);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int i = i0 + u * step;
      if (i < total) {
        const int r = i / n;
        tile[r * ld + (i - r * n)] = buf[u];
      }
    }
  }
}

template <typename T>
__device__ __forceinline__ void store_tile(T* g, const T* tile, int nrows, int n, int ld) {
  const int total = nrows * n;
  for (int i = threadIdx.x; i < total; i += blockDim.x) {
    const int r = i / n;
    g[i] = tile[r * ld + (i - r * n)];
  }
}

// registers <-> shared tile, column-owned layout; rows >= nrows read as zero.
template <typename T, int CPW, int RPL>
__device__ __forceinline__ void tile_to_regs(T (&a)[CPW][RPL], const T* tile, int nrows, int n,
                                             int ld, int warp, int lane, int nw) {
#pragma unroll
  for (int c = 0; c < CPW; ++c) {
    const int k = warp + nw * c;
#pragma unroll
    for (int i = 0; i < RPL; ++i) {
      const int r = lane + 32 * i;
      a[c][i] = (k < n && r < nrows) ? tile[r * ld + k] : T(0);
    }
  }
}

template <typename T, int CPW, int RPL>
__device__ __forceinline__ void regs_to_tile(T* tile, const T (&a)[CPW][RPL], int n, int ld,
                                             int warp, int lane, int nw) {
#pragma unroll
  for (int c = 0; c < CPW; ++c) {
    const int k = warp + nw * c;
    if (k < n) {
#pragma unroll
      for (int i = 0; i < RPL; ++i) tile[(lane + 32 * i) * ld + k] = a[c][i];
    }
  }
}

// Householder QR of the register tile. On return a[][] holds the geqrf
// compact form (R on and above the diagonal, v below it) and taus[0:n] the
// scalar factors. vbuf: 2 * 32 * RPL elements of shared memory.
template <typename T, int CPW, int RPL>
__device__ __forceinline__ void factor_regs(T (&a)[CPW][RPL], T* vbuf, T* taus, int n, int warp,
                                            int lane, int nw) {
  constexpr int TR = 32 * RPL;
  for (int j = 0; j < n; ++j) {
    const int cj = j / nw;
    T* v = vbuf + (j & 1) * TR;  // double buffer: one barrier per step suffices
    if (warp == j - cj * nw) {
      // the owner warp builds the reflector of column j
      T x[RPL];
#pragma unroll
      for (int i = 0; i < RPL; ++i) x[i] = a[0][i];
#pragma unroll
      for (int c = 1; c < CPW; ++c) {
        if (c == cj) {
#pragma unroll
          for (int i = 0; i < RPL; ++i) x[i] = a[c][i];
        }
      }
      T alpha_l = T(0), ss = T(0);
#pragma unroll
      for (int i = 0; i < RPL; ++i) {
        const int r = lane + 32 * i;
        if (r == j) alpha_l = x[i];
        if (r > j) ss = fma(x[i], x[i], ss);
      }
      ss = warp_sum(ss);
      const T alpha = __shfl_sync(MPQR_FULL_MASK, alpha_l, j & 31);
      T xnorm;
      if (ss != ss) {
        xnorm = ss;  // NaN below the diagonal: let it spread
      } else if (ss < SumSqRange<T>::lo() || ss > SumSqRange<T>::hi()) {
        T amax = T(0);
#pragma unroll
        for (int i = 0; i < RPL; ++i) {
          if (lane + 32 * i > j) amax = m_fmax(amax, m_fabs(x[i]));
        }
        amax = warp_max(amax);
        if (amax == T(0)) {
          xnorm = T(0);
        } else {
          T s2 = T(0);
#pragma unroll
          for (int i = 0; i < RPL; ++i) {
            if (lane + 32 * i > j) {
              const T y = x[i] / amax;  // an Inf entry gives NaN here, on purpose
              s2 = fma(y, y, s2);
            }
          }
          xnorm = amax * m_sqrt(warp_sum(s2));
        }
      } else {
        xnorm = m_sqrt(ss);
      }
      T beta, tau, scal;
      if (xnorm == T(0)) {
        beta = alpha;  // H = I
        tau = T(0);
        scal = T(0);
      } else {
        beta = -m_copysign(m_hypot(alpha, xnorm), alpha);
        tau = (beta - alpha) / beta;
        scal = T(1) / (alpha - beta);
      }
#pragma unroll
      for (int i = 0; i < RPL; ++i) {
        const int r = lane + 32 * i;
        const T vi = r > j ? x[i] * scal : (r == j ? T(1) : T(0));
        v[r] = vi;
        if (r > j) x[i] = vi;
        if (r == j) x[i] = beta;
      }
#pragma unroll
      for (int c = 0; c < CPW; ++c) {
        if (c == cj) {
#pragma unroll
          for (int i = 0; i < RPL; ++i) a[c][i] = x[i];
        }
      }
      if (lane == 0) taus[j] = tau;
    }
    __syncthreads();
    const T tj = taus[j];
    T vr[RPL];
#pragma unroll
    for (int i = 0; i < RPL; ++i) vr[i] = v[lane + 32 * i];
#pragma unroll
    for (int c = 0; c < CPW; ++c) {
      const int k = warp + nw * c;
      if (k > j && k < n) {  // warp-uniform
        T d = T(0);
#pragma unroll
        for (int i = 0; i < RPL; ++i) d = fma(vr[i], a[c][i], d);
        const T f = tj * warp_sum(d);
#pragma unroll
        for (int i = 0; i < RPL; ++i) a[c][i] = fma(-f, vr[i], a[c][i]);
      }
    }
  }
}


// a[][] (a chunk of columns starting as e_k, or b's columns) <- H_0 ... H_{n-1} a
// (FORWARD false) or H_{n-1} ... H_0 a (FORWARD true, Q^T b). Reflectors from
// the shared compact tile, rows >= m zero. `ident`: the chunk started as the
// identity's columns k, which H_j leaves alone for j > k (orgqr's saving).
template <typename T, int CPW, int RPL, bool FORWARD>
__device__ __forceinline__ void apply_chunk(T (&a)[CPW][RPL], const T* tile, const T* taus,
                                            int m, int n, int ld, int c0, int p, bool ident,
                                            int warp, int lane, int nw) {
  for (int s = 0; s < n; ++s) {
    const int j = FORWARD ? s : n - 1 - s;
    const T tj = taus[j];
    if (tj == T(0)) continue;  // block-uniform: H_j = I
    T vr[RPL];
#pragma unroll
    for (int i = 0; i < RPL; ++i) {
      const int r = lane + 32 * i;
      vr[i] = (r > j && r < m) ? tile[r * ld + j] : (r == j ? T(1) : T(0));
    }
#pragma unroll
    for (int c = 0; c < CPW; ++c) {
      const int k = c0 + warp + nw * c;
      if (k < p && !(ident && k < j)) {  // warp-uniform
        T d = T(0);
#pragma unroll
        for (int i = 0; i < RPL; ++i) d = fma(vr[i], a[c][i], d);
        const T f = tj * warp_sum(d);
#pragma unroll
        for (int i = 0; i < RPL; ++i) a[c][i] = fma(-f, vr[i], a[c][i]);
      }
    }
  }
}

}  // namespace mpqr_bqr

// Dynamic shared memory: tile (32*RPL x ld, ld = n | 1: a warp's column accesses
// hit distinct banks) | vbuf (2 * 32*RPL) | taus (n) | signs (n), all of type T.
// a: nb matrices m x n (contiguous); r: nb x n x n; q: nb x m x p (MODE 1: p = n,
// MODE 2: p = m, MODE 3: Q^T b); b: nb x m x p (MODE 3 only).
template <typename T, int CPW, int RPL, int MODE>
__global__ void __launch_bounds__(512)
batched_qr(const T* __restrict__ a, T* __restrict__ r, T* __restrict__ q,
           const T* __restrict__ b, int m, int n, int p) {
  using namespace mpqr_bqr;
  constexpr int TR = 32 * RPL;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int ld = n | 1;
  T* tile = reinterpret_cast<T*>(smem_raw);
  T* vbuf = tile + TR * ld;
  T* taus = vbuf + 2 * TR;
  T* sgn = taus + n;

  const int nw = blockDim.x >> 5;
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const long long mat = blockIdx.x;

  T x[CPW][RPL];
  load_tile(tile, a + mat * m * n, m, n, ld);
  __syncthreads();
  tile_to_regs(x, tile, m, n, ld, warp, lane, nw);
  factor_regs(x, vbuf, taus, n, warp, lane, nw);  // >= 1 barrier: tile reads are done
  regs_to_tile(tile, x, n, ld, warp, lane, nw);
  __syncthreads();
  for (int j = threadIdx.x; j < n; j += blockDim.x) sgn[j] = tile[j * ld + j] < T(0) ? T(-1) : T(1);
  __syncthreads();
  {
    T* r_out = r + mat * n * n;
    for (int i = threadIdx.x; i < n * n; i += blockDim.x) {
      const int row = i / n, col = i - row * n;
      r_out[i] = row <= col ? sgn[row] * tile[row * ld + col] : T(0);
    }
  }
  if (MODE == 0) return;

  const int width = CPW * nw;
  T* out = q + mat * m * p;
  const T* bm = MODE == 3 ? b + mat * m * p : nullptr;
  for (int c0 = 0; c0 < p; c0 += width) {
#pragma unroll
    for (int c = 0; c < CPW; ++c) {
      const int k = c0 + warp + nw * c;
#pragma unroll
      for (int i = 0; i < RPL; ++i) {
        const int row = lane + 32 * i;
        T val = T(0);
        if (k < p && row < m) val = MODE == 3 ? bm[(long long)row * p + k] : (row == k ? T(1) : T(0));
        x[c][i] = val;
      }
    }
    if (MODE == 3) {
      apply_chunk<T, CPW, RPL, true>(x, tile, taus, m, n, ld, c0, p, false, warp, lane, nw);
    } else {
      apply_chunk<T, CPW, RPL, false>(x, tile, taus, m, n, ld, c0, p, true, warp, lane, nw);
    }
    // signs: column k < n of Q, row j < n of Q^T b
#pragma unroll
    for (int c = 0; c < CPW; ++c) {
      const int k = c0 + warp + nw * c;
#pragma unroll
      for (int i = 0; i < RPL; ++i) {
        const int row = lane + 32 * i;
        if (MODE == 3) {
          if (row < n) x[c][i] *= sgn[row];
        } else if (k < n) {
          x[c][i] *= sgn[k];
        }
      }
    }
    if (MODE == 1) {  // one chunk (p = n <= width): through the tile, coalesced stores
      __syncthreads();  // every warp is done reading V
      regs_to_tile(tile, x, n, ld, warp, lane, nw);
      __syncthreads();
      store_tile(out, tile, m, n, ld);
    } else {
#pragma unroll
      for (int c = 0; c < CPW; ++c) {
        const int k = c0 + warp + nw * c;
        if (k < p) {
#pragma unroll
          for (int i = 0; i < RPL; ++i) {
            const int row = lane + 32 * i;
            if (row < m) out[(long long)row * p + k] = x[c][i];
          }
        }
      }
    }
  }
}
