"""The collective route: Dask places the blocks, each call goes straight to every
worker at once (:mod:`mpqr.backends.dask._launch`, no task graph), a communicator
carries the ``n x n`` reductions between the workers.

A call runs every pass of CholQR2 on each worker over its row blocks, one block's
temporaries at a time (a worker holds its share of ``A``, its share of ``Q`` and one
block more), with each Gram matrix summed across the workers by
:meth:`Communicator.allreduce_sum`, and keeps its share of ``Q`` in the worker's memory
as the blocks of the result array (the input's row chunks, new keys announced to the
scheduler as the client's). Only the ``n x n`` sums move between workers; no result
passes through the client but ``R``.

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

from mpqr.backends.dask import _launch
from mpqr.backends.dask._blocks import bind, block_backend, to_host

from mpqr._errors import BreakdownError
from mpqr.policy import gemm, record_event
from mpqr.qr.cholqr_steps import StepNumbers, passes

__all__ = ["CollectiveError", "Communicator", "NcclCommunicator", "ThreadCommunicator",
           "balance", "cholqr2", "cluster_workers", "communicator", "nccl_available"]

#: seconds a rank waits for the others at an all-reduce before the call fails
TIMEOUT = 60.0

#: worker-side registry: (communicator id, worker address) -> communicator
_REGISTRY = _launch.REGISTRY
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

    def allreduce_max(self, x: Any) -> Any:
        """The elementwise maximum of real ``x`` over all ranks, on every rank."""


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
        return self._reduce(x, lambda s, p: s + p)

    def allreduce_max(self, x: Any) -> Any:
        import numpy as np

        return self._reduce(x, np.maximum)

    def _reduce(self, x: Any, op: Any) -> Any:
        g = self.group
        try:
            g.parts[self.rank] = x
            g.barrier.wait()
            total = g.parts[0]
            for p in g.parts[1:]:  # rank order: the same bits on every rank
                total = op(total, p)
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
        from cupy.cuda import nccl

        return self._reduce(x, nccl.NCCL_SUM)

    def allreduce_max(self, x: Any) -> Any:
        from cupy.cuda import nccl

        return self._reduce(x, nccl.NCCL_MAX)

    def _reduce(self, x: Any, op: int) -> Any:
        import cupy
        from cupy.cuda import nccl

        x = cupy.ascontiguousarray(x)
        out = cupy.empty_like(x)
        real = x.view(x.real.dtype) if x.dtype.kind == "c" else x
        kinds = {"float32": nccl.NCCL_FLOAT32, "float64": nccl.NCCL_FLOAT64,
                 "float16": nccl.NCCL_FLOAT16}
        self.comm.allReduce(real.data.ptr, out.data.ptr, real.size, kinds[str(real.dtype)],
                            op, cupy.cuda.get_current_stream().ptr)
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

def _device_of(kind: str, dask_worker: Any = None) -> str | None:
    """This worker's GPU (PCI bus id) for NCCL, its process for threads; None: none."""
    if kind == "thread":
        import os

        return f"process {os.getpid()}"
    try:
        import cupy

        return cupy.cuda.Device().pci_bus_id
    except Exception:
        return None


def _join(cid: str, kind: str, uid: Any, ranks: dict[str, int], dask_worker: Any = None) -> str:
    addr = dask_worker.address
    if (cid, addr) not in _REGISTRY:
        size, rank = len(ranks), ranks[addr]
        comm = (NcclCommunicator(uid, size, rank) if kind == "nccl"
                else ThreadCommunicator(cid, size, rank))
        comm.address = addr
        _REGISTRY[cid, addr] = comm
    return addr


class _Handle:
    """The client's view of a communicator: its id, kind, the workers' ranks and memory
    limits (0: none)."""

    def __init__(self, cid: str, kind: str, ranks: dict[str, int], limits: dict[str, int]):
        self.cid, self.kind, self.ranks, self.limits = cid, kind, ranks, limits


#: (scheduler address, kind) -> the communicator over the cluster's current workers
_HANDLES: dict[tuple[str, str], _Handle] = {}
#: (scheduler address, kind, workers) -> why a communicator cannot be made there
_REFUSED: dict[tuple[str, str, tuple[str, ...]], str] = {}


def communicator(client: Any, kind: str, *, renew: bool = False, check: bool = True,
                 exclude: frozenset[str] = frozenset()) -> _Handle:
    """The cluster's communicator of ``kind`` (``"nccl"`` or ``"thread"``), made on the
    first call (every worker joins in one concurrent ``client.run``) and reused while the
    cluster's workers stay the same (a new one where they changed). ``check=False``
    returns the kept one without asking the scheduler for its workers (a call sees a
    changed cluster in where its blocks are, or a lost worker while it waits);
    ``exclude``: workers a call saw lost, left out of a renewed one.

    Raises
    ------
    CollectiveError
        The workers cannot form one: for NCCL a worker without a GPU or two on one GPU,
        for threads workers in different processes; or joining failed (the message).
    """
    key = (client.scheduler.address, kind)
    h = _HANDLES.get(key)
    if h is not None and not renew and not check:
        return h
    info = _identity(client)
    # a worker seen lost may still be listed while it closes: never a rank again
    workers = sorted(w for w in info["workers"] if w not in exclude)
    if h is not None and not renew and sorted(h.ranks) == workers:
        return h
    refused = _REFUSED.get((*key, tuple(workers)))
    if refused is not None and not renew:
        raise CollectiveError(refused)
    try:
        h = _make(client, kind, workers, info)
    except CollectiveError as exc:
        _REFUSED[(*key, tuple(workers))] = str(exc)
        raise
    _HANDLES[key] = h
    return h


