"""Fused CuPy kernels of the INT8 Ozaki engine (see mpqr/engines/ozaki.py).

* ``line_stats``: one read of the operand gives, per line, the exponent of the
  largest finite ``|x|``, whether a NaN/Inf occurs, ``sum |x| 2^-e`` and the
  nonzero count. Any strides: a line along the strided axis (B's columns) gets
  one thread (consecutive threads read consecutive columns), a line along the
  contiguous axis one warp; long lines are cut into chunks over ``blockIdx.y``
  and the chunk partials combined in chunk order by a second kernel, so the sum
  is the same bits run to run. The sum is kept relative to the running maximum's
  exponent and rescaled by exact powers of two when that grows.
* ``residues``: one read of the float64 operand writes all N int8 residue
  planes, zero-padded, four residues packed per 32-bit store. ``x'`` with unit
  stride along its rows (B read through its transpose) goes through 64x64
  shared-memory tiles so that both the reads and the writes are coalesced.
  Residues are exact and canonical (``[-(p-1)/2, (p-1)/2]`` for odd ``p``,
  ``[-128, 127]`` for 256): ``v = a 2^31 + b`` (``|b| <= 2^30``), then per
  modulus ``w = a (2^31 mod p) + b`` (< 2^40, exact), ``t = round(w / p)`` (no
  ties for odd ``p``; 256 is the low byte of ``b``), ``r = w - t p``; the int8 is
  read off the low mantissa bits of ``r + 1.5 * 2^52``.
* ``reconstruct``: one read of the N int32 product planes, the exact limb CRT
  sum, carries, faithful rounding and the power-of-two unscaling, one write
  (into a slice of the caller's output when given).

The moduli and CRT constants are compiled in as literals (hex floats, exact),
so the divisions by constants become multiply-high sequences. Every operation
matches the generic Array-API path bit for bit where that path defines the
bits (exact arithmetic, same rounding of the final sums); residues are
congruent to the generic ones, so CPU and GPU results are identical. Row and
column indices come from a 2-D mapping (a power-of-two number of threads per
row), not from 64-bit division.
"""

from __future__ import annotations

import functools

import cupy as cp

__all__ = ["gauss_combine", "gauss_residues", "line_stats", "reconstruct", "residues"]

_BLOCK = 256
#: 1.5 * 2**52: for an integer |r| < 2**51, r + _MAGIC holds r in its low mantissa bits
_MAGIC = "0x1.8p+52"
#: threads the stats kernels aim for (enough loads in flight to saturate HBM)
_STAT_THREADS = 1 << 18
_OPTS = ("--fmad=false",)  # every intended FMA is an explicit fma()


def _lg_tpr(n: int) -> int:
    """log2 of the threads given to one row of ``n`` items (a power of two <= 256)."""
    return min(8, max(0, (max(n, 1) - 1).bit_length()))


# --- line statistics ------------------------------------------------------------

