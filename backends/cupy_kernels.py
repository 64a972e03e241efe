"""Fused elementwise CUDA kernels of the CuPy backend (memory-bound conversions).

``scale_split_fp16(x, shift)`` does tc-sgemm's operand preparation
(:func:`mpqr.engines.tc_sgemm.split_hi_lo` after ``ldexp`` scaling) in one pass:
read ``x`` once, write ``hi`` and ``lo`` once, instead of five passes through
temporaries. Same numbers as the generic path, with one deliberate exception:
float64 inputs are rounded to fp16 *correctly* (through a round-to-odd float32
intermediate), where ``astype(float16)`` in CuPy rounds twice (float64 ->
float32 -> float16) and can be off by one fp16 ulp on ties; NumPy rounds
correctly, so this kernel agrees with the NumPy reference backend.
"""

from __future__ import annotations

from typing import Any

__all__ = ["LO_SHIFT", "scale_split_fp16"]

#: ``lo`` carries the residual scaled by 2**LO_SHIFT (tc_sgemm.LO_SHIFT)
LO_SHIFT = 11

_PREAMBLE = r"""
__device__ __forceinline__ float mpqr_ldexp(float x, int e) { return ldexpf(x, e); }
__device__ __forceinline__ double mpqr_ldexp(double x, int e) { return ldexp(x, e); }
// float32 value whose round-to-nearest fp16 conversion is the correctly
// rounded fp16 of x: round toward zero, then set the last bit if inexact
// (round to odd keeps the sticky information for the second rounding).
__device__ __forceinline__ float mpqr_odd_f32(float x) { return x; }
__device__ __forceinline__ float mpqr_odd_f32(double x) {
  float f = __double2float_rz(x);
  if ((double)f != x && x == x) f = __int_as_float(__float_as_int(f) | 1);
  return f;
}
"""

_BODY = r"""
  const T y = mpqr_ldexp(x, s);
  hi = float16(mpqr_odd_f32(y));
  T resid = y - (T)(float)hi;  // exact: hi is y rounded to 11 bits
  if (!isfinite(resid)) resid = (T)0;
  lo = float16(mpqr_odd_f32(mpqr_ldexp(resid, LO_SHIFT)));
""".replace("LO_SHIFT", str(LO_SHIFT))

_KERNELS: dict[str, Any] = {}


def _split_kernel(cp):
    kern = _KERNELS.get("split")
    if kern is None:
        kern = cp.ElementwiseKernel(
            "T x, int32 s",
            "float16 hi, float16 lo",
            _BODY,
            "mpqr_scale_split_fp16",
            preamble=_PREAMBLE,
        )
        _KERNELS["split"] = kern
    return kern


def scale_split_fp16(x: Any, shift: Any = None) -> tuple[Any, Any]:
    """``(hi, lo)`` fp16 with ``x * 2**shift ~= hi + lo * 2**-LO_SHIFT``, in one pass.

    Parameters
    ----------
    x : cupy.ndarray
        float32 or float64 operand.
    shift : cupy.ndarray or None
        int32 exponents broadcasting against ``x`` (e.g. ``pow2_shift``'s
        keepdims rows/columns); None means no scaling.

    Returns
    -------
    hi, lo : cupy.ndarray
        float16 arrays of the broadcast shape: ``hi = fp16(y)``,
        ``lo = fp16((y - hi) * 2**LO_SHIFT)`` with ``y = ldexp(x, shift)``, and
        ``lo = 0`` where ``y - hi`` is not finite (Inf/NaN stay in ``hi``).

    Raises
    ------
    TypeError
        If ``x`` is not float32/float64 or ``shift`` is not an integer array.

    Examples
    --------
    >>> import cupy as cp  # doctest: +SKIP
    >>> x = cp.asarray([1.0 + 2.0**-20])  # doctest: +SKIP
    >>> hi, lo = scale_split_fp16(x, cp.asarray([3], cp.int32))  # doctest: +SKIP
    """
    import cupy as cp

    if x.dtype not in (cp.float32, cp.float64):
        raise TypeError(f"scale_split_fp16: expected x of dtype float32 or float64, got {x.dtype}")
    if shift is None:
        shift = cp.zeros((), dtype=cp.int32)
    elif shift.dtype.kind not in "iu":
        raise TypeError(f"scale_split_fp16: expected an integer shift, got dtype {shift.dtype}")
    return _split_kernel(cp)(x, shift.astype(cp.int32, copy=False))
