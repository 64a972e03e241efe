"""One pass over row-chunked dask arrays as one small graph: a task per group of blocks
(the blocks one worker thread holds, or one block) and, past ``split_every`` of them, a
tree of combines of their small results; computed with one call, so one synchronous
gather, and finished on the client.

Every distributed step of :mod:`mpqr.backends.dask` that reduces over the blocks is a
:func:`reduce_pass`: the leaf function runs on the blocks' worker and returns ``n x n``
or ``n x k`` arrays, moved to the host once per block task (so the tree and the client
never need the blocks' device), the combines add them (or factor them, for TSQR), and
the top level's results (at most ``split_every``) are gathered and combined by the
client. Small operands of the leaves (the factors ``R_j``, the current iterate: ``n x n``
or ``n x k``) travel inside each block task, of which there is one per worker thread on
persisted blocks: no task of their own, and no root task, whose scheduling would each add
a hop to every pass.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from mpqr.backends.dask._blocks import Small

from mpqr.policy import record_event

__all__ = ["Pass", "PassStats", "Small", "as_column", "compute_pass", "groups", "reduce_pass",
           "run_group", "sum_parts"]

_COUNTER = itertools.count()


@dataclass
class PassStats:
    """What one pass cost in graph terms (recorded in the explain trace)."""

    what: str
    blocks: int
    leaf_tasks: int
    tasks: int
    depth: int


def sum_parts(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Combine the leaves' dicts: ``*max`` entries by maximum, ``*ok`` flags by ``and``,
    everything else by addition (arrays of one namespace, and Python scalars)."""
    import numpy as np

    out = dict(parts[0])
    with np.errstate(all="ignore"):  # Inf + -Inf: the client reads NaN/Inf as such
        for p in parts[1:]:
            for k, v in p.items():
                if k.endswith("max"):
                    out[k] = np.maximum(out[k], v)
                elif k.endswith("ok"):
                    out[k] = out[k] & v  # flags may still be on the device
                else:
                    out[k] = out[k] + v
    return out


def run_group(leaf: Any, combine: Any, small: Small, blocks: list[list[Any]],
              views: tuple[Any, ...] = ()) -> Any:
    """The leaf function on each block of a group (in turn, so that one block's
    temporaries are freed before the next), its results combined. ``views[j]``, where
    not None, is applied to the ``j``-th array's block first."""
    from mpqr.backends.dask._blocks import block_backend, on_device, on_gpu

    if views:
        blocks = [[v if f is None else f(v) for v, f in zip(blk, views)] for blk in blocks]
    first = blocks[0][0] if blocks and blocks[0] else None
    value = (on_device(small, first, block_backend(first)) if on_gpu(first)
             else small.value)
    parts = [leaf(value, *blk) for blk in blocks]
    return _on_host(parts[0] if len(parts) == 1 else combine(parts))


def _on_host(out: Any) -> Any:
    """A group's combined result with its device arrays moved to the host: the leaves
    leave theirs on the device, so that the group's blocks run without a wait for the
    GPU between them, and the group reads its result back once."""
    if not isinstance(out, dict):
        return out
    from mpqr.backends.dask._blocks import on_gpu, to_host

    return {k: to_host(v) if on_gpu(v) else v for k, v in out.items()}


def as_column(v: Any) -> Any:
    """A 1-D block as an ``(h, 1)`` view: a vector ``b`` read as one column inside the
    block task (a dask-level ``b[:, None]`` would add a task per block to every pass)."""
    return v[:, None]


def _combine_list(combine: Any, parts: list[Any]) -> Any:
    return parts[0] if len(parts) == 1 else combine(parts)


def _finish(finish: Any, combine: Any, parts: list[Any]) -> Any:
    out = _combine_list(combine, parts)
    return out if finish is None else finish(out)


def groups(x: Any) -> list[list[int]]:
    """Block indices of ``x`` grouped by the worker thread that will read them.

    With a distributed client and ``x``'s blocks all in its workers' memory, each
    worker's blocks are split over its threads (a task per thread and pass, however
    many blocks it holds); otherwise one block per group, placed by the scheduler."""
    nb = len(x.chunks[0])
    single = [[i] for i in range(nb)]
    client = _client()
    if client is None or nb <= 1:
        return single
    keys = [k for k in _keys(x)]
    try:
        who = client.who_has(x)
        threads = client.nthreads()
    except Exception:  # pragma: no cover - a client that cannot answer: one per block
        return single
    by_worker: dict[str, list[int]] = {}
    for i, k in enumerate(keys):
        holders = who.get(k) or ()
        if not holders:
            return single  # not (all) computed yet: the scheduler places each block
        by_worker.setdefault(sorted(holders)[0], []).append(i)
    out = []
    for w, idx in by_worker.items():
        t = max(1, min(int(threads.get(w, 1)), len(idx)))
        out.extend(idx[j::t] for j in range(t))
    return out


