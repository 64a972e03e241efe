"""tc-sgemm's ``hi_A hi_B`` with its k-slices added in registers (Hopper, CuTe DSL).

The cuBLAS path sums ``hi_A hi_B`` slice by slice, each slice a GEMM whose ``beta = 1``
epilogue reads and writes C once (mpqr.engines.tc_sgemm, step 4). This kernel keeps two
float32 accumulators per thread: the tensor cores add one slice into the first (their own
truncating sums, as in one cuBLAS slice); at each slice's end it is added into the second
with round-to-nearest and cleared; the epilogue adds the second to C once
(``C + sum of slices``, where the cuBLAS path adds each slice to C in turn: the same
terms, the last additions in another order).

Status: verified on an H200 (``tests/test_dsl_slices.py``: every operand layout, both
tiles, against float64 and against the cuBLAS slices); off by default (:data:`ENABLED`).
Timed alone, product by product, it beats cuBLAS's slices (a 32768^2 fp32-emulated QR's
hi*hi products: 298 against 374 ms, ``bench/probes/dsl_slices_shadow.py``), but in the QR,
where the slices run back to back, it gained 1000 -> 989 ms at 32768^2, 190 -> 187 at
16384^2 and lost 235 -> 236 at 65536 x 8192 (H200, called through TVM-FFI at 15-20 us a
call; ``bench/probes/flag_ab.py ... dsl_slices.ENABLED=False,True``). Tiles of 128 x 128 or
256 x 128 (:func:`tile_for`) x 64, one tile per CTA, one warpgroup per 64 rows (64 float32
registers each accumulator at 128 columns); ``m``, ``n`` multiples of the tile, ``k`` of
64; A with k or m contiguous, B (``k x n``) with n or k contiguous, C row-major; tall
outputs left to cuBLAS (:func:`takes`).
"""

# (no postponed annotations: the DSL reads the kernels' annotations as objects)
import functools
from typing import Any

__all__ = ["ENABLED", "TILE", "SlicedHiGemm", "add_hi_product", "available", "compiled",
           "takes", "tile_for"]

#: TVM-FFI used where it imports (a test runs the kernel both ways)
USE_TVM_FFI = True
#: pipeline stages at most (None: as many as shared memory holds, one CTA an SM)
MAX_STAGES = None

#: the CTA tile (m, n) where set, else :func:`tile_for` chooses; k per pipeline stage is
#: the MMA's k times 4
TILE = None
#: ``backend.add_hi_slices`` runs the kernel: off, since the QR gains 1 % at most with it
#: (module docstring)
ENABLED = False


@functools.cache  # asked on every product: a failed import searches the path each time
def available() -> str | None:
    """None where the DSL imports, else why not."""
    try:
        import cutlass
        import cutlass.cute  # noqa: F401
    except Exception as exc:  # the optional extra is missing or broken
        return f"{type(exc).__name__}: {exc}"
    return None


