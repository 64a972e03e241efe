"""How a collective call reaches the workers: straight from the client to each worker's
``run`` handler (the one ``Client.run`` uses), all workers at once, no task graph.

The scheduler takes no part in a call: no graph to build, order and dispatch, no task
transitions reported back, no result gathered through it. Each worker reads its blocks
from its own memory (by key), runs the call's body in its task thread (so the body queues
behind the worker's running tasks, never beside them) and, for ``Q``, hands the blocks
to its own memory under new keys, which the client announced to the scheduler as its
own beside the call (as ``Client.scatter`` does for data it places). Only the small results
come back to the client; they come back worker by worker, so that a worker that fails or
leaves is seen while the others still wait for it at an all-reduce.

Where the client does not know where the blocks are (a fresh array), it need not ask the
scheduler first (a trip on the call's path): :func:`launch` with ``find`` sends every
worker all the keys, each worker takes the ones it holds, and the body decides with the
other ranks which blocks each reads (one small all-reduce of who holds what); each worker
then announces its own blocks of ``Q`` to the scheduler as the client's, from its event
loop while its body runs, and answers only after the scheduler has them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import functools
import time
from typing import Any

__all__ = ["REGISTRY", "Closing", "Lost", "MissingBlock", "launch", "register", "release", "settle",
           "timeline"]

#: worker-side registry of communicators: (communicator id, worker address) -> communicator
REGISTRY: dict[tuple[str, str], Any] = {}


class Lost(RuntimeError):
    """A worker failed or left during a call; ``gone``: the workers seen gone;
    ``pending``: the other workers' calls, still running (see :func:`settle`)."""

    def __init__(self, message: str, gone: set[str] | None = None, missing: bool = False):
        super().__init__(message)
        self.gone = gone or set()
        self.pending: set[Any] = set()
        self.missing = missing  # a worker did not hold a block it was sent to read


class MissingBlock(RuntimeError):
    """A worker was sent to read a block it does not hold (the block moved away)."""


class Closing(RuntimeError):
    """The worker is leaving the cluster (its blocks of ``Q`` would go with it)."""


#: where True, a worker hands its blocks of ``Q`` to its memory just after it answers
#: (see :func:`_on_worker`), else before
STORE_LATE = True

_CLOSING = ("closing", "closing_gracefully", "closed", "failed")


async def _on_worker(cid: str, body: Any, keys: list[Any], qkeys: list[Any],
                     args: tuple[Any, ...], find: dict[str, Any] | None = None,
                     late: bool = False, dask_worker: Any = None) -> bytes:
    """The worker's side: its blocks by key, ``body(comm, blocks, *args)`` in the task
    thread, ``Q``'s blocks (the body's second result) kept here under ``qkeys``.

    ``find`` (the client's id ``"client"``, each result block's bytes ``"nbytes"``):
    ``keys`` and ``qkeys`` are every block's; the body is called as ``body(comm, held,
    announce, *args)`` with ``held`` the blocks this worker holds by index, and calls
    ``announce(indices)`` with the blocks it will keep, which this side tells the
    scheduler while the body runs; it returns ``info["kept"]``, those indices.

    The answer is the body's ``info`` pickled here (plain bytes travel through the comm
    without dask's per-object serialization). ``late``: ``Q``'s blocks are handed to the
    worker's memory just after the answer leaves, not before (off the call's path: the
    loop runs the hand-over before it reads any later message, and no later message can
    name them before the client has the answer)."""
    t_in = time.time()
    comm = REGISTRY[cid, dask_worker.address]
    loop = asyncio.get_running_loop()
    told: list[Any] = []
    if find is None:
        try:
            blocks = tuple(dask_worker.data[k] for k in keys)
        except KeyError as exc:
            comm.abort()  # the other ranks would wait for this one at their first sum
            raise MissingBlock(f"block {exc} is no longer on worker "
                               f"{dask_worker.address}") from None
        call = functools.partial(body, comm, blocks, *args)
    else:
        data = dask_worker.data
        held = {i: data[k] for i, k in enumerate(keys) if k in data}

        def announce(idx: list[int]) -> None:  # called from the task thread
            who = {qkeys[i]: [dask_worker.address] for i in idx}
            told.append(asyncio.run_coroutine_threadsafe(_tell(
                dask_worker, who, {qkeys[i]: find["nbytes"][i] for i in idx},
                find["client"]), loop))

        call = functools.partial(body, comm, held, announce, *args)
    t_body = time.time()
    info, out = await loop.run_in_executor(dask_worker.executors["default"], call)
    t_done = time.time()
    try:
        for f in told:  # the scheduler has this worker's blocks of Q before the client
            await asyncio.wrap_future(f)
    except Exception:
        if dask_worker.status.name not in _CLOSING:
            raise
    if dask_worker.status.name in _CLOSING:
        # a worker leaving would take the call's blocks of Q with it: the call fails
        raise Closing(f"worker {dask_worker.address} is closing")
    if out:  # the scheduler knows them already (announced with the call)
        kept = qkeys if find is None else [qkeys[i] for i in info["kept"]]
        store = functools.partial(dask_worker.update_data, data=dict(zip(kept, out)),
                                  stimulus_id=f"mpqr-collective-{t_done}")
        if late:
            loop.call_soon(store)
        else:
            store()
    info["wall"] = (t_in, t_body, t_done, time.time())
    from distributed.protocol import pickle

    return pickle.dumps(info)


