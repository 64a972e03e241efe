"""The collective route on a threaded LocalCluster of two workers (NumPy blocks, the
thread communicator): CholQR2 in one task per worker against NumPy's numerics, Q's
blocks on their input blocks' workers, the communicator reused, a lost rank a clear
error and a retry, the interface's sum checked directly."""

from __future__ import annotations

import contextlib
import threading

import numpy as np
import pytest

dask = pytest.importorskip("dask")
da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")

from mpqr.backends.dask import collective  # noqa: E402

import mpqr  # noqa: E402
from mpqr._errors import BreakdownError  # noqa: E402
from tests._qr_support import backward_error, geometric, orthogonality  # noqa: E402

pytestmark = pytest.mark.xdist_group("dask_collective")


@pytest.fixture(scope="module")
def client():
    # the two workers' bodies run at once in this process: one BLAS thread each, not two
    # BLAS pools spinning against each other on the same cores (10x slower on two cores)
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        threadpool_limits = contextlib.nullcontext
    limits = threadpool_limits(1)
    with limits, distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                  dashboard_address=None, silence_logs=40) as cluster, \
            distributed.Client(cluster) as c:
        yield c


@pytest.mark.parametrize(("cond", "n"), [(1e2, 12), (1e7, 12), (1e2, 40), (1e7, 40)])
def test_cholqr2_one_task_per_worker(client, cond, n):
    # 12 columns: Q1's Gram matrix in the solve's pass; 40: Q1 stored, then Q = Q1 R2^-1
    rng = np.random.default_rng(1)
    m = 3000
    a = geometric(rng, m, n, cond)
    x = da.from_array(a, chunks=(400, n)).persist()  # ragged: 7 x 400 + 200
    with mpqr.explain() as trace:
        q, r = collective.cholqr2(x)
    (ev,) = [e for e in trace.events if e.kind == "dask-collective"]
    assert ev.data["launches"] == 2 and ev.data["collectives"] == 2
    assert ev.data["graphs"] == 0 and ev.data["q_blocks"] == len(x.chunks[0])
    assert ev.data["q_by"] == ("fused-solve" if n <= 32 else "q1-times-inverse")
    assert q.chunks == x.chunks
    # each block of Q sits on the worker of its block of A (already persisted)
    from distributed import futures_of
    ka, kq = client.who_has(futures_of(x)), client.who_has(futures_of(q))
    wa = [ka[k[0]] for k in x.__dask_keys__()]
    wq = [kq[k[0]] for k in q.__dask_keys__()]
    assert wa == wq and len({w[0] for w in wa}) == 2
    qh = q.compute()
    u = np.finfo(np.float64).eps
    assert backward_error(a, qh, r) <= 20 * u * n
    assert orthogonality(qh) <= 20 * u * n
    assert np.all(np.diag(r) > 0)
    np.testing.assert_allclose(np.abs(r), np.abs(np.linalg.qr(a, mode="r")),
                               rtol=0, atol=1e3 * u * cond * np.linalg.norm(a, 2))


@pytest.fixture
def device_steps(monkeypatch):
    """The workers' NumPy blocks take the n x n steps' one-launch route (the Array API
    reference of the GPU kernel, :func:`mpqr.qr.cholqr_steps.portable_chol_steps`)."""
    from mpqr.backends._base import ArrayAPIBackend

    from mpqr.qr.cholqr_steps import portable_chol_steps

    calls = []

    def steps(self, g):
        calls.append(g.shape)
        return portable_chol_steps(self, g)

    monkeypatch.setattr(ArrayAPIBackend, "chol_steps", steps)
    return calls


@pytest.mark.parametrize(("cond", "n", "nxn"), [
    (1e2, 12, ["one-launch"] * 2), (1e7, 64, ["one-launch"] * 2),
    # graded columns: R1's diagonal ratio (1e8) fails the one-launch check, so that
    # pass's steps run one by one (column scaling leaves CholQR2 exact)
    (None, 40, ["one-by-one", "one-launch"])])
def test_cholqr2_nxn_steps_in_one_launch(client, device_steps, cond, n, nxn):
    rng = np.random.default_rng(5)
    a = geometric(rng, 1500, n, cond) if cond else \
        rng.standard_normal((1500, n)) * np.geomspace(1, 1e8, n)
    cond = cond or np.linalg.cond(a)
    x = da.from_array(a, chunks=(300, n)).persist()
    with mpqr.explain() as trace:
        q, r = collective.cholqr2(x, check_finite=True)
    (ev,) = [e for e in trace.events if e.kind == "dask-collective"]
    assert ev.data["nxn_steps"] == nxn and ev.data["collectives"] == 2
    assert ev.data["q_by"] == ("fused-solve" if n <= 32 else "q1-times-inverse")
    qh = q.compute()
    u = np.finfo(np.float64).eps
    assert backward_error(a, qh, r) <= 20 * u * n and orthogonality(qh) <= 20 * u * n
    np.testing.assert_array_equal(r, np.triu(r))
    np.testing.assert_allclose(np.abs(r), np.abs(np.linalg.qr(a, mode="r")),
                               rtol=0, atol=1e3 * u * cond * np.linalg.norm(a, 2))
    _, r_only = collective.cholqr2(x, want_q=False)
    np.testing.assert_array_equal(r_only, r)


