"""Distributed benchmark: mpqr.qr / mpqr.lstsq on a Dask cluster against dask.array.linalg
and against mpqr in core on one device.

``python -m mpqr bench dask [--gpus N | --workers N] [--m-per-worker M] [--n N]
[--chunk-rows R] [--strong-m M] [--scale-workers 1,2,4] [--sweep-rows H1,H2]
[--placement even|scheduler] [--no-reference] [--json PATH] [--png PATH]``

With ``--gpus N`` a ``dask_cuda.LocalCUDACluster`` runs one worker per GPU and the
matrix is generated on the workers as CuPy blocks; otherwise a ``distributed.LocalCluster``
of ``--workers`` single-threaded CPU processes holds NumPy blocks. The matrix is
persisted on the workers before any timing, its blocks spread evenly (``--placement
even``, the default: block ``i`` of ``B`` made on worker ``i w / B``, contiguous ranges, as
a user who loads a file's row ranges onto the workers places them; ``scheduler``: a
``dask.array.random`` array persisted where the scheduler puts its tasks, which need not
be even, and the busiest worker sets a call's time), and each timed call gets a fresh
persisted copy (new keys, same workers: the blocks per worker of every call are in the
row's ``calls``), so nothing is served from an earlier call's results;
every timed call computes its results onto the workers (``persist`` + ``wait``), so the
times include the scheduler, the trees and the client's ``n x n`` steps, not a transfer
of ``Q`` to the client.

Each row counts the call's round trips: ``graphs`` (graphs sent to the scheduler:
``compute`` and ``persist`` calls, each a synchronous wait), ``passes`` (passes over
``A`` from the explain trace, the lazy ``Q`` pass included when ``Q`` is persisted) and
``block_tasks`` (tasks that read a block of ``A``); on the collective route (CuPy
blocks on GPU workers with NCCL) ``launches`` (calls sent straight to the workers, no
graph), the call's ``timeline_ms``, its placement (``blocks_per_worker``, ``imbalance``:
the busiest worker's rows over the mean) and each worker's body (``bodies_ms``).

Each experiment's rows run mpqr's calls first and dask.array.linalg's after them, the
workers' CuPy memory pools emptied before each (a baseline's cached blocks never shape
the next row's allocations). A baseline that fails (out of device memory, say) is
recorded as such; ``dask.array.linalg.tsqr`` is then timed once more on every other
block (half the rows, as evenly spread), recorded apart (``dask_tsqr_half``), never as
the row's speed-up.

Experiments (each row: workers, shape, block rows, median seconds of ``--repeat``):

* ``in_core``: ``mpqr.qr`` (reduced and ``mode="r"``) and ``mpqr.lstsq`` on the whole
  ``m_per_worker x n`` matrix on one device, no Dask (GPU 0, or NumPy in this process);
* ``weak_scaling``: ``M = m_per_worker * w`` rows on ``w = 1 ... N`` workers;
  ``mpqr.qr`` with ``Q`` persisted, ``mode="r"``, and ``dask.array.linalg.tsqr`` on the
  same cluster and chunks;
* ``strong_scaling``: ``M`` fixed (``--strong-m``; by default ``m_per_worker``, which one
  worker holds), ``w = 1 ... N`` (or ``--scale-workers``, as the weak rows); a row the
  weak rows ran already (one worker on ``m_per_worker``) is theirs (``same_as``);
* ``lstsq``: weak scaling as the QR rows: ``mpqr.lstsq`` (``lapack_driver="gelsy"``,
  ``check_finite=False``, as dask's) and the default call (``gelsd``, finiteness checked) against
  ``dask.array.linalg.lstsq`` and against ``mpqr.qr``'s time on the same array;
* ``accuracy``: ``||A - QR||_F / ||A||_F`` and ``||I - Q^H Q||_F / n`` of both QRs,
  and the normal-equation residual of both solvers, all evaluated on the cluster;
* ``overhead``: mpqr's host cost per block task on one worker: each pass's block
  function against the bare library products on a ``chunk_rows x n`` block, and on a
  ``2n x n`` block (almost nothing but overhead);
* ``scheduler``: one call on a small matrix split into many blocks — the time of a
  call that does almost no arithmetic, its graph's task count and time per task;
* ``chunk_sweep``: block heights from ``min(M / (2 N), 2 chunk_rows)`` down by factors
  of 2 to ``M / (128 N)``.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
import uuid
from typing import Any

from mpqr.bench._charts import pyplot, save
from mpqr.bench._timing import environment, write_json

__all__ = ["RoundTrips", "main"]

try:
    from distributed.diagnostics.plugin import SchedulerPlugin
except ImportError:  # pragma: no cover - the bench needs distributed; --help does not
    SchedulerPlugin = object


class RoundTrips(SchedulerPlugin):
    """Scheduler plugin: graphs received and block tasks run since the last ``take``."""

    name = "mpqr-round-trips"

    def __init__(self) -> None:
        self.graphs = 0
        self.tasks = 0
        self.block_tasks = 0

    def update_graph(self, scheduler: Any, *, keys: Any, tasks: Any = (), **kw: Any) -> None:
        self.graphs += 1
        self.tasks += len(tasks)

    def transition(self, key: Any, start: str, finish: str, *args: Any, **kw: Any) -> None:
        # the block tasks of mpqr's passes are (name, 0, j); Q's are (name, i, 0)
        if start == "processing" and finish == "memory" and isinstance(key, tuple) and \
                isinstance(key[0], str) and key[0].startswith("mpqr-") and \
                (key[1] == 0 or key[0].startswith(("mpqr-cholqr2-q", "mpqr-tsqr-cholqr-q"))):
            self.block_tasks += 1

    def take(self) -> dict[str, int]:
        out = {"graphs": self.graphs, "tasks": self.tasks, "block_tasks": self.block_tasks}
        self.graphs = self.tasks = self.block_tasks = 0
        return out


def _workers(client: Any) -> list[str]:
    # asked of the scheduler: the client's cached identity can list none (a refresh race)
    from mpqr.backends.dask.collective import cluster_workers

    return cluster_workers(client)


def _take(dask_scheduler: Any) -> dict[str, int]:
    return dask_scheduler.plugins[RoundTrips.name].take()


def _cluster(gpus: int | None, workers: int) -> Any:
    if gpus:
        try:
            from dask_cuda import LocalCUDACluster
        except ImportError:
            return gpu_cluster(gpus)
        # no spilling to host: the timed calls' fresh copies of A share A's device memory,
        # which dask_cuda's accounting (80% of the device by default) counts twice
        return LocalCUDACluster(CUDA_VISIBLE_DEVICES=",".join(map(str, range(gpus))),
                                device_memory_limit=None, dashboard_address=None,
                                memory_limit=0, silence_logs=40)
    from distributed import LocalCluster

    return LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                        dashboard_address=None, silence_logs=40)


def gpu_cluster(gpus: int) -> Any:
    """One worker process per GPU without dask_cuda: ``distributed`` nannies, each with
    its own ``CUDA_VISIBLE_DEVICES``, one thread, and no memory limit (the blocks are
    device memory, which distributed would count against the host's limit and pause
    the worker at 80% of it)."""
    import os

    from distributed import Nanny, Scheduler, SpecCluster

    path = os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))
    workers = {i: {"cls": Nanny, "options": {
        "nthreads": 1, "memory_limit": 0, "silence_logs": 40,
        "env": {"CUDA_VISIBLE_DEVICES": str(i), "PYTHONPATH": path}}} for i in range(gpus)}
    return SpecCluster(workers=workers, silence_logs=40, scheduler={
        "cls": Scheduler, "options": {"dashboard_address": None}})


def _matrix(gpu: bool, m: int, n: int, rows: int, dtype: str, seed: int = 0) -> Any:
    """A Gaussian ``m x n`` matrix generated on the workers (CuPy blocks on GPUs)."""
    import dask.array as da

    if gpu:
        import cupy

        rs = da.random.RandomState(seed, RandomState=cupy.random.RandomState)
    else:
        rs = da.random.RandomState(seed)
    return rs.standard_normal((m, n), chunks=(rows, n)).astype(dtype)


def _spread(client: Any, gpu: bool, m: int, n: int, rows: int, dtype: str,
            seed: int = 0) -> Any:
    """A Gaussian ``m x n`` matrix in ``rows``-row blocks made on the workers, spread
    evenly: block ``i`` of ``B`` on worker ``i w / B`` (contiguous ranges of blocks, as
    ``client.submit(load, i, workers=[...])`` over a file's row ranges places them);
    the blocks' futures are the array's blocks (no task that could run elsewhere)."""
    import dask.array as da

    workers = _workers(client)
    sizes = [rows] * (m // rows) + ([m % rows] if m % rows else [])
    futs = [client.submit(_block, gpu, seed * 100_003 + i, h, n, dtype, pure=False,
                          workers=[workers[i * len(workers) // len(sizes)]],
                          allow_other_workers=False) for i, h in enumerate(sizes)]
    from distributed import wait

    wait(futs)
    name = f"mpqr-bench-a-{uuid.uuid4().hex}"
    return da.Array({(name, i, 0): f for i, f in enumerate(futs)}, name,
                    (tuple(sizes), (n,)), meta=_module(gpu).empty((0, 0), dtype=dtype))


def _block(gpu: bool, seed: int, h: int, n: int, dtype: str) -> Any:
    """One Gaussian ``h x n`` block on this worker (its GPU where ``gpu``)."""
    xp = _module(gpu)
    return xp.random.default_rng(seed).standard_normal((h, n)).astype(dtype, copy=False)


def _placed(client: Any, gpu: bool, m: int, n: int, rows: int, dtype: str,
            placement: str) -> Any:
    """The experiment's ``m x n`` matrix on the workers, placed as ``placement`` asks
    (``"even"``: :func:`_spread`; ``"scheduler"``: :func:`_matrix` persisted), its
    blocks per worker printed."""
    x = _spread(client, gpu, m, n, rows, dtype) if placement == "even" else \
        _run(client, _matrix(gpu, m, n, rows, dtype))[0]
    print(f"  {m}x{n} in {len(x.chunks[0])} blocks, {placement} placement: "
          f"{blocks_per_worker(client, x)} blocks per worker")
    return x


def blocks_per_worker(client: Any, x: Any) -> list[int]:
    """How many of persisted ``x``'s blocks each worker holds (workers by address; a
    replicated block counts on each holder)."""
    from distributed import futures_of

    where = client.who_has(futures_of(x))
    count = dict.fromkeys(_workers(client), 0)
    for holders in where.values():
        for w in holders:
            count[w] = count.get(w, 0) + 1
    return [count[w] for w in sorted(count)]


def _free_pools(client: Any) -> None:
    """Empty the workers' CuPy memory pools (cached blocks of earlier rows; no-op on
    CPU workers)."""
    client.run(_free_pool)


def _free_pool() -> None:
    import sys

    cupy = sys.modules.get("cupy")
    if cupy is not None:
        cupy.get_default_memory_pool().free_all_blocks()


def _run(client: Any, *arrays: Any) -> list[Any]:
    """Compute onto the workers and wait (nothing is gathered to the client)."""
    from distributed import wait

    out = client.persist(list(arrays))
    wait(out)
    return out


def _persisted(client: Any, x: Any) -> Any:
    """``x`` persisted and waited for; no graph where its blocks are futures already."""
    from dask.core import flatten
    from distributed import futures_of, wait

    have = {f.key: f for f in futures_of(x)}
    keys = list(flatten(x.__dask_keys__()))
    if all(k in have for k in keys):
        # blocks the client knows finished need no wait (a trip through its event loop)
        if any(have[k].status != "finished" for k in keys):
            wait([have[k] for k in keys])
        return x
    return _run(client, x)[0]


def _fresh(client: Any, x: Any) -> Any:
    """``x`` under new keys, persisted where ``x``'s blocks are (dask names results by
    content, and a repeated graph would be served from memory)."""
    from distributed import wait

    xi = x.map_blocks(_same, nonce=uuid.uuid4().hex, dtype=x.dtype, meta=x._meta)
    xi = client.persist(xi)
    wait(xi)
    return xi


def _median_time(client: Any, fn: Any, x: Any, repeat: int,
                 log: list[dict[str, Any]] | None = None) -> float:
    """Median seconds of ``fn(x)`` on fresh copies of ``x``; each call's results are
    released before the next call starts. ``log``: each timed call's milliseconds and
    its copy's blocks per worker appended (found after the clock stopped)."""
    def one(keep: bool) -> float:
        xi = _fresh(client, x)
        base = _tasks(client)
        t0 = time.perf_counter()
        out = fn(xi)
        dt = time.perf_counter() - t0
        del out
        if keep and log is not None:
            log.append({"ms": round(1e3 * dt, 2),
                        "blocks_per_worker": blocks_per_worker(client, xi)})
        del xi
        _released(client, base - len(x.chunks[0]))
        return dt

    one(False)  # warm-up: imports, CUDA contexts, kernel compilation
    return statistics.median(one(True) for _ in range(repeat))


