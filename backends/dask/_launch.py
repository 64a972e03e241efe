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
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import functools
import time
from typing import Any

__all__ = ["REGISTRY", "Lost", "MissingBlock", "launch", "register", "release", "settle",
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


async def _on_worker(cid: str, body: Any, keys: list[Any], qkeys: list[Any],
                     args: tuple[Any, ...], dask_worker: Any = None) -> Any:
    """The worker's side: its blocks by key, ``body(comm, blocks, *args)`` in the task
    thread, ``Q``'s blocks (the body's second result) kept here under ``qkeys``."""
    t_in = time.time()
    comm = REGISTRY[cid, dask_worker.address]
    try:
        blocks = tuple(dask_worker.data[k] for k in keys)
    except KeyError as exc:
        comm.abort()  # the other ranks would wait for this one at their first sum
        raise MissingBlock(f"block {exc} is no longer on worker {dask_worker.address}") \
            from None
    loop = asyncio.get_running_loop()
    t_body = time.time()
    info, out = await loop.run_in_executor(dask_worker.executors["default"],
                                           functools.partial(body, comm, blocks, *args))
    t_done = time.time()
    if dask_worker.status.name in ("closing", "closing_gracefully", "closed", "failed"):
        # a worker leaving would take the call's blocks of Q with it: the call fails
        raise RuntimeError(f"worker {dask_worker.address} is closing")
    if out:  # the scheduler knows them already (announced by the client with the call)
        dask_worker.update_data(data=dict(zip(qkeys, out)),
                                stimulus_id=f"mpqr-collective-{t_done}")
    info["wall"] = (t_in, t_body, t_done, time.time())
    return info


def launch(client: Any, cid: str, body: Any, work: dict[str, tuple[list[Any], list[Any]]],
           args: tuple[Any, ...], timeout: float,
           nbytes: dict[Any, int] | None = None) -> dict[str, Any]:
    """Run ``body(comm, blocks, *args)`` on every worker of ``work`` (worker -> its block
    keys and the keys of its result blocks) at once; return each worker's first result.

    The result blocks (``nbytes``: their sizes) are announced to the scheduler as the
    client's, held where ``work`` puts them, while the workers compute (one message
    beside the calls, off the call's path): no task can ask for them before the client
    hands out their futures (:func:`register`); where the call fails, :func:`release`
    drops them, and where a body keeps fewer blocks (a breakdown) too.

    Raises :class:`Lost` as soon as a worker's call fails (the worker left, or the body
    raised) or a worker of ``work`` has left the cluster, or after ``timeout`` seconds.
    """
    from distributed.protocol import pickle

    fn = pickle.dumps(_on_worker)
    loop = client.loop.asyncio_loop
    # pickled here, before the loop sends any: the messages leave back to back
    msgs = {w: pickle.dumps((cid, body, keys, qkeys, args)) for w, (keys, qkeys) in work.items()}

    async def one(addr: str) -> Any:
        return await client.rpc(addr).run(function=fn, args=msgs[addr], wait=True)

    calls = {asyncio.run_coroutine_threadsafe(one(w), loop): w for w in work}
    who_has = {k: [w] for w, (_, qk) in work.items() for k in qk}
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
        return resp["result"]
    _, exc, _tb = clean_exception(**resp)
    raise Lost(f"a worker's call failed ({addr}): {type(exc).__name__}: {exc}",
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
