"""Native GEMMs: the library's own FP32/FP64 (or complex) GEMM, no tricks.

float64 (complex128) operands multiplied in FP32 (``precision="fp32"`` on float64 data) are first
scaled by exact powers of two, rows of A and columns of B to unit magnitude, as the
tensor-core engines scale theirs (:mod:`mpqr.engines.scaling`): a plain cast would turn
entries beyond float32's range into Inf and entries below it into zero, a finite wrong
product. For data in float32's range the bits are those of the plain cast (a power of two
commutes with the rounding and the sums). Inside :func:`operands_in_range` (a QR whose
driver brought the input's columns within float32's range: its factors' entries stay
there) the operands are cast as they are: the scaling's maxima and passes cost a 4096²
float64 QR at ``precision="fp32"`` half its time again (H200, 52.7 against 78.9 ms,
``bench/probes/native_fp32_ab.py``).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

from mpqr.engines.scaling import pow2_scale, pow2_shift, unscale

__all__ = ["operands_in_range", "run_native"]

_IN_RANGE: contextvars.ContextVar[bool] = contextvars.ContextVar("mpqr_native_in_range",
                                                                 default=False)


@contextlib.contextmanager
def operands_in_range() -> Iterator[None]:
    """Within: FP32 products of float64 (complex128) data cast as they are, without the
    scaling to unit magnitude; for callers whose operands lie within float32's range by
    construction (a QR of columns scaled to unit magnitude or checked to lie within
    float32's safe range)."""
    token = _IN_RANGE.set(True)
    try:
        yield
    finally:
        _IN_RANGE.reset(token)


def run_native(backend: Any, a: Any, b: Any, *, compute_dtype: Any, out_dtype: Any) -> Any:
    xp = backend.xp
    scaled = not _IN_RANGE.get()
    if scaled and compute_dtype == xp.float32 and xp.float64 in (a.dtype, b.dtype) \
            and out_dtype == xp.float64 and a.ndim == b.ndim == 2:
        sa = pow2_shift(backend, a, axis=-1, target=0)
        sb = pow2_shift(backend, b, axis=-2, target=0)
        a = xp.astype(backend.ldexp(a, sa), compute_dtype)
        b = xp.astype(backend.ldexp(b, sb), compute_dtype)
        return unscale(backend, backend.gemm(a, b), sa, sb, out_dtype)
    if scaled and compute_dtype == xp.complex64 and xp.complex128 in (a.dtype, b.dtype) \
            and out_dtype == xp.complex128 and a.ndim == b.ndim == 2:
        # the same for complex128 data (the engines' kernels take real data: array ops)
        sa, sb = _unit_exponents(backend, a, -1), _unit_exponents(backend, b, -2)
        a = xp.astype(pow2_scale(backend, a, sa), compute_dtype)
        b = xp.astype(pow2_scale(backend, b, sb), compute_dtype)
        c = xp.astype(backend.gemm(a, b), out_dtype)
        return pow2_scale(backend, pow2_scale(backend, c, -sa), -sb)
    if a.dtype != compute_dtype:
        a = xp.astype(a, compute_dtype)
    if b.dtype != compute_dtype:
        b = xp.astype(b, compute_dtype)
    c = backend.gemm(a, b)
    return c if c.dtype == out_dtype else xp.astype(c, out_dtype)


def _unit_exponents(backend: Any, x: Any, axis: int) -> Any:
    """Int32 ``s`` (keepdims along ``axis``): each line's largest finite ``|x| 2^s`` in
    ``[1, 2)``; 0 for lines with no finite nonzero entry."""
    xp = backend.xp
    ax = xp.abs(x)
    mx = xp.max(xp.where(xp.isfinite(ax), ax, xp.zeros_like(ax)), axis=axis, keepdims=True)
    return xp.where(mx > 0, -backend.exponent(mx), xp.zeros(mx.shape, dtype=xp.int32))
