"""SciPy's promise for QR with column pivoting: ``abs(diag(R))`` non-increasing, exactly.

``d[1:] <= d[:-1]`` on the returned numbers (SciPy's own test), for ``mpqr.qr(pivoting=True)``
on each route and for every SciPy-compatible front end, on the matrices where the
randomized block order broke it; with backward error and orthogonality at working
precision (``u`` x size) and geqp3's numerical rank at a gap. ``pivoting="randomized"``
keeps the faster, non-monotone order as an explicit choice.
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import scipy.linalg as sla

import mpqr
from tests._support import to_numpy
from tests.conftest import GPU

pivoted = importlib.import_module("mpqr.qr.pivoted")
exact = importlib.import_module("mpqr.qr.pivoted_exact")


def _orth(rng, m, k, cplx=False):
    z = rng.standard_normal((m, k))
    if cplx:
        z = z + 1j * rng.standard_normal((m, k))
    return np.linalg.qr(z)[0]


def _with_sv(rng, m, n, s, cplx=False):
    return (_orth(rng, m, len(s), cplx) * s) @ _orth(rng, n, len(s), cplx).conj().T


def family(name, m, n, seed=0):
    rng = np.random.default_rng(seed)
    k = min(m, n)
    if name == "geometric":
        return _with_sv(rng, m, n, np.logspace(0, -8, k))
    if name == "algebraic":
        return _with_sv(rng, m, n, 1.0 / np.arange(1, k + 1) ** 2)
    if name == "clustered":
        return _with_sv(rng, m, n, np.r_[np.ones(k // 2), 1e-3 * np.ones(k - k // 2)])
    if name == "rank1":
        return np.outer(rng.standard_normal(m), rng.standard_normal(n))
    if name == "kahan":
        c, s = 0.285, np.sqrt(1 - 0.285**2)
        kah = np.diag(s ** np.arange(n)) @ (np.triu(-c * np.ones((n, n)), 1) + np.eye(n))
        return kah[:m] if m <= n else np.vstack([kah, np.zeros((m - n, n))])
    if name == "deficient-noise":
        return _with_sv(rng, m, n, np.logspace(0, -3, k // 3)) + \
            1e-10 * rng.standard_normal((m, n))
    if name == "complex":
        return _with_sv(rng, m, n, np.logspace(0, -8, k), cplx=True)
    if name == "float32":
        return _with_sv(rng, m, n, np.logspace(0, -4, k)).astype(np.float32)
    if name == "range":  # column norms from 1e-100 to 1e100
        return rng.standard_normal((m, n)) * np.logspace(-100, 100, n)[rng.permutation(n)]
    if name == "gaussian":
        return rng.standard_normal((m, n))
    raise AssertionError(name)


FAMILIES = ["geometric", "algebraic", "clustered", "rank1", "kahan", "deficient-noise",
            "complex", "float32", "range", "gaussian"]


def _u(a):
    return np.finfo(a.dtype).eps / 2


def _check(a, q, r, p, c=8):
    """The promise, backward error and orthogonality at working precision
    (``c (m + n) u``)."""
    m, n = a.shape
    k = min(m, n)
    d = np.abs(np.diagonal(r))
    assert np.all(d[1:] <= d[:-1]), np.flatnonzero(d[1:] > d[:-1])
    assert p.dtype == np.int32 and sorted(p.tolist()) == list(range(n))
    u = _u(a)
    wide = a.astype(np.complex128 if np.iscomplexobj(a) else np.float64)
    cols = np.linalg.norm(wide, axis=0)[p]
    # column by column (norms spanning 1e+-100): each within u x size of its own norm
    err = np.linalg.norm(wide[:, p] - q.astype(wide.dtype) @ r.astype(wide.dtype), axis=0)
    assert np.all(err <= c * (m + n) * u * np.maximum(cols, np.max(cols) * 1e-300)), \
        np.max(err / cols)
    qq = q[:, :k].astype(wide.dtype)
    assert np.linalg.norm(qq.conj().T @ qq - np.eye(k)) <= c * (m + n) * u
    return d


def _rank(d, m, n):
    return int(np.sum(d > max(m, n) * np.finfo(d.dtype).eps * d[0])) if d.size else 0


@pytest.fixture(params=["library", "gram", "blocked", "repair", "deterministic"])
def route(request, monkeypatch):
    from mpqr.backends.numpy.backend import NumpyBackend

    if request.param == "deterministic":
        monkeypatch.setattr(pivoted, "DETERMINISTIC_MAX_SIZE", 10**9)
    else:
        monkeypatch.setattr(pivoted, "DETERMINISTIC_MAX_SIZE", 0)
        monkeypatch.setattr(pivoted, "BLOCK", 16)
        monkeypatch.setattr(NumpyBackend, "qrcp_library", request.param == "library")
        monkeypatch.setattr(NumpyBackend, "qrcp_exact_route", request.param)
    return request.param


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("shape", [(120, 64), (64, 120)])
def test_families_monotone(route, name, shape):
    m, n = shape
    a = family(name, m, n)
    q, r, p = mpqr.qr(a, pivoting=True)
    d = _check(a, q, r, p)
    d2 = np.abs(np.diagonal(sla.qr(a, pivoting=True, mode="r")[0]))
    assert _rank(d, m, n) == _rank(d2, m, n)


@pytest.mark.parametrize("name,shape", [("geometric", (1500, 200)), ("algebraic", (1500, 200)),
                                        ("clustered", (1500, 200)), ("geometric", (2000, 300)),
                                        ("rank1", (300, 40))])
def test_issue_sizes(name, shape):
    """The sizes where the randomized order had 14 to 103 increases."""
    a = family(name, *shape)
    q, r, p = mpqr.qr(a, pivoting=True)
    _check(a, q, r, p)


@pytest.mark.parametrize("name", ["geometric", "clustered", "gaussian"])
def test_blocked_route_default_width(monkeypatch, name):
    """The blocked greedy QRCP at its own block width (shortened and widened blocks)."""
    from mpqr.backends.numpy.backend import NumpyBackend

    monkeypatch.setattr(NumpyBackend, "qrcp_library", False)
    monkeypatch.setattr(NumpyBackend, "qrcp_exact_route", "blocked")
    a = family(name, 700, 300, seed=2)
    with mpqr.explain() as trace:
        q, r, p = mpqr.qr(a, pivoting=True)
    assert any(e.kind == "method" and "greedy order" in e.message for e in trace.events)
    _check(a, q, r, p)
    d2 = np.abs(np.diagonal(sla.qr(a, pivoting=True, mode="r")[0]))
    d = np.abs(np.diagonal(r))
    np.testing.assert_allclose(d, d2, rtol=1e-6, atol=1e-12 * d2[0])  # geqp3's diagonal


def test_gap_rank_and_xp(xp):
    """Exact rank 20 + 1e-10 noise, on every backend: rank 20 at a gap, as geqp3."""
    a = family("deficient-noise", 90, 60)
    q, r, p = (to_numpy(v) for v in mpqr.qr(xp.asarray(a), pivoting=True))
    d = _check(a, q, r, p)
    d2 = np.abs(np.diagonal(sla.qr(a, pivoting=True, mode="r")[0]))
    assert int(np.sum(d > 1e-8 * d[0])) == int(np.sum(d2 > 1e-8 * d2[0])) == 20


@pytest.mark.parametrize("shape", [(1, 1), (0, 0), (0, 3), (3, 0), (1, 5), (5, 1)])
def test_tiny_and_empty(shape):
    a = np.arange(1.0, 1 + np.prod(shape)).reshape(shape)
    q, r, p = mpqr.qr(a, pivoting=True)
    q2, r2, p2 = sla.qr(a, pivoting=True, mode="economic")
    assert q.shape == q2.shape and r.shape == r2.shape and p.dtype == p2.dtype
    k = min(shape)  # (the unpivoted rest: any order, geqp3 leaves its swaps)
    np.testing.assert_array_equal(p[:k], p2[:k])
    assert sorted(p.tolist()) == list(range(shape[1]))
    d = np.abs(np.diagonal(r))
    assert np.all(d[1:] <= d[:-1])


@pytest.mark.parametrize("prec", ["fp32-emulated", "fp16", "fp64-emulated"])
def test_emulated_precisions(route, prec):
    a = family("geometric", 100, 70)
    q, r, p = mpqr.qr(a, pivoting=True, precision=prec)
    d = np.abs(np.diagonal(r))
    assert np.all(d[1:] <= d[:-1])
    u = {"fp16": 2.0**-11, "fp32-emulated": 2.0**-24}.get(prec, 2.0**-53)
    assert np.linalg.norm(a[:, p] - q @ r) <= 8 * 170 * u * np.linalg.norm(a)


@pytest.mark.parametrize("mode", ["full", "economic", "r", "raw"])
@pytest.mark.parametrize("name", ["geometric", "rank1", "complex", "float32"])
def test_compat_scipy_qr(mode, name):
    from mpqr.compat import scipy as cs

    a = family(name, 90, 50)
    out, ref = cs.qr(a, mode=mode, pivoting=True), sla.qr(a, mode=mode, pivoting=True)
    assert len(out) == len(ref)
    for o, e in zip(out, ref):
        if isinstance(e, tuple):
            assert [x.shape for x in o] == [x.shape for x in e]
            assert [x.dtype for x in o] == [x.dtype for x in e]
        else:
            assert o.shape == e.shape and o.dtype == e.dtype
    r = out[1] if mode in ("full", "economic", "raw") else out[0]
    d = np.abs(np.diagonal(r))
    assert np.all(d[1:] <= d[:-1])
    # pivoting given as any truthy value, as SciPy reads it
    assert np.array_equal(cs.qr(a, mode="r", pivoting=1)[1], out[-1])


@pytest.mark.parametrize("mode", ["left", "right"])
def test_compat_qr_multiply(mode):
    from mpqr.compat import scipy as cs

    a = family("algebraic", 80, 40)
    c = np.random.default_rng(1).standard_normal((40, 3) if mode == "left" else (3, 80))
    cq, r, p = cs.qr_multiply(a, c, mode=mode, pivoting=True)
    cq2, r2, p2 = sla.qr_multiply(a, c, mode=mode, pivoting=True)
    assert cq.shape == cq2.shape and r.shape == r2.shape and p.dtype == p2.dtype
    d = np.abs(np.diagonal(r))
    assert np.all(d[1:] <= d[:-1])


def test_gelsy_factor_and_solution():
    rng = np.random.default_rng(7)  # exact rank 60, past 2**16 entries
    a = _with_sv(rng, 400, 200, np.logspace(0, -3, 60))
    b = np.random.default_rng(2).standard_normal(400)
    with mpqr.explain() as trace:
        x, _res, rank, _sv = mpqr.lstsq(a, b, cond=1e-10, lapack_driver="gelsy")
    x2, _r2, rank2, _s2 = sla.lstsq(a, b, cond=1e-10, lapack_driver="gelsy")
    assert rank == rank2 == 60
    msgs = [e.message for e in trace.events]
    assert any("qr(pivoting=True)" in s for s in msgs) and not any("HQRRP" in s for s in msgs)
    assert np.linalg.norm(x - x2) <= 1e-6 * np.linalg.norm(x2)


def test_randomized_is_an_explicit_choice(monkeypatch):
    """``pivoting="randomized"``: HQRRP, rank-revealing but not monotone; SciPy-compatible
    calls never take it."""
    a = family("geometric", 1500, 200)
    with mpqr.explain() as trace:
        q, r, p = mpqr.qr(a, pivoting="randomized")
    assert any("HQRRP" in e.message for e in trace.events)
    d = np.abs(np.diagonal(r))
    assert np.sum(d[1:] > d[:-1]) > 0  # the weaker promise, as documented
    assert np.linalg.norm(a[:, p] - q @ r) <= 4 * 200 * 2.0**-53 * np.linalg.norm(a)
    d2 = np.abs(np.diagonal(sla.qr(a, pivoting=True, mode="r")[0]))
    assert _rank(d, 1500, 200) == _rank(d2, 1500, 200)
    from mpqr.compat import scipy as cs

    with mpqr.explain() as trace:
        cs.qr(a, pivoting="randomized", mode="r")  # truthy: SciPy's pivoting=True
    assert not any("HQRRP" in e.message for e in trace.events)


def test_repair_by_exchange():
    """An increase beyond rounding is repaired by a column exchange (Givens), exactly
    orthogonal: the factorization is kept, the diagonal made non-increasing."""
    from mpqr.backends import get_backend

    rng = np.random.default_rng(3)
    for cplx in (False, True):
        r = np.triu(rng.standard_normal((6, 8)))
        if cplx:
            r = r + 1j * np.triu(rng.standard_normal((6, 8)))
        q = _orth(rng, 10, 6, cplx)
        ph = np.diagonal(r) / np.abs(np.diagonal(r))
        r[:6] = r[:6] * ph.conj()[:, None]
        q = q * ph
        r[np.arange(6), np.arange(6)] = [1.0, 3.0, 0.5, 2.0, 0.1, 0.2]
        a = q @ r
        p = np.arange(8, dtype=np.int32)
        be = get_backend(mpqr._array_api.array_namespace(r))
        q2, r2, p2 = exact.monotone_diagonal(be, q.copy(), r.copy(), p.copy(), u=2.0**-53)
        d = np.abs(np.diagonal(r2))
        assert np.all(d[1:] <= d[:-1]) and np.all(np.diagonal(r2).imag == 0)
        assert np.all(np.tril(r2, -1) == 0)
        assert np.linalg.norm(a[:, p2] - q2 @ r2) <= 100 * 2.0**-53 * np.linalg.norm(a)
        assert np.linalg.norm(q2.conj().T @ q2 - np.eye(6)) <= 100 * 2.0**-53


def test_front_moves(xp):
    from mpqr.backends import get_backend

    from mpqr._array_api import array_namespace

    rng = np.random.default_rng(5)
    for n, cb, off in ((20, 6, 0), (20, 6, 3), (8, 8, 0), (15, 4, 2)):
        cand = rng.permutation(n - off)[:cb].astype(np.int32)
        x = xp.asarray(np.arange(2.0 * n).reshape(2, n))
        bxp = array_namespace(x)
        dst, src = exact.front_moves(bxp, bxp.asarray(cand), cb, off)
        if xp.__name__ == "numpy_readonly":
            continue
        get_backend(bxp).permute_columns(x, dst, src)
        got = to_numpy(x)[0, off:]
        np.testing.assert_array_equal(got[:cb], cand + off)
        assert sorted(got.tolist()) == list(range(off, n))


@pytest.mark.skipif(not GPU, reason="no CUDA GPU visible")
@pytest.mark.parametrize("name", ["geometric", "algebraic", "clustered", "gaussian", "rank1",
                                  "complex", "float32"])
def test_gpu_monotone(name):
    import cupy as cp

    a = family(name, 1500, 300) if name != "rank1" else family(name, 300, 40)
    q, r, p = (cp.asnumpy(v) for v in mpqr.qr(cp.asarray(a), pivoting=True))
    _check(a, q, r, p)
    d2 = np.abs(np.diagonal(sla.qr(a, pivoting=True, mode="r")[0]))
    assert _rank(np.abs(np.diagonal(r)), *a.shape) == _rank(d2, *a.shape)


def _hqrrp(a, block=16):
    from mpqr.backends import get_backend

    be = get_backend(mpqr._array_api.array_namespace(a))
    return be, pivoted.hqrrp(be, a, precision=None, prec_name="auto", want_q=True,
                             complete=False, block=block)


@pytest.mark.parametrize("name,shape", [("geometric", (300, 120)), ("kahan", (90, 90)),
                                        ("complex", (150, 80)), ("float32", (150, 80)),
                                        ("geometric", (80, 150))])
def test_repair_of_hqrrp_order(name, shape):
    """The repair scheme on HQRRP's own order: exchanges where HQRRP's diagonal rises,
    then ``d[1:] <= d[:-1]`` exactly, the factorization and geqp3's rank at a gap kept."""
    repair = importlib.import_module("mpqr.qr.pivoted_repair")
    a = family(name, *shape)
    be, (q, r, p) = _hqrrp(a)
    d0 = np.abs(np.diagonal(r))
    assert np.sum(d0[1:] > d0[:-1]) > 0  # something to repair
    keep = (q.copy(), r.copy(), p.copy())
    q2, r2, p2, swaps = repair.repair_diagonal(be, q, r, p, u=_u(a))
    assert all(np.array_equal(x, y) for x, y in zip((q, r, p), keep))  # inputs kept
    assert swaps > 0 and np.all(np.tril(r2, -1) == 0)
    d = _check(a, q2, r2, p2)
    d2 = np.abs(np.diagonal(sla.qr(a, pivoting=True, mode="r")[0]))
    assert _rank(d, *shape) == _rank(d2, *shape)
    assert repair.repair_diagonal(be, q, r, p, u=_u(a), limit=swaps - 1) is None