def _counted(client: Any, fn: Any, x: Any) -> dict[str, Any]:
    """One call's round trips: graphs, tasks, block tasks and mpqr's passes over ``A``."""
    import mpqr

    xi = _fresh(client, x)
    base = _tasks(client)
    client.run_on_scheduler(_take)
    with mpqr.explain() as trace:
        out = fn(xi)
    counts = client.run_on_scheduler(_take)
    counts["passes"] = sum(e.kind == "dask-pass" for e in trace.events)
    # the collective route: calls sent straight to the workers (no graph), and where
    # the call's time went (the client's steps, the workers' bodies, Q kept)
    ev = [e.data for e in trace.events if e.kind == "dask-collective"]
    if ev:
        counts["launches"] = sum(v.get("launches", 0) for v in ev)
        counts["timeline_ms"] = ev[-1].get("timeline_ms")
        # where the blocks were and what each worker's body took (the busiest sets it)
        counts.update({k: ev[-1][k] for k in ("blocks_per_worker", "imbalance",
                                               "bodies_ms", "collectives")
                       if k in ev[-1]})
        if "passes" in ev[-1]:  # lstsq: its passes over A
            counts["collective_passes"] = ev[-1]["passes"]
    del out, xi
    _released(client, base - len(x.chunks[0]))
    return counts


