"""Repeated calls replayed as CUDA graphs.

A square QR issues thousands of small launches, each behind Python's policy decisions and
CuPy's bookkeeping; on a GPU that outruns the host the launches, not the kernels, set the
time (H200, 8192^2 float32 at fp16: the GPU busy 44 ms of a 106-112 ms call). A route
the core marks as capturable (no host read between its launches) runs as usual on its
first call; on the second call with the same key it is captured once, on a stream of its
own and with a memory pool of its own, into a CUDA graph that later calls replay: the
input copied into the graph's input buffer, one graph launch, the outputs copied out.

Why a pool of its own: the addresses the graph reads and writes are fixed at capture.
Arrays freed during the capture go back to that pool only, where the capture's later
allocations take them as they will on every replay; no other array ever gets them. The
pool holds the route's whole workspace between calls, so a graph is kept only where
that fits within :data:`HOLD_FRACTION` of the device's memory, at most :data:`MAX_GRAPHS`
of them (least recently used dropped first); :func:`clear` drops them all (the memory
plan does, before a call on the lean plan). ``MPQR_GRAPHS=0`` turns replays off.

A capture that fails (a host read the core did not expect, an unsupported call) leaves
the key marked: its calls run as before.
"""

from __future__ import annotations

import collections
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["FAILED", "HOLD_FRACTION", "MAX_GRAPHS", "clear", "enabled", "held_bytes", "kept",
           "replay"]

#: graphs kept at once (each holds its route's workspace in a pool of its own)
MAX_GRAPHS = 2
#: a graph is kept only where its pool and input take at most this share of the device's
#: memory, and half the memory free before the capture
HOLD_FRACTION = 0.25


@dataclass
class _Graph:
    graph: Any
    pool: Any
    static: Any
    outputs: tuple
    #: recorded after the last replay's outputs were copied out: the next replay's input
    #: copy waits for it, whichever stream (thread) it comes from
    done: Any = None


_GRAPHS: collections.OrderedDict[tuple, _Graph] = collections.OrderedDict()
#: one replay (input in, launch, outputs out) at a time: the graph's buffers are shared
_LOCK = threading.RLock()
_SEEN: set[tuple] = set()
#: keys whose capture failed, and why
FAILED: dict[tuple, str] = {}


def enabled() -> bool:
    """Whether calls may be replayed (``MPQR_GRAPHS``, default on)."""
    return os.environ.get("MPQR_GRAPHS", "1").strip().lower() not in ("0", "off", "false", "no")


def held_bytes() -> int:
    """Device bytes the kept graphs' pools hold."""
    return sum(g.pool.total_bytes() for g in _GRAPHS.values())


def kept() -> list[tuple]:
    """The keys of the kept graphs (device, input shape, dtype, the route's own key)."""
    return list(_GRAPHS)


def clear() -> None:
    """Drop every kept graph and hand its pool's memory back to the device."""
    while _GRAPHS:
        _, g = _GRAPHS.popitem(last=False)
        _drop(g)
    _SEEN.clear()


def _drop(g: _Graph) -> None:
    pool = g.pool
    g.graph = g.static = g.outputs = None
    pool.free_all_blocks()


def replay(cp: Any, key: tuple, fn: Callable[[Any, bool], tuple], a: Any, *,
           overwrite: bool, hold_bytes: int) -> tuple:
    """``fn(a, overwrite)`` (a tuple of arrays or None), replayed from a CUDA graph from
    the second call of ``key`` on. The result's arrays are the call's own (copies of the
    graph's outputs); ``hold_bytes``: the route's workspace beyond its input, estimated."""
    if not enabled():
        return fn(a, overwrite)
    dev = cp.cuda.Device()
    key = (dev.id, tuple(a.shape), str(a.dtype), *key)
    with _LOCK:
        g = _GRAPHS.get(key)
        if g is None:
            if key in FAILED or key not in _SEEN or not _fits(cp, a, hold_bytes):
                # the first call runs as it is: it compiles the kernels, fills the
                # autotuners' and libraries' caches, which a capture must not do
                _SEEN.add(key)
                g = None
            else:
                g = _capture(cp, key, fn, a)
        else:
            _GRAPHS.move_to_end(key)
            stream = cp.cuda.get_current_stream()
            if g.done is not None:
                stream.wait_event(g.done)
            g.static[...] = a
        if g is not None:
            stream = cp.cuda.get_current_stream()
            g.graph.launch(stream)
            out = tuple(None if o is None else o.copy() for o in g.outputs)
            g.done = stream.record()
            return out
    return fn(a, overwrite)


def _fits(cp: Any, a: Any, hold_bytes: int) -> bool:
    free, total = cp.cuda.runtime.memGetInfo()
    need = hold_bytes + a.nbytes
    return need <= HOLD_FRACTION * total and need <= free / 2


def _capture(cp: Any, key: tuple, fn: Callable[[Any, bool], tuple], a: Any) -> _Graph | None:
    from mpqr.backends.cupy import blas

    why = blas.available()
    if why is not None:
        FAILED[key] = why
        return None
    pool = cp.cuda.MemoryPool()
    with cp.cuda.using_allocator(pool.malloc):
        static = cp.empty(a.shape, dtype=a.dtype)
    static[...] = a
    caller = cp.cuda.get_current_stream()
    stream = cp.cuda.Stream(non_blocking=True)
    stream.wait_event(caller.record())
    graph = outputs = None
    try:
        with stream, cp.cuda.using_allocator(pool.malloc), blas.capturing():
            stream.begin_capture()
            try:
                outputs = fn(static, True)
            finally:
                graph = stream.end_capture()
    except Exception as exc:  # any failure of the capture: this key runs without a graph
        import traceback

        where = [f for f in traceback.extract_tb(exc.__traceback__)
                 if "/mpqr/" in f.filename or "/backends/" in f.filename][-4:]
        FAILED[key] = f"{type(exc).__name__}: {exc} (at " + " < ".join(
            f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno} {f.name}" for f in reversed(where)) + ")"
        outputs = graph = None
        pool.free_all_blocks()
        return None
    if hasattr(graph, "upload"):
        graph.upload(caller)
    g = _Graph(graph, pool, static, tuple(outputs))
    _GRAPHS[key] = g
    while len(_GRAPHS) > MAX_GRAPHS:
        _drop(_GRAPHS.popitem(last=False)[1])
    return g