def test_repair_route_and_fallback(monkeypatch):
    """``pivoting=True`` without a library QRCP: the repair route; past the bound on the
    exchanges, the blocked greedy QRCP (both in explain())."""
    from mpqr.backends.numpy.backend import NumpyBackend

    repair = importlib.import_module("mpqr.qr.pivoted_repair")
    monkeypatch.setattr(NumpyBackend, "qrcp_library", False)
    monkeypatch.setattr(NumpyBackend, "qrcp_exact_route", "repair")
    monkeypatch.setattr(pivoted, "DETERMINISTIC_MAX_SIZE", 0)
    monkeypatch.setattr(pivoted, "BLOCK", 16)
    a = family("geometric", 200, 90)
    for limit, used in ((None, "qrcp-repair"), (0, "qrcp-blocked")):
        if limit is not None:
            monkeypatch.setattr(repair, "SWAPS_PER_COLUMN", 0)
            monkeypatch.setattr(repair, "swap_limit", lambda kk, lim=limit: lim)
        with mpqr.explain() as trace:
            q, r, p = mpqr.qr(a, pivoting=True)
        methods = [e.data.get("method") for e in trace.events if e.kind == "method"]
        assert methods[-1] == used, methods
        _check(a, q, r, p)
    with mpqr.explain():
        r, p = mpqr.qr(a, pivoting=True, mode="r")  # no Q: R's exchanges only
    assert np.all(np.diff(np.abs(np.diagonal(r))) <= 0)


