"""Fused CuPy kernels of the INT8 Ozaki engine (see mpqr/engines/ozaki.py).

* ``residues``: one read of the float64 operand (any strides, so B is read
  through its transpose without a copy) writes all N int8 residue planes,
  zero-padded to the 16-multiples cuBLAS int8 GEMMs like. Residues are exact:
  ``q = rint(v / p)``, ``r = fma(-q, p, v)`` is exact because ``v - q p`` is an
  integer below 2^11, then one more small exact reduction.
* ``reconstruct``: one read of the N int32 product planes, the exact limb CRT
  sum, carries, faithful rounding and the power-of-two unscaling, one write.
The moduli and CRT constants are compiled in as literals (hex floats, exact),
so the divisions by constants become multiply-high sequences. Every operation
matches the generic Array-API path bit for bit (exact arithmetic, same
rounding of the final sums), so CPU and GPU results are identical.
"""

from __future__ import annotations

import functools

import cupy as cp

__all__ = ["line_stats", "reconstruct", "residues"]

_BLOCK = 256


def _grid(total: int) -> int:
    return max(1, min(-(-total // _BLOCK), 1 << 20))


@functools.cache
def _residue_kernel(moduli: tuple[int, ...]):
    body = []
    for l, p in enumerate(moduli):
        body.append(f"""
        {{
            const double p = {float(p).hex()}, ip = {(1.0 / p).hex()};
            double q = rint(v * ip);
            double r = fma(-q, p, v);
            r = fma(-rint(r * ip), p, r);
            if (r > 127.0) r -= p;
            if (r < -128.0) r += p;
            out[{l}LL * plane + idx] = (signed char)(int)r;
        }}""")
    src = f"""
extern "C" __global__ void mpqr_ozaki_residues(
    const double* x, long long s0, long long s1, const int* shift, int rows, int cols,
    int rows_p, int cols_p, signed char* out, long long plane)
{{
    const long long total = (long long)rows_p * cols_p;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * blockDim.x) {{
        const int i = (int)(idx / cols_p), j = (int)(idx % cols_p);
        double v = 0.0;
        if (i < rows && j < cols) {{
            const double xv = x[i * s0 + j * s1];
            if (isfinite(xv)) v = rint(ldexp(xv, shift[i]));
        }}
        {''.join(body)}
    }}
}}
"""
    return cp.RawKernel(src, "mpqr_ozaki_residues")


def residues(x, shift, moduli, *, transpose, rows_p, cols_p):
    """int8 residue planes (N, rows_p, cols_p) of round(x' 2^shift); x' = x.T if transpose."""
    if x.dtype != cp.float64:
        x = x.astype(cp.float64)
    s0, s1 = (s // 8 for s in x.strides)
    rows, cols = x.shape
    if transpose:
        rows, cols, s0, s1 = cols, rows, s1, s0
    shift = cp.ascontiguousarray(shift, dtype=cp.int32)
    out = cp.empty((len(moduli), rows_p, cols_p), dtype=cp.int8)
    total = rows_p * cols_p
    _residue_kernel(tuple(moduli))(
        (_grid(total),), (_BLOCK,),
        (x, cp.int64(s0), cp.int64(s1), shift, cp.int32(rows), cp.int32(cols),
         cp.int32(rows_p), cp.int32(cols_p), out, cp.int64(total)))
    return out


@functools.cache
def _reconstruct_kernel(n_terms: int):
    from mpqr.engines.ozaki_crt import crt_constants

    c = crt_constants(n_terms)
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
    body = "\n        ".join(lines)
    src = f"""
extern "C" __global__ void mpqr_ozaki_reconstruct(
    const int* prods, long long plane, int ldp, const int* rs, const int* cs, int m, int n,
    double* out)
{{
    const long long total = (long long)m * n;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * blockDim.x) {{
        const int i = (int)(idx / n), j = (int)(idx % n);
        const long long off = (long long)i * ldp + j;
        {body}
        out[idx] = ldexp(acc, -(rs[i] + cs[j]));
    }}
}}
"""
    # exact limb arithmetic: no FMA contraction changes it, but keep it explicit
    return cp.RawKernel(src, "mpqr_ozaki_reconstruct", options=("--fmad=false",))


def reconstruct(prods, n_terms, row_shift, col_shift, m, n):
    """float64 (m, n) from the int32 product planes (N, mp, np) (see the module docstring)."""
    prods = cp.ascontiguousarray(prods)
    _, mp, np_ = prods.shape
    out = cp.empty((m, n), dtype=cp.float64)
    rs = cp.ascontiguousarray(row_shift, dtype=cp.int32)
    cs = cp.ascontiguousarray(col_shift, dtype=cp.int32)
    _reconstruct_kernel(n_terms)(
        (_grid(m * n),), (_BLOCK,),
        (prods, cp.int64(mp * np_), cp.int32(np_), rs, cs, cp.int32(m), cp.int32(n), out))
    return out


@functools.cache
def _stat_kernels():
    # one pass each, no temporaries (the portable version makes ~10 passes over x)
    rel = cp.ReductionKernel(
        "T x, int32 e", "float64 y",
        "isfinite((double)x) ? ldexp(fabs((double)x), -e) : 0.0", "a + b", "y = a", "0",
        "mpqr_ozaki_relsum")
    nnz = cp.ReductionKernel(
        "T x", "float64 y", "(isfinite((double)x) && x != 0) ? 1.0 : 0.0", "a + b", "y = a",
        "0", "mpqr_ozaki_nnz")
    bad = cp.ReductionKernel("T x", "bool y", "!isfinite((double)x)", "a || b", "y = a",
                             "false", "mpqr_ozaki_bad")
    return rel, nnz, bad


def line_stats(backend, x, axis):
    """``(e, bad, rel_sum, nnz)`` per line along ``axis`` (see ``ozaki.line_stats``).

    Four reductions along a contiguous axis; a strided axis is first made contiguous
    by one transposing copy (CuPy reduces strided axes uncoalesced).
    """
    axis %= 2
    if x.strides[axis] != x.itemsize and x.shape[axis] > 1:
        x = cp.ascontiguousarray(x.T if axis == 0 else x)
        axis = 1 if x.strides[1] == x.itemsize else axis
    rel, nnz, bad = _stat_kernels()
    e = backend.exponent(backend.max_abs_finite(x, axis))  # keepdims
    return (e.reshape(-1), bad(x, axis=axis), rel(x, e, axis=axis), nnz(x, axis=axis))
