"""Pivoted Cholesky on the GPU in LAPACK ``?pstrf``'s order (the column order of QR with
column pivoting from a Gram matrix, :mod:`mpqr.qr.pivoted_gram`), a panel of steps a
launch and the trailing update between panels a product through the precision policy;
the end (a pivot below the threshold) is read every few panels, so at most that many
panels' updates are spent after it.

``VARIANT``:

* "grid" (the default): a panel of up to ``GRID_PANEL`` steps in one launch over up to
  one thread block a multiprocessor (``pstrf_grid_panel``): each block keeps its rows of
  the panel's ``L`` in shared memory, one grid barrier a step carries the blocks'
  candidate pivots, nothing is exchanged inside the panel; then the few rows and columns
  the panel's exchanges moved past it are moved into place and the trailing block is
  updated by one rank-``nb`` product. If the blocks are not all resident at once (the
  barrier times out), the call is redone by "rows".
* "rows": ``PANEL`` steps in one thread block (``pstrf_panel_rows``), the panel's row
  exchanges (strided in a column-major matrix) deferred to one launch over the columns
  (``pstrf_rows``).
* "swap": rows and columns exchanged at each step (``pstrf_panel``).
"""

from __future__ import annotations

import functools

import cupy as cp
import numpy as np
from mpqr.backends.cupy.modules import ctype, functions

from mpqr.policy import gemm_sub

__all__ = ["CHECK_EVERY", "GRID_ACQ_REL", "GRID_ASYNC_CHECK", "GRID_LEAN_POLL", "GRID_LOWER",
           "GRID_LOWER_CHUNKS", "GRID_PANEL", "GRID_PREFETCH", "GRID_ROWS", "GRID_SPREAD",
           "PANEL", "VARIANT", "grid_layout", "grid_panel_width", "pivoted_cholesky",
           "supports"]

#: Steps a launch of "rows" / "swap" (at most 64: the kernel's shared row of L)
PANEL = 32
#: Panels between reads of whether the factorization has ended ("rows" / "swap")
CHECK_EVERY = 4
#: "grid", "rows" or "swap" (module docstring)
VARIANT = "grid"
#: Steps a launch of "grid" (fewer where the blocks' rows of L would not fit in shared
#: memory), and the fewest rows a block owns (fewer blocks: a cheaper barrier)
GRID_PANEL = 128
GRID_ROWS = 128
#: "grid": keep only the lower triangle up to date (the trailing update by block
#: columns: about 5/8 of the full product's flops; the moves read through the
#: triangle) instead of the whole symmetric matrix
GRID_LOWER = False
#: block columns of the "lower" update
GRID_LOWER_CHUNKS = 4
#: "grid": a step's exchange bookkeeping on the block's last threads, apart from the
#: threads that load the pivot's row of L (one dependent memory round trip a thread
#: instead of up to three on thread 0, on every step's critical path); False: thread 0
GRID_SPREAD = True
#: "grid": the barrier's wait reads only the counter, the timeout's flag and clock every
#: 32nd poll (a poll one memory round trip instead of two); False: every poll
GRID_LEAN_POLL = True
#: "grid": the barrier's two fences release/acquire (``fence.acq_rel.gpu``: the
#: barrier passes messages, it needs no single order of all fences) instead of
#: sequentially consistent (``__threadfence``); devices before compute capability 7.0
#: keep the latter
GRID_ACQ_REL = True
#: "grid": each block prefetches its candidate's column into L2 before the barrier (the
#: next pivot's column is one of them), where the blocks' columns together are at most
#: 4 MiB (4096 columns: 1 MiB a step; at 16384 only the last panels)
GRID_PREFETCH = True
#: "grid": whether the factorization has ended is read after every panel from a copy
#: made one panel earlier (pinned memory, an event): the host never waits for an empty
#: device queue (the next panel is queued first); a launch after the end returns at
#: once, so the lag costs at most one trailing product. False: a wait every
#: ``_GRID_CHECK_EVERY`` panels
GRID_ASYNC_CHECK = True
_GRID_CHECK_EVERY = 2
_GRID_SMEM = 200 * 1024
_THREADS = 1024
_grid_failed = False


def supports(g) -> bool:
    return g.ndim == 2 and g.dtype in (cp.float32, cp.float64)


