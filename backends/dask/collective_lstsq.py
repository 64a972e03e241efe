"""``lstsq`` by the collective route: one task per worker runs the distributed solver
(:class:`mpqr.backends.dask.solver.DaskSolver`) over that worker's block pairs, each of
its passes a local sum and one all-reduce instead of a graph.

Every rank gets the same sums (the all-reduce), so every rank takes the same decisions
in the solver's ``n x n`` steps (same inputs, same host code) and issues the same
collectives; rank 0 returns ``x``, the rank, ``s`` and the squared residual norms. The direct
solution (a refinement that did not converge under ``refine="auto"``) runs there too,
on the workers' blocks of ``Q`` from the collective CholQR2. Where CholQR2 breaks down
(a rank-deficient or very ill-conditioned ``A``) the task stops on every rank alike
and the client runs the scheduler route instead.
"""

from __future__ import annotations

import time
import warnings
from typing import Any

from mpqr.backends.dask import _blocks, _launch, collective
from mpqr.backends.dask._graph import sum_parts
from mpqr.backends.dask.solver import DaskSolver

from mpqr.lstsq.solver import Solver
from mpqr.policy import record_event

__all__ = ["CollectiveSolver", "Stop"]


class Stop(Exception):
    """The collective solver cannot finish this problem (every rank stops alike)."""


class _Shape:
    """What :class:`Solver` reads of ``a`` and ``b`` on a worker: shape, dtype, meta."""

    def __init__(self, shape: tuple[int, ...], dtype: Any, meta: Any):
        self.shape, self.dtype, self._meta, self.ndim = shape, dtype, meta, len(shape)


class _WorkerSolver(DaskSolver):
    """The solver on one worker: its passes over the worker's own block pairs."""

    def __init__(self, comm: Any, pairs: list[tuple[Any, Any]], meta: Any, backend: Any,
                 a: _Shape, b: _Shape, args: tuple[Any, ...], check_finite: bool,
                 phases: bool = False):
        Solver.__init__(self, backend, a, b, *args[:-1], need_s=args[-1])
        self.comm, self.pairs, self.meta = comm, pairs, meta
        self.check_finite, self.vector = check_finite, None
        self.host = _blocks.host_backend()
        self.passes = [0]
        self.phases: list[tuple[str, float]] | None = [] if phases else None
        self.first_gram = None
        self.n_cols = a.shape[1]

    def _pass(self, what: str, leaf: Any, small: Any, arrays: list[Any] | None = None
              ) -> dict[str, Any]:
        if arrays is not None:  # a pass over Q: the route needs Q (scheduler route)
            raise Stop(f"the solver needs Q ({what})")
        xp = self.backend.xp
        # a worker without blocks adds zeros: its leaf on empty blocks of its device
        pairs = self.pairs or [(xp.empty((0, self.n_cols), dtype=self.meta.dtype),
                                xp.empty((0, self.b.shape[1]), dtype=self.meta.dtype))]
        if self.phases is not None:  # profiling: each pass's and all-reduce's ms
            self.backend.synchronize()
            t0 = time.perf_counter()
        if _blocks.on_gpu(pairs[0][0]):  # the small operands to the GPU once a pass
            small = _blocks._moved(small, pairs[0][0], self.backend)
        parts = [leaf(small, a, b) for a, b in pairs]
        out = sum_parts(parts) if len(parts) > 1 else parts[0]
        self.passes[0] += 1
        if self.phases is None:
            return _allreduce(self.comm, self.backend, out)
        self.backend.synchronize()
        t1 = time.perf_counter()
        res = _allreduce(self.comm, self.backend, out)
        self.phases += [(what, round(1e3 * (t1 - t0), 3)),
                        (f"{what} all-reduce", round(1e3 * (time.perf_counter() - t1), 3))]
        return res

    def _factor(self, prec: str, mode: str) -> Any:
        """CholQR2 of the worker's blocks of ``A`` (the sums by all-reduce): ``R`` on
        the host for ``mode="r"``, else ``(the worker's blocks of Q, R on the device)``."""
        from mpqr.backends.dask._blocks import block_backend

        blocks = tuple(a for a, _ in self.pairs)
        backend = block_backend(blocks[0] if blocks else self.meta)
        info, q = _cholqr2(self.comm, backend, self.n_cols, str(self.meta.dtype), blocks,
                           prec, self.first_gram if mode == "r" else None, mode != "r")
        if "breakdown" in info or info["cert"] > 0.5:
            raise Stop("CholQR2 of A broke down")
        if mode == "r":
            return info["r"]
        return _LocalQ(q), self._to_blocks(info["r"])

    def _qh_b(self, q: Any) -> Any:
        """``Q^H b``: the worker's blocks' products summed, then across the workers."""
        from mpqr.policy import gemm
        from mpqr.qr._kernels import ct

        xp = self.backend.xp
        c = self._to_blocks(self.host.xp.zeros((self.n_cols, self.b.shape[1]),
                                               dtype=self.meta.dtype))
        for qi, (_, bi) in zip(q.blocks, self.pairs):
            c = c + gemm(ct(xp, qi), bi, precision=self.wprec, label="lstsq:QHb",
                         backend=self.backend)
        self.passes[0] += 1
        return self.comm.allreduce_sum(c)


