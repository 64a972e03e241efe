"""Native GEMMs: the library's own FP32/FP64 (or complex) GEMM, no tricks.

float64 operands multiplied in FP32 (``precision="fp32"`` on float64 data) are first
scaled by exact powers of two, rows of A and columns of B to unit magnitude, as the
tensor-core engines scale theirs (:mod:`mpqr.engines.scaling`): a plain cast would turn
entries beyond float32's range into Inf and entries below it into zero, a finite wrong
product. For data in float32's range the bits are those of the plain cast (a power of two
commutes with the rounding and the sums).
"""

from __future__ import annotations

from typing import Any

from mpqr.engines.scaling import pow2_shift, unscale

__all__ = ["run_native"]


def run_native(backend: Any, a: Any, b: Any, *, compute_dtype: Any, out_dtype: Any) -> Any:
    xp = backend.xp
    if compute_dtype == xp.float32 and xp.float64 in (a.dtype, b.dtype) \
            and out_dtype == xp.float64 and a.ndim == b.ndim == 2:
        sa = pow2_shift(backend, a, axis=-1, target=0)
        sb = pow2_shift(backend, b, axis=-2, target=0)
        a = xp.astype(backend.ldexp(a, sa), compute_dtype)
        b = xp.astype(backend.ldexp(b, sb), compute_dtype)
        return unscale(backend, backend.gemm(a, b), sa, sb, out_dtype)
    if a.dtype != compute_dtype:
        a = xp.astype(a, compute_dtype)
    if b.dtype != compute_dtype:
        b = xp.astype(b, compute_dtype)
    c = backend.gemm(a, b)
    return c if c.dtype == out_dtype else xp.astype(c, out_dtype)
