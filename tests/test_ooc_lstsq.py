"""Out-of-core ``mpqr.lstsq``: SciPy's results and semantics on host inputs beyond the
budget, with the passes over ``[a | b]`` counted in the trace."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg as sla

import mpqr
from mpqr import LinAlgError
from tests._ooc_support import DEVICES, Dataset, ooc_events, rand
from tests._support import conditioned_lstsq_problem

M, N = 1101, 10


def _tol(a, dtype):
    u = float(np.finfo(np.dtype(dtype)).eps) / 2
    return 50 * np.sqrt(N) * u * np.linalg.cond(a) ** 2 + 50 * N * u


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float64", "float32", "complex128"])
@pytest.mark.parametrize("nrhs", [None, 3])
@pytest.mark.parametrize("refine", ["auto", None])
def test_matches_scipy(device, dtype, nrhs, refine):
    rng = np.random.default_rng(0)
    a = rand(rng, (M, N), dtype)
    b = rand(rng, (M,) if nrhs is None else (M, nrhs), dtype)
    keep_a, keep_b = a.copy(), b.copy()
    with mpqr.explain() as trace:
        x, res, rank, s = mpqr.lstsq(a, b, refine=refine, device=device,
                                     memory_budget="40KB")
    x0, res0, rank0, s0 = sla.lstsq(a, b)
    ev = ooc_events(trace)
    assert len(ev) == 1
    assert ev[0].data["passes"].get("x") == 1  # one TSQR pass over [a | b]
    assert ev[0].data["refinement_passes"] == (0 if refine is None else 1)
    tol = _tol(a, dtype)
    assert x.shape == x0.shape and x.dtype == x0.dtype
    assert np.linalg.norm(x - x0) <= tol * np.linalg.norm(x0)
    assert rank == rank0
    assert res.shape == res0.shape
    assert res.dtype == mpqr.lstsq(a, b)[1].dtype  # as in core
    np.testing.assert_allclose(res, res0, rtol=tol)
    np.testing.assert_allclose(s, s0, rtol=tol)
    np.testing.assert_array_equal(a, keep_a)
    np.testing.assert_array_equal(b, keep_b)


@pytest.mark.parametrize("device", DEVICES)
def test_refinement_reaches_working_accuracy_from_low_precision(device):
    a, b = conditioned_lstsq_problem(M, N, 1e3, seed=1)
    with mpqr.explain() as trace:
        x, _res, _rank, _s = mpqr.lstsq(a, b, precision="fp32", device=device,
                                     memory_budget="40KB")
    x0 = sla.lstsq(a, b)[0]
    assert ooc_events(trace)[0].data["refinement_passes"] >= 1
    assert np.linalg.norm(x - x0) <= _tol(a, "float64") * np.linalg.norm(x0)


@pytest.mark.parametrize("device", DEVICES)
def test_rank_deficient_minimum_norm(device):
    rng = np.random.default_rng(2)
    a = rng.standard_normal((M, N))
    a[:, 4] = a[:, 1] + a[:, 2]
    b = rng.standard_normal((M, 2))
    x, res, rank, _s = mpqr.lstsq(Dataset(a), Dataset(b), cond=1e-10, device=device,
                                  memory_budget="40KB")
    x0, res0, rank0, _s0 = sla.lstsq(a, b, cond=1e-10)
    assert rank == rank0 == N - 1
    np.testing.assert_allclose(x, x0, rtol=0, atol=1e-10 * np.abs(x0).max())
    assert res.shape == res0.shape


@pytest.mark.parametrize("device", DEVICES)
def test_nonfinite_as_in_core(device):
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((M, N)), rng.standard_normal(M)
    an = a.copy()
    an[7, 2] = np.inf
    with pytest.raises(ValueError, match="array must not contain infs or NaNs"):
        mpqr.lstsq(an, b, device=device, memory_budget="40KB")
    with pytest.raises(LinAlgError, match="contains NaN or Inf"):
        mpqr.lstsq(an, b, check_finite=False, device=device, memory_budget="40KB")
    bn = b.copy()
    bn[3] = np.nan
    x, _res, rank, _s = mpqr.lstsq(a, bn, check_finite=False, device=device,
                                   memory_budget="40KB")
    assert np.isnan(x).all() and rank == N


def test_in_core_when_it_fits():
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal((M, N)), rng.standard_normal(M)
    with mpqr.explain() as trace:
        x = mpqr.lstsq(a, b, memory_budget="1GB")[0]
    assert ooc_events(trace, "in-core")
    np.testing.assert_array_equal(x, mpqr.lstsq(a, b)[0])
