// The Gram matrix of W = [A | B] (h x N float64, N = n + k) in double-double arithmetic:
// every product exact (fma), every sum compensated (TwoSum), so that an entry's relative
// error is about (rows summed) * 2^-104 instead of float64's (rows) * 2^-53.
//
// gram_dd_part<PPT>: each thread block sums a contiguous range of rows, staged through
// shared memory TILE rows at a time; each thread owns up to PPT entries (i <= j) of the
// upper triangle, listed in pi/pj, and keeps their double-double sums in registers. It
// writes one (hi, lo) pair per entry: part[(block * P + p) * 2 + {0, 1}].
// gram_dd_reduce: one thread per entry adds the blocks' pairs (double-double) to the
// running sum acc (2 x N x N: the hi plane, then the lo plane), both triangles.

#define TILE 32

__device__ __forceinline__ void dd_acc(double &sh, double &sl, double p, double e) {
    // (sh, sl) += (p, e), |e| <= ulp(p) / 2
    double s = sh + p;
    double bb = s - sh;
    double err = (sh - (s - bb)) + (p - bb);
    err += sl + e;
    sh = s + err;
    sl = err - (sh - s);
}

__device__ __forceinline__ void dd_add(double &ah, double &al, double bh, double bl) {
    // the accurate double-double sum (also under cancellation)
    double s = ah + bh;
    double bb = s - ah;
    double e = (ah - (s - bb)) + (bh - bb);
    double t = al + bl;
    double tb = t - al;
    double f = (al - (t - tb)) + (bl - tb);
    e += t;
    double s2 = s + e;
    e = e - (s2 - s);
    e += f;
    ah = s2 + e;
    al = e - (ah - s2);
}

template <int PPT>
__global__ void gram_dd_part(const double *__restrict__ A, long long lda, int n,
                             const double *__restrict__ B, long long ldb, int k,
                             long long h, long long rows_per_block,
                             const int *__restrict__ pi, const int *__restrict__ pj, int P,
                             double *__restrict__ part) {
    extern __shared__ double tile[];  // TILE x N
    const int N = n + k;
    const long long r0 = (long long)blockIdx.x * rows_per_block;
    long long r1 = r0 + rows_per_block;
    if (r1 > h) r1 = h;
    double sh[PPT], sl[PPT];
    int ii[PPT], jj[PPT];
#pragma unroll
    for (int q = 0; q < PPT; ++q) {
        const int p = threadIdx.x + q * blockDim.x;
        sh[q] = 0.0;
        sl[q] = 0.0;
        ii[q] = p < P ? pi[p] : 0;
        jj[q] = p < P ? pj[p] : 0;
    }
    for (long long t = r0; t < r1; t += TILE) {
        const int rows = (int)((r1 - t) < TILE ? (r1 - t) : TILE);
        for (int idx = threadIdx.x; idx < rows * N; idx += blockDim.x) {
            const int r = idx / N, c = idx - r * N;
            tile[idx] = c < n ? A[(t + r) * lda + c] : B[(t + r) * ldb + (c - n)];
        }
        __syncthreads();
        for (int r = 0; r < rows; ++r) {
            const double *row = tile + r * N;
#pragma unroll
            for (int q = 0; q < PPT; ++q) {
                const double a = row[ii[q]], b = row[jj[q]];
                const double p = a * b;
                dd_acc(sh[q], sl[q], p, fma(a, b, -p));
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int q = 0; q < PPT; ++q) {
        const int p = threadIdx.x + q * blockDim.x;
        if (p < P) {
            part[((long long)blockIdx.x * P + p) * 2] = sh[q];
            part[((long long)blockIdx.x * P + p) * 2 + 1] = sl[q];
        }
    }
}

__global__ void gram_dd_reduce(const double *__restrict__ part, int nblocks, int P,
                               const int *__restrict__ pi, const int *__restrict__ pj, int N,
                               double *__restrict__ acc) {
    const int p = blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= P) return;
    const int i = pi[p], j = pj[p];
    double h = acc[i * N + j], l = acc[N * N + i * N + j];
    for (int b = 0; b < nblocks; ++b)
        dd_add(h, l, part[((long long)b * P + p) * 2], part[((long long)b * P + p) * 2 + 1]);
    acc[i * N + j] = h;
    acc[N * N + i * N + j] = l;
    acc[j * N + i] = h;
    acc[N * N + j * N + i] = l;
}
