"""The pivots of QR with column pivoting of a small sketch, on the GPU.

The randomized blocked QRCP (:mod:`mpqr.qr.pivoted`) chooses each block's pivots by
QRCP of a ``(b + p) x n`` sketch. LAPACK on the host takes ~75 ms a block at
``n = 16384`` (half of geqp3 is BLAS-2, and the sketch crosses the bus); the device loop
of the portable code issues a dozen launches a pivot from Python. Here each pivot is
one launch of ``kernels/qrcp_sketch.cu`` (``qrcp_step``: every thread block makes the
step's pick from the previous launch's per-block maxima, then updates its 32 columns and
their norms), with no host synchronisation; the column order stays on the device.

The ``k`` launches of a block differ only in the step number, so their arguments are
packed once and each launch is one driver call: CuPy's per-call argument handling
(~10 us) exceeded the kernel's time past a few thousand columns.
"""

from __future__ import annotations

import ctypes

import cupy as cp
from mpqr.backends.cupy.modules import ctype, functions

__all__ = ["qrcp_order", "qrcp_pivots", "supports"]

#: row groups of the thread blocks (32 columns each)
_ROW_GROUPS = 8


def supports(y) -> bool:
    # real sketches only: a complex reflector needs a phase (the host path takes those)
    return y.ndim == 2 and y.dtype in (cp.float32, cp.float64)


def _kernels(dtype_name: str):
    t = ctype(dtype_name)
    return functions("qrcp_sketch.cu", (f"qrcp_init<{t}, {_ROW_GROUPS}>",
                                        f"qrcp_step<{t}, {_ROW_GROUPS}>"))


def qrcp_order(y, k: int):
    """The column order of the 2-D real ``y`` after ``min(k, *y.shape)`` steps of QR with
    column pivoting (LAPACK geqp3's choice rule: largest remaining norm, the first of
    equals by position; step ``i`` swaps column ``i`` with its pivot): int32 ``(n,)`` on
    the device, the pivots first. ``y`` is not modified; nothing waits for the device."""
    rows, ncols = y.shape
    k = min(k, rows, ncols)
    if k <= 0:
        return cp.arange(ncols, dtype=cp.int32)
    w = cp.array(y, order="C", copy=True)
    nb = -(-ncols // 32)
    nrm2 = cp.empty(ncols, dtype=w.dtype)
    pos = cp.empty(ncols, dtype=cp.int32)
    col_at = cp.empty(ncols, dtype=cp.int32)
    piv = cp.empty(k, dtype=cp.int32)
    pval = cp.empty(2 * nb, dtype=w.dtype)  # per-block maxima, two halves by step parity
    ppos = cp.empty(2 * nb, dtype=cp.int32)
    pcol = cp.empty(2 * nb, dtype=cp.int32)
    init, step = _kernels(cp.dtype(w.dtype).name)
    r, n, ld = cp.int32(rows), cp.int32(ncols), cp.int64(ncols)
    init((nb,), (32, _ROW_GROUPS), (w, nrm2, pos, col_at, pval, ppos, pcol, r, n, ld))
    arrays = (w, nrm2, pos, col_at, piv, pval, ppos, pcol)
    held = [ctypes.c_void_p(x.data.ptr) for x in arrays]
    held += [ctypes.c_int32(rows), ctypes.c_int32(ncols), ctypes.c_int64(ncols)]
    i_arg = ctypes.c_int32(0)
    held.append(i_arg)
    params = (ctypes.c_void_p * len(held))(*(ctypes.addressof(h) for h in held))
    stream = cp.cuda.get_current_stream().ptr
    smem = rows * w.itemsize  # the reflector
    launch, fn, pp = cp.cuda.driver.launchKernel, step.kernel.ptr, ctypes.addressof(params)
    for i in range(k):
        i_arg.value = i
        launch(fn, nb, 1, 1, 32, _ROW_GROUPS, 1, smem, stream, pp, 0)
    col_at[:k] = piv
    return col_at


def qrcp_pivots(y, k: int) -> list[int]:
    """The first ``min(k, *y.shape)`` pivots of :func:`qrcp_order` as host ints."""
    k = max(min(k, *y.shape), 0)
    return [int(v) for v in qrcp_order(y, k)[:k].get()]
