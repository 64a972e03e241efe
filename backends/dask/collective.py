"""The collective route: Dask places the blocks and starts one task per worker, a
communicator carries the ``n x n`` reductions between the workers.

A call sends one task per worker: the task runs every pass of CholQR2 over the
worker's row blocks, one block's temporaries at a time (a worker holds its share of
``A``, its share of ``Q`` and one block more), with each Gram matrix summed across
the workers by :meth:`Communicator.allreduce_sum`, and keeps its share of ``Q`` on the
worker as the blocks of the result array (the input's row chunks; one small task per
block names each block). Only the ``n x n``
sums move between workers; no result passes through the client but ``R``.

Communicators (one per cluster, made once by :func:`communicator` and kept in a
registry on each worker, keyed by the communicator's id and the worker's address):

* :class:`NcclCommunicator`: NCCL all-reduce (``ncclSum``) of device buffers on the
  current CuPy stream, ``cupy.cuda.nccl``; the unique id is made on the client and
  sent to every worker, which joins the communicator in one concurrent ``client.run``.
* :class:`ThreadCommunicator`: the workers of one process (``LocalCluster(processes=
  False)``) sum through shared memory, in rank order, so every rank gets the same bits;
  the route's CPU implementation, for NumPy blocks and tests.

A worker lost during a call makes the call raise :class:`CollectiveError` (the other
ranks' waits are aborted, never a partial sum); :func:`cholqr2` then builds a new
communicator over the workers left and runs once more from the inputs.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any, Protocol

from mpqr.backends.dask._blocks import block_backend, to_host

from mpqr._errors import BreakdownError
from mpqr.policy import gemm, record_event

__all__ = ["CollectiveError", "Communicator", "NcclCommunicator", "ThreadCommunicator",
           "cholqr2", "communicator", "nccl_available"]

#: seconds a rank waits for the others at an all-reduce before the call fails
TIMEOUT = 60.0

#: worker-side registry: (communicator id, worker address) -> communicator
_REGISTRY: dict[tuple[str, str], Any] = {}
#: in-process groups of the thread communicator: communicator id -> shared state
_GROUPS: dict[str, _Group] = {}
_LOCK = threading.Lock()


class CollectiveError(RuntimeError):
    """A collective call failed on some worker (lost, timed out or raised)."""


class Communicator(Protocol):
    """What the per-worker task needs: its rank, the group size and a sum."""

    rank: int
    size: int

    def allreduce_sum(self, x: Any) -> Any:
        """The elementwise sum of ``x`` over all ranks (same shape and dtype), on
        every rank."""


class _Group:
    def __init__(self, size: int):
        self.size = size
        self.parts: list[Any] = [None] * size
        self.barrier = threading.Barrier(size, timeout=TIMEOUT)
        self.count = 0


class ThreadCommunicator:
    """All-reduce between the worker threads of one process (threaded workers)."""

    def __init__(self, cid: str, size: int, rank: int):
        with _LOCK:
            self.group = _GROUPS.setdefault(cid, _Group(size))
        self.rank, self.size, self.calls = rank, size, 0

    def allreduce_sum(self, x: Any) -> Any:
        g = self.group
        try:
            g.parts[self.rank] = x
            g.barrier.wait()
            total = g.parts[0]
            for p in g.parts[1:]:  # rank order: the same bits on every rank
                total = total + p
            g.barrier.wait()
        except threading.BrokenBarrierError as exc:
            raise CollectiveError("all-reduce aborted: a worker of the communicator did "
                                  "not reach it (lost or failed)") from exc
        self.calls += 1
        return total

    def abort(self) -> None:
        self.group.barrier.abort()


class NcclCommunicator:
    """NCCL all-reduce of CuPy arrays between one GPU per worker."""

    def __init__(self, uid: Any, size: int, rank: int):
        from cupy.cuda import nccl

        self.comm = nccl.NcclCommunicator(size, uid, rank)
        self.rank, self.size, self.calls = rank, size, 0

    def allreduce_sum(self, x: Any) -> Any:
        import cupy
        from cupy.cuda import nccl

        x = cupy.ascontiguousarray(x)
        out = cupy.empty_like(x)
        real = x.view(x.real.dtype) if x.dtype.kind == "c" else x
        kinds = {"float32": nccl.NCCL_FLOAT32, "float64": nccl.NCCL_FLOAT64,
                 "float16": nccl.NCCL_FLOAT16}
        self.comm.allReduce(real.data.ptr, out.data.ptr, real.size, kinds[str(real.dtype)],
                            nccl.NCCL_SUM, cupy.cuda.get_current_stream().ptr)
        self.calls += 1
        return out

    def abort(self) -> None:
        self.comm.abort()


def nccl_available() -> str | None:
    """None where ``cupy.cuda.nccl`` loads here, else the loader's message."""
    try:
        from cupy.cuda import nccl

        nccl.get_version()
    except Exception as exc:  # ImportError, or the library failing to load
        return f"{type(exc).__name__}: {exc}"
    return None