def _keys(x: Any) -> list[Any]:
    return [k[0] if isinstance(k, list) else k for k in x.__dask_keys__()]


def _client() -> Any:
    """The distributed client that ``compute`` would use now, or None."""
    try:
        from distributed import default_client
    except ImportError:  # pragma: no cover - threaded or synchronous scheduler only
        return None
    try:
        client = default_client()
    except ValueError:
        return None
    import dask.base

    return client if dask.base.get_scheduler() == client.get else None


class _Held:
    """The last pass's result futures, released after the next pass's graph is sent, or
    a moment after the call (whichever comes first).

    A client sends its messages to the scheduler in batches at most every 10 ms: had a
    pass's futures been released when it ended, that message would hold the next pass's
    graph (or the caller's next graph, such as ``Q``'s) back by up to 10 ms."""

    DELAY_S = 0.05

    def __init__(self) -> None:
        self.futures: list[Any] = []

    def hold(self, client: Any, futures: list[Any]) -> None:
        self.futures = futures
        client.loop.call_later(self.DELAY_S, self._drop, futures)

    def _drop(self, futures: list[Any]) -> None:
        if self.futures is futures:
            self.futures = []

    def release(self) -> None:
        self.futures = []


_held = _Held()


@dataclass
class Pass:
    """A built pass: its graph, the keys of its top level and how the client finishes."""

    graph: Any
    layer: str
    keys: list[Any]
    combine: Any
    finish: Any


def reduce_pass(what: str, leaf: Any, combine: Any, arrays: list[Any], small: Any, *,
                split_every: int, finish: Any = None,
                group: list[list[int]] | None = None,
                views: tuple[Any, ...] = ()) -> tuple[Pass, PassStats]:
    """The pass computing ``finish(combine over the blocks of leaf(small, A_i, B_i,
    ...))`` for row-chunked ``arrays`` with equal row chunks (run it with
    :func:`compute_pass`), and its task counts.

    ``group``: block indices per leaf task (:func:`groups`; default one block each).
    ``views``: per array, None or a function of its block applied in the leaf task
    (:func:`as_column`)."""
    import dask
    from dask.highlevelgraph import HighLevelGraph

    keys = [_keys(a) for a in arrays]
    nb = len(keys[0])
    group = group if group is not None else [[i] for i in range(nb)]
    name = f"mpqr-{what}-{dask.base.tokenize(what, [a.name for a in arrays], next(_COUNTER))}"
    # keyed: each worker moves the operands to its device once a pass
    operands = Small(small, key=name)
    dsk: dict[Any, Any] = {}
    level = []
    for j, idx in enumerate(group):
        key = (name, 0, j)
        dsk[key] = (run_group, leaf, combine, operands,
                    [[ks[i] for ks in keys] for i in idx], tuple(views))
        level.append(key)
    depth = 0
    while len(level) > split_every:
        depth += 1
        up = []
        for j in range(0, len(level), split_every):
            key = (name, depth, j // split_every)
            dsk[key] = (_combine_list, combine, level[j:j + split_every])
            up.append(key)
        level = up
    graph = HighLevelGraph.from_collections(name, dsk, dependencies=arrays)
    stats = PassStats(what, nb, len(group), len(dsk), depth + 1)
    return Pass(graph, name, level, combine, finish), stats


def compute_pass(built: Pass, stats: PassStats) -> Any:
    """Compute one pass (one graph, one gather of its top level's small results), finish
    it on the client, and record it in the explain trace."""
    import dask
    from dask.delayed import Delayed

    delayed = [Delayed(k, built.graph, layer=built.layer) for k in built.keys]
    client = _client()
    if client is None:
        parts = dask.compute(*delayed)
    else:
        futures = client.compute(delayed)
        _held.release()  # the previous pass's results, now that this graph has gone out
        parts = client.gather(futures)
        _held.hold(client, futures)
    out = _finish(built.finish, built.combine, list(parts))
    record_event("dask-pass", f"dask: pass '{stats.what}' over {stats.blocks} row blocks: "
                 f"{stats.leaf_tasks} block tasks, {stats.tasks} tasks in all, a tree of "
                 f"depth {stats.depth}, one gather", what=stats.what, blocks=stats.blocks,
                 leaf_tasks=stats.leaf_tasks, tasks=stats.tasks, depth=stats.depth,
                 gathers=1)
    return out