class _LocalQ:
    """The worker's blocks of ``Q`` (what :meth:`_WorkerSolver._qh_b` reads)."""

    def __init__(self, blocks: list[Any]):
        self.blocks = blocks


def _cholqr2(comm: Any, backend: Any, n: int, dtype: str, blocks: tuple[Any, ...],
             prec: str, first_gram: Any, want_q: bool = False
             ) -> tuple[dict[str, Any], list[Any]]:
    try:
        with backend.ignore_fp_warnings():
            info, out = collective._cholqr2_body(comm, backend, n, dtype, blocks, want_q,
                                                 prec, False, time.perf_counter(),
                                                 comm.calls, first_gram=first_gram,
                                                 r_everywhere=True)
    except collective._Breakdown as exc:
        return {"breakdown": str(exc)}, []
    return info, out


def _allreduce(comm: Any, backend: Any, out: dict[str, Any]) -> dict[str, Any]:
    """One pass's local sums summed over the ranks: ``*max`` entries by maximum,
    ``*ok`` flags by counting the ranks where they fail, the rest by addition; on the
    host, as the scheduler route's passes return them."""
    xp = backend.xp
    import numpy as np

    keys = sorted(out)
    dt = next((out[k].dtype for k in keys if hasattr(out[k], "dtype")
               and not k.endswith("ok") and out[k].dtype.kind == "f"), xp.float64)
    like = next((out[k] for k in keys if _blocks.on_gpu(out[k])), None)

    def flat(v: Any) -> Any:
        v = xp.asarray(v, dtype=dt) if like is None else backend.from_small(
            np.asarray(_blocks.to_host(v), dtype=dt), like)
        return xp.reshape(v, (-1,))

    sums = [k for k in keys if not k.endswith("max")]
    maxes = [k for k in keys if k.endswith("max")]
    res: dict[str, Any] = {}
    for group, reduce in ((sums, comm.allreduce_sum), (maxes, comm.allreduce_max)):
        if not group:
            continue
        vals = [(0.0 if bool(_blocks.to_host(out[k])) else 1.0) if k.endswith("ok")
                else out[k] for k in group]
        shapes = [tuple(getattr(v, "shape", ())) for v in vals]
        total = _blocks.to_host(reduce(xp.concat([flat(v) for v in vals])))
        at = 0
        for k, shp in zip(group, shapes):
            size = int(np.prod(shp)) if shp else 1
            v = total[at:at + size].reshape(shp)
            at += size
            res[k] = bool(v == 0) if k.endswith("ok") else (
                v.astype(np.asarray(_blocks.to_host(out[k])).dtype) if shp else v[()])
    return res


def _lstsq_task(comm: Any, blocks: tuple[Any, ...], meta: Any, ashape: tuple[int, int],
                bshape: tuple[int, int], args: tuple[Any, ...], check_finite: bool,
                vector: bool, phases: bool = False) -> tuple[dict[str, Any], list[Any]]:
    """The solver over this worker's block pairs, ``blocks`` its blocks of ``a`` then
    those of ``b`` (the body a call runs on each worker,
    :func:`mpqr.backends.dask._launch.launch`); no blocks kept."""
    import mpqr

    half = len(blocks) // 2
    a_blocks, b_blocks = blocks[:half], blocks[half:]
    if vector:
        b_blocks = tuple(v[:, None] for v in b_blocks)
    backend = _blocks.block_backend(a_blocks[0] if a_blocks else meta)
    t0, calls0 = time.perf_counter(), comm.calls
    solver = _WorkerSolver(comm, list(zip(a_blocks, b_blocks)), meta, backend,
                           _Shape(ashape, meta.dtype, meta), _Shape(bshape, meta.dtype, meta),
                           args, check_finite, phases)
    with mpqr.explain() as trace, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            x, rank, s, rr = solver.run()
        except Stop as exc:
            return {"stop": str(exc), "rank_id": comm.rank}, []
        except collective.CollectiveError:
            raise
        except Exception as exc:  # check_finite's NaN/Inf...: the same on every rank
            return {"error": exc, "rank_id": comm.rank}, []
    out = {"rank_id": comm.rank, "collectives": comm.calls - calls0,
           "passes": solver.passes[0], "seconds": time.perf_counter() - t0}
    if solver.phases is not None:
        out["phases_ms"] = solver.phases
    if comm.rank == 0:
        out.update(x=_blocks.to_host(x), rank=rank,
                   s=None if s is None else _blocks.to_host(s),
                   rr=None if rr is None else _blocks.to_host(rr),
                   events=[(e.kind, e.message, e.data) for e in trace.events
                           if e.kind in ("refine", "scale", "method", "fallback")],
                   warnings=[(w.category, str(w.message)) for w in caught])
    return out, []


