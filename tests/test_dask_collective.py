"""The collective route on a threaded LocalCluster of two workers (NumPy blocks, the
thread communicator): CholQR2 in one task per worker against NumPy's numerics, Q's
blocks on their input blocks' workers, the communicator reused, a lost rank a clear
error and a retry, the interface's sum checked directly."""

from __future__ import annotations

import threading

import numpy as np
import pytest

da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")

from mpqr.backends.dask import collective  # noqa: E402

import mpqr  # noqa: E402
from mpqr._errors import BreakdownError  # noqa: E402
from tests._qr_support import backward_error, geometric, orthogonality  # noqa: E402

pytestmark = pytest.mark.xdist_group("dask_collective")


@pytest.fixture(scope="module")
def client():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                  dashboard_address=None, silence_logs=40) as cluster, \
            distributed.Client(cluster) as c:
        yield c


@pytest.mark.parametrize("cond", [1e2, 1e7])
def test_cholqr2_one_task_per_worker(client, cond):
    rng = np.random.default_rng(1)
    m, n = 3000, 12
    a = geometric(rng, m, n, cond)
    x = da.from_array(a, chunks=(400, n)).persist()  # ragged: 7 x 400 + 200
    with mpqr.explain() as trace:
        q, r = collective.cholqr2(x)
    (ev,) = [e for e in trace.events if e.kind == "dask-collective"]
    assert ev.data["tasks"] == 2 and ev.data["collectives"] == 2
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
        qh = cupy.asnumpy(q.compute())
    u = np.finfo(np.float64).eps
    assert backward_error(a, qh, r) <= 20 * u * 32
    assert orthogonality(qh) <= 20 * u * 32
