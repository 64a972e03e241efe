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

Triton is the compiler only: each variant of the kernel (the operands' layouts, the mode,
the tile shape) is compiled once per machine by ``triton.compile`` for the device's
architecture, its cubin kept on disk (:func:`cache_dir`), and loaded and launched through
CuPy on CuPy's current stream, specialized as Triton's own launcher would (16-byte aligned
pointers, strides and sizes divisible by 16: without the sizes' the masks broke the 16-byte
loads and the QR ran 1.6x slower). A process whose variants are on disk imports neither
Triton nor PyTorch: its first 8192^2 fp16 QR took 0.72 s, against 4.1-4.8 s through
Triton's launcher (PyTorch's import and CUDA start), and 3.2 s where the variants were
compiled first (H200, ``python3 bench/probes/fused_launch.py --first on``). Optional: needs
``triton`` to compile; the CuPy backend
takes the separate passes where it is missing, for products too small to fill the GPU or
with operands it does not take (a stride of 1 in neither dimension, unaligned, over 2**31),
and where :data:`ENABLED` is False.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import warnings
from pathlib import Path
from typing import Any

__all__ = ["CONFIGS", "ENABLED", "MAX_K", "MIN_TILES", "WIDE_FROM", "available", "cache_dir",
           "fp16_gemm", "kernel_name"]

#: Switch for A/B measurements (and a way out should a Triton release misbehave).
ENABLED = True
#: Fewest output tiles: with fewer the GPU's 132 SMs idle and cuBLAS (its split-K kernels)
#: is as fast (1024 x 1024 x 16384: 0.42-0.44 ms either way, H200).
MIN_TILES = 132
#: Tile shapes, widest first: (BM, BN, BK, num_warps, num_stages); the first whose grid has
#: :data:`MIN_TILES` tiles runs. H200, ``python3 bench/probes/fused_gemm.py OUT configs``:
#: 16384 x 8192 x 8192 in 4.96-5.15 ms with the first, 4.90-5.31 with (128, 256, 64, 8, 3|4).
CONFIGS = ((128, 128, 64, 8, 4), (64, 128, 64, 4, 4))
#: Longest inner dimension the kernel takes (None: any). Its main loop runs at ~430 TFLOP/s
#: against cuBLAS's ~600; past this ``k`` cuBLAS's product and one unscaling pass over it
#: (``backend.unscale_into``: 8 more bytes an output entry) are faster: fp16 QR 32768^2
#: 472 ms against 523 with no cap, 65536 x 8192 139 against 141, 8192^2 33.7 against
#: 34.1; a cap of 1024 lost at 65536 x 8192 (145) (H200, ``python3 bench/probes/flag_ab.py
#: OUT mpqr.backends.cupy.triton_gemm.MAX_K=None,1024,4096 --cases 32768:fp16,...``)
MAX_K: int | None = 4096
#: Operands reaching this many elements take 64-bit offsets.
WIDE_FROM = 2**31


@functools.cache
def available() -> bool:
    """Whether the kernel can run: a GPU of compute capability 8.0 or newer, and Triton
    installed (to compile a variant not yet on disk)."""
    if importlib.util.find_spec("triton") is None:
        return False
    try:
        import cupy as cp

        return int(cp.cuda.Device().compute_capability) >= 80
    except Exception:  # no usable GPU: the separate passes run (and fail or not) as before
        return False