def _kernel_class():
    import cutlass
    import cutlass.cute as cute
    import cutlass.pipeline as pipeline
    import cutlass.utils as utils
    import cutlass.utils.hopper_helpers as sm90

    class SlicedHiGemm:
        """``C += A B^T`` (A ``m x k``, B ``n x k``, batch mode last, as the DSL's tensors
        are), ``A B^T`` summed on the tensor cores ``slice_k`` at a time, the slices added
        in float32 registers."""

        def __init__(self, slice_k: int, tile_mn: tuple[int, int] = (128, 128),
                     leading: tuple[int, int] = (1, 0)):
            self.tile_mn = tile_mn
            self.slice_k = slice_k
            self.leading = leading  # unit-stride modes of A (m x k) and B (n x k)
            self.acc_dtype = cutlass.Float32
            # one warpgroup per 64 rows of the tile, 64 x n each: at n = 128 the two
            # accumulators take 64 registers each
            self.atom_layout_mnk = (tile_mn[0] // 64, 1, 1)
            self.threads = 128 * self.atom_layout_mnk[0]
            self.smem_bytes = utils.get_smem_capacity_in_bytes("sm_90")

        def _layouts(self, a, b):
            self.a_dtype, self.b_dtype = a.element_type, b.element_type
            self.a_major = utils.LayoutEnum.from_tensor(a)
            self.b_major = utils.LayoutEnum.from_tensor(b)
            self.tiled_mma = sm90.make_trivial_tiled_mma(
                self.a_dtype, self.b_dtype, self.a_major.sm90_mma_major_mode(),
                self.b_major.sm90_mma_major_mode(), self.acc_dtype, self.atom_layout_mnk,
                tiler_mn=(64, self.tile_mn[1]))
            mma_k = cute.size(self.tiled_mma.shape_mnk, mode=[2])
            self.tile_mnk = (*self.tile_mn, mma_k * 4)
            # k-tiles per slice (a slice ends on a stage's edge)
            self.tiles_per_slice = max(1, self.slice_k // self.tile_mnk[2])
            stage_bytes = (self.tile_mnk[0] + self.tile_mnk[1]) * self.tile_mnk[2] \
                * self.a_dtype.width // 8
            self.stages = (self.smem_bytes - 1024) // stage_bytes
            if MAX_STAGES:  # leave shared memory to kernels of other streams
                self.stages = min(self.stages, MAX_STAGES)
            self.sa_layout = sm90.make_smem_layout_a(self.a_major, self.tile_mnk,
                                                     self.a_dtype, self.stages)
            self.sb_layout = sm90.make_smem_layout_b(self.b_major, self.tile_mnk,
                                                     self.b_dtype, self.stages)

        @cute.jit
        def __call__(self, pa: cute.Pointer, pb: cute.Pointer, pc: cute.Pointer,
                     m: cutlass.Int32, n: cutlass.Int32, k: cutlass.Int32,
                     lda: cutlass.Int32, ldb: cutlass.Int32, ldc: cutlass.Int32, stream):
            # the operands from raw pointers and their row strides (no DLPack on the call's
            # path); the batch mode a static 1 with stride 0, as CUTLASS's L = 1 GEMMs
            sa = (lda, 1, 0) if cutlass.const_expr(self.leading[0] == 1) else (1, lda, 0)
            sb = (1, ldb, 0) if cutlass.const_expr(self.leading[1] == 0) else (ldb, 1, 0)
            a = cute.make_tensor(pa, cute.make_layout((m, k, 1), stride=sa))
            b = cute.make_tensor(pb, cute.make_layout((n, k, 1), stride=sb))
            c = cute.make_tensor(pc, cute.make_layout((m, n, 1), stride=(ldc, 1, 0)))
            self._gemm(a, b, c, stream)

        @cute.jit
        def _gemm(self, a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, stream):
            self._layouts(a, b)
            load = cute.nvgpu.cpasync.CopyBulkTensorTileG2SOp()
            tma_a, ta = cute.nvgpu.cpasync.make_tiled_tma_atom(
                load, a, cute.slice_(self.sa_layout, (None, None, 0)),
                (self.tile_mnk[0], self.tile_mnk[2]))
            tma_b, tb = cute.nvgpu.cpasync.make_tiled_tma_atom(
                load, b, cute.slice_(self.sb_layout, (None, None, 0)),
                (self.tile_mnk[1], self.tile_mnk[2]))
            tiles = cute.zipped_divide(c, tiler=self.tile_mn)
            grid = cute.get(tiles.layout, mode=[1]).shape

            @cute.struct
            class Shared:
                barriers: cute.struct.MemRange[cutlass.Int64, self.stages * 2]
                sa: cute.struct.Align[cute.struct.MemRange[
                    self.a_dtype, cute.cosize(self.sa_layout)], 1024]
                sb: cute.struct.Align[cute.struct.MemRange[
                    self.b_dtype, cute.cosize(self.sb_layout)], 1024]

            self.shared = Shared
            self.kernel(tma_a, ta, tma_b, tb, c, self.tiled_mma, self.sa_layout,
                        self.sb_layout).launch(grid=grid, block=[self.threads, 1, 1],
                                               cluster=(1, 1, 1), stream=stream)

        @cute.kernel
        def kernel(self, tma_a: cute.CopyAtom, ma: cute.Tensor, tma_b: cute.CopyAtom,
                   mb: cute.Tensor, mc: cute.Tensor, tiled_mma: cute.TiledMma,
                   sa_layout: cute.ComposedLayout, sb_layout: cute.ComposedLayout):
            warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
            tidx, _, _ = cute.arch.thread_idx()
            bm, bn, bl = cute.arch.block_idx()
            if warp == 0:
                cute.nvgpu.cpasync.prefetch_descriptor(tma_a)
                cute.nvgpu.cpasync.prefetch_descriptor(tma_b)

            storage = utils.SmemAllocator().allocate(self.shared)
            stage_bytes = cute.size_in_bytes(
                self.a_dtype, cute.slice_(sa_layout, (None, None, 0))) + cute.size_in_bytes(
                self.b_dtype, cute.slice_(sb_layout, (None, None, 0)))
            # full/empty barriers of the stages: one thread issues the loads, the 8 warps
            # release a stage once its MMAs are done
            loads = pipeline.PipelineTmaAsync.create(
                barrier_storage=storage.barriers.data_ptr(), num_stages=self.stages,
                producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
                consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread,
                                                         self.threads // 32),
                tx_count=stage_bytes, cta_layout_vmnk=cute.make_layout((1, 1, 1, 1)),
                defer_sync=True)
            pipeline.pipeline_init_arrive(cluster_shape_mn=(1, 1), is_relaxed=True)

            sa = storage.sa.get_tensor(sa_layout.outer, swizzle=sa_layout.inner)
            sb = storage.sb.get_tensor(sb_layout.outer, swizzle=sb_layout.inner)
            where = (bm, bn, None, bl)
            ga = cute.local_tile(ma, self.tile_mnk, where, proj=(1, None, 1))
            gb = cute.local_tile(mb, self.tile_mnk, where, proj=(None, 1, 1))
            gc = cute.local_tile(mc, self.tile_mnk, where, proj=(1, 1, None))

            # the warpgroup's slice for the operands' descriptors (a warpgroup's MMAs read
            # shared memory together); this thread's own slice for its entries of C
            wg = cute.arch.make_warp_uniform(tidx // 128)
            thr = tiled_mma.get_slice(
                cute.make_layout(self.atom_layout_mnk[0], stride=128)(wg))
            tcgc = tiled_mma.get_slice(tidx).partition_C(gc)
            tasa, taga = cute.nvgpu.cpasync.tma_partition(
                tma_a, 0, cute.make_layout(1), cute.group_modes(sa, 0, 2),
                cute.group_modes(ga, 0, 2))
            tbsb, tbgb = cute.nvgpu.cpasync.tma_partition(
                tma_b, 0, cute.make_layout(1), cute.group_modes(sb, 0, 2),
                cute.group_modes(gb, 0, 2))
            tcra = tiled_mma.make_fragment_A(thr.partition_A(sa))
            tcrb = tiled_mma.make_fragment_B(thr.partition_B(sb))
            part = cute.make_rmem_tensor(tcgc.shape, self.acc_dtype)  # the slice's sums
            total = cute.make_rmem_tensor(tcgc.shape, self.acc_dtype)  # the slices' sum
            total.fill(0.0)
            pipeline.pipeline_init_wait(cluster_shape_mn=(1, 1))

            ktiles = cute.size(ga, mode=[2])
            kblocks = cute.size(tcra, mode=[2])
            produce = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer,
                                                   self.stages)
            consume = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer,
                                                   self.stages)

            # the first stages' loads (one thread; the tracer needs the pipeline state
            # advanced in the loop's own body, so the issue is written out twice)
            if warp == 0:
                for _ in cutlass.range(cutlass.min(self.stages, ktiles), unroll=1):
                    loads.producer_acquire(produce)
                    bar = loads.producer_get_barrier(produce)
                    cute.copy(tma_a, taga[(None, produce.count)],
                              tasa[(None, produce.index)], tma_bar_ptr=bar)
                    cute.copy(tma_b, tbgb[(None, produce.count)],
                              tbsb[(None, produce.index)], tma_bar_ptr=bar)
                    loads.producer_commit(produce)
                    produce.advance()

            # the slice accumulator is overwritten by the first MMA after a promotion
            tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, False)
            count = 0  # k-tiles in the current slice
            release = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer,
                                                   self.stages)
            for kt in cutlass.range(ktiles, unroll=1):
                loads.consumer_wait(consume)
                cute.nvgpu.warpgroup.fence()
                for kb in cutlass.range_constexpr(kblocks):
                    at = (None, None, kb, consume.index)
                    cute.gemm(tiled_mma, part, tcra[at], tcrb[at], part)
                    tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)
                cute.nvgpu.warpgroup.commit_group()
                consume.advance()
                count += 1
                if count == self.tiles_per_slice:
                    # the slice's MMAs done before its sums are read
                    cute.nvgpu.warpgroup.wait_group(0)
                    for i in cutlass.range_constexpr(cute.size(total)):
                        total[i] = total[i] + part[i]
                    count = 0
                    tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, False)
                else:
                    # one group of MMAs stays in flight: the previous k-tile's are done
                    cute.nvgpu.warpgroup.wait_group(1)
                if kt > 0:
                    # the previous k-tile's stage is free: release it, then refill it with
                    # the k-tile a whole pipeline ahead (the first stages were loaded above)
                    loads.consumer_release(release)
                    release.advance()
                    if warp == 0 and produce.count < ktiles:
                        loads.producer_acquire(produce)
                        bar = loads.producer_get_barrier(produce)
                        cute.copy(tma_a, taga[(None, produce.count)],
                                  tasa[(None, produce.index)], tma_bar_ptr=bar)
                        cute.copy(tma_b, tbgb[(None, produce.count)],
                                  tbsb[(None, produce.index)], tma_bar_ptr=bar)
                        loads.producer_commit(produce)
                        produce.advance()
            cute.nvgpu.warpgroup.wait_group(0)
            if count > 0:  # the last, shorter slice
                for i in cutlass.range_constexpr(cute.size(total)):
                    total[i] = total[i] + part[i]
            # C += the slices' sum (each thread its own entries; tile-aligned shapes)
            tcgc.store(tcgc.load() + total.load())

    return SlicedHiGemm


