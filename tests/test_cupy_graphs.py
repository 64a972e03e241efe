"""GPU tests of repeated calls replayed from CUDA graphs (``backends/cupy/graphs.py``):
the replayed factors are bitwise those of the calls run as they are, for new inputs on
every call; the results are the caller's own arrays; a failed certificate in a replay
factors the matrix again; the kept graphs are bounded and can be dropped."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import GPU

if not GPU:
    pytest.skip("no CUDA GPU visible", allow_module_level=True)
import cupy as cp
from mpqr.backends.cupy import graphs

import mpqr


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setenv("MPQR_GRAPHS", "1")
    graphs.clear()
    graphs.FAILED.clear()
    yield
    graphs.clear()
    graphs.FAILED.clear()
    cp.get_default_memory_pool().free_all_blocks()  # no cached blocks left for later tests


def _qr(a, mode="reduced", precision="fp16"):
    return mpqr.qr(a, precision=precision, method="householder-recursive", mode=mode)


def _eager(monkeypatch, a, mode="reduced", precision="fp16"):
    monkeypatch.setenv("MPQR_GRAPHS", "0")
    try:
        return _qr(a, mode, precision)
    finally:
        monkeypatch.setenv("MPQR_GRAPHS", "1")


def _inputs(shape, count, seed=0):
    rng = cp.random.default_rng(seed)
    return [rng.standard_normal(shape, dtype=cp.float32) for _ in range(count)]


@pytest.mark.parametrize("shape", [(1536, 1536), (3000, 1200), (1000, 1800)])
@pytest.mark.parametrize("mode", ["reduced", "r", "complete"])
@pytest.mark.parametrize("precision", ["fp16", "fp32-emulated"])
def test_replays_give_the_bits_of_calls_run_as_they_are(monkeypatch, shape, mode, precision):
    inputs = _inputs(shape, 4)
    kept = [a.copy() for a in inputs]
    for i, a in enumerate(inputs):
        got = _qr(a, mode, precision)
        want = _eager(monkeypatch, a, mode, precision)
        if mode == "r":
            got, want = (got,), (want,)
        for g, w in zip(got, want):
            assert cp.array_equal(g, w), (i, shape, mode)
        assert cp.array_equal(a, kept[i])  # the input is never written
        if i >= 1 and mode != "complete":  # captured on the second call, replayed from then on
            assert len(graphs._GRAPHS) == 1, graphs.FAILED
            # a wide input's first m columns are the factored (replayed) block
            assert graphs.kept()[0][1:3] == ((shape[0], min(shape)), str(a.dtype))
    assert not graphs.FAILED


def test_results_are_the_callers_own(monkeypatch):
    a, b = _inputs((1536, 1536), 2, seed=1)
    _qr(a)
    q1, r1 = _qr(a)  # captured
    q1c, r1c = q1.copy(), r1.copy()
    q2, _ = _qr(b)  # replayed: must not write into the previous results
    assert cp.array_equal(q1, q1c) and cp.array_equal(r1, r1c)
    q2[...] = 0
    q3, _ = _qr(a)
    assert cp.array_equal(q3, q1c)


def test_a_failed_certificate_in_a_replay_factors_again(monkeypatch):
    a, b = _inputs((1536, 1536), 2, seed=2)
    _qr(a)
    _qr(a)
    assert len(graphs._GRAPHS) == 1
    b[:, 70] = b[:, 66]  # a repeated column fails the certified panel
    q, r = _qr(b)
    qe, re_ = _eager(monkeypatch, b)
    assert cp.array_equal(q, qe) and cp.array_equal(r, re_)
    b64, q64, r64 = (x.astype(cp.float64) for x in (b, q, r))
    berr = float(cp.linalg.norm(q64 @ r64 - b64) / cp.linalg.norm(b64))
    assert berr <= 10 * np.sqrt(1536) * 2.0**-11


def test_graphs_are_bounded_and_dropped(monkeypatch):
    monkeypatch.setattr(graphs, "MAX_GRAPHS", 1)
    for shape in ((1536, 1536), (2048, 1024)):
        a = _inputs(shape, 1, seed=3)[0]
        _qr(a)
        _qr(a)
    assert len(graphs._GRAPHS) == 1  # the first shape's graph dropped for the second's
    assert next(iter(graphs._GRAPHS))[1] == (2048, 1024)
    assert graphs.held_bytes() > 0
    graphs.clear()
    assert graphs.held_bytes() == 0 and not graphs._GRAPHS


def test_no_graph_when_switched_off_or_traced(monkeypatch):
    a = _inputs((1536, 1536), 1, seed=4)[0]
    monkeypatch.setenv("MPQR_GRAPHS", "0")
    _qr(a)
    _qr(a)
    assert not graphs._GRAPHS
    monkeypatch.setenv("MPQR_GRAPHS", "1")
    with mpqr.explain():
        _qr(a)
        _qr(a)
    assert not graphs._GRAPHS


def test_replays_from_threads_on_their_own_streams(monkeypatch):
    """Two threads replaying one graph on streams of their own: each gets its own input's
    factors (the graph's input buffer is not overwritten under a replay in flight)."""
    import threading

    inputs = _inputs((1536, 1536), 6, seed=5)
    _qr(inputs[0])
    _qr(inputs[0])  # captured
    want = [_eager(monkeypatch, a) for a in inputs]
    got = [None] * len(inputs)

    def work(idx):
        with cp.cuda.Stream(non_blocking=True) as s:
            for i in idx:
                got[i] = _qr(inputs[i])
            s.synchronize()

    threads = [threading.Thread(target=work, args=(range(j, 6, 2),)) for j in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(graphs._GRAPHS) == 1
    for (q, r), (qe, re_) in zip(got, want):
        assert cp.array_equal(q, qe) and cp.array_equal(r, re_)