_STATS_SRC = r"""
// floor(log2 a) for finite a > 0 (frexp: exact for subnormals too)
__device__ __forceinline__ int mpqr_expo(double a) {
  int ex;
  frexp(a, &ex);
  return ex - 1;
}

// Running statistics of one line: mx = largest finite |x|, s = sum of finite
// |x| * 2^-E with E = mpqr_expo(mx) (sc = 2^-E when representable, else 0),
// nnz = finite nonzeros, bad = a NaN/Inf was seen.
struct MpqrStats {
  double mx, s, sc;
  long long nnz;
  int emx, bad;
};

__device__ __forceinline__ void mpqr_init(MpqrStats& st) {
  st.mx = 0.0; st.s = 0.0; st.sc = 0.0; st.nnz = 0; st.emx = -100000; st.bad = 0;
}

__device__ __forceinline__ void mpqr_add(MpqrStats& st, double v) {
  if (!isfinite(v)) { st.bad = 1; return; }
  const double a = fabs(v);
  if (a == 0.0) return;  // adds 0 to the sum
  ++st.nnz;
  if (a > st.mx) {
    const int en = mpqr_expo(a);
    if (en != st.emx) {  // the scale grows: rescale the sum so far (exact barring underflow)
      st.s = ldexp(st.s, st.emx - en);
      st.emx = en;
      st.sc = en >= -1023 ? ldexp(1.0, -en) : 0.0;
    }
    st.mx = a;
  }
  st.s = __dadd_rn(st.s, st.sc != 0.0 ? __dmul_rn(a, st.sc) : ldexp(a, -st.emx));
}

// (mx, s) <- (mx, s) combined with (mx2, s2), each s relative to its own mx's exponent
__device__ __forceinline__ void mpqr_merge(double& mx, double& s, double mx2, double s2) {
  if (mx2 == 0.0) return;
  if (mx == 0.0) { mx = mx2; s = s2; return; }
  const int e1 = mpqr_expo(mx), e2 = mpqr_expo(mx2);
  if (e1 >= e2) s = __dadd_rn(s, ldexp(s2, e2 - e1));
  else s = __dadd_rn(ldexp(s, e1 - e2), s2);
  mx = mx2 > mx ? mx2 : mx;
}

// Lines along the strided axis: thread = line (consecutive threads read consecutive
// addresses when sl is 1), blockIdx.y = chunk of the line.
extern "C" __global__ void __launch_bounds__(256) mpqr_ozaki_stats_across(
    const double* __restrict__ x, long long L, long long K, long long sl, long long sk,
    long long chunk, double* pmax, double* psum, long long* pnnz, int* pbad)
{
  const long long l = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (l >= L) return;
  const long long k0 = (long long)blockIdx.y * chunk;
  const long long k1 = k0 + chunk < K ? k0 + chunk : K;
  MpqrStats st;
  mpqr_init(st);
  const double* p = x + l * sl + k0 * sk;
  long long t = k0;
  for (; t + 8 <= k1; t += 8, p += 8 * sk) {  // 8 loads in flight per thread
    const double v0 = p[0], v1 = p[sk], v2 = p[2 * sk], v3 = p[3 * sk];
    const double v4 = p[4 * sk], v5 = p[5 * sk], v6 = p[6 * sk], v7 = p[7 * sk];
    mpqr_add(st, v0); mpqr_add(st, v1); mpqr_add(st, v2); mpqr_add(st, v3);
    mpqr_add(st, v4); mpqr_add(st, v5); mpqr_add(st, v6); mpqr_add(st, v7);
  }
  for (; t < k1; ++t, p += sk) mpqr_add(st, p[0]);
  const long long o = (long long)blockIdx.y * L + l;
  pmax[o] = st.mx; psum[o] = st.s; pnnz[o] = st.nnz; pbad[o] = st.bad;
}

// Lines along the contiguous axis: warp = line (lane t reads elements t, t+32, ...),
// blockIdx.y = chunk of the line; lanes combined by a fixed shuffle tree.
extern "C" __global__ void __launch_bounds__(256) mpqr_ozaki_stats_along(
    const double* __restrict__ x, long long L, long long K, long long sl, long long sk,
    long long chunk, double* pmax, double* psum, long long* pnnz, int* pbad)
{
  const int lane = threadIdx.x & 31;
  const long long l = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const long long k0 = (long long)blockIdx.y * chunk;
  const long long k1 = k0 + chunk < K ? k0 + chunk : K;
  MpqrStats st;
  mpqr_init(st);
  if (l < L) {  // uniform per warp: every lane reaches the shuffles below
    const long long s32 = 32 * sk;
    const double* p = x + l * sl + (k0 + lane) * sk;
    long long t = k0 + lane;
    for (; t + 96 < k1; t += 128, p += 4 * s32) {
      const double v0 = p[0], v1 = p[s32], v2 = p[2 * s32], v3 = p[3 * s32];
      mpqr_add(st, v0); mpqr_add(st, v1); mpqr_add(st, v2); mpqr_add(st, v3);
    }
    for (; t < k1; t += 32, p += s32) mpqr_add(st, p[0]);
  }
  double mx = st.mx, s = st.s;
  long long nnz = st.nnz;
  int bad = st.bad;
  for (int off = 16; off > 0; off >>= 1) {
    const double mx2 = __shfl_down_sync(0xffffffffu, mx, off);
    const double s2 = __shfl_down_sync(0xffffffffu, s, off);
    nnz += __shfl_down_sync(0xffffffffu, nnz, off);
    bad |= __shfl_down_sync(0xffffffffu, bad, off);
    mpqr_merge(mx, s, mx2, s2);
  }
  if (l < L && lane == 0) {
    const long long o = (long long)blockIdx.y * L + l;
    pmax[o] = mx; psum[o] = s; pnnz[o] = nnz; pbad[o] = bad;
  }
}

// Chunk partials (nchunks, L) -> per line e, bad, sum |x| 2^-e, nnz (chunks in order).
extern "C" __global__ void mpqr_ozaki_stats_combine(
    const double* pmax, const double* psum, const long long* pnnz, const int* pbad,
    long long L, int nchunks, int* e, bool* bad, double* rel, double* nnz)
{
  const long long l = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (l >= L) return;
  double mx = 0.0, s = 0.0;
  long long cnt = 0;
  int b = 0;
  for (int c = 0; c < nchunks; ++c) {
    const long long o = (long long)c * L + l;
    mpqr_merge(mx, s, pmax[o], psum[o]);
    cnt += pnnz[o];
    b |= pbad[o];
  }
  e[l] = mx > 0.0 ? mpqr_expo(mx) : 0;
  bad[l] = b != 0;
  rel[l] = s;
  nnz[l] = (double)cnt;
}
"""