def test_repair_nonfinite():
    repair = importlib.import_module("mpqr.qr.pivoted_repair")
    from mpqr.backends import get_backend

    r = np.triu(np.ones((4, 4)))
    r[1, 1], r[2, 2] = np.nan, 5.0
    be = get_backend(mpqr._array_api.array_namespace(r))
    _q, r2, _p, swaps = repair.repair_diagonal(be, None, r, np.arange(4, dtype=np.int32),
                                               u=2.0**-53)
    assert swaps == 0 and r2 is r


@pytest.mark.skipif(not GPU, reason="no CUDA GPU visible")
@pytest.mark.parametrize("name,dtype", [("geometric", "float64"), ("kahan", "float64"),
                                        ("algebraic", "float32"), ("rank1", "float64")])
def test_gpu_repair_kernel(name, dtype):
    """The CUDA exchanges (backends/cupy/diag_repair.py) against the portable steps on
    the same HQRRP factors: the same exchanges, R, Q and P to rounding."""
    import cupy as cp

    repair = importlib.import_module("mpqr.qr.pivoted_repair")
    a = family(name, 600, 200).astype(dtype)
    be, (q, r, p) = _hqrrp(cp.asarray(a), block=32)
    tol = exact.repair_tolerance(600, 200, _u(a))
    got = be.diagonal_repair(q, r, p, tol, 10**5)
    ref = repair.reference_repair(be, q, r, p, tol, 10**5)
    assert got[3] == ref[3]
    np.testing.assert_array_equal(cp.asnumpy(got[2]), cp.asnumpy(ref[2]))
    for x, y in ((got[0], ref[0]), (got[1], ref[1])):
        assert float(cp.max(cp.abs(x - y))) <= 100 * 200 * _u(a) * float(cp.max(cp.abs(y)))
    # float32 on an H200: one column's backward error measured 1.8x past 8 (m + n) u
    # (HQRRP's float32 trailing products; the exchanges matched the portable steps)
    _check(a, *(cp.asnumpy(v) for v in got[:3]), c=16 if dtype == "float32" else 8)


