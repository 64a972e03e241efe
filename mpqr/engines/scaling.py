"""Exact power-of-two scaling of rows of A and columns of B.

Multiplying by a power of two is exact (barring underflow), so scaling row i
of A by 2^sa_i and column j of B by 2^sb_j before a low-precision product and
multiplying C_ij by 2^-(sa_i + sb_j) afterwards changes no bits of the result:
it only moves each row/column into the range where fp16 (or int8) has the most
precision. NaN and Inf are left where they are: the scale comes from the finite
entries only, so an Inf stays an Inf and spoils exactly the outputs it touches.
"""

from __future__ import annotations

from typing import Any

from mpqr._array_api import device, is_complex

__all__ = ["FP16_TARGET_EXP", "LO_SHIFT", "pow2_scale", "pow2_shift", "unscale"]

#: the exponent an operand line's largest entry is scaled to before its fp16 rounding
FP16_TARGET_EXP = 14
#: a split's low part ``lo = fp16((x - hi) * 2^LO_SHIFT)``: kept in fp16's normal range
LO_SHIFT = 11


def pow2_shift(backend: Any, x: Any, *, axis: int, target: int) -> Any:
    """Int32 shifts ``s`` (keepdims along ``axis``) such that the largest finite
    ``|x| * 2**s`` along ``axis`` lies in ``[2**target, 2**(target+1))``.
    Zero (or all non-finite) lines get shift 0."""
    return backend.pow2_shift(x, axis, target)


def unscale(backend: Any, c: Any, row_shift: Any, col_shift: Any, out_dtype: Any) -> Any:
    """``c * 2**-(row_shift + col_shift)`` in ``out_dtype``, in one exact step."""
    return backend.unscale(c, row_shift, col_shift, out_dtype)


def pow2_scale(backend: Any, x: Any, e: Any, *, in_place: bool = False) -> Any:
    """``x * 2**e`` exactly (``e`` int32, broadcasting against ``x``), complex too;
    ``in_place``: into ``x`` (real ``x``; no temporary of its size), returned."""
    xp = backend.xp
    if not is_complex(xp, x):
        if in_place:
            backend.ldexp_in_place(x, e)
            return x
        return backend.ldexp(x, e)
    # ldexp is real-only: real powers of two (each part scaled alone, an infinite one
    # kept), in two halves so that each stays finite
    rdt = xp.float64 if x.dtype == xp.complex128 else xp.float32
    two = xp.asarray(2.0, dtype=rdt, device=device(x))
    h = e // 2
    return x * xp.pow(two, xp.astype(h, rdt)) * xp.pow(two, xp.astype(e - h, rdt))