def test_lstsq_direct_solution_with_nxn_steps_in_one_launch(client, device_steps,
                                                            monkeypatch):
    import dask
    import scipy.linalg

    real, seen = collective._second_on_device, []
    monkeypatch.setattr(collective, "_second_on_device",
                        lambda *a, **kw: seen.append(real(*a, **kw)) or seen[-1])

    # the refinement stopped after one step: the direct solution's CholQR2 from the
    # first pass's Gram matrix, its n x n steps from the one launch, R on every rank
    rng = np.random.default_rng(8)
    a = geometric(rng, 1200, 6, 1e6)
    b = rng.standard_normal((1200, 2))
    x = _placed(client, a, 200, (5, 1))
    bd = da.from_array(b, chunks=(200, 2)).persist()
    with dask.config.set({collective.CONFIG_KEY: "collective"}), mpqr.explain() as trace:
        xs, res, rank, _s = mpqr.lstsq(x, bd, maxiter=1)
    assert [e for e in trace.events if e.data.get("path") == "direct"]
    # on both ranks, each collective CholQR2 the solver ran
    assert seen and len(seen) % 2 == 0 and all(v is not None for v in seen)
    ref = scipy.linalg.lstsq(a, b)
    u = np.finfo(np.float64).eps
    np.testing.assert_allclose(xs.compute(), ref[0], rtol=0,
                               atol=10 * 6 * u * 1e6**2 * np.linalg.norm(ref[0]))
    np.testing.assert_allclose(res.compute(), ref[1], rtol=1e-8)
    assert rank == 6


def test_nxn_steps_in_one_launch_break_down_as_one_by_one(client, device_steps):
    a = np.ones((400, 4))
    with pytest.raises(BreakdownError, match="positive definite|certified"):
        collective.cholqr2(da.from_array(a, chunks=(100, 4)))
    a = np.random.default_rng(6).standard_normal((400, 4))
    a[123, 2] = np.nan
    with pytest.raises(ValueError, match="infs or NaNs"):
        collective.cholqr2(da.from_array(a, chunks=(100, 4)), check_finite=True)
    # cond 1e12: the first Gram matrix is not numerically positive definite, or Q1 is
    # not certified (CholQR2 reaches u^-1/2)
    a = geometric(np.random.default_rng(7), 600, 8, 1e12)
    with pytest.raises(BreakdownError, match="positive definite|certified"):
        collective.cholqr2(da.from_array(a, chunks=(150, 8)))