def _gram_route(monkeypatch):
    from mpqr.backends.numpy.backend import NumpyBackend

    monkeypatch.setattr(NumpyBackend, "qrcp_library", False)
    monkeypatch.setattr(NumpyBackend, "qrcp_exact_route", "gram")
    monkeypatch.setattr(pivoted, "DETERMINISTIC_MAX_SIZE", 0)


def _events(trace, kind):
    return [e for e in trace.events if e.kind == kind]


@pytest.mark.parametrize("name,shape,levels", [("geometric", (400, 160), 2),
                                               ("gaussian", (400, 160), 1),
                                               ("deficient-noise", (300, 150), 2),
                                               ("geometric", (120, 300), 2)])
def test_gram_route_is_geqp3_order(monkeypatch, name, shape, levels):
    """Without ties the Gram route's P is geqp3's, with no exchange; a spectrum wider
    than the Gram matrix resolves (1 .. 1e-8, singular values at the 1e-10 noise) takes a
    second level on the trailing block."""
    _gram_route(monkeypatch)
    a = family(name, *shape)
    with mpqr.explain() as trace:
        q, r, p = mpqr.qr(a, pivoting=True)
    assert next(e.data.get("method") for e in _events(trace, "method")) == "qrcp-gram"
    done = [e for e in _events(trace, "pivot") if "levels" in e.data]
    assert done and done[0].data["levels"] == levels and done[0].data["swaps"] == 0
    _check(a, q, r, p)
    r2, p2 = sla.qr(a, pivoting=True, mode="r")
    np.testing.assert_array_equal(p, p2)
    np.testing.assert_allclose(np.abs(np.diagonal(r)), np.abs(np.diagonal(r2)), rtol=1e-6,
                               atol=64 * sum(shape) * _u(a) * abs(r2[0, 0]))


