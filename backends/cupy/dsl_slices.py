"""tc-sgemm's ``hi_A hi_B`` with its k-slices added in registers (Hopper, CuTe DSL).

The cuBLAS path sums ``hi_A hi_B`` slice by slice, each slice a GEMM whose ``beta = 1``
epilogue reads and writes C once (mpqr.engines.tc_sgemm, step 4). This kernel keeps two
float32 accumulators per thread: the tensor cores add one slice into the first (their own
truncating sums, as in one cuBLAS slice); at each slice's end it is added into the second
with round-to-nearest and cleared; the epilogue adds the second to C once
(``C + sum of slices``, where the cuBLAS path adds each slice to C in turn: the same
terms, the last additions in another order).

Status: built against ``nvidia-cutlass-dsl`` 4.8 and compiled for ``sm_90a`` on a host
without a GPU; not yet run on a GPU (``ENABLED`` off). Tiles of :data:`TILE` (or 256 x
128) x 64, one warpgroup per 64 rows (64 float32 registers each accumulator at 128
columns); ``m``, ``n`` multiples of the tile, ``k`` of 64; A with k or m contiguous, B
(``k x n``) with n or k contiguous, C row-major.
"""

# (no postponed annotations: the DSL reads the kernels' annotations as objects)
import functools
from typing import Any

__all__ = ["ENABLED", "TILE", "SlicedHiGemm", "add_hi_product", "available", "compiled"]

#: the CTA tile (m, n); k per pipeline stage is the MMA's k times 4
TILE = (128, 128)
#: ``backend.add_hi_slices`` runs the kernel (off until it is measured on a GPU)
ENABLED = False


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

        def __init__(self, slice_k: int, tile_mn: tuple[int, int] = TILE):
            self.tile_mn = tile_mn
            self.slice_k = slice_k
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
            self.sa_layout = sm90.make_smem_layout_a(self.a_major, self.tile_mnk,
                                                     self.a_dtype, self.stages)
            self.sb_layout = sm90.make_smem_layout_b(self.b_major, self.tile_mnk,
                                                     self.b_dtype, self.stages)

        @cute.jit
        def __call__(self, a: cute.Tensor, b: cute.Tensor, c: cute.Tensor, stream):
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

            wg = cute.arch.make_warp_uniform(tidx // 128)
            thr = tiled_mma.get_slice(
                cute.make_layout(self.atom_layout_mnk[0], stride=128)(wg))
            tcgc = thr.partition_C(gc)
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
            for i in cutlass.range_constexpr(cute.size(total)):
                tcgc[i] = tcgc[i] + total[i]

    return SlicedHiGemm


@functools.cache
def _class():
    return _kernel_class()


def SlicedHiGemm(slice_k: int, tile_mn: tuple[int, int] = TILE):  # built on first use
    return _class()(slice_k, tile_mn)


_COMPILED: dict[tuple, Any] = {}


def compiled(a, b, c, slice_k: int, stream, tile_mn: tuple[int, int] = TILE,
             leading: tuple[int, int] = (1, 0)):
    """The kernel compiled for these operands' layouts (shapes dynamic): ``a``, ``b``,
    ``c`` are DSL tensors (``m x k x 1``, ``n x k x 1``, ``m x n x 1``, fp16, fp16,
    float32), ``leading`` the unit-stride modes of ``a`` and ``b``."""
    import cutlass.cute as cute

    key = (slice_k, tile_mn, leading)
    fn = _COMPILED.get(key)
    if fn is None:
        fn = _COMPILED[key] = cute.compile(SlicedHiGemm(slice_k, tile_mn), a, b, c, stream)
    return fn


def _tensor(cp, x, leading: int):
    """A DSL tensor of the 2-D CuPy array ``x`` with a batch mode of one appended (the
    kernel's ``(rows, cols, 1)``), shapes dynamic, ``leading`` its unit-stride mode."""
    from cutlass.cute.runtime import from_dlpack

    r, c = x.shape
    x3 = cp.lib.stride_tricks.as_strided(x, (r, c, 1), (*x.strides, x.nbytes))
    return from_dlpack(x3, assumed_align=16).mark_layout_dynamic(leading_dim=leading)


def add_hi_product(cp, a16, b16, c, slice_k: int) -> bool:
    """``c += a16 @ b16`` (fp16 ``m x k`` and ``k x n``, ``c`` float32 ``m x n`` in C
    order) with ``a16 @ b16`` summed ``slice_k`` at a time on the tensor cores and the
    slices added in registers; False, doing nothing, where the kernel does not take these
    operands (the caller's slices then run as they do)."""
    if available() is not None or a16.ndim != 2 or b16.ndim != 2 or c.ndim != 2:
        return False
    m, k = a16.shape
    n = b16.shape[1]
    if m % TILE[0] or n % TILE[1] or k % 64 or c.dtype != cp.float32 \
            or not c.flags.c_contiguous or slice_k % 64:
        return False
    # TMA: base addresses and the strides of the other modes in multiples of 16 bytes
    for x in (a16, b16, c):
        if x.data.ptr % 16 or any(st % 16 for st in x.strides if st != x.itemsize):
            return False
    item = a16.itemsize
    if a16.strides[1] == item:
        a_lead = 1  # k contiguous
    elif a16.strides[0] == item:
        a_lead = 0
    else:
        return False
    bt = b16.T  # the kernel's B is n x k
    if bt.strides[0] == item:
        b_lead = 0  # n contiguous (b16 in C order)
    elif bt.strides[1] == item:
        b_lead = 1
    else:
        return False
    import cuda.bindings.driver as cuda

    ta, tb, tc = _tensor(cp, a16, a_lead), _tensor(cp, bt, b_lead), _tensor(cp, c, 1)
    stream = cuda.CUstream(cp.cuda.get_current_stream().ptr)
    compiled(ta, tb, tc, slice_k, stream, tile_mn=TILE, leading=(a_lead, b_lead))(
        ta, tb, tc, stream)
    return True