# --- set-up: once per cluster ----------------------------------------------------------

def _join(cid: str, kind: str, uid: Any, ranks: dict[str, int], dask_worker: Any = None) -> str:
    addr = dask_worker.address
    if (cid, addr) not in _REGISTRY:
        size, rank = len(ranks), ranks[addr]
        comm = (NcclCommunicator(uid, size, rank) if kind == "nccl"
                else ThreadCommunicator(cid, size, rank))
        _REGISTRY[cid, addr] = comm
    return addr


class _Handle:
    """The client's view of a communicator: its id, kind and the workers' ranks."""

    def __init__(self, cid: str, kind: str, ranks: dict[str, int]):
        self.cid, self.kind, self.ranks = cid, kind, ranks


_HANDLES: dict[tuple[int, str], _Handle] = {}


def communicator(client: Any, kind: str, *, renew: bool = False) -> _Handle:
    """The cluster's communicator of ``kind`` (``"nccl"`` or ``"thread"``), made on the
    first call (every worker joins in one concurrent ``client.run``) and reused."""
    workers = sorted(client.scheduler_info()["workers"])
    key = (id(client), kind)
    h = _HANDLES.get(key)
    if h is not None and not renew and sorted(h.ranks) == workers:
        return h
    cid = uuid.uuid4().hex
    ranks = {w: i for i, w in enumerate(workers)}
    uid = None
    if kind == "nccl":
        from cupy.cuda import nccl

        uid = nccl.get_unique_id()
    client.run(_join, cid, kind, uid, ranks, workers=workers)
    h = _HANDLES[key] = _Handle(cid, kind, ranks)
    return h


def _abort(cid: str, dask_worker: Any = None) -> None:
    for (c, _), comm in list(_REGISTRY.items()):
        if c == cid and hasattr(comm, "abort"):
            comm.abort()


# --- the per-worker task ---------------------------------------------------------------

class _Breakdown(Exception):
    """Every rank sees the same sums, so every rank breaks down alike; the client turns
    this into :class:`BreakdownError` (which does not pickle by its arguments)."""


def _chol(backend: Any, g: Any, which: str) -> Any:
    try:
        return backend.cholesky(g, upper=True)
    except Exception as exc:
        raise _Breakdown(f"collective CholQR2: the {which} Gram matrix is not "
                         f"numerically positive definite ({exc})") from exc


def _worker_cholqr2(cid: str, n: int, dtype: str, like: Any,
                    *blocks: Any) -> tuple[dict[str, Any], list[Any]]:
    """CholQR2 over this worker's blocks, the Gram sums by all-reduce."""
    from distributed import get_worker

    comm = _REGISTRY[cid, get_worker().address]
    backend = block_backend(blocks[0] if blocks else like)
    t0 = time.perf_counter()
    calls0 = comm.calls
    try:
        return _cholqr2_body(comm, backend, n, dtype, blocks, t0, calls0)
    except _Breakdown as exc:
        return {"breakdown": str(exc), "rank": comm.rank}, []


def _cholqr2_body(comm: Any, backend: Any, n: int, dtype: str, blocks: tuple[Any, ...],
                  t0: float, calls0: int) -> tuple[dict[str, Any], list[Any]]:
    from mpqr.qr.gram_blocked import gram

    xp = backend.xp
    dev = getattr(blocks[0], "device", None) if blocks else None

    def gram_sum(parts: list[Any], label: str) -> Any:
        # one block's temporaries at a time: a worker holds its A, its Q and one block
        g = xp.zeros((n, n), dtype=getattr(xp, dtype), device=dev)
        for p in parts:
            g = g + gram(backend, p() if callable(p) else p, None, label)
        return comm.allreduce_sum(g)

    g1 = gram_sum(list(blocks), "collective-gram1")
    r1 = _chol(backend, g1, "first")
    g2 = gram_sum([lambda b=b: backend.right_solve_upper(b, r1) for b in blocks],
                  "collective-gram2")
    eye = xp.eye(n, dtype=g2.dtype, device=dev)
    cert = float(xp.linalg.matrix_norm(g2 - eye))
    if cert > 0.5:  # every rank holds the same g2: every rank returns here
        return {"r": None, "cert": cert, "rank": comm.rank,
                "collectives": comm.calls - calls0, "seconds": time.perf_counter() - t0}, []
    r2 = _chol(backend, g2, "second")
    out = [backend.right_solve_twice(b, r1, r2) for b in blocks]
    r = gemm(r2, r1, label="collective-r", backend=backend)
    return {"r": to_host(r) if comm.rank == 0 else None, "cert": cert,
            "rank": comm.rank, "collectives": comm.calls - calls0,
            "seconds": time.perf_counter() - t0}, out


