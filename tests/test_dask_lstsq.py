"""mpqr.lstsq with a dask array chunked by rows (threaded scheduler) against SciPy."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg

da = pytest.importorskip("dask.array")
dask = pytest.importorskip("dask")

import mpqr  # noqa: E402
from tests._support import (  # noqa: E402
    assert_rank_deficient_residues,
    conditioned_lstsq_problem,
    exact_matmul,
)
from tests.test_dask_qr import _Reads  # noqa: E402

pytestmark = pytest.mark.usefixtures("dask_threads")


CHUNKS = (301, 97, 500, 3, 299)  # ragged, one block shorter than n


def _problem(kappa, dtype, k=None, seed=0):
    m, n = sum(CHUNKS), 24
    a, b = conditioned_lstsq_problem(m, n, kappa, seed)
    rng = np.random.default_rng(seed + 1)
    if k is not None:
        b = rng.standard_normal((m, k))
    if np.dtype(dtype).kind == "c":
        a = a + 1j * conditioned_lstsq_problem(m, n, kappa, seed + 2)[0]
        b = b + 1j * rng.standard_normal(b.shape)
    a, b = a.astype(dtype), b.astype(dtype)
    a.flags.writeable = False
    b.flags.writeable = False
    return a, b


def _x_tol(a, dtype):
    # forward error of a backward-stable solve: c n u (cond + cond^2 ||r|| / (||A|| ||x||))
    u = float(np.finfo(dtype).eps) / 2
    kappa = np.linalg.cond(a)
    return 50 * a.shape[1] * u * kappa**2


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex128])
@pytest.mark.parametrize("k", [None, 3])
@pytest.mark.parametrize("refine", ["auto", "cgls", "ir", None])
def test_matches_scipy(dtype, k, refine):
    a, b = _problem(10.0, dtype, k)
    xa = da.from_array(a, chunks=(CHUNKS, a.shape[1]))
    x, res, rank, s = mpqr.lstsq(xa, da.from_array(b, chunks=200), refine=refine)
    xr, resr, rankr, sr = scipy.linalg.lstsq(a, b)
    assert isinstance(x, da.Array) and isinstance(s, da.Array)
    x, res, s = x.compute(), res.compute(), s.compute()
    assert x.shape == xr.shape and x.dtype == xr.dtype
    assert res.shape == np.shape(resr) and rank == rankr and s.dtype == sr.dtype
    tol = _x_tol(a, dtype)
    assert np.linalg.norm(x - xr) <= tol * np.linalg.norm(xr)
    assert np.abs(s - sr).max() <= tol * sr[0]
    assert np.all(np.abs(res - resr) <= tol * np.abs(resr) + tol * np.linalg.norm(b) ** 2)


def test_routes_in_trace():
    a, b = _problem(2.0, np.float64)  # cond(A) <= 4: the Gram route, one pass for R and s
    xa = da.from_array(a, chunks=(CHUNKS, a.shape[1]))
    with mpqr.explain() as trace:
        x, _, _, s = mpqr.lstsq(xa, b)
    assert "gram" in [e.data.get("path") for e in trace.events]
    xr, _, _, sr = scipy.linalg.lstsq(a, b)
    assert np.linalg.norm(x.compute() - xr) <= _x_tol(a, np.float64) * np.linalg.norm(xr)
    assert np.abs(s.compute() - sr).max() <= _x_tol(a, np.float64) * sr[0]
    a2, b2 = _problem(1e6, np.float64, seed=5)
    with mpqr.explain() as trace:
        x, _, rank, _ = mpqr.lstsq(da.from_array(a2, chunks=(CHUNKS, a2.shape[1])), b2)
    kinds = [e.kind for e in trace.events]
    assert "gram-reuse" in kinds and "refine" in kinds and rank == a2.shape[1]
    xr = scipy.linalg.lstsq(a2, b2)[0]
    assert np.linalg.norm(x.compute() - xr) <= _x_tol(a2, np.float64) * np.linalg.norm(xr)


def test_rank_deficient():
    a, b = _problem(10.0, np.float64)
    a = a.copy()
    a[:, 7] = a[:, 3]
    x, res, rank, s = mpqr.lstsq(da.from_array(a, chunks=(CHUNKS, a.shape[1])), b)
    xr, resr, rankr, sr = scipy.linalg.lstsq(a, b)
    assert rank == rankr == a.shape[1] - 1
    # the minimum-norm solution is well conditioned on the rank-23 subspace
    assert np.linalg.norm(x.compute() - xr) <= 1e-10 * np.linalg.norm(xr)
    assert_rank_deficient_residues(res.compute(), resr)
    assert np.abs(s.compute() - sr).max() <= 1e-12 * sr[0]


def test_gelsy_and_in_memory_b():
    a, b = _problem(10.0, np.float64, 2)
    x, res, rank, s = mpqr.lstsq(da.from_array(a, chunks=(CHUNKS, a.shape[1])), b,
                                 lapack_driver="gelsy")
    xr, resr, rankr, _ = scipy.linalg.lstsq(a, b, lapack_driver="gelsy")
    assert s is None and res.shape == resr.shape == (0,) and rank == rankr
    assert np.linalg.norm(x.compute() - xr) <= _x_tol(a, np.float64) * np.linalg.norm(xr)


def test_errors():
    a, b = _problem(10.0, np.float64)
    xa = da.from_array(a, chunks=(CHUNKS, a.shape[1]))
    with pytest.raises(ValueError, match=r"Shape mismatch: a and b should have the same number of rows \(1200 != 1199\)"):
        mpqr.lstsq(xa, b[:-1])
    with pytest.raises(ValueError, match=r"chunked by rows only .* `a.rechunk\(\{1: -1\}\)`"):
        mpqr.lstsq(da.from_array(a, chunks=(300, 12)), b)
    with pytest.raises(ValueError, match=r"at least as many rows as columns"):
        mpqr.lstsq(da.from_array(a[:20], chunks=(10, 24)), b[:20])
    bad = b.copy()
    bad[5] = np.inf
    with pytest.raises(ValueError, match=r"array must not contain infs or NaNs \(`b`\)"):
        mpqr.lstsq(xa, bad)
    with pytest.raises(ValueError, match="`refine` must be one of"):
        mpqr.lstsq(xa, b, refine="newton")
    with pytest.raises(ValueError, match="Input array a should be 2D"):
        mpqr.lstsq(da.ones((2, 30, 4), chunks=(1, 10, 4)), b[:30])


def test_nan_b_gives_nan():
    a, b = _problem(10.0, np.float64)
    b = b.copy()
    b[0] = np.nan
    x, res, rank, _ = mpqr.lstsq(da.from_array(a, chunks=(CHUNKS, a.shape[1])), b,
                                 check_finite=False)
    assert np.isnan(x.compute()).all() and np.isnan(res.compute()).all() and rank == a.shape[1]


@pytest.mark.parametrize("scale", [2.0**-700, 2.0**600])
def test_extreme_scale(scale):
    """A scaled by 2^-700 or 2^600: the refinement runs on exactly rescaled blocks (its
    products would under- or overflow), and x scales back exactly as in-core."""
    a, b = _problem(1e3, np.float64)
    x0, _, _, s0 = scipy.linalg.lstsq(a, b)
    with mpqr.explain() as trace:
        x, _, rank, s = mpqr.lstsq(da.from_array(a * scale, chunks=(CHUNKS, a.shape[1])), b)
    assert rank == a.shape[1]
    assert np.linalg.norm(x.compute() * scale - x0) <= _x_tol(a, np.float64) * np.linalg.norm(x0)
    assert np.abs(s.compute() / scale - s0).max() <= _x_tol(a, np.float64) * s0[0]
    assert any(e.kind == "scale" for e in trace.events)


@pytest.mark.parametrize("kappa, driver", [(2.0, "gelsd"), (1e3, "gelsy")])
def test_two_passes_when_well_conditioned(kappa, driver):
    """The Gram route (cond(A) <= 4 with s, <= 1e4 without): pass 1 reads A for A^H A,
    A^H b, ||b||^2 and the finiteness check; one refinement pass measures the solution
    and gives the residues. Two reads of each block, two graphs."""
    a, b = _problem(kappa, np.float64, 2)
    with _Reads(a, 150) as reads, mpqr.explain() as trace:
        x, res, rank, s = mpqr.lstsq(reads.x, b, lapack_driver=driver)
    assert reads.passes == reads.computes == 2
    assert "gram" in [e.data.get("path") for e in trace.events]
    xr, resr, rankr, sr = scipy.linalg.lstsq(a, b, lapack_driver=driver)
    x, res = x.compute(), res.compute()
    assert rank == rankr and x.shape == xr.shape and res.shape == resr.shape
    assert np.linalg.norm(x - xr) <= _x_tol(a, np.float64) * np.linalg.norm(xr)
    if driver == "gelsd":
        assert np.abs(s.compute() - sr).max() <= _x_tol(a, np.float64) * sr[0]
        assert np.all(np.abs(res - resr) <= 1e-12 * resr)
    else:
        assert s is None and res.shape == (0,)


def test_passes_when_ill_conditioned():
    """cond(A) = 1e6: the QR route (CholQR2's second pass from pass 1's Gram matrix),
    then CGLS at one pass per step; a few passes, the answer as in-core."""
    a, b = _problem(1e6, np.float64, seed=3)
    with _Reads(a, 150) as reads, mpqr.explain() as trace:
        x, res, rank, _ = mpqr.lstsq(reads.x, b)
    refine = [e for e in trace.events if e.kind == "refine"]
    assert refine and refine[0].data["converged"]
    assert reads.passes == reads.computes == refine[0].data["passes"] <= 6
    xr, resr, rankr, _ = scipy.linalg.lstsq(a, b)
    assert rank == rankr == a.shape[1]
    assert np.linalg.norm(x.compute() - xr) <= _x_tol(a, np.float64) * np.linalg.norm(xr)
    assert abs(float(res.compute()) - float(resr)) <= 1e-10 * float(resr)


def test_residues_are_the_solutions_own():
    """A nearly consistent b (||r|| / ||b|| ~ 1e-7): the residues are ||b - A x||^2 of the
    returned x, as an error-free evaluation of the residual gives it (a recurrence from
    ||b||^2 would lose all of its digits to cancellation)."""
    a, _ = _problem(2.0, np.float64)
    rng = np.random.default_rng(11)
    b = a @ rng.standard_normal(a.shape[1]) + 1e-7 * rng.standard_normal(a.shape[0])
    x, res, _, _ = mpqr.lstsq(da.from_array(a, chunks=(CHUNKS, a.shape[1])), b)
    x, res = x.compute(), float(res.compute())
    # the residual of this x, each entry correctly rounded
    r = b - exact_matmul(a, x[:, None])[:, 0]
    exact = float(np.sum(r * r))
    u = 2.0**-53
    # the blocks' residual entries are off by ~u (|b| + |A||x|) each
    bound = 4 * np.sqrt(a.shape[0]) * u * (np.linalg.norm(b) + np.linalg.norm(a, 2)
                                            * np.linalg.norm(x)) * np.sqrt(exact) + 4 * u * exact
    assert abs(res - exact) <= bound
    assert abs(res - exact) <= 1e-6 * exact
    resr = float(scipy.linalg.lstsq(a, b)[1])
    assert abs(res - resr) <= 1e-6 * resr