def _released(client: Any, tasks: int) -> None:
    """Wait until the scheduler holds no more than ``tasks`` tasks (a call's results
    released before the next call allocates its own: a GPU holds ``A`` and one ``Q``)."""
    deadline = time.perf_counter() + 30
    while _tasks(client) > tasks and time.perf_counter() < deadline:
        time.sleep(0.01)


def _same(block: Any, nonce: str) -> Any:
    return block


def _tasks(client: Any) -> int:
    return client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks))


def _qr_errors(q: Any, r: Any, a: Any) -> tuple[float, float]:
    """Backward error and orthogonality, evaluated on the cluster in the working dtype,
    one block task per row block (a block's temporaries only: the whole-array
    expression ``a - q @ r`` held many blocks' worth on a GPU at once)."""
    import dask
    import numpy as np

    n = a.shape[1]
    rh = _host(r.compute() if hasattr(r, "compute") else r)
    parts = [dask.delayed(_block_errors)(ai, qi, rh)
             for ai, qi in zip(a.to_delayed().ravel(), q.to_delayed().ravel())]
    res = dask.compute(*parts)
    num = sum(p[0] for p in res)
    den = sum(p[1] for p in res)
    g = sum(p[2] for p in res)
    orth = np.linalg.norm(g - np.eye(n))
    return float(np.sqrt(num / den)), float(orth) / n


