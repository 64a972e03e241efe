"""The pivots of QR with column pivoting of a small sketch, on the GPU.

The randomized blocked QRCP (:mod:`mpqr.qr.pivoted`) chooses each block's pivots by
QRCP of a ``(b + p) x n`` sketch. LAPACK on the host takes ~75 ms a block at
``n = 16384`` (half of geqp3 is BLAS-2, and the sketch crosses the bus); the device loop
of the portable code issues a dozen launches a pivot from Python. Here each pivot is
one launch of ``kernels/qrcp_sketch.cu`` (``qrcp_step``: update the trailing columns
and their norms, 32 columns and 8 row groups a thread block, then the last block to
finish picks and reflects the next pivot), with no host synchronisation, and the ``k``
pivots cross once.
"""

from __future__ import annotations

import cupy as cp
from mpqr.backends.cupy_modules import ctype, functions

__all__ = ["qrcp_pivots", "supports"]

_PICK_THREADS = 1024
#: row groups of the update's thread blocks (32 columns each)
_ROW_GROUPS = 8


def supports(y) -> bool:
    # real sketches only: a complex reflector needs a phase (the host path takes those)
    return y.ndim == 2 and y.dtype in (cp.float32, cp.float64)


def _kernels(dtype_name: str):
    t = ctype(dtype_name)
    return functions("qrcp_sketch.cu", (f"qrcp_pick<{t}>", f"qrcp_step<{t}, {_ROW_GROUPS}>"))


def qrcp_pivots(y, k: int) -> list[int]:
    """The first ``min(k, *y.shape)`` pivots of QR with column pivoting of the 2-D real
    ``y`` (LAPACK geqp3's choice rule: largest remaining norm, the first of equals), as
    host ints. ``y`` is not modified."""
    rows, ncols = y.shape
    k = min(k, rows, ncols)
    if k <= 0:
        return []
    w = cp.array(y, order="C", copy=True)
    nrm2 = cp.sum(w * w, axis=0)
    perm = cp.arange(ncols, dtype=cp.int32)
    tau = cp.zeros(k, dtype=w.dtype)
    pick, step = _kernels(cp.dtype(w.dtype).name)
    r, n, ld = cp.int32(rows), cp.int32(ncols), cp.int64(ncols)
    smem = max(rows, 1) * w.itemsize  # the reflector's column
    blocks = -(-ncols // 32)
    pval = cp.empty(blocks, dtype=w.dtype)
    pidx = cp.empty(blocks, dtype=cp.int32)
    counter = cp.zeros(1, dtype=cp.uint32)
    pick((1,), (_PICK_THREADS,), (w, nrm2, perm, tau, r, n, ld, cp.int32(0)))
    for i in range(k - 1):  # step i's update and step i + 1's pick (k <= rows, ncols)
        step((-(-(ncols - i - 1) // 32),), (32, _ROW_GROUPS),
             (w, nrm2, perm, tau, pval, pidx, counter, r, n, ld, cp.int32(i)),
             shared_mem=smem)
    return [int(v) for v in perm[:k].get()]
