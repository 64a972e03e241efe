"""Fused CuPy kernels for the tensor-core GEMM engines.

Conversion passes are memory-bound, so each does one read of its input:
``max_abs_finite`` (row/column scale, a reduction), ``split_fp16`` (scale +
fp16 hi/lo split, writing every part in one pass) and ``unscale`` (fp32
accumulator to the output dtype with the exact power-of-two unscaling).
Arithmetic is done in double so that ``ldexp`` is exact for float32 and
float64 inputs alike; the hi part of a float64 input is rounded
double -> float -> half, which differs from a direct rounding only for values
within 2^-29 relative of a half-way point, and the exactly computed residual
absorbs that difference.
"""

from __future__ import annotations

import functools

import cupy as cp

__all__ = ["max_abs_finite", "split_fp16", "unscale"]


@functools.cache
def _max_abs_finite_kernel():
    return cp.ReductionKernel(
        "T x", "T y", "isfinite(x) ? abs(x) : T(0)", "max(a, b)", "y = a", "0",
        "mpqr_max_abs_finite",
    )


@functools.cache
def _split_kernels():
    hi_only = cp.ElementwiseKernel(
        "T x, int32 s", "float16 hi",
        "hi = (float)ldexp((double)x, s);",
        "mpqr_scale_fp16",
    )
    split3 = cp.ElementwiseKernel(
        "T x, int32 s, int32 lo_shift", "float16 hi, float16 hf, float16 lo",
        """
        double y = ldexp((double)x, s);
        hi = (float)y;
        float h = (float)hi;
        bool fin = isfinite(h);
        hf = fin ? h : 0.0f;
        lo = fin ? (float)ldexp(y - (double)h, lo_shift) : 0.0f;
        """,
        "mpqr_split_fp16",
    )
    return hi_only, split3


@functools.cache
def _unscale_kernel():
    return cp.ElementwiseKernel(
        "float32 c, int32 r, int32 s", "T out",
        "out = (T)ldexp((double)c, -(r + s));",
        "mpqr_unscale",
    )


def max_abs_finite(x, axis):
    return _max_abs_finite_kernel()(x, axis=axis, keepdims=True)


def split_fp16(x, shift, hi, hf=None, lo=None, lo_shift=11):
    hi_only, split3 = _split_kernels()
    if hf is None and lo is None:
        hi_only(x, shift, hi)
        return
    if hf is None or lo is None:
        raise ValueError("internal: split_fp16 writes hf and lo together")
    split3(x, shift, lo_shift, hi, hf, lo)


def unscale(c, row_shift, col_shift, out_dtype):
    out = cp.empty(c.shape, dtype=out_dtype)
    _unscale_kernel()(c, row_shift, col_shift, out)
    return out