def _block_errors(a: Any, q: Any, r: Any) -> tuple[float, float, Any]:
    """``(||a - q r||_F^2, ||a||_F^2, q^H q)`` of one row block (host scalars and matrix)."""
    xp = _module(_on_gpu(a))
    res = a - q @ xp.asarray(r)
    return (float(xp.sum(xp.abs(res) ** 2)), float(xp.sum(xp.abs(a) ** 2)),
            _host(q.conj().T @ q))


def _module(gpu: bool) -> Any:
    """CuPy for GPU workers and arrays, NumPy otherwise."""
    if gpu:
        import cupy

        return cupy
    import numpy

    return numpy


def _on_gpu(a: Any) -> bool:
    return type(a).__module__.startswith("cupy")


def _host(v: Any) -> Any:
    return v.get() if hasattr(v, "get") else v


def _qr_pair(client: Any, x: Any, repeat: int, reference: bool = True,
             ref_repeat: int | None = None, ref_checks: bool = True) -> dict[str, Any]:
    """mpqr's ``qr`` (``Q`` persisted, and ``mode="r"``) on ``x``: median times, round
    trips, errors, route; then dask's tsqr (``ref_repeat`` calls; ``ref_checks``: its
    round trips and errors too, each one call more)."""
    import dask.array as da

    import mpqr

    def ours(x: Any) -> Any:
        # Q persisted (the collective route returns it so; R is data in memory)
        q, r = mpqr.qr(x)
        return [_persisted(client, q), r]

    def ours_r(x: Any) -> Any:
        # R is computed during the call (a one-chunk dask array of data in memory)
        return mpqr.qr(x, mode="r")

    def theirs(x: Any) -> Any:
        return _run(client, *da.linalg.tsqr(x))

    calls: dict[str, list[dict[str, Any]]] = {"mpqr": [], "mpqr_r": []}
    _free_pools(client)
    out: dict[str, Any] = {"blocks_per_worker": blocks_per_worker(client, x),
                           "mpqr_s": _median_time(client, ours, x, repeat, calls["mpqr"]),
                           "mpqr_r_s": _median_time(client, ours_r, x, repeat,
                                                    calls["mpqr_r"]),
                           "calls": calls}
    rt = _counted(client, ours, x)
    if rt["passes"]:  # the scheduler route: Q's lazy pass, persisted
        rt["passes"] += 1
    out["round_trips"] = rt
    out["round_trips_r"] = _counted(client, ours_r, x)
    q, r = ours(x)
    out["backward_error"], out["orthogonality"] = _qr_errors(q, r, x)
    del q, r  # one factorization's Q on the workers at a time
    with mpqr.explain() as trace:
        mpqr.qr(x, mode="r")
    route = next((e.data.get("route") for e in trace.events if e.data.get("route")), "?")
    out["route"] = route + ("->tsqr" if any(e.kind == "fallback" for e in trace.events)
                            else "")
    if not reference:
        return out
    _free_pools(client)
    try:
        calls["dask_tsqr"] = []
        out["dask_tsqr_s"] = _median_time(client, theirs, x, ref_repeat or repeat,
                                          calls["dask_tsqr"])
        out["speedup"] = out["dask_tsqr_s"] / out["mpqr_s"]
        if ref_checks:
            out["dask_round_trips"] = _counted(client, theirs, x)
            q, r = theirs(x)
            out["dask_backward_error"], out["dask_orthogonality"] = _qr_errors(q, r, x)
            del q, r
    except Exception as exc:  # recorded, so that the rest of the run still counts
        out["dask_error"] = f"{type(exc).__name__}: {exc}"[:200]
        _free_pools(client)
        out["dask_tsqr_half"] = _half_tsqr(client, x, theirs)
    _free_pools(client)
    return out


def _half_tsqr(client: Any, x: Any, theirs: Any) -> dict[str, Any]:
    """dask.array.linalg.tsqr on every other block of ``x`` (half the rows, spread as
    ``x``'s), one call after a warm-up: where it fails at the row's size, what it takes
    at a size that fits (not the row's speed-up: another size)."""
    import dask.array as da

    nb = len(x.chunks[0])
    if nb < 2:
        return {"error": "one block: no half"}
    xh = da.concatenate([x.blocks[i] for i in range(0, nb, 2)])
    log: list[dict[str, Any]] = []
    try:
        t = _median_time(client, theirs, xh, 1, log)
    except Exception as exc:
        return {"shape": f"{xh.shape[0]}x{xh.shape[1]}",
                "error": f"{type(exc).__name__}: {exc}"[:200]}
    return {"shape": f"{xh.shape[0]}x{xh.shape[1]}", "blocks": len(xh.chunks[0]),
            "blocks_per_worker": log[0]["blocks_per_worker"], "dask_tsqr_s": t}


