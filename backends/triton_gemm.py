"""The ``tc-fp16`` product's unscaling and accumulation fused into a Triton GEMM's epilogue.

cuBLAS's fp16 GEMM writes the float32 product of the engine's scaled fp16 operands; the
engine then unscales it in a pass of its own, and ``C -= A B`` subtracts it in another.
This kernel multiplies each accumulator tile by ``2**-(sa_i + sb_j)`` and writes ``C``,
``C + P`` or ``C - P`` as it stores: the product never goes through memory.

The roundings are the engine's (:mod:`mpqr.engines.tc_fp16`): the same fp16 operands, an
exact unscaling (unless an output is a float32 subnormal: then within one subnormal step),
and one float32 rounding for the accumulation into ``C``, as the separate subtraction had.
Only the order of the tensor cores' float32 accumulation differs from cuBLAS's.

Measured against the separate passes (H200, ``python3 bench/probes/fused_gemm.py OUT.json``):
``C -= A B`` at 16384 x 8192 x 8192 5.1 against 5.8 ms, 65536 x 4096 x 4096 6.0 against 7.6;
the fp16 QR 1-6% faster. Scaling and rounding float32 operands as they are loaded (no
operand passes) was measured too and dropped: its main loop ran at 200-260 TFLOP/s, against
430 for fp16 operands, because the converted tiles go back through shared memory.

Optional: needs ``triton`` (whose CUDA runtime needs PyTorch for the device and stream
queries). The CuPy backend takes the separate passes where either is missing, for products
too small to fill the GPU, and where :data:`ENABLED` is False.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
from typing import Any

__all__ = ["CONFIGS", "ENABLED", "MIN_TILES", "WIDE_FROM", "available", "fp16_gemm",
           "kernel_name"]

#: Switch for A/B measurements (and a way out should a Triton release misbehave).
ENABLED = True
#: Fewest output tiles: with fewer the GPU's 132 SMs idle and cuBLAS (its split-K kernels)
#: is as fast (1024 x 1024 x 16384: 0.42-0.44 ms either way, H200).
MIN_TILES = 132
#: Tile shapes, widest first: (BM, BN, BK, num_warps, num_stages); the first whose grid has
#: :data:`MIN_TILES` tiles runs. H200, ``python3 bench/probes/fused_gemm.py OUT configs``:
#: 16384 x 8192 x 8192 in 4.96-5.15 ms with the first, 4.90-5.31 with (128, 256, 64, 8, 3|4).
CONFIGS = ((128, 128, 64, 8, 4), (64, 128, 64, 4, 4))
#: Operands reaching this many elements take 64-bit offsets.
WIDE_FROM = 2**31


@functools.cache
def available() -> bool:
    """Whether Triton and PyTorch (its CUDA runtime's device and stream queries) import."""
    if importlib.util.find_spec("triton") is None or importlib.util.find_spec("torch") is None:
        return False
    try:
        import torch
        import triton  # noqa: F401

        return bool(torch.cuda.is_available())
    except Exception:  # a broken install counts as absent: the separate passes run
        return False


def _kernel() -> Any:
    from mpqr.backends.triton_kernels import fp16_gemm as kernel

    return kernel


class _Ptr:
    """A CuPy array as Triton's launcher takes a pointer argument."""

    __slots__ = ("_ptr", "dtype")

    def __init__(self, x: Any):
        self._ptr = x.data.ptr
        self.dtype = str(x.dtype)

    def data_ptr(self) -> int:
        return self._ptr


def _config(m: int, n: int) -> tuple[int, int, int, int, int] | None:
    """(BM, BN, BK, num_warps, num_stages) for an ``m x n`` output, or None where the
    kernel would leave the GPU idle (:data:`MIN_TILES`)."""
    for bm, bn, bk, warps, stages in CONFIGS:
        if -(-m // bm) * -(-n // bn) >= MIN_TILES:
            return bm, bn, bk, warps, stages
    return None


def kernel_name(m: int, n: int, k: int, dtype: Any) -> str | None:
    """``"triton-epilogue"`` where :func:`fp16_gemm` takes a 2-D ``m x n x k`` product
    with a ``dtype`` (float32) result, else None."""
    import numpy as np

    if not (ENABLED and k > 0 and np.dtype(dtype) == np.float32 and _config(m, n) is not None
            and available()):
        return None
    return "triton-epilogue"


def fp16_gemm(a16: Any, b16: Any, sa: Any, sb: Any, out: Any, *, accumulate: bool,
              subtract: bool) -> bool:
    """``out = P``, ``out += P`` or ``out -= P`` (``accumulate``, ``subtract``) for the
    ``tc-fp16`` product ``P = 2**-(sa_i + sb_j) (a16 b16)_ij`` of the engine's scaled fp16
    operands ``a16`` (m x k) and ``b16`` (k x n), int32 shifts ``sa`` (m x 1) and ``sb``
    (1 x n), any strides, into float32 ``out``. Returns False, doing nothing, where the
    kernel does not take the product (:func:`kernel_name`)."""
    import cupy as cp

    if not (a16.ndim == b16.ndim == out.ndim == 2 and a16.dtype == b16.dtype == cp.float16
            and out.dtype == cp.float32):
        return False
    m, k = a16.shape
    n = b16.shape[1]
    if kernel_name(m, n, k, out.dtype) is None:
        return False
    bm, bn, bk, warps, stages = _config(m, n)
    sa = cp.ascontiguousarray(sa.reshape(m), dtype=cp.int32)
    sb = cp.ascontiguousarray(sb.reshape(n), dtype=cp.int32)
    strides = tuple(x.strides[i] // x.itemsize for x in (a16, b16, out) for i in (0, 1))
    # offsets in int32 unless an operand spans 2**31 elements
    reach = max(abs(s) * (d - 1) for s, d in zip(strides, (m, k, k, n, m, n)))
    grid = (-(-m // bm) * -(-n // bn),)
    with _on_cupy_stream():
        _kernel()[grid](_Ptr(a16), _Ptr(b16), _Ptr(out), _Ptr(sa), _Ptr(sb), m, n, k, *strides,
                        ACCUMULATE=accumulate, SUBTRACT=subtract,
                        WIDE=2 * reach >= WIDE_FROM, BM=bm, BN=bn, BK=bk, GROUP_M=8,
                        num_warps=warps, num_stages=stages)
    return True


def _on_cupy_stream() -> Any:
    """Triton launches on PyTorch's current stream: make it CuPy's for the call."""
    import cupy as cp
    import torch

    ptr = cp.cuda.get_current_stream().ptr
    dev = cp.cuda.Device().id
    if torch.cuda.current_stream(dev).cuda_stream == ptr:
        return contextlib.nullcontext()
    return torch.cuda.stream(torch.cuda.ExternalStream(ptr, device=dev))
