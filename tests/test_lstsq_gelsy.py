"""``lstsq(lapack_driver="gelsy")`` on QR with column pivoting, against SciPy's gelsy."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg as sla

import mpqr
from mpqr.lstsq.gelsy import ice_rank
from tests._support import to_numpy

U64 = np.finfo(np.float64).eps / 2


def _problem(m, n, rank, noise, cplx, seed=0):
    rng = np.random.default_rng(seed)

    def g(*shape):
        z = rng.standard_normal(shape)
        return z + 1j * rng.standard_normal(shape) if cplx else z

    a = g(m, rank) @ g(rank, n) + noise * g(m, n)
    return a, g(m, 2)


@pytest.mark.parametrize("m,n,rank,noise,cplx", [
    (60, 40, 15, 0.0, False), (40, 60, 15, 0.0, False), (60, 40, 15, 1e-11, False),
    (60, 40, 12, 0.0, True), (30, 50, 10, 1e-11, True), (50, 30, 30, 0.0, False),
])
@pytest.mark.parametrize("refine", ["auto", None])
def test_matches_scipy_gelsy(xp, m, n, rank, noise, cplx, refine):
    a, b = _problem(m, n, rank, noise, cplx)
    cond = 1e-8  # well inside the gap: the rank is defined, for SciPy as here
    x, res, rk, s = mpqr.lstsq(xp.asarray(a), xp.asarray(b), cond=cond,
                               lapack_driver="gelsy", refine=refine)
    x2, res2, rk2, s2 = sla.lstsq(a, b, cond=cond, lapack_driver="gelsy")
    x = to_numpy(x)
    assert rk == rk2 == rank
    assert s is None and s2 is None
    assert to_numpy(res).shape == res2.shape == (0,)
    sv = np.linalg.svd(a, compute_uv=False)
    kappa = sv[0] / sv[rk - 1]
    tol = 10 * max(m, n) * U64 * kappa + 10 * noise * kappa
    assert np.linalg.norm(x - x2) <= tol * np.linalg.norm(x2)
    # minimum norm: no component in the numerical null space of the truncated problem
    _, _, vh = np.linalg.svd(a)
    assert np.linalg.norm(vh[rk:] @ x) <= tol * np.linalg.norm(x)


@pytest.mark.usefixtures("general_lstsq_route")  # the gelsy route's own trace
def test_rank_zero_and_trace():
    x, _, rk, _ = mpqr.lstsq(np.zeros((5, 3)), np.ones(5), lapack_driver="gelsy")
    x2, _, rk2, _ = sla.lstsq(np.zeros((5, 3)), np.ones(5), lapack_driver="gelsy")
    assert rk == rk2 == 0 and np.array_equal(x, x2)
    a, b = _problem(40, 30, 10, 0.0, False)
    with mpqr.explain() as trace:
        mpqr.lstsq(a, b, cond=1e-8, lapack_driver="gelsy")
    assert any("QR with column pivoting" in e.message and "rank 10" in e.message
               for e in trace.events)


@pytest.mark.parametrize("seed", range(4))
def test_ice_rank_against_exact_condition(seed):
    """The incremental estimate against the exact condition numbers of R's leading
    blocks, on a triangle with a sharp drop (a rank well defined at rcond)."""
    rng = np.random.default_rng(seed)
    k = 30
    d = np.r_[np.logspace(0, -3, 18), np.logspace(-12, -14, k - 18)]
    r = np.triu(rng.standard_normal((k, k)) * 1e-3, 1) + np.diag(d)
    r[:, 18:] *= 1e-9  # the columns past the drop are small as a whole
    exact = max(i for i in range(1, k + 1) if np.linalg.cond(r[:i, :i]) < 1e8)
    from mpqr.backends import get_backend

    from mpqr._array_api import array_namespace

    backend = get_backend(array_namespace(r))
    assert ice_rank(backend, r, 1e-8) == exact == 18