class CollectiveSolver(DaskSolver):
    """The client's side: :meth:`run` sends one task per worker (the worker's blocks of
    ``a`` and ``b``), or runs the scheduler route where the collective one stops."""

    def __init__(self, *args: Any, client: Any = None, kind: str = "nccl", **kw: Any):
        super().__init__(*args, **kw)
        self.client, self.kind = client, kind
        self.args = (self.cond, self.prec, self.refine, 2 * self.u, self.tol, self.maxiter,
                     self.need_s)

    def run(self) -> tuple[Any, int, Any, Any]:
        client = self.client
        t_start = time.perf_counter()
        b = self.vector if self.vector is not None else self.b
        last: Exception | None = None
        start = time.time()
        lost: set[str] = set()
        attempt, tries = -1, 2
        while attempt + 1 < tries:
            attempt += 1
            try:
                h = collective.communicator(client, self.kind, renew=attempt > 0,
                                            check=False, exclude=frozenset(lost))
            except collective.CollectiveError as exc:
                if not attempt:
                    raise
                last = exc
                continue
            fa = collective._block_futures(client, self.a)
            fb = collective._block_futures(client, b)
            collective._ready([*fa, *fb])
            placed = [*fa, *fb]
            where, remembered = collective.placement(client, placed)
            if any(w not in h.ranks for f in fa for w in where[f.key]):
                h = collective.communicator(client, self.kind)  # the cluster changed
            per = collective.assign([where[f.key] for f in fa], self.a.chunks[0], h.ranks)
            rowbytes = (self.a.shape[1] + self.b.shape[1]) * self.a.dtype.itemsize
            collective.check_memory(h.limits, {w: rowbytes * sum(self.a.chunks[0][i]
                                                                  for i in idx)
                                               for w, idx in per.items()})
            # b's blocks read beside A's (copied there first where they are elsewhere)
            fa = collective._on_their_workers(client, fa, where, per)
            fb = collective._on_their_workers(client, fb, where, per)
            meta = self.a._meta
            work = {w: ([fa[i].key for i in idx] + [fb[i].key for i in idx], [])
                    for w, idx in per.items()}
            sent = time.time()
            try:
                res = _launch.launch(
                    client, h.cid, _blocks.bind(_lstsq_task), work,
                    (meta, self.a.shape, self.b.shape, self.args, self.check_finite,
                     self.vector is not None, collective.PHASES), collective.TIMEOUT + 10)
                back = time.time()
            except _launch.Lost as exc:
                lost |= exc.gone
                client.run(collective._abort, h.cid, on_error="ignore")
                collective.forget(client, h)
                _launch.settle(exc)
                last = collective.CollectiveError(str(exc))
                if remembered and exc.missing:  # a block moved since: asked again, one run more
                    collective.forget_placement(client, placed)
                    tries += 1
                continue
            spread = collective.balance(per, self.a.chunks[0], res)
            if collective.PHASES:
                spread["phases_ms"] = {w: res[w].get("phases_ms") for w in sorted(res)}
            res = list(res.values())
            r0 = next(v for v in res if v["rank_id"] == 0)
            if "error" in r0:
                raise r0["error"]
            if "stop" in r0:
                record_event("fallback", f"lstsq (dask): the collective route stopped "
                             f"({r0['stop']}); the scheduler route solves it",
                             fallback="scheduler", reason=r0["stop"])
                return super().run()
            for kind, message, data in r0["events"]:
                record_event(kind, message, **data)
            for category, message in r0["warnings"]:
                warnings.warn(message, category, stacklevel=5)
            record_event("dask-collective",
                         f"lstsq (dask): collective route ({self.kind}) over {len(per)} "
                         f"workers: one call straight to each worker (no task graph), "
                         f"{r0['passes']} passes over A, {r0['collectives']} all-reduces "
                         f"per worker{collective.balance_note(spread)}",
                         route="collective", communicator=self.kind, graphs=0,
                         tasks=0, launches=len(per), collectives=r0["collectives"],
                         passes=r0["passes"], attempts=attempt + 1,
                         **spread, seconds=max(v["seconds"] for v in res),
                         call_seconds=time.perf_counter() - t_start,
                         timeline_ms=_launch.timeline(start, sent, back,
                                                      [v["wall"] for v in res]))
            s = r0["s"]
            return (self._to_blocks(r0["x"]), r0["rank"], self._to_blocks(s),
                    self._to_blocks(r0["rr"]))
        raise collective.CollectiveError(
            f"collective lstsq failed on {tries} attempts (a worker lost or failed); last "
            f"error: "
            f"{type(last).__name__}: {last}") from last
