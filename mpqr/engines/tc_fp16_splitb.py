"""``tc-fp16-splitb``: fp16 A, split-fp16 B — two FP16 tensor-core GEMMs.

For products whose left operand is already a matrix of fp16 numbers (the
Householder vectors of the fp16 QR, rounded once on purpose) and whose right
operand must not lose bits (the matrix being factored, or a block of W):

1. Scale rows of A / columns of B by exact powers of two (largest finite entry
   in [2^14, 2^15), :mod:`mpqr.engines.scaling`).
2. ``a16 = fp16(A)`` — exact when A holds fp16 numbers at this scaling;
   ``B = hi + lo * 2^-11`` with ``hi = fp16(B)``, ``lo = fp16((B - hi) 2^11)``
   (as in ``tc-sgemm``), about 22 significant bits.
3. ``C = a16 @ hi + 2^-11 (a16 @ lo)``: two FP16 GEMMs with FP32 accumulation,
   the second added by the GEMM epilogue (``beta = 1``).

Error bound (elementwise): ``|C - fp16(A) B| <= (2^-22 + k u32) |fp16(A)| |B|``
(roughly) — the product of the rounded A with the *unrounded* B to fp32-level
accuracy, at 2x the tensor-core flops of ``tc-fp16``. Only the rounding of A
remains, which is why the QR rounds its reflectors once and rebuilds their
``T`` factor from the rounded vectors (:mod:`mpqr.qr.householder_recursive`).

A float16 A is used as it is (shift 0, no pass); a float16 B is widened first (its low
part is zero).

NaN/Inf: ``lo`` is 0 where ``hi`` is not finite and the ``lo`` product uses A
with non-finite entries zeroed, so Inf and NaN land where ``tc-fp16`` puts them.
"""

from __future__ import annotations

from typing import Any

from mpqr.engines.scaling import pow2_shift, unscale
from mpqr.engines.tc_fp16 import FP16_TARGET_EXP, fp16_operand
from mpqr.engines.tc_sgemm import LO_SHIFT

__all__ = ["run_tc_fp16_splitb"]


def run_tc_fp16_splitb(backend: Any, a: Any, b: Any, *, out_dtype: Any) -> Any:
    xp = backend.xp
    if b.dtype == xp.float16:
        b = xp.astype(b, out_dtype)
    sb = pow2_shift(backend, b, axis=-2, target=FP16_TARGET_EXP)
    if a.dtype == xp.float16:
        sa, a16 = fp16_operand(backend, a, -1)
        a16f = backend.finite_or_zero(a16)
    else:
        sa = pow2_shift(backend, a, axis=-1, target=FP16_TARGET_EXP)
        a16 = backend.empty_for(a, a.shape, xp.float16)
        a16f = backend.empty_for(a, a.shape, xp.float16)
        scratch = backend.empty_for(a, a.shape, xp.float16)  # A's residual: not used
        backend.split_fp16(a, sa, a16, hf=a16f, lo=scratch, lo_shift=LO_SHIFT)
        del scratch
    b_hi = backend.empty_for(b, b.shape, xp.float16)
    b_hf = backend.empty_for(b, b.shape, xp.float16)
    b_lo = backend.empty_for(b, b.shape, xp.float16)
    backend.split_fp16(b, sb, b_hi, hf=b_hf, lo=b_lo, lo_shift=LO_SHIFT)
    del b_hf
    c = backend.gemm_fp16(a16, b_hi)
    backend.gemm_fp16(a16f, b_lo, out=c, alpha=2.0**-LO_SHIFT, beta=1.0)
    return unscale(backend, c, sa, sb, out_dtype)
