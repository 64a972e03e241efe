// Layout kernels of the library QR route (cupy_geqrf.py): a row-major matrix into
// cuSOLVER's column-major layout, and R out of geqrf's column-major result (upper triangle,
// rows times the signs that make diag(R) >= 0), each as a tiled transpose through shared
// memory so that both the reads and the writes are coalesced.
//
//   out[c * ldo + r] = keep(r, c) ? sgn[c] * src[r * lds + c] : 0,   r < rows, c < cols
//
// keep(r, c) = true, or (upper) r >= c; sgn = 1 where null. Tiles of 32 x 32, blocks of
// 32 x 8 threads; blockIdx.x runs over row tiles (up to 2^31 - 1 of them), blockIdx.y over
// column tiles.

#define TILE 32
#define ROWS_PER_PASS 8

template <typename T>
__global__ void transpose_tile(const T* __restrict__ src, long long lds, T* __restrict__ out,
                               long long ldo, long long rows, long long cols, int upper,
                               const T* __restrict__ sgn) {
  __shared__ T tile[TILE][TILE + 1];
  const long long r0 = (long long)blockIdx.x * TILE, c0 = (long long)blockIdx.y * TILE;
  const int tx = threadIdx.x, ty = threadIdx.y;
  for (int k = 0; k < TILE; k += ROWS_PER_PASS) {
    const long long r = r0 + ty + k, c = c0 + tx;
    if (r < rows && c < cols) tile[ty + k][tx] = src[r * lds + c];
  }
  __syncthreads();
  for (int k = 0; k < TILE; k += ROWS_PER_PASS) {
    const long long c = c0 + ty + k, r = r0 + tx;
    if (r < rows && c < cols) {
      T v = tile[tx][ty + k];
      if (upper && r < c) v = T(0);
      else if (sgn != nullptr) v *= sgn[c];
      out[c * ldo + r] = v;
    }
  }
}