def pivoted_cholesky(g, tol: float, panel: int | None = None, variant: str | None = None):
    """``(P, k, gmax)`` of :meth:`mpqr.backends._base.ArrayAPIBackend.pivoted_cholesky`
    for a real symmetric ``g``; ``g`` is not modified. ``panel``: steps a launch
    (default ``GRID_PANEL`` for "grid", ``PANEL`` otherwise)."""
    global _grid_failed
    variant = VARIANT if variant is None else variant
    if variant not in ("grid", "rows", "swap"):
        raise ValueError(f"variant must be 'grid', 'rows' or 'swap'; got {variant!r}")
    hi = 1024 if variant == "grid" else 64
    if panel is not None and not 1 <= panel <= hi:
        raise ValueError(f"panel must be within 1..{hi} for {variant!r}; got {panel}")
    n = g.shape[0]
    perm = cp.arange(n, dtype=cp.int32)
    gmax = float(cp.max(cp.diagonal(g))) if n else 0.0
    if not gmax > 0:
        return perm, 0, max(gmax, 0.0)
    if variant == "grid" and not _grid_failed:
        out = _grid(g, tol, gmax, GRID_PANEL if panel is None else panel)
        if out is False:  # the blocks were not co-resident: "rows" from now on
            _grid_failed = True
        elif out is not None:
            return out
    if variant == "grid":
        variant, panel = "rows", None
    return _single_block(g, tol, gmax, PANEL if panel is None else panel, variant)


def _single_block(g, tol, gmax, nb, variant):
    n = g.shape[0]
    dt = g.dtype
    perm = cp.arange(n, dtype=cp.int32)
    t = ctype(cp.dtype(dt).name)
    swap, rows, moves = functions("pstrf.cu", (f"pstrf_panel<{t}>", f"pstrf_panel_rows<{t}>",
                                               f"pstrf_rows<{t}>"))
    # C order: the kernel's column-major view of a symmetric matrix is the matrix itself,
    # and its columns of L are this array's rows (the update's operands without copies)
    w = cp.array(g, order="C", copy=True)
    d = cp.empty(n, dtype=dt)
    state = cp.zeros(2, dtype=cp.int32)
    rho = cp.empty(n, dtype=cp.int32)
    sk, sp = cp.empty(nb, dtype=cp.int32), cp.empty(nb, dtype=cp.int32)
    stop = dt.type(tol * gmax)
    prec = "fp64" if dt == cp.float64 else "fp32"
    for i, j0 in enumerate(range(0, n, nb)):
        head = (w, cp.int64(n), cp.int32(n), cp.int32(j0), cp.int32(nb))
        if variant == "swap":
            swap((1,), (_THREADS,), (*head, d, perm, stop, state))
        else:
            rows((1,), (_THREADS,), (*head, d, perm, rho, sk, sp, stop, state))
            moves((n - j0,), (128,), (*head, rho, sk, sp))
        j2 = j0 + nb
        if j2 >= n or (i % CHECK_EVERY == CHECK_EVERY - 1 and int(state[1])):
            break
        lt = w[j0:j2, j2:]  # the panel's columns of L below it, as rows
        gemm_sub(w[j2:, j2:], lt.T, lt, precision=prec, label="qrcp-pstrf-update")
    h = state.get()
    return perm, (int(h[0]) if h[1] else n), gmax