def _identity(client: Any) -> dict[str, Any]:
    """The scheduler's identity with every worker, asked of the scheduler itself.

    ``Client.scheduler_info`` returns the client's cached copy, which the client's
    periodic refresh overwrites with one that lists no workers (distributed 2026.8 asks
    with ``n_workers=0``): a read racing that refresh saw an empty cluster."""
    try:
        return dict(client.sync(client.scheduler.identity, n_workers=-1))
    except TypeError:  # a scheduler whose identity takes no n_workers (older distributed)
        return dict(client.scheduler_info())


def cluster_workers(client: Any) -> list[str]:
    """The cluster's worker addresses, sorted, asked of the scheduler (not the client's
    cached identity, which a periodic refresh leaves without workers: see
    :func:`_identity`)."""
    return sorted(_identity(client)["workers"])


def _make(client: Any, kind: str, workers: list[str], info: dict[str, Any]) -> _Handle:
    if not workers:
        raise CollectiveError("the cluster has no workers")
    devices = client.run(_device_of, kind, workers=workers)
    if kind == "nccl":
        none = [w for w in workers if devices.get(w) is None]
        if none:
            raise CollectiveError(f"NCCL communicator: worker(s) {none} have no GPU (CuPy "
                                  f"could not reach a CUDA device there)")
        if len(set(devices.values())) < len(workers):
            raise CollectiveError(f"NCCL communicator: two workers share a GPU ({devices}); "
                                  "give each worker its own (CUDA_VISIBLE_DEVICES)")
    elif len(set(devices.values())) > 1:
        raise CollectiveError(f"thread communicator: the workers run in different processes "
                              f"({devices}); it needs a threaded cluster (processes=False)")
    cid = uuid.uuid4().hex
    ranks = {w: i for i, w in enumerate(workers)}
    uid = None
    if kind == "nccl":
        from cupy.cuda import nccl

        uid = nccl.get_unique_id()
    try:
        client.run(_join, cid, kind, uid, ranks, workers=workers)
    except Exception as exc:
        raise CollectiveError(f"{kind} communicator: joining failed on the workers: "
                              f"{type(exc).__name__}: {exc}") from exc
    limits = {w: int(info["workers"][w].get("memory_limit") or 0) for w in workers}
    return _Handle(cid, kind, ranks, limits)


def forget(client: Any, h: _Handle) -> None:
    """Stop reusing ``h`` (its ranks' waits were aborted: it cannot sum any more); the
    next call makes a new communicator."""
    key = (client.scheduler.address, h.kind)
    if _HANDLES.get(key) is h:
        del _HANDLES[key]


def _abort(cid: str, dask_worker: Any = None) -> None:
    for (c, _), comm in list(_REGISTRY.items()):
        if c == cid and hasattr(comm, "abort"):
            comm.abort()


# --- which route ----------------------------------------------------------------------

#: dask config key: ``"auto"`` (the collective route for CuPy blocks on a distributed
#: cluster whose workers each have their own GPU and NCCL loads), ``"collective"``
#: (also NumPy blocks on a threaded cluster, by the thread communicator) or
#: ``"scheduler"`` (never)
CONFIG_KEY = "mpqr.dask.route"


def route(x: Any, *, method: str, prec_name: str, what: str) -> tuple[Any, str] | None:
    """``(client, communicator kind)`` where ``x``'s call takes the collective route,
    else None; either way the trace names the route and why (``dask-route``)."""
    import dask

    choice = dask.config.get(CONFIG_KEY, "auto")
    if choice not in ("auto", "collective", "scheduler"):
        raise ValueError(f"dask config {CONFIG_KEY!r} must be 'auto', 'collective' or "
                         f"'scheduler', got {choice!r}")
    cupy_blocks = type(x._meta).__module__.startswith("cupy")
    kind = "nccl" if cupy_blocks else "thread"
    why = None
    client = None
    if choice == "scheduler":
        why = f"dask config {CONFIG_KEY}='scheduler'"
    elif method not in ("auto", "cholqr2"):
        why = f"method={method!r} (the collective route runs CholQR2)"
    elif prec_name not in ("auto", "fp64", "fp32"):
        why = f"precision={prec_name!r} (the collective route runs native products)"
    elif x.dtype.kind != "f":
        why = f"dtype {x.dtype} (the collective route sums real Gram matrices)"
    elif choice == "auto" and not cupy_blocks:
        why = "NumPy blocks (CPU workers)"
    else:
        try:
            from distributed import default_client

            client = default_client()
        except (ImportError, ValueError):
            why = "no distributed client"
    if why is None and kind == "nccl":
        why = nccl_available()
        why = None if why is None else f"NCCL does not load on the client: {why}"
    if why is None:
        try:
            communicator(client, kind, check=False)
        except CollectiveError as exc:
            why = str(exc)
    if why is not None:
        record_event("dask-route", f"{what} (dask): the scheduler route (a graph per pass, "
                     f"the sums in trees): {why}", route="scheduler", reason=why)
        return None
    record_event("dask-route", f"{what} (dask): the collective route (one task per worker, "
                 f"the n x n sums by {kind} all-reduce)", route="collective",
                 communicator=kind)
    return client, kind


