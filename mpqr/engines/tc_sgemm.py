"""``tc-sgemm``: FP32-accurate GEMM from FP16 tensor-core products.

Scheme (after Ootomo & Yokota, and Leng et al.'s TC-SGEMM):

1. Scale rows of A / columns of B by exact powers of two so the largest finite
   entry of each lies in [2^14, 2^15) (see :mod:`mpqr.engines.scaling`).
2. Split each scaled operand ``x = hi + lo * 2^-11`` with ``hi = fp16(x)`` and
   ``lo = fp16((x - hi) * 2^11)``: the residual ``x - hi`` is exact in the input
   precision, and the 2^11 factor keeps ``lo`` in fp16's normal range. Together
   hi and lo carry about 23 significant bits (fp32 has 24).
3. ``AB ~= hi_A hi_B + 2^-11 (hi_A lo_B + lo_A hi_B)``; the ``lo lo`` term is
   below fp32's rounding and is dropped.
4. Tensor cores accumulate inside one GEMM with truncation, not
   round-to-nearest, and that bias grows with k and defeats the compensation.
   So k is cut into slices of ``slice_k``; each slice's three products are
   added into an fp32 accumulator by the GEMM epilogue (``beta = 1``), which
   rounds to nearest. The slice length trades accuracy for speed and is
   chosen from measurements on the GPU (``bench/results``).
5. Convert to the output dtype and undo the scaling exactly.

NaN/Inf: the scale ignores non-finite entries, ``lo`` is 0 where ``hi`` is
not finite, and the correction products use ``hi`` with non-finite entries
zeroed (else ``inf * 0`` from an exactly representable partner would turn an
Inf into NaN). An Inf in A or B then gives the Inf/NaN pattern the native
GEMM gives, in exactly the outputs it touches.
"""

from __future__ import annotations

from typing import Any

from mpqr._array_api import device
from mpqr.engines.scaling import pow2_shift, unscale
from mpqr.engines.tc_fp16 import FP16_TARGET_EXP

__all__ = ["LO_SHIFT", "run_tc_sgemm", "split_hi_lo"]

LO_SHIFT = 11


def split_hi_lo(backend: Any, x: Any) -> tuple[Any, Any, Any]:
    """``(hi, lo, hi_finite)`` fp16 parts with ``x ~= hi + lo * 2**-LO_SHIFT``;
    ``hi_finite`` is ``hi`` with non-finite entries set to 0."""
    xp = backend.xp
    hi = backend.to_fp16(x)
    finite = xp.isfinite(hi)
    hi_f = xp.where(finite, hi, xp.zeros_like(hi))
    # exact: hi is x rounded to 11 bits (masking avoids inf - inf)
    resid = xp.where(finite, x, xp.zeros_like(x)) - xp.astype(hi_f, x.dtype)
    lo = backend.to_fp16(backend.ldexp(resid, xp.asarray(LO_SHIFT, dtype=xp.int32)))
    return hi, lo, hi_f


def run_tc_sgemm(backend: Any, a: Any, b: Any, *, out_dtype: Any, slice_k: int) -> Any:
    xp = backend.xp
    sa = pow2_shift(backend, a, axis=-1, target=FP16_TARGET_EXP)
    sb = pow2_shift(backend, b, axis=-2, target=FP16_TARGET_EXP)
    a_hi, a_lo, a_hf = split_hi_lo(backend, backend.ldexp(a, sa))
    b_hi, b_lo, b_hf = split_hi_lo(backend, backend.ldexp(b, sb))
    k = a.shape[-1]
    shape = (*a.shape[:-1], b.shape[-1])
    c = xp.zeros(shape, dtype=xp.float32, device=device(a))
    corr = 2.0**-LO_SHIFT
    for s in range(0, k, slice_k):
        e = min(k, s + slice_k)
        backend.gemm_fp16(a_hi[..., s:e], b_hi[..., s:e, :], out=c, alpha=1.0,
                          beta=0.0 if s == 0 else 1.0)
        backend.gemm_fp16(a_hf[..., s:e], b_lo[..., s:e, :], out=c, alpha=corr, beta=1.0)
        backend.gemm_fp16(a_lo[..., s:e], b_hf[..., s:e, :], out=c, alpha=corr, beta=1.0)
    return unscale(backend, xp.astype(c, out_dtype), sa, sb)

