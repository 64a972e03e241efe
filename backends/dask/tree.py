"""The TSQR reduction tree across row blocks (Demmel et al. 2012): each leaf block is
factored by ``mpqr.qr`` on its worker, groups of ``split_every`` R factors are stacked
and factored again up to the root, and Q is the leaf Q times the products of the
tree's Q blocks on the way down. Unconditionally stable (every node is a Householder
QR); what ``mpqr.qr`` runs for ``Q`` of a numerically rank-deficient matrix (after
the preconditioned CholQR fallback breaks down) and for the in-core methods named
explicitly."""

from __future__ import annotations

import math
from typing import Any

from mpqr.backends.dask import _blocks

__all__ = ["tree_depth", "tsqr"]


def tree_depth(nblocks: int, split_every: int) -> int:
    """Levels above the leaves of a tree reducing ``nblocks`` in groups of ``split_every``."""
    return 0 if nblocks <= 1 else math.ceil(math.log(nblocks) / math.log(split_every) - 1e-12)


def _slice_rows(q: Any, start: int, stop: int) -> Any:
    return q[start:stop, :]


def _min(a: int, b: int) -> int:
    return a if a < b else b


def tsqr(x: Any, *, precision: Any, method: str, want_q: bool, split_every: int,
         wprec: str) -> tuple[Any, Any]:
    """``(Q or None, R)`` as dask arrays (lazy) of the tall, row-chunked ``x``: Q with
    ``x``'s row chunks and ``n`` columns, R ``n x n`` with a non-negative real diagonal."""
    import dask
    import dask.array as da

    n = x.shape[1]
    blocks = [b for b in x.to_delayed().ravel()]
    heights = list(x.chunks[0])
    leaf = dask.delayed(_blocks.bind(_blocks.leaf_qr), nout=2, pure=True)
    node = dask.delayed(_blocks.bind(_blocks.node_qr), nout=2, pure=True)
    # level 0: leaves; every entry (q, r, k) with k = rows of r
    level = []
    for b, h in zip(blocks, heights):
        q, r = leaf(b, precision, method)
        level.append((q, r, _min(h, n)))
    levels = [level]
    while len(level) > 1:
        up = []
        for i in range(0, len(level), split_every):
            group = level[i:i + split_every]
            q, r = node([g[1] for g in group], precision, method)
            up.append((q, r, _min(sum(g[2] for g in group), n)))
        levels.append(up)
        level = up
    root_q, root_r, k = levels[-1][0]
    r_arr = da.from_delayed(root_r, shape=(k, n), dtype=x.dtype, meta=x._meta)
    if not want_q:
        return None, r_arr
    # top-down: W(child) = Q(node)[rows of the child] @ W(node), W(root) = I
    prod = dask.delayed(_blocks.bind(_blocks.product), pure=True)
    rows = dask.delayed(_slice_rows, pure=True)
    ws: list[Any] = [None]
    for depth in range(len(levels) - 1, 0, -1):
        below = levels[depth - 1]
        nxt = []
        for j, w in enumerate(ws):
            start = 0
            for child in below[j * split_every:(j + 1) * split_every]:
                sub = rows(levels[depth][j][0], start, start + child[2])
                nxt.append(sub if w is None else prod(sub, w, wprec, "dask-tsqr-W"))
                start += child[2]
        ws = nxt
    if len(levels) == 1:
        parts = [da.from_delayed(root_q, shape=(heights[0], k), dtype=x.dtype, meta=x._meta)]
    else:
        parts = [da.from_delayed(prod(lv[0], w, wprec, "dask-tsqr-Q"), shape=(h, k),
                                 dtype=x.dtype, meta=x._meta)
                 for lv, w, h in zip(levels[0], ws, heights)]
    return da.concatenate(parts, axis=0), r_arr