def test_communicator_reused_and_sum(client):
    h1 = collective.communicator(client, "thread")
    h2 = collective.communicator(client, "thread")
    assert h1 is h2 and len(h1.ranks) == 2
    comms = [collective.ThreadCommunicator("sum-test", 3, r) for r in range(3)]
    out = [None] * 3
    parts = [np.full((2, 2), float(r + 1)) for r in range(3)]

    def go(r):
        out[r] = comms[r].allreduce_sum(parts[r])

    ts = [threading.Thread(target=go, args=(r,)) for r in range(3)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    for o in out:
        np.testing.assert_array_equal(o, np.full((2, 2), 6.0))


def test_lost_rank_is_an_error_then_a_retry(client, monkeypatch):
    rng = np.random.default_rng(2)
    a = rng.standard_normal((800, 6))
    x = da.from_array(a, chunks=(200, 6)).persist()
    real = collective.ThreadCommunicator.allreduce_sum
    failed = []

    def flaky(self, v):
        if not failed and self.rank == 1:
            failed.append(1)
            self.abort()  # as a lost worker's peers see it
            raise collective.CollectiveError("rank 1 lost")
        return real(self, v)

    monkeypatch.setattr(collective.ThreadCommunicator, "allreduce_sum", flaky)
    with mpqr.explain() as trace:
        q, r = collective.cholqr2(x)
    (ev,) = [e for e in trace.events if e.kind == "dask-collective"]
    assert ev.data["attempts"] == 2
    assert backward_error(a, q.compute(), r) <= 100 * np.finfo(float).eps
    failed.clear()
    with pytest.raises(collective.CollectiveError, match="failed on 1 attempts"):
        collective.cholqr2(x, retries=0)
    monkeypatch.undo()
    with mpqr.explain() as trace:  # the aborted communicator is not reused
        collective.cholqr2(x)
    (ev,) = [e for e in trace.events if e.kind == "dask-collective"]
    assert ev.data["attempts"] == 1


def test_bad_input_and_breakdown(client):
    with pytest.raises(ValueError, match="chunked by rows only"):
        collective.cholqr2(da.zeros((100, 8), chunks=(50, 4)))
    a = np.ones((400, 4))
    with pytest.raises(BreakdownError, match="positive definite|certified"):
        collective.cholqr2(da.from_array(a, chunks=(100, 4)))


def _nccl_or_skip():
    cupy = pytest.importorskip("cupy")
    try:
        cupy.cuda.runtime.getDeviceCount()
    except Exception:
        pytest.skip("no CUDA device")
    why = collective.nccl_available()
    if why:
        pytest.skip(f"NCCL does not load: {why}")
    return cupy


def test_nccl_allreduce_one_rank():
    cupy = _nccl_or_skip()
    from cupy.cuda import nccl

    comm = collective.NcclCommunicator(nccl.get_unique_id(), 1, 0)
    v = cupy.arange(12, dtype=cupy.float64).reshape(3, 4)
    cupy.testing.assert_array_equal(comm.allreduce_sum(v), v)
    assert comm.calls == 1


def test_nccl_cholqr2_one_gpu_worker():
    cupy = _nccl_or_skip()
    rng = np.random.default_rng(3)
    a = geometric(rng, 2**16, 32, 1e5)
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                                  dashboard_address=None, silence_logs=40) as cluster, \
            distributed.Client(cluster) as c:
        x = da.from_array(cupy.asarray(a), chunks=(2**13, 32)).persist()
        with mpqr.explain() as trace:
            q, r = collective.cholqr2(x, client=c)
        (ev,) = [e for e in trace.events if e.kind == "dask-collective"]
        assert ev.data["communicator"] == "nccl" and ev.data["collectives"] == 2
        assert ev.data["nxn_steps"] == ["one-launch"] * 2  # the GPU kernel, both passes
        qh = cupy.asnumpy(q.compute())
        # mpqr.qr / mpqr.lstsq of CuPy blocks on a GPU worker take this route by themselves
        b = rng.standard_normal(2**16)
        bd = da.from_array(cupy.asarray(b), chunks=2**13).persist()
        with mpqr.explain() as trace:
            _q2, r2 = mpqr.qr(x)
            xs = mpqr.lstsq(x, bd)[0]
        assert [e.data["route"] for e in trace.events if e.kind == "dask-route"] == \
            ["collective"] * 2
        u = np.finfo(float).eps
        np.testing.assert_allclose(cupy.asnumpy(r2.compute()), r, rtol=0,
                                   atol=10 * u * 1e5 * np.abs(r).max())
        ref = np.linalg.lstsq(a, b, rcond=None)[0]
        # LS forward error: the residual's term scales with cond(A)^2 u
        np.testing.assert_allclose(cupy.asnumpy(xs.compute()), ref, rtol=0,
                                   atol=10 * 32 * u * 1e5**2 * np.linalg.norm(ref))
    u = np.finfo(np.float64).eps
    assert backward_error(a, qh, r) <= 20 * u * 32
    assert orthogonality(qh) <= 20 * u * 32


def _placed(client, a, chunk, counts):
    """``a`` in row blocks of ``chunk`` rows, ``counts[w]`` of them on worker ``w``."""
    workers = collective.cluster_workers(client)
    owner = [w for w, c in zip(workers, counts) for _ in range(c)]
    futs = [client.scatter(a[i * chunk:(i + 1) * chunk], workers=[w], hash=False)
            for i, w in enumerate(owner)]
    # the futures themselves as the blocks (no task that could run elsewhere)
    name = f"placed-{id(futs)}"
    dsk = {(name, i, 0) if a.ndim == 2 else (name, i): f for i, f in enumerate(futs)}
    chunks = ((chunk,) * len(futs), *((n,) for n in a.shape[1:]))
    return da.Array(dsk, name, chunks, meta=a[:0])


