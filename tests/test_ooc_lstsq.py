"""Out-of-core ``mpqr.lstsq``: SciPy's results and semantics on host inputs beyond the
budget, with the passes over ``[a | b]`` counted in the trace and by the inputs' reads.

Well-conditioned problems take the Gram route (one pass forming ``A^H A`` and ``A^H b``,
one refinement pass), whatever ``b``: a good fit (``b = A c + 1e-3`` noise, so
``[a | b]`` is ill-conditioned) and a random ``b``. Ill-conditioned ones, ``refine=None``
and low factorization precisions take the TSQR route of ``[a | b]``."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg as sla

import mpqr
from mpqr import LinAlgError
from mpqr.lstsq.gram import GRAM_COND_MAX
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
    if refine is None:  # one TSQR pass over [a | b]
        assert ev[0].data["passes"] == {"x": 1} and ev[0].data["method"] == "tsqr"
        assert ev[0].data["refinement_passes"] == 0
    else:  # cond(a) ~ 1.2: the Gram route
        method, passes, refinements = _gram_route(dtype, device)
        assert ev[0].data["passes"] == {"[a | b]": passes}
        assert ev[0].data["method"] == method
        assert ev[0].data["refinement_passes"] == refinements
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


def _gram_route(dtype, device):
    """(method, passes over [a | b], refinement passes) of the Gram route: on the GPU, real
    dtypes in one pass (its Gram matrix in double-double); otherwise one pass plus one
    refinement (the one-pass route on the NumPy backend: tests/test_double_double.py)."""
    if device == "cuda" and dtype in ("float64", "float32"):
        return "gram-dd", 1, 0
    return "gram", 2, 1


def _good_fit(rng, a, k):
    """``b = A c + 1e-3`` noise: residual norms ~1e-3 sqrt(M) against ``|b|`` ~ 1e3."""
    c = 1e3 * rand(rng, (a.shape[1], k), a.dtype)
    return (a @ c + 1e-3 * rand(rng, (a.shape[0], k), a.dtype)).astype(a.dtype)


def _ne_residual(a, b, x):
    """``||A^H (b - A x)|| / (||A||^2 ||x||)`` in extended precision."""
    wide = np.clongdouble if np.iscomplexobj(a) else np.longdouble
    aw = a.astype(wide)
    r = b.astype(wide) - aw @ x.astype(wide)
    return float(np.linalg.norm((aw.conj().T @ r).astype(np.complex128)) /
                 (np.linalg.norm(a.astype(np.complex128), 2) ** 2 * np.linalg.norm(x)))


def _exact_residues(a, b, x):
    """``||b - A x||^2`` per column in extended precision (the residues SciPy defines)."""
    wide = np.clongdouble if np.iscomplexobj(a) else np.longdouble
    r = b.astype(wide) - a.astype(wide) @ x.astype(wide)
    return np.sum(np.abs(r) ** 2, axis=0).astype(np.float64)


def _residue_tol(a, b, x, res, dtype):
    """Rounding of residues formed in the working precision: the residual's entries are
    off by ``(N + 1) u (|b| + |A| |x|)``, so ``||r||^2`` by ``2 ||r|| e + e^2`` with
    ``e = (N + 1) u (||b|| + ||A||_F ||x||)``, plus the sum's ``M u ||r||^2``; x2 margin."""
    u = float(np.finfo(np.dtype(dtype)).eps) / 2
    e = (N + 1) * u * (np.linalg.norm(b, axis=0) + np.linalg.norm(a) * np.linalg.norm(x, axis=0))
    rn = np.sqrt(np.abs(res))
    return 2 * (2 * rn * e + e**2 + M * u * rn**2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float64", "float32", "complex128"])
@pytest.mark.parametrize("kind", ["good-fit", "random"])
@pytest.mark.parametrize("driver", [None, "gelsy"])
def test_gram_route_passes(device, dtype, kind, driver):
    rng = np.random.default_rng(10)
    a = rand(rng, (M, N), dtype)
    b = _good_fit(rng, a, 2) if kind == "good-fit" else rand(rng, (M, 2), dtype)
    keep_a, keep_b = a.copy(), b.copy()
    da, db = Dataset(a), Dataset(b)
    with mpqr.explain() as trace:
        x, res, rank, s = mpqr.lstsq(da, db, lapack_driver=driver, device=device,
                                     memory_budget="40KB")
    ev = ooc_events(trace)[0].data
    method, passes, refinements = _gram_route(dtype, device)
    assert ev["method"] == method and ev["passes"] == {"[a | b]": passes}
    assert ev["refinement_passes"] == refinements
    assert da.passes == db.passes == passes  # the inputs' own count of rows read
    np.testing.assert_array_equal(a, keep_a)
    np.testing.assert_array_equal(b, keep_b)
    x0, res0, rank0, s0 = sla.lstsq(a, b, lapack_driver=driver)
    assert x.shape == x0.shape and x.dtype == x0.dtype and rank == rank0 == N
    assert np.linalg.norm(x - x0) <= _tol(a, dtype) * np.linalg.norm(x0)
    # the refinement's promise: the normal-equation residual at its rounding floor
    u = float(np.finfo(np.dtype(dtype)).eps) / 2
    for j in range(2):
        assert _ne_residual(a, b[:, j], x[:, j]) <= 2 * np.sqrt(M) * u
    if driver == "gelsy":
        assert s is None and res.shape == res0.shape == (0,)
        return
    assert res.shape == res0.shape and res.dtype == res0.dtype
    exact = _exact_residues(a, b, x)
    assert np.all(np.abs(res - exact) <= _residue_tol(a, b, x, exact, dtype))
    assert np.all(np.abs(res - res0) <= _residue_tol(a, b, x, exact, dtype) +
                  _residue_tol(a, b, x0, res0, dtype))
    assert s.dtype == s0.dtype and s.shape == s0.shape
    # s from A^H A: within 2x the QR route's bound (see mpqr.lstsq.gram)
    assert np.max(np.abs(s - s0)) <= 10 * (np.sqrt(M) * u * GRAM_COND_MAX / 2 + N * u) * s0[0]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["good-fit", "random"])