def _pick(res: tuple[dict[str, Any], list[Any]], j: int) -> Any:
    """Block ``j`` of the worker's ``Q`` (the same array, no copy)."""
    return res[1][j] if j < len(res[1]) else None


def _info(res: tuple[dict[str, Any], list[Any]]) -> dict[str, Any]:
    """The task's small results (``R`` on rank 0, the certificate, counts)."""
    return res[0]


# --- the client's side -----------------------------------------------------------------

def _block_futures(client: Any, x: Any) -> list[Any]:
    from distributed import futures_of

    order = {f.key: f for f in futures_of(x)}
    if not all(k in order for k in _row_keys(x)):  # not persisted as these blocks
        x = client.persist(x)
        order = {f.key: f for f in futures_of(x)}
    return [order[k] for k in _row_keys(x)]


def _row_keys(x: Any) -> list[Any]:
    return [k[0] for k in x.__dask_keys__()]


#: fraction of a worker's ``memory_limit`` at which distributed pauses it (its default)
PAUSE_FRACTION = 0.8


def check_memory(limits: dict[str, int], held: dict[str, int]) -> None:
    """Raise where a worker's ``memory_limit`` cannot hold its blocks of ``x`` and of ``Q``.

    distributed counts a CuPy block's bytes against the worker's (host) memory limit and
    pauses the worker at :data:`PAUSE_FRACTION` of it; a paused worker runs no task, so
    the collective call would wait on it. ``limits``: worker -> ``memory_limit`` (0: no
    limit); ``held``: worker -> bytes of its blocks of ``x`` and of ``Q``.
    """
    short = {w: (b, limits.get(w, 0)) for w, b in held.items()
             if limits.get(w, 0) and b > PAUSE_FRACTION * limits[w]}
    if short:
        gib = 2.0**30
        what = "; ".join(f"{w}: memory_limit {lim / gib:.2f} GiB, its blocks of x and Q "
                         f"{b / gib:.2f} GiB" for w, (b, lim) in sorted(short.items()))
        raise MemoryError(
            f"collective route: the worker memory limit is below the blocks it holds "
            f"({what}); distributed would pause the worker at {PAUSE_FRACTION:.0%} of its "
            f"limit and the call would wait on it. Start the workers with memory_limit=0 "
            f"(CuPy blocks live in device memory) or a limit above twice their share of x")


def _wait_or_lost(client: Any, futs: list[Any], ranks: dict[str, int]) -> None:
    """Wait for ``futs``; raise :class:`CollectiveError` as soon as a worker of the
    communicator has left the cluster (its task would wait for it forever)."""
    from distributed import wait

    deadline = time.monotonic() + TIMEOUT + 10
    while True:
        try:
            wait(futs, timeout=0.25)
            return
        except TimeoutError:
            pass
        gone = set(ranks) - set(client.ncores())
        if gone:
            raise CollectiveError(f"worker(s) {sorted(gone)} left the cluster during the "
                                  f"call")
        if time.monotonic() > deadline:
            raise CollectiveError(f"collective call did not finish in {TIMEOUT + 10:.0f} s")