def _scaling(args: Any, gpu: bool, fixed_m: int | None,
             done: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The rows of ``args.scale_workers``; a row of ``done`` (the weak rows) with the
    same workers and shape is reused, not run again (one worker on ``m_per_worker``)."""
    from distributed import Client

    rows_out = []
    for w in args.scale_workers:
        m = fixed_m if fixed_m else args.m_per_worker * w
        same = [r for r in done or () if r["workers"] == w and r["shape"] == f"{m}x{args.n}"]
        if same:
            rows_out.append({**same[0], "same_as": "weak_scaling"})
            continue
        with _cluster(w if gpu else None, w) as cluster, Client(cluster) as client:
            client.register_plugin(RoundTrips())
            x = _placed(client, gpu, m, args.n, args.chunk_rows, args.dtype,
                        args.placement)
            row = {"workers": w, "shape": f"{m}x{args.n}", "block_rows": args.chunk_rows,
                   "blocks": len(x.chunks[0]), "placement": args.placement}
            row.update(_qr_pair(client, x, args.repeat, reference=not args.no_reference))
            rows_out.append(row)
            print(row)
            del x
    return rows_out


def _lstsq(client: Any, x: Any, gpu: bool, repeat: int, reference: bool = True,
           ref_repeat: int | None = None, ref_checks: bool = True) -> dict[str, Any]:
    """mpqr's ``lstsq`` (gelsy without the finiteness check, as dask's; the default call)
    and ``qr`` on ``x`` and a right-hand side beside its blocks, then dask's lstsq
    (``ref_repeat`` calls; ``ref_checks``: its round trips and residual too)."""
    import dask.array as da

    import mpqr

    m, n = x.shape
    # b's blocks drawn where A's live (a b generated apart is placed apart, and each pass
    # would move its blocks between the workers)
    b = x.map_blocks(_rhs_block, drop_axis=1, dtype=x.dtype, meta=x._meta.reshape((0,)))
    b = _run(client, b)[0]

    # x, residues and s are computed during the call (one-chunk dask arrays of data in
    # memory); their .compute() would add one more round trip for the client's own data
    def ours(x: Any) -> Any:
        return mpqr.lstsq(x, b, lapack_driver="gelsy", check_finite=False)

    def ours_default(x: Any) -> Any:
        return mpqr.lstsq(x, b)

    def theirs(x: Any) -> Any:
        return da.linalg.lstsq(x, b)[0].compute()

    def qr(x: Any) -> Any:
        q, r = mpqr.qr(x)
        return [_persisted(client, q), r]

    calls: dict[str, list[dict[str, Any]]] = {"mpqr": [], "mpqr_gelsd": [], "mpqr_qr": []}
    _free_pools(client)
    out: dict[str, Any] = {"shape": f"{m}x{n}", "blocks": len(x.chunks[0]),
                           "blocks_per_worker": blocks_per_worker(client, x),
                           "mpqr_s": _median_time(client, ours, x, repeat, calls["mpqr"]),
                           "mpqr_gelsd_s": _median_time(client, ours_default, x, repeat,
                                                        calls["mpqr_gelsd"]),
                           "mpqr_qr_s": _median_time(client, qr, x, repeat, calls["mpqr_qr"]),
                           "round_trips": _counted(client, ours, x),
                           "round_trips_gelsd": _counted(client, ours_default, x),
                           "calls": calls}
    out["vs_mpqr_qr"] = out["mpqr_s"] / out["mpqr_qr_s"]
    sols = [("mpqr", ours(x)[0].compute())]
    try:
        if not reference:
            raise LookupError("dask.array.linalg.lstsq left out (--no-reference)")
        _free_pools(client)
        calls["dask_lstsq"] = []
        out["dask_lstsq_s"] = _median_time(client, theirs, x, ref_repeat or repeat,
                                           calls["dask_lstsq"])
        out["speedup"] = out["dask_lstsq_s"] / out["mpqr_s"]
        if ref_checks:
            out["dask_round_trips"] = _counted(client, theirs, x)
            sols.append(("dask", theirs(x)))
    except Exception as exc:  # recorded, so that the rest of the run still counts
        out["dask_error"] = f"{type(exc).__name__}: {exc}"[:200]
    for key, sol in sols:
        xs = da.from_array(sol, chunks=sol.shape, asarray=False)
        r = b - x @ xs
        num, an, xn = da.compute(da.linalg.norm(x.conj().T @ r), da.linalg.norm(x),
                                 da.linalg.norm(xs))
        out[f"{key}_normal_eq_residual"] = float(num) / (float(an) ** 2 * float(xn))
    with mpqr.explain() as trace:
        mpqr.lstsq(x, b, lapack_driver="gelsy", check_finite=False)
    it = [e.data.get("iterations") for e in trace.events if e.kind == "refine"]
    out["refine_iterations"] = it[0] if it else 0
    out["path"] = ",".join(str(e.data["path"]) for e in trace.events if "path" in e.data)
    return out


def _rhs_block(a: Any, block_id: Any = None) -> Any:
    """A Gaussian right-hand side block for row block ``a``, on ``a``'s device."""
    rng = _module(_on_gpu(a)).random.default_rng(1000 + block_id[0])
    return rng.standard_normal(a.shape[0]).astype(a.dtype)


