"""The square Householder route's calls handed to ``backend.replay`` (CUDA graphs on
CuPy: ``tests/test_cupy_graphs.py``): which calls go there, what the backend is given,
and the certificate read after the replay, on the NumPy backend with a replay that runs
the route on a buffer of its own as a graph does."""

from __future__ import annotations

import numpy as np
import pytest
from mpqr.backends._base import ArrayAPIBackend

import mpqr
from mpqr.qr import driver
from tests._qr_support import backward_error, orthogonality


@pytest.fixture
def replays(monkeypatch):
    seen = []

    def replay(self, key, fn, a, *, overwrite, hold_bytes):
        static = self.xp.asarray(a, copy=True)  # the graph's input buffer
        outs = fn(static, True)
        seen.append({"key": key, "overwrite": overwrite, "hold": hold_bytes, "outs": outs})
        return tuple(None if o is None else self.xp.asarray(o, copy=True) for o in outs)

    monkeypatch.setattr(ArrayAPIBackend, "replay", replay)
    return seen


def _qr(a, precision="fp16", mode="reduced"):
    return mpqr.qr(a, precision=precision, method="householder-recursive", mode=mode)


@pytest.mark.parametrize("precision", ["fp16", "fp32-emulated"])
@pytest.mark.parametrize("shape", [(300, 300), (400, 250), (200, 330)])
def test_replayed_calls_give_the_bits_of_direct_ones(replays, monkeypatch, precision, shape):
    a = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    a0 = a.copy()
    q, r = _qr(a, precision)
    assert len(replays) == 1
    call = replays[0]
    assert call["key"][0] == "householder-recursive" and precision in call["key"]
    assert call["hold"] > a.nbytes  # the route's workspace estimate (what a graph keeps)
    assert len(call["outs"]) == 3  # Q, R and the panels' certificate
    assert np.array_equal(a, a0)
    monkeypatch.setattr(driver, "REPLAYED", frozenset())
    q2, r2 = _qr(a, precision)
    assert len(replays) == 1
    assert np.array_equal(q, q2) and np.array_equal(r, r2)


def test_only_listed_precisions_small_inputs_and_untraced_calls(replays, monkeypatch):
    a = np.random.default_rng(2).standard_normal((300, 300))
    _qr(a, "fp64")
    _qr(a.astype(np.float32), "fp32")
    assert not replays
    with mpqr.explain():
        _qr(a.astype(np.float32))
    assert not replays
    monkeypatch.setattr(driver, "REPLAY_MAX_ELEMENTS", 300 * 300 - 1)
    _qr(a.astype(np.float32))
    assert not replays
    monkeypatch.setattr(driver, "REPLAY_MAX_ELEMENTS", 300 * 300)
    _qr(a.astype(np.float32))
    assert len(replays) == 1


def test_mode_r_replays_without_q(replays):
    a = np.random.default_rng(3).standard_normal((300, 200)).astype(np.float32)
    r = _qr(a, mode="r")
    assert replays[0]["outs"][0] is None and r.shape == (200, 200)


def test_a_failed_certificate_read_after_the_replay_factors_again(replays, monkeypatch):
    """The certificate is read after the replayed route: a repeated column fails it and
    the matrix is factored again with ``geqrf`` panels, as a direct call does."""
    a = np.random.default_rng(4).standard_normal((260, 200)).astype(np.float32)
    a[:, 70] = a[:, 66]
    q, r = _qr(a)
    # the failed replay, then the route again with geqrf panels (no certificate)
    assert len(replays) == 2 and int(np.asarray(replays[0]["outs"][2])[0]) != 0
    assert len(replays[1]["outs"]) == 2 and replays[0]["key"] != replays[1]["key"]
    u = 2.0**-11
    assert backward_error(a, q, r) <= 10 * np.sqrt(260 * 200) * u
    assert orthogonality(q) <= 10 * np.sqrt(200) * u
    monkeypatch.setattr(driver, "REPLAYED", frozenset())
    with mpqr.explain() as trace:
        q2, r2 = _qr(a)
    assert any("factored again" in e.message for e in trace.events)
    assert np.array_equal(q, q2) and np.array_equal(r, r2)