async def _tell(dask_worker: Any, who_has: dict[Any, list[str]], nbytes: dict[Any, int],
                client: str) -> None:
    """This worker's blocks of ``Q`` announced to the scheduler as ``client``'s data."""
    await dask_worker.scheduler.update_data(who_has=who_has, nbytes=nbytes, client=client)


def launch(client: Any, cid: str, body: Any, work: dict[str, tuple[list[Any], list[Any]]],
           args: tuple[Any, ...], timeout: float,
           nbytes: dict[Any, int] | None = None, find: bool = False) -> dict[str, Any]:
    """Run ``body(comm, blocks, *args)`` on every worker of ``work`` (worker -> its block
    keys and the keys of its result blocks) at once; return each worker's first result.

    The result blocks (``nbytes``: their sizes) are announced to the scheduler as the
    client's, held where ``work`` puts them, while the workers compute (one message
    beside the calls, off the call's path): no task can ask for them before the client
    hands out their futures (:func:`register`); where the call fails, :func:`release`
    drops them, and where a body keeps fewer blocks (a breakdown) too.

    ``find``: ``work`` gives every worker all the keys; the bodies choose which blocks
    each reads and the workers announce the result blocks they keep (see
    :func:`_on_worker`).

    Raises :class:`Lost` as soon as a worker's call fails (the worker left, or the body
    raised) or a worker of ``work`` has left the cluster, or after ``timeout`` seconds.
    """
    from distributed.protocol import pickle

    fn = _pickled_on_worker()
    loop = client.loop.asyncio_loop
    # pickled here, before the loop sends any: the messages leave back to back
    if find:
        keys, qkeys = next(iter(work.values()))
        sizes = [(nbytes or {}).get(k, -1) for k in qkeys]
        one_msg = pickle.dumps((cid, body, keys, qkeys, args,
                                {"client": client.id, "nbytes": sizes}, STORE_LATE))
        msgs = dict.fromkeys(work, one_msg)
    else:
        msgs = {w: pickle.dumps((cid, body, keys, qkeys, args, None, STORE_LATE))
                for w, (keys, qkeys) in work.items()}

    async def one(addr: str) -> Any:
        return await client.rpc(addr).run(function=fn, args=msgs[addr], wait=True)

    calls = {asyncio.run_coroutine_threadsafe(one(w), loop): w for w in work}
    who_has = {} if find else {k: [w] for w, (_, qk) in work.items() for k in qk}
    told = asyncio.run_coroutine_threadsafe(client.scheduler.update_data(
        who_has=who_has, nbytes=nbytes or {}, client=client.id), loop) if who_has else None
    deadline = time.monotonic() + timeout
    out: dict[str, Any] = {}
    pending = set(calls)
    try:
        while pending:
            done, pending = cf.wait(pending, timeout=0.25, return_when=cf.FIRST_COMPLETED)
            failed = []
            for f in done:
                try:
                    out[calls[f]] = _unpack(f, calls[f])
                except Lost as exc:
                    failed.append(exc)
            if failed:  # a block not where it was sent, where one was (the others' cause)
                raise next((e for e in failed if e.missing), failed[0])
            if done:
                continue
            gone = set(work) - set(client.ncores())
            if gone:
                raise Lost(f"worker(s) {sorted(gone)} left the cluster during the call",
                           gone)
            if time.monotonic() > deadline:
                raise Lost(f"collective call did not finish in {timeout:.0f} s")
    except Lost as exc:
        exc.pending = pending | ({told} if told is not None else set())
        raise
    if told is not None:
        try:
            told.result(timeout=timeout)
        except Exception as exc:  # a worker of the call left the scheduler meanwhile
            raise Lost(f"the call's result blocks could not be announced: "
                       f"{type(exc).__name__}: {exc}") from exc
    return out


