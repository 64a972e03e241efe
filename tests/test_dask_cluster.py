"""mpqr.qr and mpqr.lstsq on a distributed.LocalCluster of two worker processes: the
results match the in-core ones, and a worker killed mid-factorization is recovered
from (Dask recomputes its blocks) without touching the input."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest

da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")

import mpqr  # noqa: E402
from tests._qr_support import backward_error, geometric, orthogonality  # noqa: E402

TIMEOUT = 60  # seconds for any one result

# one cluster (the module's fixture) for all these tests: pytest-xdist keeps them together
pytestmark = pytest.mark.xdist_group("dask_cluster")


@pytest.fixture(scope="module")
def client():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None, silence_logs=40) as cluster, \
            distributed.Client(cluster, timeout=TIMEOUT) as c:
        yield c


def test_qr_and_lstsq_on_two_workers(client):
    rng = np.random.default_rng(0)
    a = geometric(rng, 1600, 16, 1e3)
    b = rng.standard_normal(1600)
    x = da.from_array(a, chunks=(200, 16))
    with mpqr.explain() as trace:
        q, r = mpqr.qr(x)
    # each pass's Gram matrix is its own computation (dask serves equal keys from memory)
    assert [e.kind for e in trace.events if e.kind in ("certificate", "fallback")] == \
        ["certificate"]
    q, r = client.compute([q, r], sync=False)
    q, r = q.result(timeout=TIMEOUT), r.result(timeout=TIMEOUT)
    assert backward_error(a, q, r) <= 20 * 16 * 2.0**-53
    assert orthogonality(q) <= 20 * 16 * 2.0**-53
    xs, res, rank, s = mpqr.lstsq(x, b)
    x0, res0, rank0, s0 = mpqr.lstsq(a, b)
    u = 2.0**-53
    kappa = 1e3
    tol = 50 * 16 * u * kappa**2
    assert rank == rank0 == 16
    assert np.linalg.norm(xs.compute() - x0) <= tol * np.linalg.norm(x0)
    assert np.abs(s.compute() - s0).max() <= tol * s0[0]
    assert abs(float(res.compute()) - float(res0)) <= tol * float(res0)


def test_worker_killed_mid_factorization(client):
    rng = np.random.default_rng(1)
    a = geometric(rng, 2400, 8, 10.0)
    before = a.copy()
    # 16 blocks that take 0.15 s each to load (a lambda pickles by value to the workers)
    x = da.from_array(a, chunks=(150, 8)).map_blocks(lambda blk: (time.sleep(0.15), blk)[1],
                                                     dtype=a.dtype)
    pids = client.run(os.getpid)
    victim = next(iter(pids.values()))
    killer = threading.Timer(0.3, os.kill, (victim, signal.SIGKILL))
    killer.start()  # while the first Gram pass runs
    try:
        q, r = mpqr.qr(x)
        q = client.compute(q).result(timeout=TIMEOUT)
        r = r.compute()
    finally:
        killer.cancel()
    assert victim not in client.run(os.getpid).values()  # the worker really died
    assert np.array_equal(a, before)
    assert backward_error(a, q, r) <= 20 * 8 * 2.0**-53
    assert orthogonality(q) <= 20 * 8 * 2.0**-53


def test_lstsq_refinement_on_two_workers(client):
    """An fp32 R refined to float64 accuracy in several steps: every iteration's products
    are new computations."""
    rng = np.random.default_rng(2)
    a = geometric(rng, 1200, 12, 1e3)
    b = rng.standard_normal((1200, 2))
    x = da.from_array(a, chunks=(150, 12))
    with mpqr.explain() as trace:
        xs, res, rank, _ = mpqr.lstsq(x, b, refine="ir", precision="fp32")
    steps = [e.data["iterations"] for e in trace.events if e.kind == "refine"]
    assert steps and steps[0] >= 2
    x0, res0, rank0, _ = mpqr.lstsq(a, b)
    tol = 50 * 12 * 2.0**-53 * 1e6
    assert rank == rank0 == 12
    assert np.linalg.norm(xs.compute() - x0) <= tol * np.linalg.norm(x0)
    assert np.all(np.abs(res.compute() - res0) <= tol * res0)


def test_precision_context_reaches_the_workers(client):
    """``with mpqr.precision(...)`` on the client sets the workers' products too: a
    one-pass CholQR with fp16 Gram products is far closer to the in-core fp16 result
    (they differ only in the order of the fp32-accumulated sums) than to the float64 one
    (fp16's input rounding)."""
    rng = np.random.default_rng(3)
    a = geometric(rng, 800, 8, 10.0)
    x = da.from_array(a, chunks=(200, 8))
    with mpqr.precision("fp16"):
        r = mpqr.qr(x, mode="r", method="cholqr").compute()
    r16 = mpqr.qr(a, mode="r", method="cholqr", precision="fp16")
    r64 = mpqr.qr(a, mode="r", method="cholqr", precision="fp64")
    assert np.abs(r16 - r64).max() > 1e6 * 2.0**-53 * np.abs(r64).max()  # fp16 changed R
    assert np.abs(r - r16).max() <= 0.1 * np.abs(r - r64).max()


def test_gemm_options_reach_the_workers(client):
    """An ``mpqr.gemm_options`` block on the client forces the workers' engine too."""
    rng = np.random.default_rng(4)
    a = geometric(rng, 800, 8, 10.0)
    x = da.from_array(a, chunks=(200, 8))
    with mpqr.gemm_options(engine="tc-fp16"):
        r = mpqr.qr(x, mode="r", method="cholqr", precision="fp64").compute()
    with mpqr.gemm_options(engine="tc-fp16"):
        r16 = mpqr.qr(a, mode="r", method="cholqr", precision="fp64")
    r64 = mpqr.qr(a, mode="r", method="cholqr", precision="fp64")
    assert np.abs(r16 - r64).max() > 1e6 * 2.0**-53 * np.abs(r64).max()  # the engine ran
    assert np.abs(r - r16).max() <= 0.1 * np.abs(r - r64).max()


def test_round_trips_on_the_cluster(client):
    """On persisted blocks: lstsq of a well-conditioned problem sends two graphs (two
    passes, one gather each), mode "r" one, and each pass runs one block task per worker
    thread (a worker's blocks in one task), counted by a scheduler plugin."""
    from distributed import wait

    from mpqr.bench.dask import RoundTrips, _take

    client.register_plugin(RoundTrips())
    rng = np.random.default_rng(5)
    a = geometric(rng, 3200, 16, 2.0)
    b = rng.standard_normal(3200)
    x = client.persist(da.from_array(a, chunks=(200, 16)))  # 16 blocks on 2 workers
    bd = client.persist(da.from_array(b, chunks=200))
    wait([x, bd])
    threads = sum(client.nthreads().values())
    client.run_on_scheduler(_take)
    with mpqr.explain() as trace:
        xs, res, rank, s = mpqr.lstsq(x, bd)
    counts = client.run_on_scheduler(_take)
    assert counts["graphs"] == 2 and counts["block_tasks"] == 2 * threads
    assert sum(e.kind == "dask-pass" for e in trace.events) == 2
    # each graph: the 16 + 16 persisted blocks of a and b, and the pass's own tasks (a
    # block task per worker thread, no tree below 8 of them); no task per block (a vector b is read
    # as a column inside the block tasks, not through a getitem layer)
    passes = [e for e in trace.events if e.kind == "dask-pass"]
    assert counts["tasks"] == sum(32 + e.data["tasks"] for e in passes), counts
    assert all(e.data["tasks"] == threads for e in passes), [e.data for e in passes]
    x0, res0, rank0, s0 = mpqr.lstsq(a, b)
    u = 2.0**-53
    assert rank == rank0 == 16
    assert np.linalg.norm(xs.compute() - x0) <= 50 * 16 * u * 4 * np.linalg.norm(x0)
    assert abs(float(res.compute()) - float(res0)) <= 1e-12 * float(res0)
    assert np.abs(s.compute() - s0).max() <= 50 * 16 * u * 4 * s0[0]
    client.run_on_scheduler(_take)
    r = mpqr.qr(x, mode="r")
    counts = client.run_on_scheduler(_take)
    assert counts["graphs"] == 1 and counts["block_tasks"] == threads
    assert np.abs(r.compute() - mpqr.qr(a, mode="r")).max() <= 40 * 16 * u * 2.0 * \
        np.linalg.norm(a, 2)


def test_pass_results_released_after_the_call(client):
    """A pass's result keys are held on the scheduler until the next graph is sent (or
    a moment after the call), then released: nothing stays behind."""
    from distributed import wait

    rng = np.random.default_rng(7)
    x = client.persist(da.from_array(geometric(rng, 1600, 8, 10.0), chunks=(200, 8)))
    wait(x)

    def ours(dask_scheduler):
        return sorted(str(k) for k in dask_scheduler.tasks if "mpqr-" in str(k))

    q, r = mpqr.qr(x)
    qv, rv = client.compute([q, r], sync=True)
    assert backward_error(x.compute(), qv, rv) <= 20 * 8 * 2.0**-53
    del q, r
    deadline = time.monotonic() + 10
    while client.run_on_scheduler(ours) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert client.run_on_scheduler(ours) == []
