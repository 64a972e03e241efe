"""``tc-fp16``: FP16 inputs, FP32 accumulation (the FP16 tensor-core GEMM).

Rows of A and columns of B are scaled by exact powers of two so that their
largest finite entry lies in [2^14, 2^15): nothing overflows fp16's 65504 and
fp32 inputs as small as 1e-38 or as large as 3e38 keep fp16's 11 significant
bits. Error bound (elementwise, for entries within 2^-24 of their row/column
maximum): |C - AB| <= (2 u16 + u16^2 + k u32) |A||B| with u16 = 2^-11,
u32 = 2^-24 (round-to-nearest inputs; fp32 accumulation).
"""

from __future__ import annotations

from typing import Any

from mpqr.engines.scaling import pow2_shift, unscale

__all__ = ["FP16_TARGET_EXP", "run_tc_fp16"]

FP16_TARGET_EXP = 14


def run_tc_fp16(backend: Any, a: Any, b: Any, *, out_dtype: Any) -> Any:
    xp = backend.xp
    sa = pow2_shift(backend, a, axis=-1, target=FP16_TARGET_EXP)
    sb = pow2_shift(backend, b, axis=-2, target=FP16_TARGET_EXP)
    a16 = backend.empty_for(a, a.shape, xp.float16)
    b16 = backend.empty_for(b, b.shape, xp.float16)
    backend.split_fp16(a, sa, a16)
    backend.split_fp16(b, sb, b16)
    return unscale(backend, backend.gemm_fp16(a16, b16), sa, sb, out_dtype)