@pytest.mark.parametrize("counts", [(4, 0), (1, 5)])
def test_worker_without_blocks_and_uneven_blocks(client, counts):
    rng = np.random.default_rng(4)
    a = rng.standard_normal((sum(counts) * 100, 5))
    x = _placed(client, a, 100, counts)
    with mpqr.explain() as trace:
        q, r = collective.cholqr2(x)
    (ev,) = [e for e in trace.events if e.kind == "dask-collective"]
    assert ev.data["blocks_per_worker"] == list(counts) and ev.data["launches"] == 2
    # the trace names the placement: rows per worker, the busiest over the mean, and
    # each worker's body (the busiest sets the call's time)
    rows = [100 * c for c in counts]
    assert ev.data["rows_per_worker"] == rows
    assert ev.data["imbalance"] == pytest.approx(max(rows) / (sum(rows) / 2), abs=1e-3)
    assert len(ev.data["bodies_ms"]) == 2 and all(t >= 0 for t in ev.data["bodies_ms"])
    assert "spread unevenly" in ev.message and str(list(counts)) in ev.message
    qh = q.compute()
    u = np.finfo(np.float64).eps
    assert backward_error(a, qh, r) <= 20 * u * 5 and orthogonality(qh) <= 20 * u * 5
    # lstsq's trace says the same of its blocks
    b = _placed(client, rng.standard_normal(a.shape[0]), 100, counts)
    with dask.config.set({collective.CONFIG_KEY: "collective"}), mpqr.explain() as trace:
        xs = mpqr.lstsq(x, b)[0]
    (ev,) = [e for e in trace.events if e.kind == "dask-collective"]
    assert ev.data["rows_per_worker"] == rows and "spread unevenly" in ev.message
    np.testing.assert_allclose(xs.compute(), np.linalg.lstsq(a, b.compute(), rcond=None)[0],
                               rtol=0, atol=1e3 * u)


def test_balance_of_a_placement():
    # ragged blocks: rows, not block counts, set the imbalance
    b = collective.balance({"w1": [0, 2], "w0": [1]}, (10, 30, 10))
    assert b == {"blocks_per_worker": [1, 2], "rows_per_worker": [30, 20],
                 "imbalance": 1.2}
    assert "1.20x the mean rows" in collective.balance_note(b)
    even = collective.balance({"w0": [0], "w1": [1]}, (10, 10))
    assert even["imbalance"] == 1.0 and collective.balance_note(even) == ""
    assert collective.balance({"w0": [], "w1": []}, ())["imbalance"] == 1.0


def test_qr_and_lstsq_take_the_route_asked(client):
    import dask
    import scipy.linalg

    rng = np.random.default_rng(5)
    a = geometric(rng, 1200, 6, 1e3)
    x = _placed(client, a, 200, (2, 4))
    with mpqr.explain() as trace:
        mpqr.qr(x, mode="r")
    (ev,) = [e.data for e in trace.events if e.kind == "dask-route"]
    assert ev["route"] == "scheduler" and "NumPy blocks" in ev["reason"]
    from mpqr.bench.dask import RoundTrips, _take

    client.register_plugin(RoundTrips())
    with dask.config.set({collective.CONFIG_KEY: "collective"}):
        client.run_on_scheduler(_take)
        with mpqr.explain() as trace:
            q, r = mpqr.qr(x)
        # the scheduler saw no graph and ran no task: the call went straight to the workers
        assert client.run_on_scheduler(_take) == {"graphs": 0, "tasks": 0, "block_tasks": 0}
        with mpqr.explain() as more:
            r_only = mpqr.qr(x, mode="r")
        events = [*trace.events, *more.events]
        assert [e.data["route"] for e in events if e.kind == "dask-route"] == \
            ["collective"] * 2
        assert not [e for e in events if e.kind == "dask-pass"]  # no graph a pass
        evs = [e.data for e in events if e.kind == "dask-collective"]
        assert [(v["graphs"], v["launches"], v["q_blocks"], v["collectives"])
                for v in evs] == [(0, 2, 6, 2), (0, 2, 0, 2)]
        u = np.finfo(np.float64).eps
        assert backward_error(a, q.compute(), r.compute()) <= 20 * u * 6
        np.testing.assert_array_equal(r_only.compute(), r.compute())
        for b in (rng.standard_normal(1200), rng.standard_normal((1200, 2))):
            bd = da.from_array(b, chunks=(200, *b.shape[1:])).persist()
            with mpqr.explain() as trace:
                got = mpqr.lstsq(x, bd)
            (ev,) = [e.data for e in trace.events if e.kind == "dask-collective"]
            assert ev["graphs"] == 0 and ev["launches"] == 2
            ref = scipy.linalg.lstsq(a, b)
            xs, res, rank, s = (v.compute() if hasattr(v, "compute") else v for v in got)
            assert rank == ref[2] and xs.shape == ref[0].shape and res.shape == ref[1].shape
            # LS forward error: the residual's term scales with cond(A)^2 u
            tol = 10 * 6 * u * 1e3**2 * np.linalg.norm(ref[0])
            np.testing.assert_allclose(xs, ref[0], rtol=0, atol=tol)
            np.testing.assert_allclose(res, ref[1], rtol=1e-10)
            np.testing.assert_allclose(s, ref[3], rtol=100 * u * 6)
        # a refinement stopped early (refine="auto"): the direct solution on the
        # workers' blocks of Q, still one call
        a6 = geometric(rng, 1200, 6, 1e6)
        x6 = _placed(client, a6, 200, (5, 1))
        with mpqr.explain() as trace:
            xs, res, rank, s = mpqr.lstsq(x6, bd, maxiter=1)
        assert [e for e in trace.events if e.data.get("path") == "direct"]
        (ev,) = [e.data for e in trace.events if e.kind == "dask-collective"]
        assert ev["graphs"] == 0
        ref = scipy.linalg.lstsq(a6, b)
        np.testing.assert_allclose(xs.compute(), ref[0], rtol=0,
                                   atol=10 * 6 * u * 1e6**2 * np.linalg.norm(ref[0]))
        np.testing.assert_allclose(res.compute(), ref[1], rtol=1e-8)
        assert rank == 6
        # rank deficient: the collective solver stops, the scheduler route answers
        ad = a.copy()
        ad[:, 5] = ad[:, 0]
        xd = _placed(client, ad, 200, (6, 0))
        bd = da.from_array(b, chunks=(200, 2)).persist()
        with mpqr.explain() as trace:
            xs, res, rank, s = mpqr.lstsq(xd, bd)
        assert [e for e in trace.events if e.kind == "fallback"
                and e.data.get("fallback") == "scheduler"]
        assert rank == 5