@functools.cache
def _class():
    return _kernel_class()


def SlicedHiGemm(slice_k: int, tile_mn: tuple[int, int] = (128, 128),  # built on first use
                 leading: tuple[int, int] = (1, 0)):
    return _class()(slice_k, tile_mn, leading)


_COMPILED: dict[tuple, Any] = {}


def _tvm_ffi() -> bool:
    """Whether TVM-FFI (``apache-tvm-ffi``) is there: the compiled kernel is then called
    through it, with plain integers, at a few microseconds a call."""
    return USE_TVM_FFI and _tvm_ffi_imports()


@functools.cache
def _tvm_ffi_imports() -> bool:
    try:
        import tvm_ffi  # noqa: F401
    except Exception:  # not installed, or broken
        return False
    return True


def compiled(slice_k: int, tile_mn: tuple[int, int], leading: tuple[int, int]):
    """``(kernel, through TVM-FFI)``: the kernel compiled for a slice, tile and operand
    layout (``leading``: the unit-stride modes of A, ``m x k``, and of B, ``n x k``);
    shapes and strides are its arguments."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_stream, make_ptr

    ffi = _tvm_ffi()
    key = (slice_k, tile_mn, leading, ffi, MAX_STAGES)
    fn = _COMPILED.get(key)
    if fn is None:
        gmem = cute.AddressSpace.gmem
        ptrs = [make_ptr(t, 1024, gmem, assumed_align=16)
                for t in (cutlass.Float16, cutlass.Float16, cutlass.Float32)]
        dims = [cutlass.Int32(1024)] * 6
        kernel = SlicedHiGemm(slice_k, tile_mn, leading)
        if ffi:
            fn = cute.compile(kernel, *ptrs, *dims,
                              make_fake_stream(use_tvm_ffi_env_stream=False),
                              options="--enable-tvm-ffi")
        else:
            fn = cute.compile(kernel, *ptrs, *dims, make_fake_stream())
        _COMPILED[key] = fn
    return fn, ffi


def tile_for(m: int, n: int) -> tuple[int, int]:
    """The CTA tile: 256 x 128 for outputs of at least 8192 x 8192, else 128 x 128
    (:data:`TILE` where set). H200, ``bench/probes/dsl_slices_shadow.py``: 256-row tiles
    took 302.7 ms of a 32768^2 QR's products against 333.2 for 128-row ones, which win on
    the small outputs (512 x 512 x 65536: 0.51 against 1.27 ms)."""
    if TILE is not None:
        return TILE
    return (256, 128) if m * n >= 8192 * 8192 and m % 256 == 0 else (128, 128)


def takes(m: int, n: int) -> bool:
    """Whether the kernel is faster than cuBLAS's slices for an ``m x n`` output: not for
    tall outputs of at least 32768 rows and twice as many rows as columns, where cuBLAS's
    slices of 1024 were as fast or faster (H200, ``dsl_slices_shadow.py``: 32768 x 16384 x
    16384 36.6 ms against 38.7, 65536 x 2048 x 2048 3.6 against 4.6)."""
    return not (m >= 32768 and m >= 2 * n)


def add_hi_product(cp, a16, b16, c, slice_k: int) -> bool:
    """``c += a16 @ b16`` (fp16 ``m x k`` and ``k x n``, ``c`` float32 ``m x n`` in C
    order) with ``a16 @ b16`` summed ``slice_k`` at a time on the tensor cores and the
    slices added in registers; False, doing nothing, where the kernel does not take these
    operands (the caller's slices then run as they do)."""
    if available() is not None or a16.ndim != 2 or b16.ndim != 2 or c.ndim != 2:
        return False
    m, k = a16.shape
    n = b16.shape[1]
    tile = tile_for(m, n)
    if m % tile[0] or n % tile[1] or k % 64 or c.dtype != cp.float32 \
            or not c.flags.c_contiguous or slice_k % 64 or not takes(m, n):
        return False
    # TMA: base addresses and the strides of the other modes in multiples of 16 bytes;
    # offsets within 32 bits (the strides are 32-bit arguments)
    for x in (a16, b16, c):
        if x.data.ptr % 16 or any(st % 16 for st in x.strides if st != x.itemsize) \
                or max(x.strides) * max(x.shape) >= 2**31 * x.itemsize:
            return False
    item = a16.itemsize
    if a16.strides[1] == item:
        a_lead, lda = 1, a16.strides[0] // item  # k contiguous
    elif a16.strides[0] == item:
        a_lead, lda = 0, a16.strides[1] // item
    else:
        return False
    if b16.strides[1] == item:
        b_lead, ldb = 0, b16.strides[0] // item  # n contiguous (b16 in C order)
    elif b16.strides[0] == item:
        b_lead, ldb = 1, b16.strides[1] // item
    else:
        return False
    fn, ffi = compiled(slice_k, tile, (a_lead, b_lead))
    stream = cp.cuda.get_current_stream().ptr
    if ffi:  # integers straight through TVM-FFI's C calling convention
        fn(a16.data.ptr, b16.data.ptr, c.data.ptr, m, n, k, lda, ldb, c.strides[0] // 4,
           stream)
        return True
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_ptr

    gmem = cute.AddressSpace.gmem
    fn(make_ptr(cutlass.Float16, a16.data.ptr, gmem, assumed_align=16),
       make_ptr(cutlass.Float16, b16.data.ptr, gmem, assumed_align=16),
       make_ptr(cutlass.Float32, c.data.ptr, gmem, assumed_align=16),
       m, n, k, lda, ldb, c.strides[0] // 4, cuda.CUstream(stream))
    return True