# --- the per-worker task ---------------------------------------------------------------

class _Breakdown(Exception):
    """Every rank sees the same sums, so every rank breaks down alike; the client turns
    this into :class:`BreakdownError` (which does not pickle by its arguments)."""


def _chol(backend: Any, g: Any, which: str) -> Any:
    try:
        r = backend.cholesky(g, upper=True)
    except Exception as exc:
        raise _Breakdown(f"collective CholQR2: the {which} Gram matrix is not "
                         f"numerically positive definite ({exc})", float("inf")) from exc
    if not bool(backend.all_finite(r)):
        raise _Breakdown(f"collective CholQR2: the {which} Gram matrix is out of range "
                         "(a column's squares over- or underflow)", float("inf"))
    return r


def _cholqr2_task(comm: Any, blocks: tuple[Any, ...], n: int, dtype: str, like: Any,
                  want_q: bool, prec: str, check: bool, phases: bool, found: Any = None
                  ) -> tuple[dict[str, Any], list[Any]]:
    """CholQR2 over this worker's blocks, the Gram sums by all-reduce (the body a call
    runs on each worker, :func:`mpqr.backends.dask._launch.launch`); ``found``: see
    :func:`_cholqr2_body`."""
    backend = block_backend(blocks[0] if blocks else _Meta.real(like))
    t0 = time.perf_counter()
    calls0 = comm.calls
    try:
        with backend.ignore_fp_warnings():  # a Gram matrix out of range breaks down below
            info, q = _cholqr2_body(comm, backend, n, dtype, blocks, want_q, prec, check, t0,
                                    calls0, phases=phases, found=found)
    except _Breakdown as exc:
        info, q = {"breakdown": str(exc), "rank": comm.rank, "cond": exc.args[1]}, []
    return info, q


def _found_task(comm: Any, held: dict[int, Any], announce: Any, plan: dict[str, Any],
                *args: Any) -> tuple[dict[str, Any], list[Any]]:
    """``plan["body"](comm, blocks, *args)`` over the blocks this rank reads, chosen on
    the ranks (``plan``: the blocks' ``rows``, the communicator's ``ranks``, the workers'
    ``limits``, ``bytes_per_row`` of ``A`` and ``Q`` a worker holds, ``keep`` whether
    ``Q`` is kept, ``like`` an array of the blocks' kind, ``ride``): every rank's
    holdings (``held``: index -> block) are summed by an all-reduce, so that every rank
    sees the same holders and makes the same :func:`assign`. With ``ride`` they ride on
    the body's first sum (its ``found``, a :class:`_Found`; the body reads every block it
    holds, and reads its share again only where a block is held twice), else they are
    summed by one all-reduce of their own first. The blocks of ``Q`` a rank will keep
    are announced (``announce``) before its body makes them. Where a block is held by
    no rank, or a worker's memory limit is below its share, every rank returns that
    (``unplaced`` / ``memory``) and nothing more runs."""
    found = _Found(comm, held, announce, plan)
    if plan["ride"]:
        res, out = plan["body"](comm, found.held, *args, found=found)
        if found.stop:
            return {**found.info, **res}, []
    else:
        like = found.held[0] if found.held else _Meta.real(plan["like"])
        total = comm.allreduce_sum(block_backend(like).from_small(found.holdings(), like))
        if found.settle(to_host(total)) is None:
            return found.info, []
        res, out = plan["body"](comm, found.blocks, *args)
    res.update(found.info, kept=found.idx if out else [])
    return res, out


class _Meta:
    """A zero-size array of the blocks' kind as a call's messages carry it: its module
    and dtype (a CuPy array pickles through the device on the client and back onto it
    on the worker), made again on the worker only where a rank holds no block."""

    __slots__ = ("dtype", "module")

    def __init__(self, a: Any):
        self.module = type(a).__module__.partition(".")[0]
        self.dtype = str(a.dtype)

    @staticmethod
    def real(like: Any) -> Any:
        """``like`` as an array (made here where it is a :class:`_Meta`)."""
        if not isinstance(like, _Meta):
            return like
        import importlib

        return importlib.import_module(like.module).empty((0, 0), dtype=like.dtype)


