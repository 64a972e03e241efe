"""mpqr.lstsq with a dask array chunked by rows (threaded scheduler) against SciPy."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg

da = pytest.importorskip("dask.array")
dask = pytest.importorskip("dask")

import mpqr  # noqa: E402
from tests._support import assert_rank_deficient_residues, conditioned_lstsq_problem  # noqa: E402

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
