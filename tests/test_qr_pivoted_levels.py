"""The Gram route as one Householder factorization (``pivoted_gram.householder_levels``):
``geqrf`` of each level's resolved columns, their reflectors applied to the rest, the
rest's rows below ordered from their own Gram matrix, ``Q`` formed once. Against the
level-by-level route (a QR of each trailing block and a product into ``Q``): the same
``P``, and SciPy's promise, backward error and orthogonality at working precision."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

import mpqr
from tests.conftest import GPU
from tests.test_qr_pivoted_order import _check, _gram_route, _with_sv, family

gram = importlib.import_module("mpqr.qr.pivoted_gram")


def _zero_tail(m, n):
    a = np.zeros((m, n))
    a[:, 3] = np.arange(m) + 1.0
    a[:, n - 1] = np.cos(np.arange(m))
    return a


def _deep(m, n, cplx=False):
    """Singular values 1 .. 1e-14: two or more Gram levels."""
    return _with_sv(np.random.default_rng(1), m, n, np.logspace(0, -14, min(m, n)), cplx)


@pytest.mark.parametrize("name,m,n,mode", [
    ("deep", 160, 70, "reduced"), ("deep-complex", 120, 60, "reduced"),
    ("deep", 160, 70, "r"), ("float32", 120, 60, "reduced"), ("geometric", 50, 120, "reduced"),
    ("deficient-noise", 150, 60, "reduced"), ("zero-tail", 40, 30, "r")])
def test_householder_levels_match_level_route(monkeypatch, name, m, n, mode):
    _gram_route(monkeypatch)
    a = _zero_tail(m, n) if name == "zero-tail" else _deep(m, n) if name == "deep" else \
        _deep(m, n, True) if name == "deep-complex" else family(name, m, n)
    taken = []
    real = gram.householder_levels
    monkeypatch.setattr(gram, "householder_levels",
                        lambda *x, **k: taken.append(1) or real(*x, **k))
    out = {}
    for levels in (True, False):
        monkeypatch.setattr(gram, "HOUSEHOLDER_LEVELS", levels)
        with mpqr.explain() as trace:
            res = mpqr.qr(a, pivoting=True, mode=mode)
        ev = [e.data for e in trace.events if e.kind == "pivot" and "levels" in e.data]
        out[levels] = (res, ev[0]["levels"])
    assert taken == [1]
    (hl, lv_hl), (old, lv_old) = out[True], out[False]
    assert lv_hl == lv_old and (not name.startswith("deep") or lv_hl >= 2)
    if mode == "r":
        (r, p), (r2, p2) = hl, old
    else:
        (q, r, p), (_q2, r2, p2) = hl, old
        _check(a, q, r, p)
    np.testing.assert_array_equal(p, p2)
    d, d2 = np.abs(np.diagonal(r)), np.abs(np.diagonal(r2))
    assert np.all(d[1:] <= d[:-1])
    u = np.finfo(a.dtype).eps / 2
    np.testing.assert_allclose(d, d2, rtol=0, atol=64 * (m + n) * u * d2[0])


def test_householder_levels_only_for_the_library_factor(monkeypatch):
    """An explicit non-Householder method keeps the level-by-level route."""
    _gram_route(monkeypatch)
    taken = []
    real = gram.householder_levels
    monkeypatch.setattr(gram, "householder_levels",
                        lambda *x, **k: taken.append(1) or real(*x, **k))
    a = family("geometric", 160, 70)
    q, r, p = mpqr.qr(a, pivoting=True, method="householder-recursive")
    assert taken == []
    _check(a, q, r, p)
    qc, rc, pc = mpqr.qr(a, pivoting=True, mode="complete")
    assert taken == [] and qc.shape == (160, 160)
    np.testing.assert_allclose(qc @ rc, a[:, pc], atol=64 * 230 * 2.0**-53)


@pytest.mark.skipif(not GPU, reason="no CUDA GPU visible")
@pytest.mark.parametrize("name,m,n", [("deep", 1500, 600), ("float32", 1200, 400),
                                      ("deficient-noise", 900, 300)])
def test_gpu_householder_levels(monkeypatch, name, m, n):
    """cuSOLVER's steps (geqrf + ormqr a level, orgqr once): the level-by-level route's
    P, SciPy's promise, backward error and orthogonality."""
    import cupy as cp

    a = _deep(m, n) if name == "deep" else family(name, m, n)
    taken = []
    real = gram.householder_levels
    monkeypatch.setattr(gram, "householder_levels",
                        lambda *x, **k: taken.append(1) or real(*x, **k))
    out = {}
    for levels in (True, False):
        monkeypatch.setattr(gram, "HOUSEHOLDER_LEVELS", levels)
        out[levels] = [cp.asnumpy(v) for v in mpqr.qr(cp.asarray(a), pivoting=True)]
    assert taken == [1]
    q, r, p = out[True]
    _check(a, q, r, p)
    np.testing.assert_array_equal(p, out[False][2])
