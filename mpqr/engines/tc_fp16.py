"""``tc-fp16``: FP16 inputs, FP32 accumulation (the FP16 tensor-core GEMM).

Rows of A and columns of B are scaled by exact powers of two so that their
largest finite entry lies in [2^14, 2^15): nothing overflows fp16's 65504 and
fp32 inputs as small as 1e-38 or as large as 3e38 keep fp16's 11 significant
bits. Error bound (elementwise, for entries within 2^-24 of their row/column
maximum): |C - AB| <= (2 u16 + u16^2 + k u32) |A||B| with u16 = 2^-11,
u32 = 2^-24 (round-to-nearest inputs; fp32 accumulation).

Where the backend has a fused kernel for the product (``backend.fused_fp16_kernel``; on
CuPy with Triton installed: :mod:`mpqr.backends.cupy.triton_gemm`), the unscaling, and any
accumulation into an output (:func:`accumulate_tc_fp16`: ``C -= A B`` in place), happen in
the GEMM's epilogue: the same roundings without the passes over the product. The policy's
``kernel`` parameter (shown in the explain trace) says where it runs.

An operand that is float16 already (the fp16 QR keeps its rounded Householder vectors so)
is used as it is, at shift 0: its entries are fp16 numbers, so scaling and rounding them
would change no bit, and skipping the pass saves a read, a write and the range scan.
"""

from __future__ import annotations

from typing import Any

from mpqr._array_api import device
from mpqr.engines.scaling import FP16_TARGET_EXP, unscale

__all__ = ["FP16_TARGET_EXP", "FUSED_UNSCALE", "UNSCALE_IN_PLACE", "accumulate_tc_fp16",
           "fp16_operand", "run_tc_fp16", "tc_fp16_params"]

#: ``c -= A B`` / ``c = A B`` without a fused kernel: the GEMM, then the unscaling and the
#: update of ``c`` in one pass over the product (``backend.unscale_into``) instead of an
#: unscaled copy and a second pass; the same roundings
FUSED_UNSCALE = True
#: ``c = A B`` without a fused kernel: the GEMM's float32 product unscaled in its own
#: storage where it is already the output's dtype (no second array of its size; the same
#: bits)
UNSCALE_IN_PLACE = True


def tc_fp16_params(backend: Any, m: int, n: int, k: int, dtype: Any, options: Any
                   ) -> dict[str, Any]:
    """``{"kernel": name}`` where the backend runs this product as a fused kernel."""
    name = backend.fused_fp16_kernel(m, n, k, dtype)
    return {} if name is None else {"kernel": name}


def accumulate_tc_fp16(backend: Any, a: Any, b: Any, c: Any, *, subtract: bool | None,
                       out_dtype: Any, kernel: str | None = None) -> bool:
    """``c = P`` (``subtract=None``), ``c -= P`` or ``c += P`` for the ``tc-fp16`` product
    ``P = a @ b`` (2-D) with the backend's fused epilogue (``kernel``), else the GEMM and
    one unscaling pass into ``c`` (:data:`FUSED_UNSCALE`; the same roundings as an
    unscaled product and an update); False, doing nothing, where neither applies.
    Operands the kernel declines after the split (an output view it does not take) finish
    from the split parts, not split again."""
    if (kernel is None and not FUSED_UNSCALE) or a.ndim != 2 or b.ndim != 2 \
            or c.dtype != out_dtype:
        return False
    sa, sb, a16, b16 = _scaled(backend, a, b)
    if kernel is None or not backend.fused_fp16_gemm(
            a16, b16, sa, sb, c, accumulate=subtract is not None, subtract=bool(subtract)):
        backend.unscale_into(c, backend.gemm_fp16(a16, b16), sa, sb, subtract=subtract)
    return True


def fp16_operand(backend: Any, x: Any, axis: int) -> tuple[Any, Any]:
    """``(shift, x16)``: ``x`` scaled along ``axis`` (rows of a left operand: ``-1``;
    columns of a right one: ``-2``) and rounded to fp16, or a float16 ``x`` as it is at
    shift 0."""
    from mpqr.engines.prepared import Prepared, prepare

    xp = backend.xp
    if isinstance(x, Prepared):  # its parts (the policy passes them along this axis only)
        if x.axis != axis:
            raise ValueError(f"internal: an operand prepared along axis {x.axis} was used "
                             f"along {axis}")
        return x.shift, x.hi
    if x.dtype == xp.float16:
        shape = list(x.shape)
        shape[axis] = 1
        return xp.zeros(tuple(shape), dtype=xp.int32, device=device(x)), x
    p = prepare(backend, x, side="left" if axis == -1 else "right", engine="tc-fp16")
    return p.shift, p.hi


def _scaled(backend: Any, a: Any, b: Any) -> tuple[Any, Any, Any, Any]:
    """The shifts and the scaled fp16 operands: ``(sa, sb, a16, b16)``."""
    sa, a16 = fp16_operand(backend, a, -1)
    sb, b16 = fp16_operand(backend, b, -2)
    return sa, sb, a16, b16


def run_tc_fp16(backend: Any, a: Any, b: Any, *, out_dtype: Any, kernel: str | None = None
                ) -> Any:
    sa, sb, a16, b16 = _scaled(backend, a, b)
    if kernel is not None and a.ndim == 2 and b.ndim == 2:
        c = backend.xp.empty((a.shape[0], b.shape[1]), dtype=out_dtype, device=device(a16))
        if backend.fused_fp16_gemm(a16, b16, sa, sb, c, accumulate=False, subtract=False):
            return c
    p = backend.gemm_fp16(a16, b16)
    if UNSCALE_IN_PLACE and p.dtype == out_dtype:
        backend.unscale_into(p, p, sa, sb, subtract=None)
        return p
    return unscale(backend, p, sa, sb, out_dtype)