@functools.cache
def _stats_module():
    return cp.RawModule(code=_STATS_SRC, options=_OPTS)


def line_stats(x, axis):
    """``(e, bad, rel_sum, nnz)`` per line along ``axis`` (see ``ozaki.line_stats``),
    in one read of ``x`` whatever its strides (no transposing copy)."""
    if x.dtype != cp.float64:
        x = x.astype(cp.float64)
    axis %= 2
    n_lines, length = x.shape[1 - axis], x.shape[axis]
    sl, sk = x.strides[1 - axis] // 8, x.strides[axis] // 8
    if n_lines == 0 or length == 0:
        return (cp.zeros(n_lines, cp.int32), cp.zeros(n_lines, cp.bool_),
                cp.zeros(n_lines, cp.float64), cp.zeros(n_lines, cp.float64))
    mod = _stats_module()
    if n_lines > 1 and abs(sl) < abs(sk):
        name, per_line, min_chunk = "mpqr_ozaki_stats_across", 1, 64
        block = min(_BLOCK, 32 * -(-n_lines // 32))
        lines_per_block = block
    else:
        name, per_line, min_chunk = "mpqr_ozaki_stats_along", 32, 256
        lines_per_block = min(8, n_lines)
        block = 32 * lines_per_block
    nch = max(1, min(65535, -(-_STAT_THREADS // (per_line * n_lines)), -(-length // min_chunk)))
    chunk = -(-length // nch)
    nch = -(-length // chunk)
    pmax = cp.empty((nch, n_lines), dtype=cp.float64)
    psum = cp.empty((nch, n_lines), dtype=cp.float64)
    pnnz = cp.empty((nch, n_lines), dtype=cp.int64)
    pbad = cp.empty((nch, n_lines), dtype=cp.int32)
    mod.get_function(name)(
        (-(-n_lines // lines_per_block), nch), (block,),
        (x, cp.int64(n_lines), cp.int64(length), cp.int64(sl), cp.int64(sk), cp.int64(chunk),
         pmax, psum, pnnz, pbad))
    e = cp.empty(n_lines, dtype=cp.int32)
    bad = cp.empty(n_lines, dtype=cp.bool_)
    rel = cp.empty(n_lines, dtype=cp.float64)
    nnz = cp.empty(n_lines, dtype=cp.float64)
    mod.get_function("mpqr_ozaki_stats_combine")(
        (-(-n_lines // _BLOCK),), (_BLOCK,),
        (pmax, psum, pnnz, pbad, cp.int64(n_lines), cp.int32(nch), e, bad, rel, nnz))
    return e, bad, rel, nnz


# --- residues ---------------------------------------------------------------------

def _residue_body(moduli: tuple[int, ...]) -> str:
    """Statements storing the residues of the integers v0..v3 (doubles) modulo each
    modulus, packed little-endian (v0 in the low byte), at ``dst[l * plane4]``."""
    lines = []
    for q in range(4):  # v = a 2^31 + b, |b| <= 2^30 (exact)
        lines.append(f"const double a{q} = rint(__dmul_rn(v{q}, 0x1p-31));")
        lines.append(f"const double b{q} = fma(-a{q}, 0x1p+31, v{q});")
    lines.append("unsigned int r0, r1, r2, r3;")
    for l, p in enumerate(moduli):
        if p != 256 and p % 2 == 0:
            raise ValueError(f"internal: the residue kernel takes 256 and odd moduli, got {p}")
        if not 2 < p <= 256:
            raise ValueError(f"internal: modulus {p} out of range")
        for q in range(4):
            if p == 256:  # 2^31 = 0 mod 256: the low byte of b
                lines.append(f"r{q} = (unsigned int)__double2loint(__dadd_rn(b{q}, {_MAGIC}));")
                continue
            c = float((1 << 31) % p).hex()
            lines.append(
                f"{{ const double w = fma(a{q}, {c}, b{q});"  # = v mod p, |w| < 2^40
                f" const double t = __dsub_rn(fma(w, {(1.0 / p).hex()}, {_MAGIC}), {_MAGIC});"
                f" r{q} = (unsigned int)__double2loint("
                f"fma(-t, {float(p).hex()}, __dadd_rn(w, {_MAGIC}))); }}")
        lines.append(f"dst[{l}LL * plane4] = __byte_perm(__byte_perm(r0, r1, 0x0040u),"
                     " __byte_perm(r2, r3, 0x0040u), 0x5410u);")
    return "\n        ".join(lines)


_LOAD = "{{ const double t = {src}; if (isfinite(t)) v{q} = rint(ldexp(t, sh)); }}"


def _residue_source(moduli: tuple[int, ...]) -> str:
    body = _residue_body(moduli)
    rows_loads = "\n        ".join(
        f"if (j + {q} < cols) " + _LOAD.format(src=f"p[{q} * s1]", q=q) for q in range(4))
    return f"""
// x' with unit stride along its columns: a power-of-two number of threads per row,
// each thread four consecutive columns (one packed 32-bit store per modulus).
extern "C" __global__ void __launch_bounds__(256) mpqr_ozaki_residues_rows(
    const double* __restrict__ x, long long s0, long long s1, const int* __restrict__ shift,
    int rows, int cols, int rows_p, int cols_p, unsigned int* __restrict__ out,
    long long plane4, int lg_tpr)
{{
  const int tpr = 1 << lg_tpr, rpb = 256 >> lg_tpr, ng = cols_p >> 2;
  for (long long i = (long long)blockIdx.x * rpb + (threadIdx.x >> lg_tpr); i < rows_p;
       i += (long long)gridDim.x * rpb) {{
    const bool in_i = i < rows;
    const int sh = in_i ? shift[i] : 0;
    for (int g = threadIdx.x & (tpr - 1); g < ng; g += tpr) {{
      double v0 = 0.0, v1 = 0.0, v2 = 0.0, v3 = 0.0;
      const int j = 4 * g;
      if (in_i) {{
        const double* p = x + i * s0 + (long long)j * s1;
        {rows_loads}
      }}
      unsigned int* dst = out + i * ng + g;
      {{
        {body}
      }}
    }}
  }}
}}

// x' with unit stride along its rows (B read through its transpose): 64x64 tiles,
// read along the rows of x' into shared memory, written along its columns. Tile
// column jj = 4g + q is kept at q * 16 + g: both phases are free of bank conflicts.
extern "C" __global__ void __launch_bounds__(256, 4) mpqr_ozaki_residues_tile(
    const double* __restrict__ x, long long s0, long long s1, const int* __restrict__ shift,
    int rows, int cols, int rows_p, int cols_p, unsigned int* __restrict__ out,
    long long plane4)
{{
  __shared__ double tile[64][65];
  const int ng = cols_p >> 2, j0 = blockIdx.x * 64;
  const int ti = threadIdx.x & 63, tq = threadIdx.x >> 6;
  const int ntiles = (rows_p + 63) >> 6;
  for (int bi = blockIdx.y; bi < ntiles; bi += gridDim.y) {{
    const int i0 = bi * 64;
    {{
      const int i = i0 + ti;
      const bool in_i = i < rows;
      const int sh = in_i ? shift[i] : 0;
      const double* p = x + (long long)i * s0 + (long long)(j0 + tq) * s1;
      const long long s4 = 4 * s1;
      double t[16];
#pragma unroll
      for (int r = 0; r < 16; ++r)  // tile column tq + 4r: all loads first
        t[r] = (in_i && j0 + tq + 4 * r < cols) ? p[r * s4] : 0.0;
#pragma unroll
      for (int r = 0; r < 16; ++r)
        tile[ti][tq * 16 + r] = isfinite(t[r]) ? rint(ldexp(t[r], sh)) : 0.0;
    }}
    __syncthreads();
    for (int w = threadIdx.x; w < 64 * 16; w += 256) {{
      const int ii = w >> 4, g = w & 15;
      const int i = i0 + ii, gg = (j0 >> 2) + g;
      if (i < rows_p && gg < ng) {{
        const double v0 = tile[ii][g], v1 = tile[ii][16 + g], v2 = tile[ii][32 + g],
                     v3 = tile[ii][48 + g];
        unsigned int* dst = out + (long long)i * ng + gg;
        {body}
      }}
    }}
    __syncthreads();
  }}
}}
"""


@functools.cache
def _residue_module(moduli: tuple[int, ...]):
    return cp.RawModule(code=_residue_source(moduli), options=_OPTS)


def residues(x, shift, moduli, *, transpose, rows_p, cols_p):
    """int8 residue planes (N, rows_p, cols_p) of round(x' 2^shift); x' = x.T if transpose."""
    if x.dtype != cp.float64:
        x = x.astype(cp.float64)
    s0, s1 = (s // 8 for s in x.strides)
    rows, cols = x.shape
    if transpose:
        rows, cols, s0, s1 = cols, rows, s1, s0
    shift = cp.ascontiguousarray(shift, dtype=cp.int32)
    cols_4 = -(-cols_p // 4) * 4  # whole 32-bit words per row (the engine pads to 16)
    out = cp.empty((len(moduli), rows_p, cols_4), dtype=cp.int8)
    if out.size:
        mod = _residue_module(tuple(moduli))
        args = (x, cp.int64(s0), cp.int64(s1), shift, cp.int32(rows), cp.int32(cols),
                cp.int32(rows_p), cp.int32(cols_4), out, cp.int64(rows_p * cols_4 // 4))
        if rows > 1 and abs(s0) < abs(s1):
            grid = (-(-cols_4 // 64), min(-(-rows_p // 64), 65535))
            mod.get_function("mpqr_ozaki_residues_tile")(grid, (_BLOCK,), args)
        else:
            lg = _lg_tpr(cols_4 // 4)
            grid = (max(1, min(-(-rows_p // (_BLOCK >> lg)), 1 << 20)),)
            mod.get_function("mpqr_ozaki_residues_rows")(grid, (_BLOCK,), (*args, cp.int32(lg)))
    return out if cols_4 == cols_p else cp.ascontiguousarray(out[:, :, :cols_p])


# --- reconstruction -----------------------------------------------------------------

def _reconstruct_source(moduli: tuple[int, ...]) -> str:
    from mpqr.engines.ozaki_crt import crt_constants_for

    c = crt_constants_for(tuple(moduli))
    n_limbs = len(c.shifts)
    lines = [f"double s[{n_limbs}] = {{{', '.join(['0.0'] * n_limbs)}}};"]
    for l, p in enumerate(c.moduli):
        lines.append(f"{{ int v = prods[{l}LL * plane + off] % {p}; if (v < 0) v += {p};"
                     " const double u = (double)v;")
        for r in range(n_limbs):
            lines.append(f"  s[{r}] += {c.weights[l][r].hex()} * u;")
        lines.append("}")
    head = "s[0] + s[1]" if n_limbs > 1 else "s[0]"
    lines.append(f"const double q = rint(({head}) / {c.p_float.hex()});")
    for r in range(n_limbs):
        lines.append(f"s[{r}] -= q * {c.p_limbs[r].hex()};")
    for r in range(n_limbs - 1, 0, -1):
        unit = (2.0 ** c.shifts[r - 1]).hex()
        lines.append(f"{{ const double cr = rint(s[{r}] / {unit}) * {unit};"
                     f" s[{r}] -= cr; s[{r - 1}] += cr; }}")
    lines.append(f"double acc = s[{n_limbs - 1}];")
    for r in range(n_limbs - 2, -1, -1):
        lines.append(f"acc = s[{r}] + acc;")
    body = "\n            ".join(lines)
    return f"""
// a power-of-two number of threads per output row; consecutive threads, consecutive
// columns (coalesced int32 reads of every plane and float64 writes)
extern "C" __global__ void __launch_bounds__(256) mpqr_ozaki_reconstruct(
    const int* __restrict__ prods, long long plane, int ldp, const int* __restrict__ rs,
    const int* __restrict__ cs, int m, int n, double* __restrict__ out, long long ldo,
    int lg_tpr)
{{
    const int tpr = 1 << lg_tpr, rpb = 256 >> lg_tpr;
    for (long long i = (long long)blockIdx.x * rpb + (threadIdx.x >> lg_tpr); i < m;
         i += (long long)gridDim.x * rpb) {{
        const int ri = rs[i];
        for (int j = threadIdx.x & (tpr - 1); j < n; j += tpr) {{
            const long long off = i * ldp + j;
            {body}
            out[i * ldo + j] = ldexp(acc, -(ri + cs[j]));
        }}
    }}
}}
"""


@functools.cache
def _reconstruct_kernel(moduli: tuple[int, ...]):
    # exact limb arithmetic: no FMA contraction changes it, but keep it explicit
    return cp.RawKernel(_reconstruct_source(moduli), "mpqr_ozaki_reconstruct", options=_OPTS)


def _moduli_key(moduli):
    """The moduli tuple (an int ``N``: the first N of ``MODULI``, as the engine used to pass)."""
    from mpqr.engines.ozaki_crt import MODULI

    return MODULI[:moduli] if isinstance(moduli, int) else tuple(moduli)


def reconstruct(prods, moduli, row_shift, col_shift, m, n, out=None):
    """float64 (m, n) from the int32 product planes (N, mp, np) (see the module docstring),
    written into ``out`` (an (m, n) float64 array, e.g. a block of a larger C) if given."""
    prods = cp.ascontiguousarray(prods)
    _, mp, np_ = prods.shape
    if out is None:
        out = cp.empty((m, n), dtype=cp.float64)
    elif out.shape != (m, n) or out.dtype != cp.float64:
        raise ValueError(f"internal: reconstruct out must be float64 {(m, n)}, "
                         f"got {out.dtype} {out.shape}")
    if m == 0 or n == 0:
        return out
    # the kernel writes rows of unit stride at any (non-negative) row pitch
    direct = (out.strides[1] == 8 or n == 1) and out.strides[0] % 8 == 0 and \
        (out.strides[0] >= 8 * n or m == 1)
    dst = out if direct else cp.empty((m, n), dtype=cp.float64)
    rs = cp.ascontiguousarray(row_shift, dtype=cp.int32)
    cs = cp.ascontiguousarray(col_shift, dtype=cp.int32)
    lg = _lg_tpr(n)
    grid = (max(1, min(-(-m // (_BLOCK >> lg)), 1 << 20)),)
    _reconstruct_kernel(_moduli_key(moduli))(
        grid, (_BLOCK,),
        (prods, cp.int64(mp * np_), cp.int32(np_), rs, cs, cp.int32(m), cp.int32(n), dst,
         cp.int64(dst.strides[0] // 8), cp.int32(lg)))
    if dst is not out:
        out[...] = dst
    return out


# --- the 2M complex product (mpqr/engines/ozaki_complex.py) ---------------------------

@functools.cache
def _gauss_residue_kernel():
    # |re +- j im| < 2^15: int arithmetic is exact; symmetric residues of odd p fit int8
    # (``i`` is CuPy's loop index: not a parameter name)
    return cp.ElementwiseKernel(
        "int8 re, int8 im, int32 j, int32 p", "int8 up, int8 um",
        """
        const int h = (p - 1) >> 1;
        int u = ((int)re + j * (int)im) % p;
        if (u < 0) u += p;
        up = (signed char)(u > h ? u - p : u);
        u = ((int)re - j * (int)im) % p;
        if (u < 0) u += p;
        um = (signed char)(u > h ? u - p : u);
        """, "mpqr_ozaki_gauss_residues")


def gauss_residues(rr, ri, moduli, js):
    """(2N, R, C) int8: the residues of Xr + j Xi, then of Xr - j Xi (as the generic path)."""
    nt = len(moduli)
    out = cp.empty((2 * nt, *rr.shape[1:]), dtype=cp.int8)
    p = cp.asarray(moduli, dtype=cp.int32).reshape(-1, 1, 1)
    j = cp.asarray(js, dtype=cp.int32).reshape(-1, 1, 1)
    _gauss_residue_kernel()(rr, ri, j, p, out[:nt], out[nt:])
    return out


@functools.cache
def _gauss_combine_kernel():
    return cp.ElementwiseKernel(
        "int32 xp, int32 xm, int32 p, int32 inv2, int32 inv2j", "int32 cr, int32 ci",
        """
        int a = xp % p; if (a < 0) a += p;
        int b = xm % p; if (b < 0) b += p;
        cr = ((a + b) * inv2) % p;
        ci = ((a - b + p) * inv2j) % p;
        """, "mpqr_ozaki_gauss_combine")


def gauss_combine(prods, moduli, js):
    """(Cr, Ci) residue planes in [0, p) from the 2N product planes (as the generic path)."""
    nt = len(moduli)
    shape = (-1, 1, 1)
    p = cp.asarray(moduli, dtype=cp.int32).reshape(shape)
    inv2 = cp.asarray([pow(2, -1, q) for q in moduli], dtype=cp.int32).reshape(shape)
    inv2j = cp.asarray([pow(2 * jj, -1, q) for jj, q in zip(js, moduli)],
                       dtype=cp.int32).reshape(shape)
    cr = cp.empty((nt, *prods.shape[1:]), dtype=cp.int32)
    ci = cp.empty_like(cr)
    _gauss_combine_kernel()(prods[:nt], prods[nt:], p, inv2, inv2j, cr, ci)
    return cr, ci