def test_memory_limit_below_the_blocks_is_a_clear_error(client, monkeypatch):
    gib = 2**30
    collective.check_memory({"w0": 0, "w1": 16 * gib}, {"w0": 40 * gib, "w1": 8 * gib})
    with pytest.raises(MemoryError, match=r"w1: memory_limit 7.87 GiB, its blocks of x "
                       r"and Q 32.00 GiB.*memory_limit=0"):
        collective.check_memory({"w1": int(7.87 * gib)}, {"w1": 32 * gib})
    h = collective.communicator(client, "thread")
    monkeypatch.setattr(h, "limits", {w: 1000 for w in h.ranks})
    x = da.from_array(np.ones((800, 4)), chunks=(200, 4)).persist()
    with pytest.raises(MemoryError, match="memory_limit 0.00 GiB"):
        collective.cholqr2(x)


def test_worker_lost_mid_call_then_a_retry_from_the_inputs(monkeypatch):
    rng = np.random.default_rng(6)
    a = rng.standard_normal((1200, 5))
    real = collective._cholqr2_body
    lost = []

    def body(comm, *args, **kw):
        if not lost and comm.rank == comm.size - 1:
            (w,) = [w for w in cluster.workers.values() if w.address == comm.address]
            lost.append(w.address)
            w.loop.add_callback(w.close, executor_wait=False)
        return real(comm, *args, **kw)

    monkeypatch.setattr(collective, "_cholqr2_body", body)
    with distributed.LocalCluster(n_workers=3, threads_per_worker=1, processes=False,
                                  dashboard_address=None, silence_logs=50) as cluster, \
            distributed.Client(cluster) as c:
        x = da.from_array(a, chunks=(200, 5)).persist()  # lost blocks are recomputed
        h0 = collective.communicator(c, "thread")
        with mpqr.explain() as trace:
            q, r = collective.cholqr2(x, client=c)
        (ev,) = [e.data for e in trace.events if e.kind == "dask-collective"]
        assert lost and ev["attempts"] == 2 and ev["workers"] == 2
        h1 = collective.communicator(c, "thread")
        assert h1 is not h0 and lost[0] not in h1.ranks
        assert backward_error(a, q.compute(), r) <= 100 * np.finfo(float).eps


def test_blocks_assigned_to_their_holders_replicas_balanced():
    ranks = {"a": 0, "b": 1}
    # blocks 0-3 on both workers (an earlier compute), 4-7 on b only, 8 on neither
    holders = [["a", "b"]] * 4 + [["b"]] * 4 + [["c"]]
    per = collective.assign(holders, (10,) * 9, ranks)
    assert per == {"a": [0, 1, 2, 3, 8], "b": [4, 5, 6, 7]}


def _q_keys(client):
    """Keys of the collective route's Q blocks the scheduler holds, and the workers."""
    def on_scheduler(dask_scheduler=None):
        return sorted(str(k) for k in dask_scheduler.tasks if "collective-q-" in str(k))

    def on_worker(dask_worker=None):
        return sorted(str(k) for k in dask_worker.data if "collective-q-" in str(k))

    on_workers = [k for keys in client.run(on_worker).values() for k in keys]
    return client.run_on_scheduler(on_scheduler), sorted(on_workers)


