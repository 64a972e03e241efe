// A certified leaf's rank-nb update (nb <= 32 reflectors of one panel):
//
//   leaf_z      partial Z = W^T B over a chunk of B's rows (grid: column tiles x row
//               chunks), or Z itself where one chunk takes all rows;
//   leaf_sum    Z = the chunks' partials added in chunk order (the same bits run to run);
//   leaf_apply  B -= Y Z for Y = [L; Y2]: L (nb x nb, row-major, leading dimension nb) the
//               panel's explicit unit-lower top, Y2 the rows from nb on.
//
// A thread owns one column j of B and all nb rows of Z's column j, in registers: leaf_z
// reads B's column j down its chunk (coalesced across the block) against W's rows, which
// the block stages in shared memory and every lane reads at once (broadcast); leaf_apply
// holds Z's column j and streams B's column down its chunk against Y's staged rows. So
// each launch is one pass over B, and the products run from registers: cuBLAS's kernels
// for these shapes (inner dimension 32, or an output of 32 rows with an inner dimension of
// thousands) spend most of their time in small tiles and split-K passes.
// Matrices are row-major (the working matrix's layout); products and sums in T (as
// cuBLAS's native products are).

#define LEAF_K 32        // reflectors of a panel (at most)
#define LEAF_THREADS 128 // columns of B per block

// rows of B a thread holds in registers per step (double: half, for the registers)
template <typename T> struct LeafRows;
template <> struct LeafRows<float> { static constexpr int value = 32; };
template <> struct LeafRows<double> { static constexpr int value = 16; };

// grid (ceil(q / LEAF_THREADS), chunks): rows [chunk y, chunk (y + 1)) of B (r x q) and
// W (r x nb); out: Z (nb x q, row-major, leading dimension q) when there is one chunk,
// else the chunk's partial at out + y nb q
template <typename T>
__global__ void __launch_bounds__(LEAF_THREADS)
leaf_z(const T* __restrict__ b, long long ldb, const T* __restrict__ w, long long ldw,
       long long r, int nb, int q, long long chunk, T* __restrict__ out) {
  constexpr int R = LeafRows<T>::value;
  __shared__ __align__(16) T ws[2][R][LEAF_K];
  const int j = blockIdx.x * LEAF_THREADS + threadIdx.x;
  const long long i0 = (long long)blockIdx.y * chunk, i1 = min(r, i0 + chunk);
  T acc[LEAF_K];
#pragma unroll
  for (int k = 0; k < LEAF_K; ++k) acc[k] = T(0);
  auto stage = [&](int buf, long long ib) {
    for (int e = threadIdx.x; e < R * LEAF_K; e += LEAF_THREADS) {
      const int rr = e / LEAF_K, k = e % LEAF_K;
      const long long i = ib + rr;
      ws[buf][rr][k] = (i < i1 && k < nb) ? w[i * ldw + k] : T(0);
    }
  };
  int buf = 0;
  stage(0, i0);
  __syncthreads();
  for (long long ib = i0; ib < i1; ib += R) {
    T bv[R];  // this step's rows of column j, loaded before the next W rows are staged
#pragma unroll
    for (int rr = 0; rr < R; ++rr) {
      const long long i = ib + rr;
      bv[rr] = (j < q && i < i1) ? b[i * ldb + j] : T(0);
    }
    if (ib + R < i1) stage(buf ^ 1, ib + R);
#pragma unroll
    for (int rr = 0; rr < R; ++rr) {
#pragma unroll
      for (int k = 0; k < LEAF_K; ++k) acc[k] += ws[buf][rr][k] * bv[rr];
    }
    __syncthreads();
    buf ^= 1;
  }
  if (j >= q) return;
  T* o = out + (long long)blockIdx.y * nb * q + j;
#pragma unroll
  for (int k = 0; k < LEAF_K; ++k)
    if (k < nb) o[(long long)k * q] = acc[k];
}

// grid ceil(n / 256) x 256 threads: z[e] = part[e] + part[n + e] + ... (chunks in order)
template <typename T>
__global__ void __launch_bounds__(256)
leaf_sum(const T* __restrict__ part, long long n, int chunks, T* __restrict__ z) {
  const long long e = (long long)blockIdx.x * 256 + threadIdx.x;
  if (e >= n) return;
  T s = part[e];
#pragma unroll 8
  for (int t = 1; t < chunks; ++t) s += part[(long long)t * n + e];
  z[e] = s;
}

// grid (ceil(q / LEAF_THREADS), chunks): B -= Y Z on rows [chunk y, chunk (y + 1)); Y's
// row i is L's row i for i < nb and y2 + (i - nb) ldy below
template <typename T>
__global__ void __launch_bounds__(LEAF_THREADS)
leaf_apply(T* __restrict__ b, long long ldb, const T* __restrict__ l,
           const T* __restrict__ y2, long long ldy, const T* __restrict__ z, long long r,
           int nb, int q, long long chunk) {
  constexpr int R = LeafRows<T>::value;
  __shared__ __align__(16) T ys[R][LEAF_K];
  const int j = blockIdx.x * LEAF_THREADS + threadIdx.x;
  const long long i0 = (long long)blockIdx.y * chunk, i1 = min(r, i0 + chunk);
  T zc[LEAF_K];
#pragma unroll
  for (int k = 0; k < LEAF_K; ++k) zc[k] = (j < q && k < nb) ? z[(long long)k * q + j] : T(0);
  for (long long ib = i0; ib < i1; ib += R) {
    T bv[R];
#pragma unroll
    for (int rr = 0; rr < R; ++rr) {
      const long long i = ib + rr;
      bv[rr] = (j < q && i < i1) ? b[i * ldb + j] : T(0);
    }
    __syncthreads();  // the previous step's reads of ys are done
    for (int e = threadIdx.x; e < R * LEAF_K; e += LEAF_THREADS) {
      const int rr = e / LEAF_K, k = e % LEAF_K;
      const long long i = ib + rr;
      T v = T(0);
      if (i < i1 && k < nb) v = i < nb ? l[i * nb + k] : y2[(i - nb) * ldy + k];
      ys[rr][k] = v;
    }
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < R; ++rr) {
      T s = T(0);
#pragma unroll
      for (int k = 0; k < LEAF_K; ++k) s += ys[rr][k] * zc[k];
      const long long i = ib + rr;
      if (j < q && i < i1) b[i * ldb + j] = bv[rr] - s;
    }
  }
}