def test_resolve_threshold():
    """Above the threshold, a Schur-complement diagonal entry is RESOLVE times its
    rounding estimate ((sqrt(m) + sqrt(n)) u max|a_j|^2)."""
    gram = importlib.import_module("mpqr.qr.pivoted_gram")
    u = 2.0**-53
    assert gram.resolve_threshold(4096, 4096, u) == pytest.approx(gram.RESOLVE * 128 * u)
    assert gram.resolve_threshold(65536, 4096, u) == pytest.approx(gram.RESOLVE * 320 * u)


@pytest.mark.parametrize("name,n", [("geometric", 90), ("gaussian", 70), ("rank1", 40),
                                    ("complex", 50)])
def test_pivoted_cholesky_steps_match_lapack(name, n):
    """The portable steps (any Array API library) against LAPACK ?pstrf: the same stop
    and order; a zero matrix: no step."""
    from mpqr.backends._base import ArrayAPIBackend
    from mpqr.backends.host.pstrf import lapack_pivoted_cholesky

    gram = importlib.import_module("mpqr.qr.pivoted_gram")
    from mpqr.backends import get_backend

    a = family(name, 200, n)
    g = a.conj().T @ a
    be = get_backend(mpqr._array_api.array_namespace(g))
    tol = gram.resolve_threshold(200, n, 2.0**-53)
    p, k, gmax = ArrayAPIBackend.pivoted_cholesky(be, g, tol)
    p2, k2, gmax2 = lapack_pivoted_cholesky(g, tol)
    assert k == k2 and gmax == gmax2 and (k < n or name != "rank1")
    np.testing.assert_array_equal(p[:k], p2[:k])
    assert sorted(p.tolist()) == list(range(n)) and p.dtype == np.int32
    z = np.zeros((4, 4))
    for fn in (lambda: ArrayAPIBackend.pivoted_cholesky(be, z, tol),
               lambda: lapack_pivoted_cholesky(z, tol)):
        pz, kz, gz = fn()
        assert kz == 0 and gz == 0 and list(pz) == [0, 1, 2, 3]


