"""A certified leaf's rank-32 products in kernels of their own (``kernels/leaf_update.cu``).

After each 32-column panel the leaf's later columns take ``B <- B - Y (W^T B)``. cuBLAS
runs that as four launches (``W^T B`` split over its long inner dimension, the split's
reduction, ``L Z`` and ``Y2 Z``), each at the latency of small tiles: at 16384² the
leaves' native products took ~40 ms of a 216 ms fp32-emulated QR for ~0.3 TFLOP (H200,
bench/NOTES.md). Here ``Z = W^T B`` takes one launch over row chunks and one that adds
the chunks' partials in a fixed order, and ``B -= Y Z`` another; a thread holds a column
of Z in registers. The same ``W^T B`` kernels give the combined ``W``'s
``G^T = W_j^T Y_<j``.

The sums run in another order than cuBLAS's, in the same precision (products and sums in
the working dtype), so results agree to rounding, not bit for bit; each configuration is
reproducible run to run. Measured slower than cuBLAS in the whole QR, so off by default
(:data:`UPDATE_KERNEL`, :data:`JOIN_KERNEL`); kept, with their GPU tests, as the
measured alternative.
"""

from __future__ import annotations

import functools

import cupy as cp
from mpqr.backends.cupy.modules import ctype, functions

__all__ = ["BLOCKS_PER_SM", "JOIN_KERNEL", "MAX_CHUNKS", "MIN_COLUMNS", "MIN_ROWS",
           "UPDATE_KERNEL", "LeafProducts", "chunks", "for_leaf"]

#: dtypes whose certified leaves update their later columns by these kernels (the others,
#: by default all, by cuBLAS). Off: alone at a first panel's shape (16384 x 992) the
#: kernels took 0.17 against cuBLAS's 0.35 ms in float32 (0.33 against 0.36 in float64,
#: where cuBLAS runs on the FP64 tensor cores), but in the QR they lost: 65536 x 8192 fp16
#: 173.1 ms (products of 8192 rows and 256 columns or more) and 211.8 (every product)
#: against 157.8, fp32-emulated 322.3 / 370.5 against 294.6; 16384^2 fp16 170.9 / 157.4
#: against 165.4 (H200, one process, ``bench/probes/leaf_update.py``): the leaf's later
#: panels' narrow products, and the kernels' FP32 FMAs (~12 TFLOP/s, issue-bound) beside
#: the lookahead's panel, favour cuBLAS's tiles
UPDATE_KERNEL: tuple[str, ...] = ()
#: dtypes whose certified leaves make the combined W's ``G`` by the ``W^T B`` kernels
JOIN_KERNEL: tuple[str, ...] = ()
#: where enabled, the kernels take a product of at least this many rows and columns of B
#: (cuBLAS the smaller ones)
MIN_ROWS = 8192
MIN_COLUMNS = 256
_THREADS = 128  # columns of B per block (LEAF_THREADS in the source)
#: rows of B a thread takes per step (``LeafRows`` in the source)
_ROWS = {"float32": 32, "float64": 16}
#: most row chunks of ``W^T B`` (each a partial Z of ``nb x q``)
MAX_CHUNKS = 64
#: blocks per SM a launch aims at
BLOCKS_PER_SM = 4


@functools.cache
def _kernels(dtype_name: str):
    t = ctype(dtype_name)
    return functions("leaf_update.cu", (f"leaf_z<{t}>", f"leaf_sum<{t}>", f"leaf_apply<{t}>"))


@functools.cache
def _sm_count(device: int) -> int:
    return int(cp.cuda.Device(device).attributes["MultiProcessorCount"])


def chunks(r: int, q: int, dtype_name: str, sms: int, most: int | None = None
           ) -> tuple[int, int]:
    """``(chunks, rows)``: B's ``r`` rows in chunks of ``rows`` (a multiple of the step)
    so that the grid has about :data:`BLOCKS_PER_SM` blocks per SM, at most ``most``."""
    step = _ROWS[dtype_name]
    tiles = -(-q // _THREADS)
    want = -(-BLOCKS_PER_SM * sms // tiles)
    steps = -(-r // step)
    n = max(1, min(want, steps, most or steps))
    rows = -(-steps // n) * step
    return -(-r // rows), rows


class LeafProducts:
    """The kernels and workspace of one leaf of ``k`` columns (``Z`` and the partial sums
    for products up to ``32 x k``)."""

    def __init__(self, dtype, k: int):
        name = cp.dtype(dtype).name
        self.name = name
        self.zk, self.sum_k, self.apply_k = _kernels(name)
        self.sms = _sm_count(cp.cuda.Device().id)
        self.z = cp.empty(32 * k, dtype=dtype)
        self.part = cp.empty(MAX_CHUNKS * 32 * k, dtype=dtype)

    def takes(self, r: int, q: int) -> bool:
        """Whether the kernels take a product over ``r x q`` B (:data:`MIN_ROWS`,
        :data:`MIN_COLUMNS`)."""
        return r >= MIN_ROWS and q >= MIN_COLUMNS

    def wtb(self, pb: int, ldb: int, pw: int, ldw: int, r: int, nb: int, q: int) -> int:
        """``Z = W^T B`` (``nb x q``, row-major, leading dimension ``q``) for row-major B
        (``r x q`` at ``pb``) and W (``r x nb`` at ``pw``); returns Z's address."""
        n, rows = chunks(r, q, self.name, self.sms, MAX_CHUNKS)
        self.zk((-(-q // _THREADS), n), (_THREADS,),
                (cp.uint64(pb), cp.int64(ldb), cp.uint64(pw), cp.int64(ldw), cp.int64(r),
                 cp.int32(nb), cp.int32(q), cp.int64(rows), self.part if n > 1 else self.z))
        if n > 1:
            size = nb * q
            self.sum_k((-(-size // 256),), (256,),
                       (self.part, cp.int64(size), cp.int32(n), self.z))
        return self.z.data.ptr

    def apply(self, pb: int, ldb: int, pl: int, py2: int, ldy: int, pz: int, r: int,
              nb: int, q: int) -> None:
        """``B -= Y Z`` for row-major B (``r x q`` at ``pb``), Y's top ``nb`` rows L
        (``nb x nb`` row-major at ``pl``), its rows from ``nb`` at ``py2`` (leading
        dimension ``ldy``) and Z as :meth:`wtb` leaves it."""
        n, rows = chunks(r, q, self.name, self.sms)
        self.apply_k((-(-q // _THREADS), n), (_THREADS,),
                     (cp.uint64(pb), cp.int64(ldb), cp.uint64(pl), cp.uint64(py2),
                      cp.int64(ldy), cp.uint64(pz), cp.int64(r), cp.int32(nb), cp.int32(q),
                      cp.int64(rows)))


def for_leaf(dtype, k: int) -> tuple[LeafProducts | None, bool, bool]:
    """``(products, update, join)``: the kernels of a leaf of ``k`` columns in ``dtype``
    where :data:`UPDATE_KERNEL` or :data:`JOIN_KERNEL` takes it, and which of the two."""
    name = cp.dtype(dtype).name
    update, join = name in UPDATE_KERNEL, name in JOIN_KERNEL
    return (LeafProducts(dtype, k) if update or join else None), update, join