def _in_core(gpu: bool, m: int, n: int, dtype: str, repeat: int) -> list[dict[str, Any]]:
    """``mpqr.qr`` and ``mpqr.lstsq`` of the whole matrix on one device, no Dask."""
    import mpqr
    from mpqr.bench._timing import release_pool, time_it

    limit: Any = contextlib.nullcontext()
    xp = _module(gpu)
    if not gpu:
        with contextlib.suppress(ImportError):
            from threadpoolctl import threadpool_limits

            limit = threadpool_limits(1)  # as one single-threaded worker process
    rng = xp.random.RandomState(0)
    rows: list[dict[str, Any]] = []
    data = [rng.standard_normal((m, n)).astype(dtype), rng.standard_normal(m).astype(dtype)]
    try:
        limit.__enter__()
        cases = (("qr", lambda: mpqr.qr(data[0])),
                 ("qr_r", lambda: mpqr.qr(data[0], mode="r")),
                 ("lstsq", lambda: mpqr.lstsq(*data, lapack_driver="gelsy",
                                              check_finite=False)),
                 ("lstsq_gelsd", lambda: mpqr.lstsq(*data)))
        for what, fn in cases:
            try:
                rows.append({"what": what, "shape": f"{m}x{n}",
                             "seconds": time_it(xp, fn, repeat=repeat, warmup=1)})
            except Exception as exc:  # out of device memory: recorded
                rows.append({"what": what, "shape": f"{m}x{n}",
                             "error": f"{type(exc).__name__}: {exc}"[:200]})
            print(rows[-1])
    finally:
        limit.__exit__(None, None, None)
        data.clear()
        release_pool(xp)
    return rows


def _overhead(client: Any, gpu: bool, n: int, rows: int, dtype: str, repeat: int
              ) -> list[dict[str, Any]]:
    """Per block task, on one worker: mpqr's block functions against the bare products."""
    worker = _workers(client)[0]
    out = []
    for h in (rows, 2 * n):
        res = client.submit(_overhead_on_worker, gpu, h, n, dtype, repeat, pure=False,
                            workers=[worker]).result()
        out.append(res)
        print(res)
    return out


def _overhead_on_worker(gpu: bool, h: int, n: int, dtype: str, repeat: int) -> dict[str, Any]:
    from mpqr.backends.dask import _blocks
    from mpqr.bench._timing import time_it

    xp = _module(gpu)
    rng = xp.random.RandomState(0)
    a = rng.standard_normal((h, n)).astype(dtype)
    b = rng.standard_normal((h, 1)).astype(dtype)
    x = _blocks.to_host(rng.standard_normal((n, 2)).astype(dtype))
    prec = "fp64" if dtype == "float64" else "fp32"

    def host(v: Any) -> Any:
        return _blocks.to_host(v)

    cases = {
        "bare_gram": lambda: host(a.T @ a),
        "gram_leaf": lambda: _blocks.gram_leaf(((), "cholqr2", prec, prec, True, False), a),
        "bare_lstsq_first": lambda: (host(a.T @ a), host(a.T @ b)),
        "lstsq_leaf": lambda: _blocks.lstsq_leaf((prec, prec, True), a, b),
        "bare_refine": lambda: host(a.T @ (xp.concatenate([b, b], axis=1)
                                         - a @ xp.asarray(x))),
        "residual_leaf": lambda: _blocks.residual_leaf((x, 1, prec, 0, 0, True), a, b),
    }
    out: dict[str, Any] = {"block": f"{h}x{n}"}
    for k, fn in cases.items():
        out[f"{k}_ms"] = 1e3 * time_it(xp, fn, repeat=max(repeat, 5), warmup=2)
    for k in ("gram", "lstsq_first", "refine"):
        leaf = {"gram": "gram_leaf", "lstsq_first": "lstsq_leaf", "refine": "residual_leaf"}[k]
        out[f"{k}_overhead_ms"] = out[f"{leaf}_ms"] - out[f"bare_{k}_ms"]
    return out


def _scheduler(client: Any, gpu: bool, n: int, blocks: int, repeat: int) -> dict[str, Any]:
    import mpqr

    rows = 4 * n
    x = _placed(client, gpu, rows * blocks, n, rows, "float64", "even")
    t = _median_time(client, lambda xi: _run(client, *mpqr.qr(xi)), x, repeat)
    q, _r = mpqr.qr(x)
    tasks = len(q.__dask_graph__())
    return {"shape": f"{rows * blocks}x{n}", "blocks": blocks, "seconds_per_call": t,
            "tasks_in_Q_graph": tasks, "ms_per_task": 1e3 * t / max(tasks, 1)}