def cache_dir() -> Path:
    """Where compiled variants are kept: ``$MPQR_CACHE_DIR/triton``, by default
    ``~/.cache/mpqr/triton``."""
    root = os.environ.get("MPQR_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "mpqr")
    return Path(root) / "triton"


def _layout(x: Any) -> tuple[str, int] | None:
    """``("r", row stride)`` for unit column stride, ``("c", column stride)`` for unit row
    stride (a dimension of one counts as unit), None for neither."""
    s0, s1 = (x.strides[i] // x.itemsize for i in (0, 1))
    if s1 == 1 or x.shape[1] == 1:
        return "r", s0
    if s0 == 1 or x.shape[0] == 1:
        return "c", s1
    return None


_STRIDES = (("s_am", "s_ak"), ("s_bk", "s_bn"), ("s_cm", "s_cn"))


@functools.cache
def _source_hash() -> str:
    src = Path(__file__).with_name("triton_kernels.py").read_bytes()
    try:
        from importlib.metadata import version

        tv = version("triton")
    except Exception:
        tv = "?"
    return hashlib.sha256(src + tv.encode()).hexdigest()[:20]


_FUNCTIONS: dict[tuple, tuple[Any, int, int, Any]] = {}


def _function(variant: tuple, compile_fn: Any = None) -> tuple[Any, int, int, Any]:
    """``(CuPy function, shared bytes, threads, module)`` of a variant on the current
    device: loaded already, from disk, or compiled now by ``compile_fn(variant, cc)``
    (default: this module's kernel) and kept on disk where it can be. Variants of other
    kernels (:mod:`mpqr.backends.cupy.triton_sgemm`) begin with their kernel's name."""
    import cupy as cp

    dev = cp.cuda.Device()
    got = _FUNCTIONS.get((dev.id, variant))
    if got is not None:
        return got
    cc = int(dev.compute_capability)
    path = _path(variant, cc)
    found = _cached(path)
    if found is None:
        found = (compile_fn or _compile)(variant, cc)
        _store(path, *found)  # best effort: a read-only cache compiles again next time
    cubin, info = found
    mod = cp.cuda.function.Module()
    mod.load(cubin)
    fn = mod.get_function(info["name"])
    if info["shared"] > 48 * 1024:
        attr = getattr(cp.cuda.driver, "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES", 8)
        cp.cuda.driver.funcSetAttribute(fn.ptr, attr, info["shared"])
    got = (fn, info["shared"], 32 * info["num_warps"], mod)
    _FUNCTIONS[(dev.id, variant)] = got
    return got


def _path(variant: tuple, cc: int) -> Path:
    """Where the cubin of a variant for compute capability ``cc`` is kept."""
    key = hashlib.sha256(repr((_source_hash(), cc, variant)).encode()).hexdigest()[:32]
    return cache_dir() / f"{key}.cubin"


def _cached(path: Path) -> tuple[bytes, dict[str, Any]] | None:
    """The cubin at ``path`` and its ``.json`` beside it, or None (absent or unreadable)."""
    try:
        info = json.loads(path.with_suffix(".json").read_text())
        cubin = path.read_bytes()
    except (OSError, ValueError):
        return None
    if not (cubin and {"name", "shared", "num_warps"} <= set(info)):
        return None
    return cubin, info


def _store(path: Path, cubin: bytes, info: dict[str, Any]) -> bool:
    """Write the cubin and its ``.json`` (each atomically: concurrent processes write the
    same bytes); False where the directory cannot be written."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        for dst, data in ((path, cubin), (path.with_suffix(".json"),
                                          json.dumps(info).encode())):
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_bytes(data)
            os.replace(tmp, dst)
    except OSError:
        return False
    return True


def _compile(variant: tuple, cc: int) -> tuple[bytes, dict[str, Any]]:
    """The cubin of one variant for compute capability ``cc``, and its launch facts."""
    layouts, divs, dims16, accumulate, subtract, wide, (bm, bn, bk, warps, stages) = variant
    fn = _kernel()
    sig = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp32", "sa_ptr": "*i32",
           "sb_ptr": "*i32", "M": "i32", "N": "i32", "K": "i32"}
    const = {"ACCUMULATE": accumulate, "SUBTRACT": subtract, "WIDE": wide, "BM": bm, "BN": bn,
             "BK": bk, "GROUP_M": 8}
    attrs = _specialize(fn, sig, const, 5, _STRIDES, layouts, divs, dims16)
    return _build(fn, sig, const, attrs, cc, warps, stages)


def _specialize(fn: Any, sig: dict[str, str], const: dict[str, Any], pointers: int,
                strides: tuple, layouts: tuple, divs: tuple, dims16: tuple) -> dict:
    """Complete a kernel's signature as Triton's own launcher would specialize it, in
    place: each operand's unit stride a constant and its leading dimension an ``i32``
    (divisible by 16 where ``divs`` says), the sizes ``M, N, K`` divisible by 16 where
    ``dims16`` says (the masks along a contiguous dimension then keep 16-byte loads),
    every entry of ``const`` a ``constexpr``; returns the attributes (the first
    ``pointers`` arguments 16-byte aligned)."""
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(pointers)}
    for name, div in zip(("M", "N", "K"), dims16):
        if div:
            attrs[(fn.arg_names.index(name),)] = [["tt.divisibility", 16]]
    for (outer, inner), lay, div in zip(strides, layouts, divs):
        unit, ld = (inner, outer) if lay == "r" else (outer, inner)
        sig[unit] = "constexpr"
        const[unit] = 1
        sig[ld] = "i32"
        if div:
            attrs[(fn.arg_names.index(ld),)] = [["tt.divisibility", 16]]
    for name in list(const):
        sig[name] = "constexpr"
    return attrs


def _build(fn: Any, sig: dict[str, str], const: dict[str, Any], attrs: dict, cc: int,
           warps: int, stages: int) -> tuple[bytes, dict[str, Any]]:
    """``triton.compile`` of a kernel specialized by ``sig``/``const``/``attrs`` for compute
    capability ``cc``: its cubin and launch facts (shared with the other kernels' launchers)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig = {name: sig[name] for name in fn.arg_names}
    k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=const, attrs=attrs),
                       target=GPUTarget("cuda", cc, 32),
                       options={"num_warps": warps, "num_stages": stages})
    md = k.metadata
    if getattr(md, "global_scratch_size", 0) or getattr(md, "profile_scratch_size", 0):
        raise RuntimeError("the kernel asks for scratch memory, which its launch does not pass")
    return k.asm["cubin"], {"name": md.name, "shared": md.shared, "num_warps": md.num_warps}


def _disable(exc: BaseException) -> None:
    """Turn the kernel off for the process, saying why once: a compiler or driver failure
    must cost speed, not the product."""
    global ENABLED
    ENABLED = False
    warnings.warn(f"mpqr: the fp16 GEMM with the fused epilogue is off for this process "
                  f"({type(exc).__name__}: {exc}); the engine's separate passes run",
                  RuntimeWarning, stacklevel=3)


def _kernel() -> Any:
    from mpqr.backends.cupy.triton_kernels import fp16_gemm as kernel

    return kernel


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

    if not (ENABLED and 0 < k < 2**31 and max(m, n) < 2**31 and np.dtype(dtype) == np.float32
            and (MAX_K is None or k <= MAX_K) and _config(m, n) is not None and available()):
        return None
    return "triton-epilogue"


def fp16_gemm(a16: Any, b16: Any, sa: Any, sb: Any, out: Any, *, accumulate: bool,
              subtract: bool) -> bool:
    """``out = P``, ``out += P`` or ``out -= P`` (``accumulate``, ``subtract``) for the
    ``tc-fp16`` product ``P = 2**-(sa_i + sb_j) (a16 b16)_ij`` of the engine's scaled fp16
    operands ``a16`` (m x k) and ``b16`` (k x n), int32 shifts ``sa`` (m x 1) and ``sb``
    (1 x n), into float32 ``out``; each operand with a unit stride in one dimension.
    Returns False, doing nothing, where the kernel does not take the product."""
    import cupy as cp
    import numpy as np

    if not (a16.ndim == b16.ndim == out.ndim == 2 and a16.dtype == b16.dtype == cp.float16
            and out.dtype == cp.float32):
        return False
    m, k = a16.shape
    n = b16.shape[1]
    if kernel_name(m, n, k, out.dtype) is None:
        return False
    lays = [_layout(x) for x in (a16, b16, out)]
    if any(lay is None or not 0 < lay[1] < 2**31 for lay in lays):
        return False
    sa = cp.ascontiguousarray(sa.reshape(m), dtype=cp.int32)
    sb = cp.ascontiguousarray(sb.reshape(n), dtype=cp.int32)
    ptrs = [x.data.ptr for x in (a16, b16, out, sa, sb)]
    if any(p % 16 for p in ptrs):
        return False
    cfg = _config(m, n)
    # offsets in int32 unless an operand spans 2**31 elements
    outer = [(m, k), (k, n), (m, n)]  # (rows, columns) of a16, b16, out
    reach = max(ld * ((r if lay == "r" else c) - 1) for (lay, ld), (r, c) in zip(lays, outer))
    wide = 2 * (reach + max(m, n, k)) >= WIDE_FROM
    variant = (tuple(lay for lay, _ in lays), tuple(ld % 16 == 0 for _, ld in lays),
               tuple(v % 16 == 0 for v in (m, n, k)), bool(accumulate), bool(subtract), wide,
               cfg)
    try:
        fn, shared, threads, _ = _function(variant)
    except Exception as exc:  # Triton or the driver refused the variant
        _disable(exc)
        return False
    grid = (-(-m // cfg[0]) * -(-n // cfg[1]), 1, 1)
    args = (*(np.uint64(p) for p in ptrs), *(np.int32(v) for v in (m, n, k)),
            *(np.int32(ld) for _, ld in lays), np.uint64(0), np.uint64(0))
    fn(grid, (threads, 1, 1), args, shared_mem=shared, stream=cp.cuda.get_current_stream())
    return True