def test_gram_route_repair_and_fallback(monkeypatch):
    """An order that is not greedy (the identity claimed resolved): the exchanges make
    |diag(R)| non-increasing; past their bound, the blocked greedy QRCP."""
    from mpqr.backends.numpy.backend import NumpyBackend

    _gram_route(monkeypatch)
    repair = importlib.import_module("mpqr.qr.pivoted_repair")
    monkeypatch.setattr(NumpyBackend, "pivoted_cholesky",
                        lambda self, g, tol: (np.arange(g.shape[0], dtype=np.int32),
                                              g.shape[0], 1.0))
    a = family("geometric", 200, 60)[:, ::-1].copy()  # the greedy order reversed
    with mpqr.explain() as trace:
        q, r, p = mpqr.qr(a, pivoting=True)
    done = [e for e in _events(trace, "pivot") if "levels" in e.data]
    assert done and done[0].data["swaps"] > 0
    _check(a, q, r, p)
    monkeypatch.setattr(repair, "swap_limit", lambda kk: 0)
    with mpqr.explain() as trace:
        q, r, p = mpqr.qr(a, pivoting=True)
    assert [e.data.get("method") for e in _events(trace, "method")][-1] == "qrcp-blocked"
    _check(a, q, r, p)


def test_gram_route_modes_and_range(monkeypatch):
    """mode "r" and "complete", truncation, and column norms 1e-100 .. 1e100 (the Gram
    matrix of the scaled whole; the small columns ordered at later levels)."""
    _gram_route(monkeypatch)
    a = family("range", 150, 40)
    q, r, p = mpqr.qr(a, pivoting=True)
    _check(a, q, r, p)
    _r2, p2 = sla.qr(a, pivoting=True, mode="r")
    np.testing.assert_array_equal(p, p2)
    b = family("geometric", 150, 60)
    _q1, r1, p1 = mpqr.qr(b, pivoting=True)
    rr, pr = mpqr.qr(b, pivoting=True, mode="r")
    np.testing.assert_array_equal(pr, p1)
    np.testing.assert_allclose(rr, r1, rtol=0, atol=64 * 210 * _u(b))
    qc, rc, pc = mpqr.qr(b, pivoting=True, mode="complete")
    assert qc.shape == (150, 150) and rc.shape == (150, 60)
    np.testing.assert_array_equal(pc, p1)
    np.testing.assert_allclose(qc @ rc, b[:, pc], atol=64 * 210 * _u(b))
    q3, r3, p3 = mpqr.qr(b, pivoting=True, rtol=1e-4)
    kept = int(np.sum(np.abs(np.diagonal(r1)) > 1e-4 * r1[0, 0]))
    assert r3.shape == (kept, 60) and q3.shape == (150, kept)
    np.testing.assert_array_equal(p3, p1)