class _Found:
    """Which blocks a rank reads, from every rank's holdings (see :func:`_found_task`)."""

    def __init__(self, comm: Any, held: dict[int, Any], announce: Any,
                 plan: dict[str, Any]):
        self.comm, self.announce, self.plan = comm, announce, plan
        self.index = sorted(held)
        self.held = tuple(held[i] for i in self.index)
        self.blocks: tuple[Any, ...] = ()
        self.idx: list[int] = []
        self.stop = False
        self.info: dict[str, Any] = {"rank": comm.rank}

    def holdings(self, width: int | None = None) -> Any:
        """This rank's row of the ``ranks x blocks`` 0/1 matrix (the others' rows 0), on
        the host; ``width``: flattened, zero-padded and folded into rows of that width."""
        import numpy as np

        nb = len(self.plan["rows"])
        mine = np.zeros((self.comm.size, nb), dtype=str(self.plan["like"].dtype))
        mine[self.comm.rank, self.index] = 1
        if width is None:
            return mine
        flat = np.zeros(-(-mine.size // width) * width, dtype=mine.dtype)
        flat[:mine.size] = mine.ravel()
        return flat.reshape(-1, width)

    def settle(self, total: Any) -> tuple[Any, ...] | None:
        """The blocks this rank reads, from the summed holdings (host; folded as
        :meth:`holdings` folds them, or not); None where the call stops (``info`` says
        why: ``unplaced`` or ``memory``). The blocks of ``Q`` it keeps are announced."""
        rows, ranks = self.plan["rows"], self.plan["ranks"]
        total = total.ravel()[:self.comm.size * len(rows)].reshape(self.comm.size, -1)
        by_rank = {r: w for w, r in ranks.items()}
        holders = [[by_rank[r] for r in range(self.comm.size) if total[r, i] > 0]
                   for i in range(len(rows))]
        self.info["holders"] = holders
        if not all(holders):
            self.stop = True
            self.info["unplaced"] = [i for i, h in enumerate(holders) if not h]
            return None
        per = assign(holders, rows, ranks)
        try:
            check_memory(self.plan["limits"],
                         {w: self.plan["bytes_per_row"] * sum(rows[i] for i in idx)
                          for w, idx in per.items()})
        except MemoryError as exc:
            self.stop = True
            self.info["memory"] = str(exc)
            return None
        self.info["per"] = per
        self.idx = per[by_rank[self.comm.rank]]
        if self.plan["keep"]:
            self.announce(self.idx)
        where = {i: j for j, i in enumerate(self.index)}
        self.blocks = tuple(self.held[where[i]] for i in self.idx)
        return self.blocks

    @property
    def replicated(self) -> bool:
        """Some block is held by more than one rank (so a sum over every rank's
        holdings counted it more than once)."""
        return any(len(h) > 1 for h in self.info.get("holders", ()))


def _cholqr2_body(comm: Any, backend: Any, n: int, dtype: str, blocks: tuple[Any, ...],
                  want_q: bool, prec: str, check: bool, t0: float, calls0: int,
                  first_gram: Any = None, r_everywhere: bool = False,
                  phases: bool = False, found: Any = None) -> tuple[dict[str, Any], list[Any]]:
    """CholQR2's passes over ``blocks``; ``first_gram``: the summed ``A^H A`` already
    made (a host array, the same on every rank), in place of the first pass; ``phases``:
    the device synchronised after each step and its time recorded (``phases_ms``);
    ``found`` (a :class:`_Found`): ``blocks`` are every block this rank holds, and which
    of them it reads is settled from the holdings summed with the first Gram matrix."""
    from mpqr.backends.dask._blocks import _finite

    from mpqr.policy import fused_gemm
    from mpqr.qr import cholqr as c
    from mpqr.qr.gram_blocked import gram

    xp = backend.xp
    dev = getattr(blocks[0], "device", None) if blocks else None
    dt = getattr(xp, dtype)
    m = sum(b.shape[0] for b in blocks)

    def zeros(shape: tuple[int, ...]) -> Any:
        return xp.zeros(shape, dtype=dt, device=dev) if dev is not None else \
            xp.zeros(shape, dtype=dt)

    marks: dict[str, float] = {}
    last = [time.perf_counter()]

    def mark(step: str) -> None:
        if phases:
            backend.synchronize()
            now = time.perf_counter()
            marks[step] = round(1e3 * (now - last[0]), 3)
            last[0] = now

    # pass 1: each block's Gram product added up (no concatenation: one block at a time)
    g = zeros((n, n))
    bad = 0
    for b in (blocks if first_gram is None else ()):
        gb = gram(backend, b, prec, "collective-gram1")
        if check and not _finite(backend, b, gb, True):
            bad += 1
        g = g + gb
    mark("gram1")
    if check:  # a count of non-finite blocks rides on the first sum
        g = xp.concat([g, xp.full((1, n), float(bad), dtype=dt, device=dev)
                       if dev is not None else xp.full((1, n), float(bad), dtype=dt)])
    if found is not None:  # who holds which block rides on the same sum
        held = backend.from_small(found.holdings(n), g)
        g = xp.concat([g, held])
    # pass 2's choice made now: nothing of it waits on the sums
    fused = (backend.fused_cholqr_max_n is not None and n <= backend.fused_cholqr_max_n
             and dtype == "float64" and fused_gemm(backend, g.dtype, (n, n, max(m, 1)),
                                                   engine="native-fp64", precision=prec,
                                                   label="collective-gram2"))
    g = comm.allreduce_sum(g) if first_gram is None else backend.from_small(first_gram, g)
    mark("allreduce1")
    if found is not None:
        k = g.shape[0] - held.shape[0]
        picked = found.settle(to_host(g[k:]))
        if picked is None:  # a block on no rank, or short of memory: found.info says
            return {}, []
        if found.replicated:  # a block held twice was summed twice: the share read again
            return _cholqr2_body(comm, backend, n, dtype, picked, want_q, prec, check, t0,
                                 calls0, r_everywhere=r_everywhere, phases=phases)
        g = g[:k]
    # the n x n steps in one launch where the backend has it (Cholesky, R^-1 and their
    # checks' numbers on the device, read back once with the non-finite count); where a
    # check fails, or the backend has none, the steps below redo them one by one
    steps = backend.chol_steps(g[:n] if check else g)
    if steps is not None:
        extra = [xp.astype(g[n, :1], xp.float64)] if check else []
        nums = to_host(xp.concat([steps[2], *extra]) if extra else steps[2])
        if check and nums[8] > 0:
            return {"nonfinite": True, "rank": comm.rank}, []
        s1 = StepNumbers.from_host(nums[:8])
        if not passes(s1, **_limits(xp, g, prec, n, False)):
            steps = None
    elif check and float(g[n, 0]) > 0:
        return {"nonfinite": True, "rank": comm.rank}, []
    if check:
        g = g[:n]
    r1 = _chol(backend, g, "first") if steps is None else steps[0]
    nxn = ["one-launch" if steps is not None else "one-by-one"]
    mark("chol1")
    # pass 2: the Gram matrix of Q1 = A R1^-1, as the in-core CholQR2 forms it: up to
    # backend.fused_cholqr_max_n columns (float64, native products) in the solve's own
    # pass over A (Q1 never stored), else Q1 by a GEMM by R1^-1 where R1 is well
    # conditioned (by substitution where not), kept for Q when Q is wanted
    inv1 = None if fused or not blocks else (
        c.inverse_and_cond(backend, r1) if steps is None else (steps[1], s1.cond1))
    g2 = zeros((n, n))
    kept = []
    for b in blocks:
        if fused:
            g2 = g2 + backend.right_solve_gram(b, r1)
        else:
            w = c._apply_inverse(backend, backend, b, r1, "cholqr2", prec, inverse=inv1)
            g2 = g2 + gram(backend, w, prec, "collective-gram2")
            if want_q:
                kept.append(w)
            del w
    mark("gram2")
    g2 = comm.allreduce_sum(g2)
    mark("allreduce2")
    info = {"r": None, "rank": comm.rank, "fused": bool(fused), "nxn_steps": nxn}
    steps2 = backend.chol_steps(g2)
    if steps2 is not None:
        done = _second_on_device(backend, steps2, g2, r1, blocks, kept, want_q, fused,
                                 prec, comm.rank == 0 or r_everywhere, info, mark)
        if done is not None:
            nxn.append("one-launch")
            out, r = done
            info.update(r=r, collectives=comm.calls - calls0,
                        seconds=time.perf_counter() - t0)
            if phases:
                info["phases_ms"] = marks
            return info, out
        # a check failed: the steps one by one below raise or decide as they always did
    nxn.append("one-by-one")
    eye = xp.eye(n, dtype=g2.dtype, device=dev) if dev is not None else \
        xp.eye(n, dtype=g2.dtype)
    cert = float(xp.linalg.matrix_norm(g2 - eye))
    info["cert"] = cert
    if cert > 0.5:  # every rank holds the same g2: every rank returns here
        info.update(collectives=comm.calls - calls0, seconds=time.perf_counter() - t0)
        return info, []
    r2 = _chol(backend, g2, "second")
    r = gemm(r2, r1, label="collective-r", backend=backend)
    mark("chol2")
    out = []
    if want_q and blocks and fused:  # Q from A in one pass a block
        out = [backend.right_solve_twice(b, r1, r2) for b in blocks]
        info["q_by"] = "fused-solve"
    elif want_q and blocks:  # Q = Q1 R2^-1 (cond(R2) <= sqrt(3): a GEMM), Q1 freed a block
        inv2 = c.inverse_and_cond(backend, r2)  # at a time
        for j in range(len(kept)):
            # a block of Q1 the device's steps freed already: made again, the same bits
            w = kept[j] if kept[j] is not None else c._apply_inverse(
                backend, backend, blocks[j], r1, "cholqr2", prec, inverse=inv1)
            out.append(c._apply_inverse(backend, backend, w, r2, "cholqr2", prec,
                                        inverse=inv2))
            kept[j] = w = None
        info["q_by"] = "q1-times-inverse"
    mark("q")
    if not (comm.rank == 0 or r_everywhere):
        backend.synchronize()  # the body ends with its blocks of Q made, on every rank
    info.update(r=to_host(r) if comm.rank == 0 or r_everywhere else None,
                collectives=comm.calls - calls0,
                seconds=time.perf_counter() - t0)
    if phases:
        info["phases_ms"] = marks
    return info, out


def _limits(xp: Any, g: Any, prec: str, n: int, certified: bool) -> dict[str, Any]:
    """The thresholds of :func:`mpqr.qr.cholqr_steps.passes` for a Gram matrix ``g``
    formed at ``prec``, as the in-core pass reads them."""
    from mpqr.qr import cholqr as c

    return dict(u=c.gram_roundoff(xp, g.dtype, prec), n=n,
                gram_min=c._gram_min(xp, g, prec), certified=certified)


def _second_on_device(backend: Any, steps: tuple[Any, Any, Any], g2: Any, r1: Any,
                      blocks: tuple[Any, ...], kept: list[Any], want_q: bool, fused: bool,
                      prec: str, want_r: bool, info: dict[str, Any], mark: Any
                      ) -> tuple[list[Any], Any] | None:
    """The certified pass's ``n x n`` steps from the backend's one launch: ``Q`` and ``R``
    are launched before its numbers are read (the certificate bounds ``cond_2(R_2)`` by
    ``sqrt(3)``, which the GEMM by ``R_2^-1`` needs; a failed one drops them), and the
    numbers come back with ``R`` in one read, after ``Q``'s products. ``(Q's blocks, R on
    the host or None)``; None where a check fails (the caller redoes the steps one by one;
    ``info["cert"]`` is set either way)."""
    from mpqr.qr import cholqr as c
    from mpqr.qr._kernels import panel_precision

    xp = backend.xp
    n = g2.shape[0]
    r2, x2, st = steps
    r = xp.triu(gemm(r2, r1, label="collective-r", backend=backend))
    mark("chol2")
    out: list[Any] = []
    by_gemm = bool(kept) and c._inverse_by_gemm(backend, kept[0], n)
    if want_q and blocks and fused:  # Q from A in one pass a block
        out = [backend.right_solve_twice(b, r1, r2) for b in blocks]
        info["q_by"] = "fused-solve"
    elif want_q and blocks and by_gemm:  # Q = Q1 R2^-1 by GEMM, Q1 freed a block at a time
        p = panel_precision(prec, kept[0].dtype, xp)
        for j in range(len(kept)):
            out.append(c._times_upper(backend, kept[j], x2, "cholqr2-apply-inverse", p))
            kept[j] = None
        info["q_by"] = "q1-times-inverse"
    nums = to_host(xp.concat([st, xp.reshape(xp.astype(r, xp.float64), (-1,))])
                   if want_r else st)
    s = StepNumbers.from_host(nums[:8])
    info["cert"] = s.dist_to_identity
    if not passes(s, **_limits(xp, g2, prec, n, True)):
        return None
    if want_q and blocks and not fused and not by_gemm:  # by substitution where not
        for j in range(len(kept)):
            out.append(c._apply_inverse(backend, backend, kept[j], r2, "cholqr2", prec,
                                        inverse=(x2, s.cond1)))
            kept[j] = None
        info["q_by"] = "q1-times-inverse"
    mark("q")
    rh = None
    if want_r:
        import numpy as np

        rh = np.asarray(nums[8:], dtype=np.dtype(str(r.dtype))).reshape(n, n)
    return out, rh


# --- the client's side -----------------------------------------------------------------

def _block_futures(client: Any, x: Any) -> list[Any]:
    """The futures of ``x``'s row blocks: its own where it is persisted (or its blocks
    are futures under other keys), else ``x`` persisted first (one graph more)."""
    from distributed import Future, futures_of

    graph = x.__dask_graph__()
    direct = [graph.get(k) for k in _row_keys(x)]
    if all(isinstance(f, Future) for f in direct):
        return direct
    order = {f.key: f for f in futures_of(x)}
    if not all(k in order for k in _row_keys(x)):  # not persisted as these blocks
        x = client.persist(x)
        order = {f.key: f for f in futures_of(x)}
    return [order[k] for k in _row_keys(x)]


def _ready(futs: list[Any]) -> None:
    """Wait for ``futs`` unless the client already knows them finished (a wait on
    finished futures still costs a trip through the client's event loop)."""
    from distributed import wait

    if any(f.status != "finished" for f in futs):
        wait(futs)


#: where the latest arrays' blocks were found: (client id, block keys) -> (the client's
#: states of their futures, worker -> holders); reused while those futures are the same
#: and finished, so a repeated call on one array asks the scheduler nothing before it
#: starts. A block since moved away fails the call at once on its worker (its key is
#: not there), which then runs once more from the scheduler's answer.
_PLACED: dict[tuple[str, tuple[Any, ...]], tuple[list[Any], dict[Any, Any]]] = {}
_PLACED_MAX = 16


def placement(client: Any, futs: list[Any], ask: bool = True
              ) -> tuple[dict[Any, Any] | None, bool]:
    """``(key -> holders, remembered)`` for the finished futures ``futs``: the holders
    found for the same futures before, else the scheduler's (one trip), remembered;
    ``ask=False``: None where not remembered (the workers find them, :func:`remember`)."""
    key = (client.id, tuple(f.key for f in futs))
    seen = _PLACED.get(key)
    states = [client.futures.get(f.key) for f in futs]
    if seen is not None and all(a is b for a, b in zip(seen[0], states)) \
            and all(st is not None and st.status == "finished" for st in states):
        return seen[1], True
    if not ask:
        return None, False
    where = client.who_has(futs)
    remember(client, futs, where)
    return where, False


def remember(client: Any, futs: list[Any], where: dict[Any, Any]) -> None:
    """Keep ``where`` (key -> holders) for the next call on the same futures."""
    if len(_PLACED) >= _PLACED_MAX:
        del _PLACED[next(iter(_PLACED))]
    _PLACED[client.id, tuple(f.key for f in futs)] = (
        [client.futures.get(f.key) for f in futs], where)


def forget_placement(client: Any, futs: list[Any]) -> None:
    """Ask the scheduler again next time (a call that used the remembered holders failed)."""
    _PLACED.pop((client.id, tuple(f.key for f in futs)), None)


def _row_keys(x: Any) -> list[Any]:
    return [k if x.ndim == 1 else k[0] for k in x.__dask_keys__()]


def assign(holders: list[Any], rows: tuple[int, ...], ranks: dict[str, int]
           ) -> dict[str, list[int]]:
    """Which worker reads each block: its holder; a block held by several (replicated,
    e.g. by an earlier ``compute``) goes to the holder with the fewest rows so far, after
    the blocks held once are counted; a block held by no worker of the communicator to
    the least loaded worker (:func:`_on_their_workers` copies it there)."""
    per: dict[str, list[int]] = {w: [] for w in ranks}
    load = dict.fromkeys(ranks, 0)
    mine = [[w for w in hs if w in per] for hs in holders]
    for i in sorted(range(len(mine)), key=lambda i: len(mine[i]) != 1):
        w = min(mine[i] or per, key=lambda w: (load[w], ranks[w]))
        per[w].append(i)
        load[w] += rows[i]
    for idx in per.values():
        idx.sort()
    return per


#: imbalance (the busiest worker's rows over the mean) above which a call's trace says
#: that the blocks are spread unevenly
IMBALANCE_NOTE = 1.05


def balance(per: dict[str, list[int]], rows: tuple[int, ...],
            res: dict[str, Any] | None = None) -> dict[str, Any]:
    """The placement a call ran on, by worker address: ``blocks_per_worker``,
    ``rows_per_worker`` and ``imbalance``, the busiest worker's rows over the mean (1.0:
    even). Every pass waits at its all-reduce for the busiest worker, so a call's body
    takes about ``imbalance`` times an even placement's. ``res``: the workers' results,
    for each body's milliseconds (``bodies_ms``)."""
    ws = sorted(per)
    nrows = [sum(rows[i] for i in per[w]) for w in ws]
    mean = sum(nrows) / len(nrows) if nrows else 0
    out: dict[str, Any] = {"blocks_per_worker": [len(per[w]) for w in ws],
                           "rows_per_worker": nrows,
                           "imbalance": round(max(nrows) / mean, 3) if mean else 1.0}
    if res is not None:
        out["bodies_ms"] = [round(1e3 * (res[w]["wall"][2] - res[w]["wall"][1]), 2)
                            if w in res else None for w in ws]
    return out


def balance_note(b: dict[str, Any]) -> str:
    """The trace's words on an uneven placement ('' where it is even enough)."""
    if b["imbalance"] <= IMBALANCE_NOTE:
        return ""
    return (f"; blocks spread unevenly ({b['blocks_per_worker']} per worker): the busiest "
            f"worker holds {b['imbalance']:.2f}x the mean rows and every pass waits for it "
            f"(spread the blocks evenly over the workers, e.g. made or persisted with an "
            f"even worker assignment)")


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


def _on_their_workers(client: Any, futs: list[Any], where: dict[Any, Any],
                      per: dict[str, list[int]]) -> list[Any]:
    """``futs`` with each block on the worker ``per`` reads it there: a block held by
    none of the communicator's workers is copied to its worker first (one small graph;
    only where the cluster changed since the blocks were made)."""
    from distributed import wait

    moved = {i: client.submit(_same, futs[i], workers=[w], allow_other_workers=False,
                              pure=False)
             for w, idx in per.items() for i in idx if w not in where[futs[i].key]}
    if not moved:
        return futs
    wait(list(moved.values()))
    return [moved.get(i, f) for i, f in enumerate(futs)]


def _same(block: Any) -> Any:
    return block


#: where True, a call on an array whose holders the client does not know lets the
#: workers find them (one all-reduce in the call) instead of asking the scheduler first
FIND = True

#: where True, the holdings the workers find ride on the first Gram matrix's all-reduce
#: (else they are summed by an all-reduce of their own before the body)
RIDE = True

#: where True, a call's messages carry the blocks' kind as a :class:`_Meta` (module and
#: dtype), else as a zero-size array of that kind
LIGHT_META = True

#: where True, each call's worker bodies synchronise the device after each step and
#: report the step's milliseconds (the trace's ``phases_ms``): for profiling only
PHASES = False


def cholqr2(x: Any, *, client: Any = None, kind: str | None = None, retries: int = 1,
            want_q: bool = True, precision: str = "auto",
            check_finite: bool = False) -> tuple[Any, Any]:
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
    want_q : bool
        False: ``R`` only (no ``Q`` is written; ``Q`` is None).
    precision : str
        The blocks' Gram products' precision (a native one: ``"auto"``, ``"fp64"``...).
    check_finite : bool
        Raise ``ValueError`` where ``x`` holds NaN or Inf (read from the Gram matrices'
        diagonals, the blocks themselves only where those are not finite).

    Returns
    -------
    Q : dask.array.Array, shape (m, n), or None
        Persisted: its blocks held where ``x``'s are, ``x``'s row chunks.
    R : numpy.ndarray, shape (n, n)

    Raises
    ------
    BreakdownError
        A Gram matrix is not numerically positive definite, or the second one fails
        CholQR2's certificate ``||Q_1^H Q_1 - I||_F <= 1/2``.
    CollectiveError
        A worker was lost or failed, after ``retries`` further runs.
    ValueError
        ``x`` is not chunked by rows only, or holds NaN or Inf (``check_finite``).
    MemoryError
        A worker's ``memory_limit`` is below its blocks of ``x`` and ``Q``
        (:func:`check_memory`).
    """
    import dask.array as da
    from distributed import default_client

    client = client or default_client()
    if x.ndim != 2 or x.numblocks[1] != 1:
        raise ValueError(f"x must be a 2-D dask array chunked by rows only, got shape "
                         f"{x.shape} with chunks {x.chunks}")
    n = x.shape[1]
    meta = x._meta
    if kind is None:
        kind = "nccl" if type(meta).__module__.startswith("cupy") else "thread"
    last: Exception | None = None
    t_start, start = time.perf_counter(), time.time()
    lost: set[str] = set()
    attempt, tries = -1, retries + 1
    ask = again = False  # ask: the scheduler for the holders; again: no run was lost
    while attempt + 1 < tries:
        attempt += 1
        try:
            h = communicator(client, kind, renew=attempt > 0 and not again, check=False,
                             exclude=frozenset(lost))
        except CollectiveError as exc:
            if not attempt:
                raise
            last = exc
            continue
        futs = _block_futures(client, x)
        _ready(futs)
        # a fresh array's holders are found by the workers in the call itself (no trip
        # to the scheduler before it); after a loss, or where a block was held by none
        # of the ranks, the scheduler is asked
        where, remembered = placement(client, futs, ask=bool(lost) or ask or not FIND)
        found = "workers" if where is None else "remembered" if remembered else "scheduler"
        placed, again = futs, False
        rowbytes = n * x.dtype.itemsize
        name = "collective-q-" + uuid.uuid4().hex
        qkeys = [(name, i, 0) for i in range(len(futs))] if want_q else []
        like = _Meta(meta) if LIGHT_META else meta
        args: tuple[Any, ...] = (n, str(x.dtype), like, want_q, precision, check_finite,
                                 PHASES)
        body = bind(_cholqr2_task)
        per: dict[str, list[int]] | None = None
        if where is None:
            plan = {"body": body, "rows": x.chunks[0], "ranks": h.ranks, "limits": h.limits,
                    "bytes_per_row": (1 + want_q) * rowbytes, "keep": want_q, "like": like,
                    "ride": RIDE}
            body, args = _found_task, (plan, *args)
            work = {w: ([f.key for f in futs], qkeys) for w in h.ranks}
        else:
            if lost:  # a worker seen lost may still be listed as a holder while it closes
                where = {k: [w for w in hs if w not in lost] for k, hs in where.items()}
            if any(w not in h.ranks for f in futs for w in where[f.key]):
                # the cluster changed: asks the scheduler
                h = communicator(client, kind, exclude=frozenset(lost))
            per = assign([where[f.key] for f in futs], x.chunks[0], h.ranks)
            check_memory(h.limits, {w: (1 + want_q) * rowbytes * sum(x.chunks[0][i]
                                                                      for i in idx)
                                    for w, idx in per.items()})
            futs = _on_their_workers(client, futs, where, per)
            work = {w: ([futs[i].key for i in idx], [qkeys[i] for i in idx] if want_q
                        else []) for w, idx in per.items()}
        sent = time.time()
        try:
            res = _launch.launch(client, h.cid, body, work, args, TIMEOUT + 10,
                                 {k: x.chunks[0][k[1]] * rowbytes for k in qkeys},
                                 find=per is None)
            back = time.time()
        except _launch.Lost as exc:  # a lost worker, a timeout, an aborted all-reduce
            lost |= exc.gone
            client.run(_abort, h.cid, on_error="ignore")  # a closing worker may not answer
            forget(client, h)
            _launch.settle(exc)
            _launch.release(client, qkeys)
            last = CollectiveError(str(exc))
            if remembered and exc.missing:  # a block moved since: asked again, one run more
                forget_placement(client, placed)
                tries += 1
            continue
        infos = list(res.values())
        r0 = next(v for v in infos if v["rank"] == 0)
        if per is None:  # the workers found the holders
            if "unplaced" in r0:  # a block on no rank: the scheduler's view, once more
                _launch.release(client, qkeys)
                ask = again = True
                tries += 1
                continue
            if "memory" in r0:
                _launch.release(client, qkeys)
                raise MemoryError(r0["memory"])
            per = r0["per"]
            remember(client, futs, {f.key: r0["holders"][i] for i, f in enumerate(futs)})
        if want_q and (r0.get("nonfinite") or "breakdown" in r0 or r0["cert"] > 0.5):
            _launch.release(client, qkeys)  # announced, never kept
        if r0.get("nonfinite"):
            raise ValueError("array must not contain infs or NaNs (`x`)")
        if "breakdown" in r0:
            raise BreakdownError(r0["breakdown"], method="cholqr2",
                                 cond_estimate=r0["cond"])
        if r0["cert"] > 0.5:
            raise BreakdownError(f"collective CholQR2 not certified: ||Q_1^H Q_1 - I||_F"
                                 f" = {r0['cert']:.2e} > 1/2", method="cholqr2",
                                 cond_estimate=float("inf"))
        q = None
        if want_q:
            blocks = _launch.register(client, qkeys, meta)
            q = da.Array(dict(zip(qkeys, blocks)), name, (x.chunks[0], (n,)), meta=meta)
        walls = [v["wall"] for v in infos]
        extra = {"phases_ms": {w: res[w].get("phases_ms") for w in sorted(res)}} \
            if PHASES else {}
        spread = balance(per, x.chunks[0], res)
        record_event("dask-collective",
                     f"dask: collective CholQR2 ({kind}) over {len(per)} workers, "
                     f"{len(futs)} blocks: one call straight to each worker (no task "
                     f"graph), {r0['collectives']} all-reduces per worker, "
                     f"{want_q * len(futs)} blocks of Q kept where A's are"
                     f"{balance_note(spread)}",
                     route="collective", communicator=kind, graphs=0, tasks=0,
                     launches=len(per), q_blocks=want_q * len(futs),
                     collectives=r0["collectives"], fused_gram=r0["fused"],
                     nxn_steps=r0.get("nxn_steps"),
                     q_by=r0.get("q_by"), attempts=attempt + 1, workers=len(per),
                     holders_from=found, **spread,
                     seconds=max(v["seconds"] for v in infos),
                     call_seconds=time.perf_counter() - t_start,
                     timeline_ms=_launch.timeline(start, sent, back, walls, time.time()),
                     **extra)
        return q, r0["r"]
    raise CollectiveError(f"collective CholQR2 failed on {tries} attempts (a worker "
                          f"lost or failed); last error: {type(last).__name__}: {last}") \
        from last
