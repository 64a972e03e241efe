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

Where the backend has it (CuPy with Triton), steps 3-5 and any update ``C -= AB`` run as
one kernel (:data:`FUSED_KERNEL`): the same fp16 parts, the corrections first, then the
slices added one by one with round-to-nearest, no partials in memory.

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

from mpqr._array_api import device
from mpqr.engines.scaling import LO_SHIFT, unscale

__all__ = ["BATCHED_PARTIALS_BYTES", "FUSED_KERNEL", "FUSED_UNSCALE", "LO_SHIFT", "PARTIALS_SHARE",
           "accumulate_tc_sgemm", "add_slices", "partials_limit",
           "run_tc_sgemm", "split_product"]

#: per-slice partial products are batched in groups of at most this many bytes. H200,
#: 256 / 64 / 16 MiB, the same bits: ``matmul`` 512 x 512 x 2^20 13.43 / 13.38 / 13.41 ms,
#: 2048 x 8192 x 16384 4.07 / 3.95 / 3.99; the fp32-emulated QR 16384^2 169.0 / 169.2 /
#: 169.1, 32768^2 860 / 856 / 863, 65536 x 8192 235.2 / 235.1 / 235.2 (its products'
#: partials, 0.25x a 16384^2 float32 input at 256 MiB, were the QR's largest temporary
#: after the operands' parts; ``python3 bench/probes/flag_ab.py OUT
#: mpqr.engines.tc_sgemm.BATCHED_PARTIALS_BYTES=268435456,67108864,16777216``)
BATCHED_PARTIALS_BYTES = 16 * 2**20
#: ``c -= A B`` / ``c = A B`` (:func:`accumulate_tc_sgemm`): the unscaling and the update
#: of ``c`` in one pass over the product (``backend.unscale_into``) instead of an unscaled
#: copy and a second pass; the same roundings
FUSED_UNSCALE = True
#: the whole product (corrections, slices, unscaling, update of ``c``) in the backend's one
#: kernel where it has one (CuPy + Triton: :mod:`mpqr.backends.cupy.triton_sgemm`) and it
#: takes the operands; the same sums in the same order as the cuBLAS path's loop of slices
FUSED_KERNEL = True
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
    pa, pb, sa, sb = _parts(backend, a, b)
    xp = backend.xp
    if FUSED_KERNEL and out_dtype == xp.float32 and pa.hi.ndim == pb.hi.ndim == 2 \
            and backend.fused_sgemm_kernel(pa.shape[0], pb.shape[1], pa.shape[1], slice_k):
        c = xp.empty((pa.shape[0], pb.shape[1]), dtype=xp.float32, device=device(pa.hi))
        if _fused(backend, pa, pb, sa, sb, c, slice_k=slice_k, subtract=None):
            return c
    c = _split_parts(backend, pa, pb, slice_k=slice_k, partials_bytes=partials_bytes)
    return unscale(backend, c, sa, sb, out_dtype)


def accumulate_tc_sgemm(backend: Any, a: Any, b: Any, c: Any, *, subtract: bool | None,
                        out_dtype: Any, slice_k: int,
                        partials_bytes: int = BATCHED_PARTIALS_BYTES) -> bool:
    """``c = P`` (``subtract=None``), ``c -= P`` or ``c += P`` for the ``tc-sgemm`` product
    ``P = a @ b`` (2-D), unscaled into ``c`` in one pass (:data:`FUSED_UNSCALE`); False,
    doing nothing, where that is off (the policy then forms ``P`` and updates ``c``)."""
    if not FUSED_UNSCALE or a.ndim != 2 or b.ndim != 2 or c.dtype != out_dtype:
        return False
    pa, pb, sa, sb = _parts(backend, a, b)
    if FUSED_KERNEL and c.dtype == backend.xp.float32 \
            and _fused(backend, pa, pb, sa, sb, c, slice_k=slice_k, subtract=subtract):
        return True
    p = _split_parts(backend, pa, pb, slice_k=slice_k, partials_bytes=partials_bytes)
    backend.unscale_into(c, p, sa, sb, subtract=subtract)
    return True


def _fused(backend: Any, pa: Any, pb: Any, sa: Any, sb: Any, c: Any, *, slice_k: int,
           subtract: bool | None) -> bool:
    """The whole product and the update of ``c`` in the backend's one kernel, where it has
    one that takes these operands (:meth:`fused_sgemm`); whether it ran."""
    if pa.hi.ndim != 2 or pb.hi.ndim != 2 or c.ndim != 2:
        return False
    return backend.fused_sgemm(pa.hi, pa.hf, pa.lo, pb.hi, pb.hf, pb.lo, sa, sb, c,
                               slice_k=slice_k, accumulate=subtract is not None,
                               subtract=bool(subtract))