def test_ill_conditioned_falls_back_to_tsqr(device, kind):
    a, b = conditioned_lstsq_problem(M, N, 1e3, seed=11)
    if kind == "good-fit":
        b = _good_fit(np.random.default_rng(12), a, 1)[:, 0]
    da, db = Dataset(a), Dataset(b)
    with mpqr.explain() as trace:
        x, res, rank, s = mpqr.lstsq(da, db, device=device, memory_budget="40KB")
    ev = ooc_events(trace)[0].data
    assert ev["method"] == "tsqr"
    assert any(e.kind == "fallback" and e.data.get("path") == "tsqr" for e in trace.events)
    # the declined Gram pass, the TSQR pass, the refinement passes
    assert ev["passes"] == {"[a | b]": 1 + ev["refinement_passes"], "x": 1}
    assert da.passes == db.passes == 2 + ev["refinement_passes"]
    x0, res0, rank0, s0 = sla.lstsq(a, b)
    assert rank == rank0 == N and res.shape == res0.shape
    assert np.linalg.norm(x - x0) <= _tol(a, "float64") * np.linalg.norm(x0)
    np.testing.assert_allclose(s, s0, rtol=_tol(a, "float64"))
    exact = _exact_residues(a, b[:, None], x[:, None])
    assert np.abs(res - exact) <= _residue_tol(a, b[:, None], x[:, None], exact, "float64")


@pytest.mark.parametrize("device", DEVICES)
def test_extreme_scale_of_b_declines_the_gram_route(device):
    rng = np.random.default_rng(13)
    a = rng.standard_normal((M, N))
    b = rng.standard_normal(M) * 2.0**300
    with mpqr.explain() as trace:
        x, _res, _rank, _s = mpqr.lstsq(a, b, device=device, memory_budget="40KB")
    assert ooc_events(trace)[0].data["method"] == "tsqr"
    x0 = sla.lstsq(a, b)[0]
    assert np.linalg.norm(x - x0) <= _tol(a, "float64") * np.linalg.norm(x0)


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
    for bad in (np.nan, np.inf):
        bn = b.copy()
        bn[3] = bad
        x, res, rank, _s = mpqr.lstsq(a, bn, check_finite=False, device=device,
                                      memory_budget="40KB")
        assert np.isnan(x).all() and rank == N and np.isnan(res).all()


@pytest.mark.usefixtures("general_lstsq_route")
def test_in_core_when_it_fits():
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal((M, N)), rng.standard_normal(M)
    with mpqr.explain() as trace:
        x = mpqr.lstsq(a, b, memory_budget="1GB")[0]
        # the in-memory call under explain() too (a small lstsq's fast path is not traced)
        want = mpqr.lstsq(a, b)[0]
    assert ooc_events(trace, "in-core")
    np.testing.assert_array_equal(x, want)
