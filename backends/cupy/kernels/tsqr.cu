// Tile kernels of the TSQR panel factorization (mpqr.backends.cupy_tsqr).
//
// One thread block owns one tile of at most 32*RPL rows and n columns of a
// row-major matrix (tiles of a batch of matrices share one launch). The tile
// lives in registers in a column-owned layout (after Leng et al., SC'23,
// §V.A.2): warp w owns columns w, w+nw, w+2nw, ... (at most CPW of them) and
// lane l holds rows l, l+32, ..., l+32*(RPL-1) of each. Every inner product
// is then a reduction inside one warp (shuffles), and a Householder step needs
// one __syncthreads() to broadcast its vector through shared memory.
//
// Conventions are LAPACK's (dgeqrf/dlarfg/dorgqr): H = I - tau v v^T with
// v(j) = 1, beta = -sign(alpha) * ||x||, tau = (beta - alpha) / beta, and
// tau = 0 (H = I) when the part below the diagonal is exactly zero.
//
// Modes (template MODE):
//   0  factor:        src -> (compact V/R tile to dst if FLAG_V) (R to rdst if
//                     FLAG_R) (tau to taus if FLAG_TAU)
//   1  apply:         Q_tile = H_0 ... H_{n-1} [C; 0], V read from src, tau from
//                     taus, C from cbuf (identity without FLAG_C); Q to dst
//   2  factor+apply:  mode 0 then mode 1 without going through global memory
//
// Tile t of the grid covers rows [unit*(t*base + min(t, rem)), +unit*(base +
// (t < rem))) of its matrix; block b*ntiles + t works on batch entry b. Rows
// beyond the tile are zero padding; they are never read from or written to
// global memory. src and dst may alias (each block reads its whole tile
// before it writes any of it), so no pointer is __restrict__.
//
// No #include: the file is compiled by NVRTC through cupy.RawModule.

#define MPQR_FULL_MASK 0xffffffffu

enum { FLAG_V = 1, FLAG_R = 2, FLAG_TAU = 4, FLAG_C = 8 };

namespace mpqr_tsqr {

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

// a[][] <- H_0 H_1 ... H_{n-1} a[][], the reflectors read from the shared
// compact tile (rows >= nrows are zero) and taus. `from_identity`: a starts
// as [I; 0], whose column k is untouched by H_j for j > k (dorgqr's saving).
template <typename T, int CPW, int RPL>
__device__ __forceinline__ void apply_regs(T (&a)[CPW][RPL], const T* tile, const T* taus,
                                           int nrows, int n, int ld, bool from_identity,
                                           int warp, int lane, int nw) {
  for (int j = n - 1; j >= 0; --j) {
    const T tj = taus[j];
    T vr[RPL];
#pragma unroll
    for (int i = 0; i < RPL; ++i) {
      const int r = lane + 32 * i;
      vr[i] = (r > j && r < nrows) ? tile[r * ld + j] : (r == j ? T(1) : T(0));
    }
#pragma unroll
    for (int c = 0; c < CPW; ++c) {
      const int k = warp + nw * c;
      if (k < n && !(from_identity && k < j)) {  // warp-uniform
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

}  // namespace mpqr_tsqr

// Dynamic shared memory: tile (32*RPL x ld) | vbuf (2 * 32*RPL) | taus (n),
// all of type T, ld = n | 1 (odd: column accesses of a warp hit 32 banks).
template <typename T, int CPW, int RPL, int MODE>
__global__ void __launch_bounds__(512)
tsqr_tile(const T* src, T* dst, T* rdst, T* tau_g, const T* cbuf, int n, int ntiles, int unit,
          int base, int rem, int flags, long long src_bs, long long dst_bs) {
  using namespace mpqr_tsqr;
  constexpr int TR = 32 * RPL;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int ld = n | 1;
  T* tile = reinterpret_cast<T*>(smem_raw);
  T* vbuf = tile + TR * ld;
  T* taus = vbuf + 2 * TR;

  const int nw = blockDim.x >> 5;
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const long long bid = blockIdx.x;
  const int t = (int)(bid % ntiles);
  const long long b = bid / ntiles;
  const long long row0 = (long long)unit * ((long long)t * base + min(t, rem));
  const int nrows = unit * (base + (t < rem ? 1 : 0));
  const long long tile_off = row0 * n;
  const long long rt_off = (b * ntiles + t) * (long long)n;  // tile index * n

  T a[CPW][RPL];

  if (MODE == 0 || MODE == 2) {
    load_tile(tile, src + b * src_bs + tile_off, nrows, n, ld);
    __syncthreads();
    tile_to_regs(a, tile, nrows, n, ld, warp, lane, nw);
    factor_regs(a, vbuf, taus, n, warp, lane, nw);  // n >= 1 barriers: tile reads are done
    regs_to_tile(tile, a, n, ld, warp, lane, nw);
    __syncthreads();
    if ((flags & FLAG_R) != 0) {
      T* r_out = rdst + rt_off * n;
      for (int i = threadIdx.x; i < n * n; i += blockDim.x) {
        const int r = i / n, c = i - (i / n) * n;
        r_out[i] = r <= c ? tile[r * ld + c] : T(0);
      }
    }
    if (MODE == 0) {
      if ((flags & FLAG_V) != 0) store_tile(dst + b * dst_bs + tile_off, tile, nrows, n, ld);
      if ((flags & FLAG_TAU) != 0) {
        for (int i = threadIdx.x; i < n; i += blockDim.x) tau_g[rt_off + i] = taus[i];
      }
      return;
    }
  } else {
    load_tile(tile, src + b * src_bs + tile_off, nrows, n, ld);
    for (int i = threadIdx.x; i < n; i += blockDim.x) taus[i] = tau_g[rt_off + i];
    __syncthreads();
  }

  // [C; 0] (or [I; 0]) in registers; the tile has at least n rows.
  const bool has_c = (flags & FLAG_C) != 0;
  const T* cblk = cbuf + rt_off * n;  // parent Q rows of this tile (contiguous n x n)
#pragma unroll
  for (int c = 0; c < CPW; ++c) {
    const int k = warp + nw * c;
#pragma unroll
    for (int i = 0; i < RPL; ++i) {
      const int r = lane + 32 * i;
      T val = T(0);
      if (k < n && r < n) val = has_c ? cblk[r * n + k] : (r == k ? T(1) : T(0));
      a[c][i] = val;
    }
  }
  apply_regs(a, tile, taus, nrows, n, ld, !has_c, warp, lane, nw);
  __syncthreads();  // everyone is done reading V from the tile
  regs_to_tile(tile, a, n, ld, warp, lane, nw);
  __syncthreads();
  store_tile(dst + b * dst_bs + tile_off, tile, nrows, n, ld);
}