def test_q_blocks_are_the_clients_data_released_with_q(client):
    import gc
    import time

    # earlier tests' blocks of Q: on their way out, or held by a reference cycle (an
    # exception's traceback and the frames it holds) until the collector runs
    gc.collect()
    deadline = time.monotonic() + 10
    while any(_q_keys(client)) and time.monotonic() < deadline:
        time.sleep(0.05)
    rng = np.random.default_rng(7)
    a = rng.standard_normal((1000, 4))
    x = _placed(client, a, 250, (2, 2))
    q, r = collective.cholqr2(x)
    held, on_workers = _q_keys(client)
    assert len(held) == 4 and sorted(held) == sorted(on_workers)
    assert all(f.status == "finished" for f in distributed.futures_of(q))
    np.testing.assert_allclose(q.compute() @ r, a, rtol=0, atol=1e3 * np.finfo(float).eps)
    del q
    deadline = time.monotonic() + 10
    while any(_q_keys(client)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _q_keys(client) == ([], [])
    # a breakdown keeps no block of Q: the blocks announced with the call are dropped
    with pytest.raises(BreakdownError):
        collective.cholqr2(_placed(client, np.ones((400, 4)), 100, (2, 2)))
    deadline = time.monotonic() + 10
    while any(_q_keys(client)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _q_keys(client) == ([], [])


def test_a_block_away_from_its_reader_is_copied_there(client):
    workers = collective.cluster_workers(client)
    f = client.scatter(np.arange(6.0), workers=[workers[0]], hash=False)
    where = client.who_has([f])
    (g,) = collective._on_their_workers(client, [f], where, {workers[1]: [0]})
    assert client.who_has([g])[g.key] == [workers[1]]
    np.testing.assert_array_equal(g.result(), np.arange(6.0))
    assert collective._on_their_workers(client, [f], where, {workers[0]: [0]}) == [f]


def test_placement_remembered_and_a_moved_block_asked_again(client, monkeypatch):
    rng = np.random.default_rng(9)
    a = rng.standard_normal((800, 6))
    x = _placed(client, a, 200, (2, 2))
    asked = []
    real = type(client).who_has
    monkeypatch.setattr(type(client), "who_has",
                        lambda self, *args, **kw: asked.append(1) or real(self, *args, **kw))
    froms = []
    for _ in range(2):  # a fresh array: the workers find its holders, then remembered
        with mpqr.explain() as trace:
            collective.cholqr2(x, want_q=False)
        (ev,) = [e for e in trace.events if e.kind == "dask-collective"]
        froms.append(ev.data["holders_from"])
    assert froms == ["workers", "remembered"] and not asked
    # the remembered holders gone stale (as after a block moved): the worker sent to read
    # a block it does not hold fails the call at once, which runs again with the holders
    # found afresh, even without retries; the result as before
    key = (client.id, tuple(f.key for f in collective._block_futures(client, x)))
    states, where = collective._PLACED[key]
    workers = collective.cluster_workers(client)
    first = key[1][0]
    collective._PLACED[key] = (states, {**where, first: [w for w in workers
                                                         if w not in where[first]]})
    with mpqr.explain() as trace:
        q, r = collective.cholqr2(x, retries=0)
    (ev,) = [e for e in trace.events if e.kind == "dask-collective"]
    assert ev.data["attempts"] == 2 and ev.data["holders_from"] == "workers"
    u = np.finfo(np.float64).eps
    assert backward_error(a, q.compute(), r) <= 20 * u * 6
    # without the workers' search, the scheduler is asked once, then remembered
    monkeypatch.setattr(collective, "FIND", False)
    y = _placed(client, a, 200, (1, 3))
    froms = []
    for _ in range(2):
        with mpqr.explain() as trace:
            _q2, r2 = collective.cholqr2(y)
        (ev,) = [e for e in trace.events if e.kind == "dask-collective"]
        froms.append(ev.data["holders_from"])
    assert froms == ["scheduler", "remembered"] and len(asked) == 1
    assert ev.data["blocks_per_worker"] == [1, 3]
    np.testing.assert_allclose(r2, r, rtol=0, atol=100 * u * np.linalg.norm(a, 2))


def test_workers_find_replicated_blocks_once_each(client):
    rng = np.random.default_rng(12)
    a = rng.standard_normal((1200, 7))
    x = _placed(client, a, 200, (4, 2))
    futs = collective._block_futures(client, x)
    client.replicate(futs[:3], n=2)  # blocks 0-2 on both workers
    assert all(len(v) == 2 for v in client.who_has(futs[:3]).values())
    with mpqr.explain() as trace:
        q, r = collective.cholqr2(x)
    (ev,) = [e for e in trace.events if e.kind == "dask-collective"]
    # the blocks held once counted first, the replicas to the worker with fewer rows
    assert ev.data["holders_from"] == "workers" and ev.data["blocks_per_worker"] == [3, 3]
    assert ev.data["q_blocks"] == 6
    qh = q.compute()
    u = np.finfo(np.float64).eps
    assert backward_error(a, qh, r) <= 20 * u * 7 and orthogonality(qh) <= 20 * u * 7


@pytest.mark.parametrize("replicate", [False, True])
def test_holdings_ride_on_the_first_sum(client, monkeypatch, replicate):
    # the holdings found by the workers summed with the first Gram matrix: one all-reduce
    # a rank fewer than summed on their own (a block held twice: the share read again,
    # one more), the same R, bit for bit; NaN still refused
    rng = np.random.default_rng(14)
    a = rng.standard_normal((1000, 6))
    x = _placed(client, a, 200, (3, 2))
    if replicate:
        client.replicate(collective._block_futures(client, x)[:2], n=2)
    sums = []
    real = collective.ThreadCommunicator.allreduce_sum
    monkeypatch.setattr(collective.ThreadCommunicator, "allreduce_sum",
                        lambda self, g: sums.append(g.shape) or real(self, g))
    got = {}
    for ride in (True, False):
        monkeypatch.setattr(collective, "RIDE", ride)
        collective._PLACED.clear()
        sums.clear()
        with mpqr.explain() as trace:
            q, r = collective.cholqr2(x, check_finite=True)
        (ev,) = [e for e in trace.events if e.kind == "dask-collective"]
        assert ev.data["holders_from"] == "workers"
        got[ride] = (r, q.compute(), len(sums) // 2, ev.data["blocks_per_worker"])
    assert got[True][2] == got[False][2] - (0 if replicate else 1) == 2 + replicate
    assert got[True][3] == got[False][3] == [3, 2]
    np.testing.assert_array_equal(got[True][0], got[False][0])
    np.testing.assert_array_equal(got[True][1], got[False][1])
    u = np.finfo(np.float64).eps
    assert backward_error(a, got[True][1], got[True][0]) <= 20 * u * 6
    bad = a.copy()
    bad[450, 2] = np.nan
    y = _placed(client, bad, 200, (3, 2))
    monkeypatch.setattr(collective, "RIDE", True)
    with pytest.raises(ValueError, match="infs or NaNs"):
        collective.cholqr2(y, check_finite=True)


@pytest.mark.parametrize("light", [True, False])
def test_r_made_where_computed_and_the_blocks_kind_sent_light(client, monkeypatch, light):
    # mpqr.qr's R is one task from the host's R (no copy to the device on the call's
    # path), bitwise the route's R; the messages carry the blocks' kind as module and
    # dtype (a rank without blocks makes its zero-size array from them) or as the array
    monkeypatch.setattr(collective, "LIGHT_META", light)
    rng = np.random.default_rng(15)
    a = rng.standard_normal((600, 4)).astype(np.float32)
    x = _placed(client, a, 150, (4, 0))
    with dask.config.set({collective.CONFIG_KEY: "collective"}):
        q, r = mpqr.qr(x)
        _q2, r2 = collective.cholqr2(x)
    assert len(r.__dask_graph__()) == 1
    assert r.dtype == np.float32 and type(r._meta) is np.ndarray and r.shape == (4, 4)
    rh = r.compute()
    assert type(rh) is np.ndarray and rh.dtype == np.float32
    np.testing.assert_array_equal(rh, r2)
    meta = collective._Meta(np.empty((0, 4), dtype=np.float32))
    made = collective._Meta.real(meta)
    assert type(made) is np.ndarray and made.dtype == np.float32 and made.size == 0
    u = np.finfo(np.float32).eps
    assert backward_error(a, q.compute(), rh) <= 20 * u * 4


def test_a_block_on_no_rank_is_asked_of_the_scheduler():
    # a worker joined after the communicator was made holds a block: the workers' search
    # finds it on no rank, the call asks the scheduler and runs on a new communicator
    rng = np.random.default_rng(13)
    a = rng.standard_normal((600, 5))
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                  dashboard_address=None, silence_logs=50) as cluster, \
            distributed.Client(cluster) as c:
        h0 = collective.communicator(c, "thread")
        cluster.scale(3)
        c.wait_for_workers(3)
        x = _placed(c, a, 200, (1, 1, 1))
        with mpqr.explain() as trace:
            q, r = collective.cholqr2(x, client=c, retries=0)
        (ev,) = [e.data for e in trace.events if e.kind == "dask-collective"]
        assert ev["holders_from"] == "scheduler" and ev["attempts"] == 2
        assert ev["workers"] == 3 and ev["blocks_per_worker"] == [1, 1, 1]
        assert collective.communicator(c, "thread", check=False) is not h0
        u = np.finfo(np.float64).eps
        assert backward_error(a, q.compute(), r) <= 20 * u * 5


def test_bench_spreads_blocks_evenly_and_logs_each_calls_placement(client):
    """The Dask bench's matrix: block i of B made on worker i w / B (contiguous ranges),
    each timed call's copy on the same workers, its blocks per worker logged; dask's
    tsqr on every other block keeps the spread."""
    import dask.array as dask_array

    from mpqr.bench import dask as bench

    x = bench._spread(client, False, 700, 3, 100, "float64", seed=2)
    assert x.chunks == ((100,) * 7, (3,))
    assert bench.blocks_per_worker(client, x) == [4, 3]
    ref = np.concatenate([np.random.default_rng(2 * 100_003 + i).standard_normal((100, 3))
                          for i in range(7)])
    np.testing.assert_array_equal(x.compute(), ref)
    log: list = []
    t = bench._median_time(client, lambda xi: xi.sum().compute(), x, 2, log)
    assert t > 0 and [c["blocks_per_worker"] for c in log] == [[4, 3], [4, 3]]
    half = bench._half_tsqr(client, x, lambda xi: bench._run(
        client, *dask_array.linalg.tsqr(xi)))
    assert half["shape"] == "400x3" and half["blocks_per_worker"] == [2, 2]
    assert half["dask_tsqr_s"] > 0


def test_lstsq_phases_name_each_pass(client, monkeypatch):
    """Profiling (``PHASES``): each worker reports every pass and all-reduce of the
    solver, in order, the first pass first."""
    monkeypatch.setattr(collective, "PHASES", True)
    rng = np.random.default_rng(6)
    a = rng.standard_normal((800, 6))
    b = rng.standard_normal(800)
    x = _placed(client, a, 100, (4, 4))
    bd = _placed(client, b, 100, (4, 4))
    with dask.config.set({collective.CONFIG_KEY: "collective"}), mpqr.explain() as trace:
        xs = mpqr.lstsq(x, bd)[0]
    (ev,) = [e for e in trace.events if e.kind == "dask-collective"]
    phases = ev.data["phases_ms"]
    assert len(phases) == 2
    for steps in phases.values():
        names = [s for s, _ in steps]
        assert names[:2] == ["lstsq-first", "lstsq-first all-reduce"]
        assert len(names) == 2 * ev.data["passes"] and all(t >= 0 for _, t in steps)
    np.testing.assert_allclose(xs.compute(), np.linalg.lstsq(a, b, rcond=None)[0], rtol=0,
                               atol=1e3 * np.finfo(np.float64).eps)


def test_docs_recipe_spreads_blocks_evenly(client):
    """docs/dask.md's recipe for spreading blocks (run here as written, on the threaded
    cluster): contiguous ranges of blocks per worker, and the route's trace says the
    placement is even."""
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "dask.md").read_text()
    (code,) = [b for b in re.findall(r"```python\n(.*?)```", page, re.S)
               if "workers=[workers[i * len(workers) // nblocks]]" in b]
    rows, n, nblocks = 50, 4, 6
    env = {"load": lambda i: np.random.default_rng(i).standard_normal((rows, n)),
           "nblocks": nblocks, "rows": rows, "n": n, "meta": np.empty((0, 0))}
    exec(code, env)
    a = env["a"]
    from distributed import futures_of, wait

    wait(a)
    where = client.who_has(futures_of(a))
    holders = [where[k[0]][0] for k in a.__dask_keys__()]
    w0, w1 = collective.cluster_workers(client)
    assert holders == [w0, w0, w0, w1, w1, w1]
    with dask.config.set({collective.CONFIG_KEY: "collective"}), mpqr.explain() as trace:
        q, r = mpqr.qr(a)
    (ev,) = [e for e in trace.events if e.kind == "dask-collective"]
    assert ev.data["blocks_per_worker"] == [3, 3] and ev.data["imbalance"] == 1.0
    assert "unevenly" not in ev.message
    ah = np.concatenate([env["load"](i) for i in range(nblocks)])
    u = np.finfo(np.float64).eps
    assert backward_error(ah, q.compute(), r.compute() if hasattr(r, "compute") else r) \
        <= 20 * u * n


def test_workers_are_asked_of_the_scheduler_not_the_clients_cache(client, monkeypatch):
    """The client's cached identity lists no workers after its periodic refresh: the
    communicator asks the scheduler itself, so a call never sees an empty cluster."""
    stale = {**dict(client.scheduler_info()), "workers": {}}
    monkeypatch.setattr(client, "scheduler_info", lambda *a, **k: stale)
    assert len(collective.cluster_workers(client)) == 2
    h = collective.communicator(client, "thread", renew=True)
    assert len(h.ranks) == 2
    rng = np.random.default_rng(5)
    a = rng.standard_normal((800, 6))
    x = da.from_array(a, chunks=(200, 6)).persist()
    q, r = collective.cholqr2(x)
    assert backward_error(a, q.compute(), r) <= 100 * np.finfo(float).eps
