"""The ``tc-sgemm`` product in one Triton kernel: slices, corrections, unscaling, update.

The engine (:mod:`mpqr.engines.tc_sgemm`) forms its float32 product from fp16 parts with
cuBLAS: the correction products ``2^-11 (hf_A lo_B + lo_A hf_B)`` as one GEMM, then the
``hi_A hi_B`` products k-slice by k-slice, each slice's tensor-core sum added to the
product with round-to-nearest (by ``beta = 1``, or as batched partials summed by a
ones-row GEMM), then an unscaling pass into ``C``. This kernel does the same sums in the
same order in registers: the corrections into a float32 accumulator, scaled by ``2^-11``;
each ``slice_k`` slice summed on the tensor cores into a second accumulator and added to
the first (round-to-nearest); then ``C = P``, ``C += P`` or ``C -= P`` with
``P = 2^-(sa_i + sb_j) acc`` as it stores. Neither the partials nor the product go
through memory. Only the tensor cores' order within a slice (and within the corrections)
differs from cuBLAS's.

The compile, on-disk cache and launch through CuPy are :mod:`mpqr.backends.cupy.triton_gemm`'s;
the variants of this kernel begin with ``"sgemm"``. Taken for 2-D products with float32
output of at least :data:`MIN_TILES` tiles, ``slice_k`` a multiple of the tile's ``BK``,
every part with a unit stride in one dimension (``hi`` and the ``hf``/``lo`` pair of an
operand in the same orientation), 16-byte aligned; elsewhere, and where :data:`ENABLED` is
False, the engine's cuBLAS path runs.
"""

from __future__ import annotations

from typing import Any

from mpqr.backends.cupy import triton_gemm as tg

__all__ = ["CONFIGS", "ENABLED", "FLATTEN", "MAX_SLICE", "MIN_TILES", "config", "kernel_name",
           "sgemm_split"]

#: Switch for A/B measurements (and a way out should a Triton release misbehave).
ENABLED = True
#: Fewest output tiles (as the fp16 kernel's: fewer leave SMs idle).
MIN_TILES = 132
#: Longest ``slice_k`` the kernel takes (None: any). Its main loop ran at ~370 TFLOP/s of
#: fp16 work against cuBLAS's ~570 (H200, 16384 x 8192 x 8192: 17.7 against 11.6 ms with
#: operands prepared); what it saves is the cuBLAS path's per-slice partials (written,
#: then summed by a ones-row GEMM), ``k / slice_k`` passes over the output: worth it for
#: the short slices of outputs under 2^24 entries (128: 1024 x 8192 x 16384 in 2.16
#: against 4.32 ms), not for slices of 1024 (16384^2 fp32-emulated QR: 269.3 ms off,
#: 271.3 for every slice, 280.8 for slices of 1024 only)
MAX_SLICE: int | None = 512
#: the slices' loop nest flattened into one pipelined loop (``tl.range(flatten=True)``)
#: rather than a pipeline per slice
FLATTEN = True
#: Tile shapes, widest first: (BM, BN, BK, num_warps, num_stages); the first whose grid has
#: :data:`MIN_TILES` tiles and whose ``BK`` divides ``slice_k`` runs. Two float32
#: accumulators live during the slices (the product and the slice's sum). Four stages
#: of the first: fp32-emulated QR 65536 x 8192 267.4 against 269.2 ms with three, 16384^2
#: 202.3 against 204.4, the same bits; (128, 128, 64, 8, 2) 274.6 / 204.8, starting
#: from (128, 64, 64, 8, 3) 272.1 / 221.3 (H200, ``python3 bench/probes/flag_ab.py OUT
#: "mpqr.backends.cupy.triton_sgemm.CONFIGS=[...]" --cases 65536x8192:fp32-emulated,...``)
CONFIGS = ((128, 128, 32, 8, 4), (128, 64, 64, 8, 3), (64, 64, 64, 4, 3))

_PTRS = ("ah_ptr", "af_ptr", "al_ptr", "bh_ptr", "bf_ptr", "bl_ptr", "c_ptr", "sa_ptr",
         "sb_ptr")
#: (row stride, column stride) argument names of a_hi, a's parts, b_hi, b's parts, c
_STRIDES = (("s_ahm", "s_ahk"), ("s_apm", "s_apk"), ("s_bhk", "s_bhn"), ("s_bpk", "s_bpn"),
            ("s_cm", "s_cn"))