def _parts(backend: Any, a: Any, b: Any) -> tuple[Any, Any, Any, Any]:
    """``(pa, pb, sa, sb)``: both operands prepared (steps 1-2) and the shifts that unscale
    their product, for operands of which any may be
    :class:`~mpqr.engines.prepared.Prepared` (of this engine, 2-D; the others, stacks
    too, are prepared here).
    Shifts of a prepared operand along the inner axis go to the other operand's lines
    along ``k`` before it is split: in float64 for a float32 operand (exact), so that its
    own scaling then keeps every bit."""
    from mpqr.engines.prepared import Prepared, operand, prepare

    xp = backend.xp
    pa = a if isinstance(a, Prepared) else None
    pb = b if isinstance(b, Prepared) else None
    if pa is not None and pb is not None and pa.inner("left") and pb.inner("right"):
        pb = None  # two sets of inner shifts: the right operand's array instead
    a_arr, b_arr = operand(a), operand(b)
    if pa is not None and pa.inner("left"):
        b_arr = backend.ldexp_wide(b_arr, -xp.reshape(pa.shift, (-1, 1)))
    if pb is not None and pb.inner("right"):
        a_arr = backend.ldexp_wide(a_arr, -xp.reshape(pb.shift, (1, -1)))
    if pa is None:
        pa = prepare(backend, a_arr, side="left", engine="tc-sgemm")
    if pb is None:
        pb = prepare(backend, b_arr, side="right", engine="tc-sgemm")
    m, n = pa.shape[-2], pb.shape[-1]
    dev = device(pa.hi)
    sa = xp.zeros((m, 1), dtype=xp.int32, device=dev) if pa.inner("left") else pa.shift
    sb = xp.zeros((1, n), dtype=xp.int32, device=dev) if pb.inner("right") else pb.shift
    return pa, pb, sa, sb


def _split_parts(backend: Any, pa: Any, pb: Any, *, slice_k: int,
                 partials_bytes: int = BATCHED_PARTIALS_BYTES) -> Any:
    """The float32 product of two prepared operands' scaled parts (steps 3-4, cuBLAS)."""
    a_cat, b_cat = pa.cat_for("left"), pb.cat_for("right")
    if a_cat is not None and b_cat is not None:
        return split_product(backend, pa.hi, a_cat, pb.hi, b_cat, slice_k=slice_k,
                             partials_bytes=partials_bytes)
    return split_product(backend, pa.hi, None, pb.hi, None, slice_k=slice_k,
                         parts=(pa.hf, pa.lo, pb.hf, pb.lo), partials_bytes=partials_bytes)


def split_product(backend: Any, a_hi: Any, a_cat: Any, b_hi: Any, b_cat: Any, *,
                  slice_k: int, out: Any = None, parts: Any = None,
                  partials_bytes: int = BATCHED_PARTIALS_BYTES) -> Any:
    """Steps 3-4 on split operands: the float32 product of the scaled operands, written
    into ``out`` (a float32 view, e.g. a block of a Gram matrix) if given. Without the
    concatenations (``a_cat``/``b_cat`` None), ``parts = (a_hf, a_lo, b_hf, b_lo)``: the
    two correction products as two GEMMs (the second adds to the first's float32 sums,
    rounded to nearest), the same terms. The slices' partial products are batched in
    groups of at most ``partials_bytes`` bytes (a workspace limit lowers it:
    :func:`partials_limit`)."""
    batch = a_hi.shape[:-2]
    if a_cat is None or b_cat is None:
        a_hf, a_lo, b_hf, b_lo = parts
        if out is None:
            c = backend.gemm_fp16(a_hf, b_lo, alpha=2.0**-LO_SHIFT)
        else:
            c = backend.gemm_fp16(a_hf, b_lo, out=out, alpha=2.0**-LO_SHIFT, beta=0.0)
        backend.gemm_fp16(a_lo, b_hf, out=c, alpha=2.0**-LO_SHIFT, beta=1.0)
    elif out is None:
        c = backend.gemm_fp16(a_cat, b_cat, alpha=2.0**-LO_SHIFT)
    else:
        c = backend.gemm_fp16(a_cat, b_cat, out=out, alpha=2.0**-LO_SHIFT, beta=0.0)
    if not batch and backend.add_hi_slices(a_hi, b_hi, c, slice_k):
        return c  # the slices added in the backend's one kernel
    return add_slices(backend, a_hi, b_hi, c, slice_k, partials_bytes)


def add_slices(backend: Any, a_hi: Any, b_hi: Any, c: Any, slice_k: int,
               partials_bytes: int = BATCHED_PARTIALS_BYTES) -> Any:
    """Step 4 by cuBLAS: ``c += a_hi @ b_hi`` summed ``slice_k`` at a time on the tensor
    cores, each slice added to ``c`` with round-to-nearest (few outputs and many slices:
    the slices as strided-batched GEMMs into partials, summed a group at a time)."""
    xp = backend.xp
    *batch, m, k = a_hi.shape
    n = b_hi.shape[-1]
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