@pytest.mark.skipif(not GPU, reason="no CUDA GPU visible")
@pytest.mark.parametrize("name,n,panel,variant", [("geometric", 700, 32, "rows"),
                                                  ("gaussian", 500, 16, "rows"),
                                                  ("geometric", 300, 64, "rows"),
                                                  ("rank1", 200, 32, "rows"),
                                                  ("geometric", 700, 32, "swap")])
def test_gpu_pivoted_cholesky_kernel(name, n, panel, variant):
    """The device kernel (backends/cupy/pstrf.py) against LAPACK ?pstrf on the host:
    the same stop and order."""
    import cupy as cp
    from mpqr.backends.cupy import pstrf
    from mpqr.backends.host.pstrf import lapack_pivoted_cholesky

    gram = importlib.import_module("mpqr.qr.pivoted_gram")
    a = family(name, 1200, n)
    g = a.T @ a
    tol = gram.resolve_threshold(1200, n, 2.0**-53)
    p, k, gmax = pstrf.pivoted_cholesky(cp.asarray(g), tol, panel=panel, variant=variant)
    p2, k2, gmax2 = lapack_pivoted_cholesky(g, tol)
    assert k == k2 and gmax == pytest.approx(gmax2, rel=1e-15)
    np.testing.assert_array_equal(cp.asnumpy(p)[:k], p2[:k])
    assert sorted(cp.asnumpy(p).tolist()) == list(range(n))