def _sweep(client: Any, gpu: bool, args: Any, m: int, workers: int) -> list[dict[str, Any]]:
    out = []
    if args.sweep_rows:
        heights = [int(h) for h in args.sweep_rows.split(",")]
    else:
        heights, rows = [], min(m // (2 * workers), 2 * args.chunk_rows)
        while rows >= max(args.n, m // (128 * workers)):
            heights.append(rows)
            rows //= 2
    for rows in heights:
        x = _placed(client, gpu, m, args.n, rows, args.dtype, args.placement)
        row = {"shape": f"{m}x{args.n}", "block_rows": rows, "blocks": len(x.chunks[0])}
        row.update(_qr_pair(client, x, args.repeat, reference=not args.no_reference))
        out.append(row)
        print(row)
        del x
    return out


def plot(payload: dict[str, Any], path: str) -> None:
    plt = pyplot()
    if plt is None:
        return
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, key, title in ((axes[0], "weak_scaling", "weak scaling (rows per worker fixed)"),
                           (axes[1], "strong_scaling", "strong scaling (matrix fixed)")):
        rows = payload.get(key) or []
        w = [r["workers"] for r in rows]
        ax.plot(w, [r["mpqr_s"] for r in rows], "o-", label="mpqr.qr")
        ax.plot(w, [r.get("dask_tsqr_s", float("nan")) for r in rows], "s--",
                label="dask.array.linalg.tsqr")
        ax.set_xlabel("workers")
        ax.set_ylabel("seconds")
        ax.set_title(title)
        ax.set_xticks(w)
        ax.legend()
    rows = payload.get("chunk_sweep") or []
    if rows:
        axes[2].plot([r["block_rows"] for r in rows], [r["mpqr_s"] for r in rows], "o-",
                     label="mpqr.qr")
        axes[2].plot([r["block_rows"] for r in rows],
                     [r.get("dask_tsqr_s", float("nan")) for r in rows], "s--",
                     label="dask tsqr")
        axes[2].set_xscale("log", base=2)
        axes[2].set_xlabel("rows per block")
        axes[2].set_title("block height sweep")
    else:  # no sweep run: lstsq by workers (rows per worker fixed)
        rows = payload.get("lstsq") or []
        w = [r["workers"] for r in rows]
        axes[2].plot(w, [r["mpqr_s"] for r in rows], "o-", label="mpqr.lstsq")
        axes[2].plot(w, [r.get("dask_lstsq_s", float("nan")) for r in rows], "s--",
                     label="dask.array.linalg.lstsq")
        axes[2].set_xticks(w)
        axes[2].set_xlabel("workers")
        axes[2].set_title("lstsq (rows per worker fixed)")
    axes[2].set_ylabel("seconds")
    axes[2].legend()
    for ax in axes:
        ax.set_yscale("log")  # mpqr's rows sit 5-20x below dask's own
    env = payload["environment"]
    fig.suptitle(f"mpqr on Dask: {env.get('device', '?')} x {payload['workers']} "
                 f"({payload['cluster']})")
    save(fig, path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mpqr bench dask", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpus", type=int, default=None,
                   help="a dask_cuda.LocalCUDACluster with this many GPUs (one worker each)")
    p.add_argument("--workers", type=int, default=2, help="CPU worker processes (no --gpus)")
    p.add_argument("--m-per-worker", type=int, default=None,
                   help="rows per worker (default: 2^26 on GPUs, 2^16 on CPUs)")
    p.add_argument("--n", type=int, default=64)
    p.add_argument("--chunk-rows", type=int, default=None,
                   help="rows per block (default: 2^22 on GPUs, 2^13 on CPUs)")
    p.add_argument("--strong-m", type=int, default=None,
                   help="rows of the strong-scaling matrix (default: --m-per-worker, which one "
                        "worker holds)")
    p.add_argument("--scale-workers", default=None,
                   help="comma-separated worker counts of the scaling rows (default 1 ... N)")
    p.add_argument("--sweep-rows", default=None,
                   help="comma-separated block heights of the chunk sweep (default: from "
                        "min(M / 2N, 2 chunk_rows) down by 2 to M / 128N)")
    p.add_argument("--placement", choices=("even", "scheduler"), default="even",
                   help="how the blocks are placed on the workers: even (block i of B made "
                        "on worker i w / B) or where the scheduler runs dask.array.random's "
                        "tasks")
    p.add_argument("--no-reference", action="store_true",
                   help="leave dask.array.linalg's tsqr and lstsq out")
    p.add_argument("--route", choices=("auto", "collective", "scheduler"), default="auto",
                   help="the Dask route of mpqr's calls (dask config mpqr.dask.route; auto: "
                        "collective for CuPy blocks on GPU workers with NCCL)")
    p.add_argument("--dtype", default="float64")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--skip", default="", help="comma-separated experiments to leave out")
    p.add_argument("--json")
    p.add_argument("--png")
    args = p.parse_args(argv)
    gpu = bool(args.gpus)
    if args.m_per_worker is None:
        args.m_per_worker = 2**26 if gpu else 2**16
    if args.chunk_rows is None:
        args.chunk_rows = 2**22 if gpu else 2**13
    skip = set(filter(None, args.skip.split(",")))
    top = args.gpus or args.workers
    args.scale_workers = ([int(w) for w in args.scale_workers.split(",")]
                          if args.scale_workers else list(range(1, top + 1)))
    xp = _module(gpu)
    import dask
    from distributed import Client

    dask.config.set({"mpqr.dask.route": args.route})

    payload: dict[str, Any] = {
        "benchmark": "dask", "environment": environment(xp), "dask": dask.__version__,
        "cluster": (_cluster_kind() if gpu else "LocalCluster (processes)"), "workers": top,
        "route": args.route, "placement": args.placement,
        "n": args.n, "dtype": args.dtype, "m_per_worker": args.m_per_worker,
        "block_rows": args.chunk_rows, "strong_m": args.strong_m or args.m_per_worker,
        "repeat": args.repeat}
    if "in_core" not in skip:
        payload["in_core"] = _in_core(gpu, args.m_per_worker, args.n, args.dtype,
                                      args.repeat)
    if "weak" not in skip:
        payload["weak_scaling"] = _scaling(args, gpu, None)
        write_json(args.json, payload)  # each experiment kept, should a later one fail
    if "strong" not in skip:  # by default the one-worker size, so that one worker holds it
        payload["strong_scaling"] = _scaling(args, gpu, args.strong_m or args.m_per_worker,
                                             payload.get("weak_scaling"))
        write_json(args.json, payload)
    if "lstsq" not in skip:  # weak scaling, as the QR rows
        payload["lstsq"] = []
        for w in args.scale_workers:
            with _cluster(w if gpu else None, w) as cluster, Client(cluster) as client:
                client.register_plugin(RoundTrips())
                x = _placed(client, gpu, args.m_per_worker * w, args.n, args.chunk_rows,
                            args.dtype, args.placement)
                payload["lstsq"].append({"workers": w, **_lstsq(client, x, gpu, args.repeat,
                                                                not args.no_reference)})
                print(payload["lstsq"][-1])
                write_json(args.json, payload)
                del x
    if not {"overhead", "scheduler", "sweep"} <= skip:
        _last(args, gpu, skip, payload)
    with contextlib.suppress(KeyError):
        weak = payload["weak_scaling"]
        payload["weak_efficiency"] = weak[0]["mpqr_s"] / weak[-1]["mpqr_s"]
    payload["summary"] = summary(payload)
    print(payload["summary"])
    write_json(args.json, payload)
    if args.png:
        plot(payload, args.png)
    return 0


def _cluster_kind() -> str:
    try:
        import dask_cuda  # noqa: F401
    except ImportError:
        return "SpecCluster of nannies, one GPU each (no dask_cuda)"
    return "LocalCUDACluster"


def summary(payload: dict[str, Any]) -> dict[str, Any]:
    """The ratios the targets speak of: ``qr`` with ``Q`` persisted on w workers over
    in-core ``qr`` (strong scaling), the weak-scaling ratio (last over first), and
    dask.array.linalg's tsqr and lstsq over mpqr's on the same cluster and chunks."""
    out: dict[str, Any] = {}
    core = {r["what"]: r.get("seconds") for r in payload.get("in_core", [])}
    for row in payload.get("strong_scaling", []):
        if core.get("qr"):
            out[f"qr {row['workers']} workers / in core"] = row["mpqr_s"] / core["qr"]
        if core.get("qr_r"):
            out[f"qr mode=r {row['workers']} workers / in core"] = row["mpqr_r_s"] / core["qr_r"]
    weak = payload.get("weak_scaling", [])
    if len(weak) > 1:
        out["weak scaling (last / first)"] = weak[-1]["mpqr_s"] / weak[0]["mpqr_s"]
    for row in weak:
        if row.get("speedup"):
            out[f"dask tsqr / mpqr qr, {row['workers']} workers"] = row["speedup"]
    for row in payload.get("strong_scaling", []):
        if row.get("speedup"):
            out[f"dask tsqr / mpqr qr, {row['workers']} workers, {row['shape']}"] = \
                row["speedup"]
    for row in payload.get("lstsq", []):
        if row.get("speedup"):
            out[f"dask lstsq / mpqr lstsq, {row['workers']} workers"] = row["speedup"]
        if core.get("lstsq"):  # the lstsq rows hold m_per_worker rows per worker
            w = row["workers"]
            out[f"lstsq {w} workers / in core" if w == 1 else
                f"lstsq {w} workers on {w} x the rows / in core"] = \
                row["mpqr_s"] / core["lstsq"]
    ls = payload.get("lstsq", [])
    if len(ls) > 1:
        out["lstsq weak scaling (last / first)"] = ls[-1]["mpqr_s"] / ls[0]["mpqr_s"]
    return out


def _last(args: Any, gpu: bool, skip: set[str], payload: dict[str, Any]) -> None:
    """The per-task rows, on a cluster of every worker."""
    from distributed import Client

    top = args.gpus or args.workers
    with _cluster(args.gpus, args.workers) as cluster, Client(cluster) as client:
        client.register_plugin(RoundTrips())
        m = args.m_per_worker * top
        if "overhead" not in skip:
            payload["overhead"] = _overhead(client, gpu, args.n, args.chunk_rows, args.dtype,
                                            args.repeat)
        if "scheduler" not in skip:
            payload["scheduler"] = [_scheduler(client, gpu, args.n, b, args.repeat)
                                    for b in (1, 16, 128)]
            print(payload["scheduler"])
        if "sweep" not in skip:
            payload["chunk_sweep"] = _sweep(client, gpu, args, m, top)
