"""QR with column pivoting (``mpqr.qr(x, pivoting=True)``) against SciPy's geqp3.

The routes run on every backend of the ``xp`` fixture: LAPACK geqp3's order (NumPy), the
order from pivoted Cholesky of the Gram matrix (forced onto small matrices; its trailing
levels and exchange repair included) and the deterministic column-norm route; the
blocked routes (randomized, greedy) are forced onto small matrices by a 16-column block.
Tolerances: unit roundoff x size; ``|R_kk|`` against the singular values by the
factor 10 of the rank-revealing claim.
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

U64 = np.finfo(np.float64).eps / 2
U32 = np.finfo(np.float32).eps / 2


def _small_blocks(monkeypatch, block=16):
    """Blocks of ``block`` columns on every backend (the GPU's own width is wider), so
    that the test matrices span many blocks."""
    monkeypatch.setattr(pivoted, "BLOCK", block)
    if GPU:
        from mpqr.backends.cupy.backend import CupyBackend

        monkeypatch.setattr(CupyBackend, "qrcp_block", block)


def _device_backends():
    """The backend classes without a library QRCP whose exact route a test picks."""
    from mpqr.backends._base import ArrayAPIBackend

    return [ArrayAPIBackend]


@pytest.fixture(params=["library", "gram", "deterministic"])
def route(request, monkeypatch, xp):
    """The routes of ``pivoting=True``: LAPACK geqp3's order (NumPy only), the order from
    the Gram matrix's pivoted Cholesky (the default without a library QRCP; the blocked
    greedy QRCP and the exchange repair of HQRRP's order: test_qr_pivoted_order.py),
    column-norm pivoting."""
    from mpqr.backends.numpy_backend import NumpyBackend

    if request.param == "library" and xp.__name__ != "numpy":
        pytest.skip("geqp3's order: the NumPy backend")

    if request.param != "deterministic":
        _small_blocks(monkeypatch)
        monkeypatch.setattr(pivoted, "DETERMINISTIC_MAX_SIZE", 0)
        if request.param in ("blocked", "gram"):
            monkeypatch.setattr(NumpyBackend, "qrcp_library", False)
            for be in _device_backends():
                monkeypatch.setattr(be, "qrcp_exact_route", request.param)
    else:
        monkeypatch.setattr(pivoted, "DETERMINISTIC_MAX_SIZE", 10**9)
    return request.param


def _orth(rng, m, k, cplx=False):
    z = rng.standard_normal((m, k))
    if cplx:
        z = z + 1j * rng.standard_normal((m, k))
    return np.linalg.qr(z)[0]


def _with_sv(rng, m, n, s, cplx=False):
    return (_orth(rng, m, len(s), cplx) * s) @ _orth(rng, n, len(s), cplx).conj().T


def _kahan(n, c=0.285):
    s = np.sqrt(1 - c * c)
    return np.diag(s ** np.arange(n)) @ (np.triu(-c * np.ones((n, n)), 1) + np.eye(n))


def family(name, m, n, seed=0):
    rng = np.random.default_rng(seed)
    k = min(m, n)
    if name == "geometric":
        return _with_sv(rng, m, n, np.logspace(0, -12, k))
    if name == "algebraic":
        return _with_sv(rng, m, n, 1.0 / np.arange(1, k + 1) ** 3)
    if name == "kahan":
        kah = _kahan(n)
        return kah[:m] if m <= n else np.vstack([kah, np.zeros((m - n, n))])
    if name == "rank-deficient":  # exact rank k // 3
        return _with_sv(rng, m, n, np.logspace(0, -3, k // 3))
    if name == "rank-deficient-noise":
        return _with_sv(rng, m, n, np.logspace(0, -3, k // 3)) + \
            1e-10 * rng.standard_normal((m, n))
    if name == "range":  # column norms from 1e-100 to 1e100
        return rng.standard_normal((m, n)) * np.logspace(-100, 100, n)[rng.permutation(n)]
    if name == "complex":
        return _with_sv(rng, m, n, np.logspace(0, -10, k), cplx=True)
    raise AssertionError(name)


FAMILIES = ["geometric", "algebraic", "kahan", "rank-deficient", "rank-deficient-noise",
            "range", "complex"]


def _np(*arrays):
    return tuple(to_numpy(a) for a in arrays)


def _numerical_rank(d, m, n):
    """Numerical rank from |diag(R)| at the default tolerance (numpy.linalg.matrix_rank's
    ``max(m, n) eps`` relative to the largest)."""
    return int(np.sum(d > max(m, n) * np.finfo(d.dtype).eps * d[0]))


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("shape", [(80, 60), (60, 80)])
def test_families_against_geqp3(xp, route, name, shape):
    m, n = shape
    if m < n and xp.__name__ != "numpy":  # the same code runs wide on every backend: the
        pytest.skip("wide shapes on NumPy only (keeps this file fast)")  # modes test
    a = family(name, m, n)
    x = xp.asarray(a)
    q, r, p = _np(*mpqr.qr(x, pivoting=True))
    np.testing.assert_array_equal(to_numpy(x), a)  # input untouched
    k = min(m, n)
    assert q.shape == (m, k) and r.shape == (k, n) and p.shape == (n,)
    assert p.dtype == sla.qr(a, pivoting=True)[2].dtype
    assert sorted(p.tolist()) == list(range(n))
    # backward error and orthogonality at working precision
    assert np.linalg.norm(a[:, p] - q @ r) <= 4 * n * U64 * np.linalg.norm(a)
    assert np.linalg.norm(q.conj().T @ q - np.eye(k)) <= 4 * n * U64
    assert np.all(np.tril(r, -1) == 0)
    d = np.diagonal(r)
    assert np.all(d.real >= 0) and np.all(d.imag == 0)
    # rank-revealing: |R_kk| within 10x of sigma_k below the numerical rank, same rank
    # as geqp3
    r2, _ = sla.qr(a, pivoting=True, mode="r")
    s = np.linalg.svd(a, compute_uv=False)
    rank = _numerical_rank(np.abs(d), m, n)
    assert rank == _numerical_rank(np.abs(np.diagonal(r2)), m, n)
    ratio = np.abs(d[:rank]) / s[:rank]
    if name == "kahan":  # the greedy order's known failure: |R_nn| misses sigma_n
        ratio = ratio[:-1]
    assert ratio.min() >= 0.1 and ratio.max() <= 10, (ratio.min(), ratio.max())


def test_rank_deficiency_with_noise_gap(xp, route):
    """Exact rank 20 plus 1e-10 noise: the numerical rank at a tolerance above the noise
    is 20, as geqp3 finds, and R's trailing block is at the noise level."""
    a = family("rank-deficient-noise", 90, 60)
    _q, r, _p = _np(*mpqr.qr(xp.asarray(a), pivoting=True))
    d = np.abs(np.diagonal(r))
    d2 = np.abs(np.diagonal(sla.qr(a, pivoting=True, mode="r")[0]))
    assert int(np.sum(d > 1e-8 * d[0])) == int(np.sum(d2 > 1e-8 * d2[0])) == 20
    assert np.linalg.norm(r[20:, 20:]) <= 10 * np.linalg.norm(1e-10 * np.ones((90, 40)))


@pytest.mark.skip_xp_backend("array_api_strict", reason="no float16 GEMM engine")
@pytest.mark.parametrize("prec,u", [("fp32-emulated", U32), ("fp16", 2.0**-11)])
def test_emulated_precisions(xp, route, prec, u):
    a = family("geometric", 80, 60)
    q, r, p = _np(*mpqr.qr(xp.asarray(a), pivoting=True, precision=prec))
    assert q.dtype == np.float64
    assert np.linalg.norm(a[:, p] - q @ r) <= 4 * 60 * u * np.linalg.norm(a)
    assert np.linalg.norm(q.T @ q - np.eye(60)) <= 4 * 60 * u


@pytest.mark.parametrize("dtype", ["float32", "complex64"])
def test_single_precision(xp, route, dtype):
    rng = np.random.default_rng(3)
    a = rng.standard_normal((70, 50)) * np.logspace(0, -4, 50)
    if dtype == "complex64":
        a = a + 1j * rng.standard_normal((70, 50)) * np.logspace(0, -4, 50)
    a = a.astype(dtype)
    q, r, p = _np(*mpqr.qr(xp.asarray(a), pivoting=True))
    assert q.dtype == r.dtype == np.dtype(dtype)
    a64 = a.astype(np.complex128 if "complex" in dtype else np.float64)
    assert np.linalg.norm(a64[:, p] - q @ r) <= 4 * 50 * U32 * np.linalg.norm(a64)


@pytest.mark.parametrize("shape", [(70, 50), (50, 70)])
def test_modes(xp, route, shape):
    m, n = shape
    k = min(m, n)
    a = family("algebraic", m, n, seed=4)
    x = xp.asarray(a)
    _q, r, p = _np(*mpqr.qr(x, pivoting=True))
    qc, rc, pc = _np(*mpqr.qr(x, mode="complete", pivoting=True))
    ro, po = _np(*mpqr.qr(x, mode="r", pivoting=True))
    assert qc.shape == (m, m) and rc.shape == (m, n)
    np.testing.assert_array_equal(pc, p)
    np.testing.assert_array_equal(po, p)
    assert np.linalg.norm(qc.T @ qc - np.eye(m)) <= 4 * m * U64
    assert np.linalg.norm(a[:, p] - qc @ rc) <= 4 * n * U64 * np.linalg.norm(a)
    assert np.all(rc[k:] == 0)
    # the same R whatever Q is formed
    assert np.linalg.norm(ro - r) <= 4 * n * U64 * np.linalg.norm(a)
    assert np.linalg.norm(rc[:k] - r) <= 4 * n * U64 * np.linalg.norm(a)


def test_same_factors_as_unpivoted_qr_of_permuted(xp, route):
    """The sign convention of the unpivoted call: qr(x[:, P]) gives the same Q and R."""
    a = family("algebraic", 80, 50, seed=5)
    q, r, p = _np(*mpqr.qr(xp.asarray(a), pivoting=True))
    q2, r2 = _np(*mpqr.qr(xp.asarray(a[:, p])))
    cond = np.linalg.cond(a)
    assert np.linalg.norm(q - q2) <= 10 * 50 * U64 * cond
    assert np.linalg.norm(r - r2) <= 10 * 50 * U64 * cond * np.linalg.norm(a)


def test_stack_matches_geqp3_per_matrix(xp):
    rng = np.random.default_rng(6)
    a = rng.standard_normal((3, 30, 20)) * rng.uniform(0.1, 10, (3, 1, 20))
    q, r, p = _np(*mpqr.qr(xp.asarray(a), pivoting=True))
    assert p.shape == (3, 20) and p.dtype == np.int32
    for i in range(3):
        _, p2 = sla.qr(a[i], pivoting=True, mode="r")
        np.testing.assert_array_equal(p[i], p2)  # distinct norms: LAPACK's exact choice
        assert np.linalg.norm(a[i][:, p[i]] - q[i] @ r[i]) <= 4 * 20 * U64 * \
            np.linalg.norm(a[i])
    _rr, pr = _np(*mpqr.qr(xp.asarray(a), mode="r", pivoting=True))
    np.testing.assert_array_equal(pr, p)


@pytest.mark.parametrize("shape", [(0, 3), (3, 0), (0, 0), (2, 0, 3), (2, 3, 0)])
@pytest.mark.parametrize("mode", ["reduced", "complete", "r"])
def test_empty_shapes(xp, shape, mode):
    x = xp.zeros(shape, dtype=xp.float64)
    out = _np(*mpqr.qr(x, mode=mode, pivoting=True))
    _m, n = shape[-2:]
    if len(shape) == 2 and mode != "r":  # (mode "r": R is (k, n), NumPy's convention)
        smode = {"reduced": "economic", "complete": "full"}[mode]
        ref = sla.qr(np.zeros(shape), mode=smode, pivoting=True)
        assert [o.shape for o in out] == [o.shape for o in ref]
        assert [o.dtype for o in out] == [o.dtype for o in ref]
    p = out[-1]
    assert p.shape == (*shape[:-2], n) and p.dtype == np.int32
    np.testing.assert_array_equal(p, np.broadcast_to(np.arange(n), p.shape))


def test_truncated_max_rank(xp, route):
    a = family("geometric", 90, 70, seed=7)
    k = 25
    q, r, p = _np(*mpqr.qr(xp.asarray(a), pivoting=True, max_rank=k))
    assert q.shape == (90, k) and r.shape == (k, 70) and p.shape == (70,)
    assert np.linalg.norm(q.T @ q - np.eye(k)) <= 4 * 70 * U64
    # the left-out part: within 10x of geqp3's (the norm of its trailing block)
    err = np.linalg.norm(a[:, p] - q @ r)
    r2, _ = sla.qr(a, pivoting=True, mode="r")
    ref = np.linalg.norm(r2[k:, k:])
    s = np.linalg.svd(a, compute_uv=False)
    assert np.linalg.norm(s[k:]) <= err * (1 + 1e-8) and err <= 10 * ref
    # the kept rows are those of the full factorization
    rf, pf = _np(*mpqr.qr(xp.asarray(a), mode="r", pivoting=True))
    np.testing.assert_array_equal(pf[:k], p[:k])
    back, back_f = np.argsort(p), np.argsort(pf)  # the later columns' order may differ
    assert np.linalg.norm(rf[:k, back_f] - r[:, back]) <= 4 * 70 * U64 * np.linalg.norm(a)
    r0, p0 = _np(*mpqr.qr(xp.asarray(a), mode="r", pivoting=True, max_rank=0))
    assert r0.shape == (0, 70) and p0.shape == (70,)


def test_truncated_rtol(xp, route):
    a = family("rank-deficient-noise", 90, 70, seed=8)
    q, r, p = _np(*mpqr.qr(xp.asarray(a), pivoting=True, rtol=1e-8))
    rf, _pf = _np(*mpqr.qr(xp.asarray(a), mode="r", pivoting=True))
    d = np.abs(np.diagonal(rf))
    k = int(np.argmax(d <= 1e-8 * d[0]))
    assert k == 23 and q.shape == (90, k) and r.shape == (k, 70)
    assert np.all(np.abs(np.diagonal(r)) > 1e-8 * d[0])
    assert np.linalg.norm(a[:, p] - q @ r) <= 10 * np.sqrt(90 * 70) * 1e-10


@pytest.mark.parametrize("lib", ["numpy", "cupy"])
def test_resketch_on_rank_deficiency(monkeypatch, lib):
    """An exactly rank-deficient matrix makes R11 singular inside a block: the
    downdated sketch is refused and the trailing matrix sketched again (on the GPU after
    the next block's pivots were already chosen from the refused sketch)."""
    if lib == "cupy" and not GPU:
        pytest.skip("no CUDA GPU visible")
    xp = importlib.import_module(lib)
    _small_blocks(monkeypatch)
    monkeypatch.setattr(pivoted, "DETERMINISTIC_MAX_SIZE", 0)
    rng = np.random.default_rng(9)
    a = rng.standard_normal((80, 20)) @ rng.standard_normal((20, 60))
    with mpqr.explain() as trace:
        q, r, p = _np(*mpqr.qr(xp.asarray(a), pivoting="randomized"))
    assert any("sketched again" in e.message for e in trace.events)
    assert np.linalg.norm(a[:, p] - q @ r) <= 4 * 60 * U64 * np.linalg.norm(a)
    d = np.abs(np.diagonal(r))
    assert _numerical_rank(d, 80, 60) == 20
    # zero columns: nothing to choose after them, the order is kept
    z = np.zeros((80, 60))
    z[:, 5] = 1.0
    q, r, p = _np(*mpqr.qr(xp.asarray(z), pivoting="randomized"))
    assert p[0] == 5 and np.all(np.isfinite(r))
    assert np.linalg.norm(z[:, p] - q @ r) <= 4 * 60 * U64 * np.linalg.norm(z)


@pytest.mark.skip_xp_backend("numpy_readonly", reason="moves columns in place")
def test_swap_order_and_its_move_lists(xp):
    """The column moves of a block: the order after LAPACK-style swaps, applied with
    fixed-length index arrays (repeated slots write the same column twice)."""
    from mpqr.backends import get_backend
    from mpqr.backends._base import swap_order

    assert swap_order([4, 0, 2], 6) == [4, 0, 2, 3, 1, 5]
    assert swap_order([], 3) == [0, 1, 2]
    from mpqr._array_api import array_namespace

    rng = np.random.default_rng(4)
    for n, k, off in ((30, 5, 0), (30, 5, 7), (12, 12, 0), (9, 3, 2)):
        piv = [int(v) for v in rng.permutation(n - off)[:k]]
        order = swap_order(piv, n - off)
        assert sorted(order) == list(range(n - off)) and order[:k] == piv
        x = xp.asarray(np.arange(3 * n, dtype=np.float64).reshape(3, n))
        bxp = array_namespace(x)  # the Array API namespace the algorithms use
        backend = get_backend(bxp)
        dst, src = pivoted.move_lists(bxp, bxp.asarray(order, dtype=bxp.int32), k, off)
        backend.permute_columns(x, dst, src)
        want = np.arange(3 * n, dtype=np.float64).reshape(3, n)
        want[:, off:] = want[:, off:][:, order]
        np.testing.assert_array_equal(to_numpy(x), want)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite(xp, route, bad):
    a = family("algebraic", 60, 40)
    a[7, 11] = bad
    with pytest.raises(ValueError, match="must not contain infs or NaNs"):
        mpqr.qr(xp.asarray(a), pivoting=True, check_finite=True)
    _q, r, _p = _np(*mpqr.qr(xp.asarray(a), pivoting=True))
    assert not np.all(np.isfinite(r))


def test_gaussian_is_the_same_on_every_backend(xp):
    ns = mpqr._array_api.array_namespace(xp.zeros(1))  # the namespace the core is handed
    g = to_numpy(pivoted.gaussian(ns, (6, 50), ns.float64, None, 3))
    ref = to_numpy(pivoted.gaussian(mpqr._array_api.array_namespace(np.zeros(1)),
                                      (6, 50), np.float64, None, 3))
    # Box-Muller's log, sqrt and cos are not correctly rounded: a GPU's differ in the
    # last bit (the sketch's pivots are the same but for ties within that rounding)
    np.testing.assert_allclose(g, ref, rtol=4 * np.finfo(np.float64).eps, atol=0)
    assert abs(g.mean()) < 0.3 and 0.7 < g.std() < 1.3


@pytest.mark.parametrize("kw,exc,msg", [
    (dict(max_rank=3), ValueError, "pass pivoting=True"),
    (dict(rtol=0.1), ValueError, "pass pivoting=True"),
    (dict(pivoting=True, max_rank=-1), ValueError, "`max_rank` must be >= 0"),
    (dict(pivoting=True, max_rank=2.5), TypeError, "`max_rank` must be an integer"),
    (dict(pivoting=True, rtol=-1.0), ValueError, "`rtol` must be finite and >= 0"),
    (dict(pivoting=True, rtol="x"), TypeError, "`rtol` must be a real number"),
    (dict(pivoting="yes"), ValueError, "`pivoting` must be True, False or 'randomized'"),
    (dict(pivoting=1), TypeError, "`pivoting` must be True, False or 'randomized'"),
    (dict(pivoting=True, max_rank=2, mode="complete"), ValueError, "no complete Q"),
])
def test_validation(kw, exc, msg):
    with pytest.raises(exc, match=msg):
        mpqr.qr(np.ones((4, 3)), **kw)


def test_rtol_needs_one_matrix():
    with pytest.raises(ValueError, match="`rtol` needs a single matrix"):
        mpqr.qr(np.ones((2, 4, 3)), pivoting=True, rtol=1e-3)


def test_out_of_core_route_refused_and_numpy_integer_rank():
    with pytest.raises(NotImplementedError, match=r"qr\(pivoting=True\) runs on arrays in memory"):
        mpqr.qr(np.ones((6, 4)), pivoting=True, memory_budget="1MB")
    a = family("geometric", 20, 10)
    q, r, _p = mpqr.qr(a, pivoting=True, max_rank=np.int64(3))
    assert q.shape == (20, 3) and r.shape == (3, 10)


@pytest.mark.parametrize("prec", ["fp64", "fp64-emulated"])
def test_fp64_settings_hqrrp(monkeypatch, prec):
    monkeypatch.setattr(pivoted, "BLOCK", 16)
    monkeypatch.setattr(pivoted, "DETERMINISTIC_MAX_SIZE", 0)
    a = family("algebraic", 70, 50, seed=11)
    with mpqr.explain() as trace:
        q, r, p = mpqr.qr(a, pivoting="randomized", precision=prec)
    assert any(e.kind == "method" and "HQRRP" in e.message for e in trace.events)
    assert np.linalg.norm(a[:, p] - q @ r) <= 4 * 50 * U64 * np.linalg.norm(a)
    assert np.linalg.norm(q.T @ q - np.eye(50)) <= 4 * 50 * U64