def grid_layout(rows: int, sms: int, least: int | None = None) -> tuple[int, int]:
    """``(blocks, R)``: ``rows`` rows in ``blocks`` contiguous runs of ``R`` (the last
    may be shorter, none empty), at most ``sms`` blocks, each at least ``least`` rows
    (default ``GRID_ROWS`` as it is at the call) where there are enough."""
    least = GRID_ROWS if least is None else least
    blocks = max(1, min(sms, -(-rows // least)))
    r = -(-rows // blocks)
    return -(-rows // r), r


def grid_panel_width(r: int, itemsize: int, nb: int) -> int:
    """The panel width for blocks of ``r`` rows: ``nb`` halved until the block's shared
    memory ((nb + 1) r + nb values and r ints) fits; 0 where not even one step fits."""
    while nb >= 1:
        if ((nb + 1) * r + nb) * itemsize + 4 * r <= _GRID_SMEM:
            return nb
        nb //= 2
    return 0


@functools.cache
def _sm_count(device: int) -> int:
    # once a device: ``attributes`` reads every attribute of the device, each call
    return cp.cuda.Device(device).attributes["MultiProcessorCount"]


def _grid(g, tol, gmax, nb, lower=None, spread=None, lean=None, acq_rel=None,
          prefetch=None):
    """The "grid" variant; None where a block's rows of one step do not fit its shared
    memory, False where its barrier timed out. ``lower``, ``spread``, ``lean``,
    ``acq_rel``, ``prefetch``: default ``GRID_LOWER``, ``GRID_SPREAD``,
    ``GRID_LEAN_POLL``, ``GRID_ACQ_REL``, ``GRID_PREFETCH``."""
    lower = GRID_LOWER if lower is None else lower
    spread = GRID_SPREAD if spread is None else spread
    lean = GRID_LEAN_POLL if lean is None else lean
    acq_rel = GRID_ACQ_REL if acq_rel is None else acq_rel
    prefetch = GRID_PREFETCH if prefetch is None else prefetch
    # the kernel's bits
    barrier = int(bool(lean)) | (int(bool(acq_rel)) << 1) | (int(bool(prefetch)) << 2)
    n = g.shape[0]
    dt = g.dtype
    sms = _sm_count(cp.cuda.Device().id)
    _b0, r0 = grid_layout(n, sms)
    nb = min(grid_panel_width(r0, dt.itemsize, nb), n)
    if nb == 0:
        return None
    t = ctype(cp.dtype(dt).name)
    panel_k, cols_out, cols_in, rows_k, sym_out, sym_in = functions(
        "pstrf.cu", (f"pstrf_grid_panel<{t}>", f"pstrf_grid_cols_out<{t}>",
                     f"pstrf_grid_cols_in<{t}>", f"pstrf_grid_rows<{t}>",
                     f"pstrf_grid_sym_out<{t}>", f"pstrf_grid_sym_in<{t}>"))
    threads = min(512, max(64, -(-r0 // 32) * 32))
    smem = ((nb + 1) * r0 + nb) * dt.itemsize + 4 * r0
    if smem > 48 * 1024 and panel_k.max_dynamic_shared_size_bytes < smem:
        panel_k.max_dynamic_shared_size_bytes = smem  # beyond 48 KiB: opt in
    w = cp.array(g, order="C", copy=True)  # the column-major view is the matrix itself
    perm = cp.arange(n, dtype=cp.int32)
    lp = cp.empty((nb, n), dtype=dt)  # the panel's L, a row a step, physical columns
    cval, cpos, cidx = (cp.empty(2 * sms, dtype=dt), cp.empty(2 * sms, dtype=cp.int32),
                        cp.empty(2 * sms, dtype=cp.int32))
    rho = cp.empty(n, dtype=cp.int32)
    moved = cp.empty(nb, dtype=cp.int32)
    tmp = cp.empty(nb * n, dtype=dt)
    state = cp.zeros(4, dtype=cp.int32)
    npanels = -(-n // nb)
    bars = cp.zeros(npanels, dtype=cp.uint32)
    stop = dt.type(tol * gmax)
    prec = "fp64" if dt == cp.float64 else "fp32"
    ld, n32 = cp.int64(n), cp.int32(n)
    lagged = GRID_ASYNC_CHECK
    if lagged:
        hmem = cp.cuda.alloc_pinned_memory(state.nbytes)
        hstate = np.ndarray((state.size,), dtype=np.int32, buffer=hmem)
        stream = cp.cuda.get_current_stream()
        copied = None  # the event after the last copy of state
    for i, j0 in enumerate(range(0, n, nb)):
        blocks, r = grid_layout(n - j0, sms)
        if r > r0:  # never more rows a block than the shared memory was sized for
            r = r0
            blocks = -(-(n - j0) // r)
        panel_k((blocks,), (threads,),
                (w, ld, n32, cp.int32(j0), cp.int32(nb), cp.int32(r), lp, cval, cpos, cidx,
                 perm, rho, moved, stop, state, bars[i:], cp.int32(lower), cp.int32(spread),
                 cp.int32(barrier)), shared_mem=smem)
        j2 = j0 + nb
        if j2 >= n:
            break
        if lagged:
            if copied is not None:  # the state before this panel (this one is queued)
                copied.synchronize()
                if hstate[1] or hstate[3]:
                    break
            cp.cuda.runtime.memcpyAsync(hstate.ctypes.data, state.data.ptr, state.nbytes,
                                        cp.cuda.runtime.memcpyDeviceToHost, stream.ptr)
            copied = cp.cuda.Event(disable_timing=True)
            copied.record(stream)
        elif i % _GRID_CHECK_EVERY == _GRID_CHECK_EVERY - 1:
            h = state.get()
            if h[1] or h[3]:
                break
        if lower:
            sym_out((nb,), (256,), (w, ld, n32, cp.int32(j2), rho, moved, state, tmp))
            sym_in((nb,), (256,), (w, ld, n32, cp.int32(j2), moved, state, tmp))
        else:
            cols_out((nb,), (256,), (w, ld, n32, cp.int32(j0), rho, moved, state, tmp))
            cols_in((nb,), (256,), (w, ld, n32, cp.int32(j0), moved, state, tmp))
            rows_k((n - j2,), (max(32, -(-nb // 32) * 32),),
                   (w, ld, n32, cp.int32(j2), rho, moved, state))
        lt = cp.take(lp, rho[j2:], axis=1)  # the panel's L at the positions after it
        if not lower:
            gemm_sub(w[j2:, j2:], lt.T, lt, precision=prec, label="qrcp-pstrf-update")
            continue
        # the array's rows are the column-major view's columns: rows c0:c1 from column
        # c0 on hold that view's lower triangle of those columns
        step = max(1, -(-(n - j2) // GRID_LOWER_CHUNKS))
        for c0 in range(j2, n, step):
            c1 = min(c0 + step, n)
            gemm_sub(w[c0:c1, c0:], lt[:, c0 - j2:c1 - j2].T, lt[:, c0 - j2:], precision=prec,
                     label="qrcp-pstrf-update")
    h = state.get()
    if h[3]:
        return False
    return perm, (int(h[0]) if h[1] else n), gmax