_ON_WORKER: list[bytes] = []


def _pickled_on_worker() -> bytes:
    """:func:`_on_worker` pickled once (by reference: the same bytes every call)."""
    if not _ON_WORKER:
        from distributed.protocol import pickle

        _ON_WORKER.append(pickle.dumps(_on_worker))
    return _ON_WORKER[0]


def settle(exc: Lost, timeout: float = 10.0) -> None:
    """Wait (up to ``timeout`` s) for the calls still running when ``exc`` was raised, once
    their all-reduces were aborted: a worker that finished meanwhile has kept its blocks
    of ``Q``, which :func:`release` then drops. ``exc.missing`` is set where one of them
    failed for a block it does not hold (the call that failed first may be a rank whose
    all-reduce that one aborted)."""
    if exc.pending:
        cf.wait(exc.pending, timeout=timeout)
    from distributed.core import clean_exception

    for f in exc.pending:  # a worker sent to read a block it no longer holds: say so
        resp = f.result() if f.done() and f.exception() is None else None
        if isinstance(resp, dict) and resp.get("status") == "error":
            exc.missing |= isinstance(clean_exception(**resp)[1], MissingBlock)


def _unpack(f: Any, addr: str) -> Any:
    from distributed.core import clean_exception

    try:
        resp = f.result()
    except Exception as exc:  # the connection: the worker died or closed
        raise Lost(f"worker {addr} failed during the call: {type(exc).__name__}: {exc}",
                   {addr}) from exc
    if resp.get("status") == "OK":
        from distributed.protocol import pickle

        return pickle.loads(resp["result"])
    _, exc, _tb = clean_exception(**resp)
    raise Lost(f"a worker's call failed ({addr}): {type(exc).__name__}: {exc}",
               {addr} if isinstance(exc, Closing) else None,
               missing=isinstance(exc, MissingBlock)) from exc


def register(client: Any, keys: list[Any], like: Any) -> list[Any]:
    """Futures of the result blocks the workers kept and announced (``keys``)."""
    from distributed import Future

    futs = [Future(k, client) for k in keys]
    for k in keys:
        client.futures[k].finish(type=type(like))
    return futs


def release(client: Any, keys: list[Any]) -> None:
    """Drop result blocks a failed call may have kept (unknown keys are ignored)."""
    from distributed import Future

    for k in keys:
        Future(k, client).release()


def timeline(start: float, sent: float, back: float, walls: list[tuple[float, ...]],
             done: float | None = None) -> dict[str, float]:
    """Where a call's time went (ms; the client's and the workers' clocks of one host):
    the client's steps before the call went out, until the first worker had it, from there
    until the last worker's body began (the task thread's hand-over), the slowest body,
    ``Q``'s blocks kept, until the client had every result, and (``done``: when the
    client's result was made) the client's steps after."""
    recv, body0 = min(w[0] for w in walls), max(w[1] for w in walls)
    body = max(w[2] - w[1] for w in walls)
    last = max(w[3] for w in walls)
    out = {"before_send": sent - start, "send_to_worker": recv - sent,
           "to_body": body0 - recv, "body": body,
           "keep_q": max(w[3] - w[2] for w in walls), "to_client": back - last}
    if done is not None:
        out["after"] = done - back
    return {k: round(1e3 * v, 2) for k, v in out.items()}
