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
   round-to-nearest; for long k the bias defeats the compensation. Only the
   ``hi hi`` term is large enough for that to matter: the correction terms are
   2^-11 smaller, so their truncation error is 2^-11 below fp32's rounding.
   Hence the corrections run as ONE GEMM over the whole k (operands
   concatenated along k: ``[hi_A | lo_A] @ [lo_B ; hi_B]``), and ``hi hi`` is
   cut into k-slices of ``slice_k`` whose partial products are added with
   round-to-nearest in fp32, outside the tensor cores: by the GEMM epilogue
   (``beta = 1``) one slice at a time, or, when ``m n`` is small, as one
   strided-batched GEMM into per-slice partials that are then summed.
   The slice length trades accuracy for speed; its default comes from
   measurements on the GPU (``bench/results``).
5. Convert to the output dtype and undo the scaling exactly.

Range: each entry keeps ~23 bits relative to itself while it lies within
2^-28 of its row's (A) or column's (B) largest entry; smaller entries fall into
fp16's subnormals. A product of a matrix graded along k by more than that with
an inversely graded one is therefore less accurate than native SGEMM, which is
why ``precision="auto"`` never picks this engine.

NaN/Inf: the scale ignores non-finite entries, ``lo`` is 0 where ``hi`` is
not finite, and the correction product uses ``hi`` with non-finite entries
zeroed (else ``inf * 0`` from an exactly representable partner would turn an
Inf into NaN). An Inf in A or B then gives the Inf/NaN pattern the native
GEMM gives, in exactly the outputs it touches.
"""

from __future__ import annotations

from typing import Any

from mpqr.engines.scaling import pow2_shift, unscale
from mpqr.engines.tc_fp16 import FP16_TARGET_EXP

__all__ = ["BATCHED_PARTIALS_BYTES", "LO_SHIFT", "PARTIALS_SHARE", "partials_limit",
           "run_tc_sgemm", "split_product"]

LO_SHIFT = 11
#: per-slice partial products are batched in groups of at most this many bytes
BATCHED_PARTIALS_BYTES = 256 * 2**20
#: under a workspace limit the partials take this share of it (the operands' splits and
#: the product the rest: the policy's tiles are sized to that); 256 MiB of partials
#: were 0.25x a 16384^2 float32 input beside the lean plan's 0.2x cap
PARTIALS_SHARE = 0.25


def partials_limit(workspace_limit: int | None) -> int:
    """Bytes of the slices' batched partial products under ``workspace_limit``."""
    if workspace_limit is None:
        return BATCHED_PARTIALS_BYTES
    return min(BATCHED_PARTIALS_BYTES, int(PARTIALS_SHARE * workspace_limit))


def run_tc_sgemm(backend: Any, a: Any, b: Any, *, out_dtype: Any, slice_k: int,
                 partials_bytes: int = BATCHED_PARTIALS_BYTES) -> Any:
    xp = backend.xp
    *batch, m, k = a.shape
    n = b.shape[-1]
    sa = pow2_shift(backend, a, axis=-1, target=FP16_TARGET_EXP)
    sb = pow2_shift(backend, b, axis=-2, target=FP16_TARGET_EXP)
    a_hi = backend.empty_for(a, a.shape, xp.float16)
    b_hi = backend.empty_for(b, b.shape, xp.float16)
    a_cat = backend.empty_for(a, (*batch, m, 2 * k), xp.float16)  # [hi_f | lo]
    b_cat = backend.empty_for(b, (*batch, 2 * k, n), xp.float16)  # [lo ; hi_f]
    backend.split_fp16(a, sa, a_hi, hf=a_cat[..., :k], lo=a_cat[..., k:], lo_shift=LO_SHIFT)
    backend.split_fp16(b, sb, b_hi, hf=b_cat[..., k:, :], lo=b_cat[..., :k, :],
                       lo_shift=LO_SHIFT)
    c = split_product(backend, a_hi, a_cat, b_hi, b_cat, slice_k=slice_k,
                      partials_bytes=partials_bytes)
    return unscale(backend, c, sa, sb, out_dtype)


def split_product(backend: Any, a_hi: Any, a_cat: Any, b_hi: Any, b_cat: Any, *,
                  slice_k: int, out: Any = None,
                  partials_bytes: int = BATCHED_PARTIALS_BYTES) -> Any:
    """Steps 3-4 on split operands: the float32 product of the scaled operands, written
    into ``out`` (a float32 view, e.g. a block of a Gram matrix) if given. The slices'
    partial products are batched in groups of at most ``partials_bytes`` bytes (a
    workspace limit lowers it: :func:`partials_limit`)."""
    xp = backend.xp
    *batch, m, k = a_hi.shape
    n = b_hi.shape[-1]
    if out is None:
        c = backend.gemm_fp16(a_cat, b_cat, alpha=2.0**-LO_SHIFT)
    else:
        c = backend.gemm_fp16(a_cat, b_cat, out=out, alpha=2.0**-LO_SHIFT, beta=0.0)
    nfull = k // slice_k
    group = partials_bytes // max(1, m * n * 4)
    start = 0
    if not batch and nfull > 1 and group > 1:
        # few outputs, long k: the slices run as strided-batched GEMMs into
        # partials (at most `group` at a time), each group summed with RN
        for g0 in range(0, nfull, group):
            g = min(group, nfull - g0)
            k0, k1 = g0 * slice_k, (g0 + g) * slice_k
            a3 = xp.permute_dims(xp.reshape(a_hi[:, k0:k1], (m, g, slice_k)), (1, 0, 2))
            b3 = xp.reshape(b_hi[k0:k1, :], (g, slice_k, n))
            backend.add_partials(c, backend.gemm_fp16(a3, b3))
        start = nfull * slice_k
    for s in range(start, k, slice_k):
        e = min(k, s + slice_k)
        backend.gemm_fp16(a_hi[..., s:e], b_hi[..., s:e, :], out=c, alpha=1.0, beta=1.0)
    return c