def cholqr2(x: Any, *, client: Any = None, kind: str | None = None,
            retries: int = 1) -> tuple[Any, Any]:
    """``(Q, R)`` of a dask array chunked by rows by the collective route.

    Parameters
    ----------
    x : dask.array.Array, shape (m, n)
        Row chunks only; persisted blocks are used where they are (else persisted
        first). A worker that holds none of them takes part with a zero Gram matrix.
    client : distributed.Client, optional
        Default: the current client.
    kind : {"nccl", "thread"}, optional
        The communicator; default NCCL for CuPy blocks, threads otherwise.
    retries : int
        Runs from the inputs after a worker was lost, each on a new communicator.

    Returns
    -------
    Q : dask.array.Array, shape (m, n)
        Persisted: its blocks held where ``x``'s are, ``x``'s row chunks.
    R : numpy.ndarray, shape (n, n)

    Raises
    ------
    BreakdownError
        A Gram matrix is not numerically positive definite, or the second one fails
        CholQR2's certificate ``||Q_1^H Q_1 - I||_F <= 1/2``.
    CollectiveError
        A worker was lost or failed, after ``retries`` further runs.
    MemoryError
        A worker's ``memory_limit`` is below its blocks of ``x`` and ``Q``
        (:func:`check_memory`).
    """
    import dask.array as da
    from distributed import default_client, wait

    client = client or default_client()
    if x.ndim != 2 or x.numblocks[1] != 1:
        raise ValueError(f"x must be a 2-D dask array chunked by rows only, got shape "
                         f"{x.shape} with chunks {x.chunks}")
    n = x.shape[1]
    meta = x._meta
    if kind is None:
        kind = "nccl" if type(meta).__module__.startswith("cupy") else "thread"
    last: Exception | None = None
    t_start = time.perf_counter()
    for attempt in range(retries + 1):
        h = communicator(client, kind, renew=attempt > 0)
        futs = _block_futures(client, x)
        wait(futs)
        where = client.who_has(futs)
        per: dict[str, list[int]] = {w: [] for w in h.ranks}
        for i, f in enumerate(futs):
            holders = [w for w in where[f.key] if w in per]
            if not holders:
                raise CollectiveError(f"block {i} of x is held by no worker of the "
                                      f"communicator ({where[f.key]})")
            per[holders[0]].append(i)
        rowbytes = n * x.dtype.itemsize
        info = client.scheduler_info(n_workers=-1)["workers"]
        check_memory({w: int(info.get(w, {}).get("memory_limit") or 0) for w in per},
                     {w: 2 * rowbytes * sum(x.chunks[0][i] for i in idx)
                      for w, idx in per.items()})
        name = "collective-q-" + uuid.uuid4().hex
        tasks, infos, blocks = {}, [], [None] * len(futs)
        for w, idx in per.items():  # sent together: one message to the scheduler
            t = tasks[w] = client.submit(
                _worker_cholqr2, h.cid, n, str(x.dtype), meta, *[futs[i] for i in idx],
                workers=[w], allow_other_workers=False, pure=False, retries=0)
            infos.append(client.submit(_info, t, workers=[w], pure=False))
            for j, i in enumerate(idx):  # Q's blocks: the worker's arrays, kept on it
                blocks[i] = client.submit(_pick, t, j, key=(name, i, 0), workers=[w],
                                          pure=False)
        try:
            _wait_or_lost(client, infos, h.ranks)
            res = client.gather(infos)
        except Exception as exc:  # a lost worker, a timeout, an aborted all-reduce
            client.run(_abort, h.cid)
            for f in [*tasks.values(), *infos, *blocks]:
                f.cancel()
            last = exc
            continue
        r0 = next(v for v in res if v["rank"] == 0)
        if "breakdown" in r0:
            raise BreakdownError(r0["breakdown"], method="cholqr2")
        if r0["cert"] > 0.5:
            raise BreakdownError(f"collective CholQR2 not certified: ||Q_1^H Q_1 - I||_F"
                                 f" = {r0['cert']:.2e} > 1/2", method="cholqr2")
        wait(blocks)
        q = da.Array({b.key: b for b in blocks}, name, (x.chunks[0], (n,)), meta=meta)
        record_event("dask-collective",
                     f"dask: collective CholQR2 ({kind}) over {len(per)} workers, "
                     f"{len(futs)} blocks: one graph of {len(per)} compute tasks and "
                     f"{len(futs) + len(per)} tasks that name Q's blocks and the results, "
                     f"{r0['collectives']} all-reduces per worker",
                     route="collective", communicator=kind, graphs=1, tasks=len(per),
                     block_tasks=len(futs), collectives=r0["collectives"],
                     attempts=attempt + 1, workers=len(per),
                     blocks_per_worker=[len(per[w]) for w in sorted(per)],
                     seconds=max(v["seconds"] for v in res),
                     call_seconds=time.perf_counter() - t_start)
        return q, r0["r"]
    raise CollectiveError(f"collective CholQR2 failed on {retries + 1} attempts (a worker "
                          f"lost or failed); last error: {type(last).__name__}: {last}") \
        from last