def config(m: int, n: int, slice_k: int) -> tuple[int, int, int, int, int] | None:
    """(BM, BN, BK, num_warps, num_stages) for an ``m x n`` output and ``slice_k``, or None."""
    for cfg in CONFIGS:
        bm, bn, bk = cfg[:3]
        if slice_k % bk == 0 and -(-m // bm) * -(-n // bn) >= MIN_TILES:
            return cfg
    return None


def kernel_name(m: int, n: int, k: int, slice_k: int) -> str | None:
    """``"triton-sgemm"`` where :func:`sgemm_split` takes an ``m x n x k`` product with
    slices of ``slice_k``, else None."""
    if not (ENABLED and tg.ENABLED and 0 < k < 2**31 and max(m, n) < 2**31
            and 0 < slice_k <= (MAX_SLICE or slice_k)
            and config(m, n, slice_k) is not None and tg.available()):
        return None
    return "triton-sgemm"


def _compile(variant: tuple, cc: int) -> tuple[bytes, dict[str, Any]]:
    from mpqr.backends.cupy.triton_kernels import sgemm_split as fn

    from mpqr.engines.scaling import LO_SHIFT

    _, layouts, divs, dims16, accumulate, subtract, wide, slice_k, flatten, cfg = variant
    bm, bn, bk, warps, stages = cfg
    sig = {name: ("*i32" if name[0] == "s" else "*fp32" if name[0] == "c" else "*fp16")
           for name in _PTRS}
    sig.update(M="i32", N="i32", K="i32")
    const = {"ACCUMULATE": accumulate, "SUBTRACT": subtract, "WIDE": wide, "SLICE": slice_k,
             "FLATTEN": flatten, "LO_SCALE": 2.0**-LO_SHIFT, "BM": bm, "BN": bn, "BK": bk,
             "GROUP_M": 8}
    attrs = tg._specialize(fn, sig, const, len(_PTRS), _STRIDES, layouts, divs, dims16)
    return tg._build(fn, sig, const, attrs, cc, warps, stages)


def _pair_layout(x: Any, y: Any) -> tuple[str, int] | None:
    """The layout shared by two parts of one operand (``hf`` and ``lo``), or None."""
    lx, ly = tg._layout(x), tg._layout(y)
    if lx is None or lx != ly:
        return None
    return lx


def sgemm_split(a_hi: Any, a_hf: Any, a_lo: Any, b_hi: Any, b_hf: Any, b_lo: Any, sa: Any,
                sb: Any, out: Any, *, slice_k: int, accumulate: bool, subtract: bool) -> bool:
    """``out = P``, ``out += P`` or ``out -= P`` for the ``tc-sgemm`` product of the
    engine's parts (``a_*`` m x k, ``b_*`` k x n, fp16; int32 shifts ``sa`` m x 1 and
    ``sb`` 1 x n) into float32 ``out``, the ``hi hi`` term in slices of ``slice_k``.
    Returns False, doing nothing, where the kernel does not take the product."""
    import cupy as cp
    import numpy as np

    parts = (a_hi, a_hf, a_lo, b_hi, b_hf, b_lo)
    if not (out.ndim == 2 and out.dtype == cp.float32
            and all(x.ndim == 2 and x.dtype == cp.float16 for x in parts)):
        return False
    m, k = a_hi.shape
    n = b_hi.shape[1]
    if a_hf.shape != (m, k) or a_lo.shape != (m, k) or b_hf.shape != (k, n) \
            or b_lo.shape != (k, n) or out.shape != (m, n):
        return False
    if kernel_name(m, n, k, slice_k) is None:
        return False
    lays = [tg._layout(a_hi), _pair_layout(a_hf, a_lo), tg._layout(b_hi),
            _pair_layout(b_hf, b_lo), tg._layout(out)]
    if any(lay is None or not 0 < lay[1] < 2**31 for lay in lays):
        return False
    sa = cp.ascontiguousarray(sa.reshape(m), dtype=cp.int32)
    sb = cp.ascontiguousarray(sb.reshape(n), dtype=cp.int32)
    ptrs = [x.data.ptr for x in (*parts, out, sa, sb)]
    if any(p % 16 for p in ptrs):
        return False
    cfg = config(m, n, slice_k)
    outer = [(m, k), (m, k), (k, n), (k, n), (m, n)]
    reach = max(ld * ((r if lay == "r" else c) - 1) for (lay, ld), (r, c) in zip(lays, outer))
    wide = 2 * (reach + max(m, n, k) + slice_k) >= tg.WIDE_FROM
    variant = ("sgemm", tuple(lay for lay, _ in lays), tuple(ld % 16 == 0 for _, ld in lays),
               tuple(v % 16 == 0 for v in (m, n, k)), bool(accumulate), bool(subtract), wide,
               int(slice_k), bool(FLATTEN), cfg)
    try:
        fn, shared, threads, _ = tg._function(variant, _compile)
    except Exception as exc:  # Triton or the driver refused the variant
        if not variant[-2]:
            _disable(exc)
            return False
        try:  # a Triton without loop flattening: the loop nest as written
            variant = (*variant[:-2], False, cfg)
            fn, shared, threads, _ = tg._function(variant, _compile)
        except Exception as exc2:
            _disable(exc2)
            return False
    grid = (-(-m // cfg[0]) * -(-n // cfg[1]), 1, 1)
    args = (*(np.uint64(p) for p in ptrs), *(np.int32(v) for v in (m, n, k)),
            *(np.int32(ld) for _, ld in lays), np.uint64(0), np.uint64(0))
    fn(grid, (threads, 1, 1), args, shared_mem=shared, stream=cp.cuda.get_current_stream())
    return True


def _disable(exc: BaseException) -> None:
    import warnings

    global ENABLED
    ENABLED = False
    warnings.warn(f"mpqr: the tc-sgemm kernel is off for this process "
                  f"({type(exc).__name__}: {exc}); the engine's cuBLAS path runs",
                  RuntimeWarning, stacklevel=3)
