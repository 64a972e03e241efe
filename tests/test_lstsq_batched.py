"""``mpqr.lstsq`` on stacks of small problems through ``householder-batched``
(:mod:`mpqr.lstsq.batched`; on the host the portable scheme the GPU kernel shares):
outputs against SciPy's batched ``lstsq`` on the same inputs (shapes, dtypes, values to
``u x size x kappa``) and against the per-problem loop."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg as sla

import mpqr


def _batched_events(ex):
    return [e for e in ex.events if e.data.get("path") == "batched"]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("batch", "m", "n", "k"), [((5,), 20, 8, None), ((2, 3), 16, 16, 3),
                                                    ((4,), 30, 7, 2)])
def test_matches_scipy(batch, m, n, k, dtype):
    rng = np.random.default_rng(m * n)
    a = rng.standard_normal((*batch, m, n)).astype(dtype)
    b = rng.standard_normal((m,) if k is None else (*batch, m, k)).astype(dtype)
    a0, b0 = a.copy(), b.copy()
    with mpqr.explain() as ex:
        out = mpqr.lstsq(a, b)
    assert _batched_events(ex)
    ref = sla.lstsq(a, b)
    kappa = np.linalg.cond(a.astype(np.float64)).max()
    tol = 10 * np.finfo(dtype).eps * m * kappa
    x, res, rank, s = out
    for o, r in zip(out, ref):
        assert o.shape == r.shape and o.dtype == r.dtype
    assert np.abs(x - ref[0]).max() <= tol * max(1.0, np.abs(ref[0]).max()) * kappa
    if res.size:
        assert np.abs(res - ref[1]).max() <= tol * np.abs(ref[1]).max()
    assert np.array_equal(rank, ref[2])
    assert np.abs(s - ref[3]).max() <= 10 * np.finfo(dtype).eps * m * s.max()
    assert np.array_equal(a, a0) and np.array_equal(b, b0)


def test_rank_deficient_member_takes_the_loop():
    # square members: SciPy's batch stacking refuses mixed residue shapes of M > N stacks
    rng = np.random.default_rng(1)
    a = rng.standard_normal((4, 6, 6))
    a[2, :, 3] = a[2, :, 1]  # member 2 has rank 5
    b = rng.standard_normal((4, 6, 2))
    with mpqr.explain() as ex:
        x, res, rank, _s = mpqr.lstsq(a, b)
    assert not _batched_events(ex)
    xr, resr, rankr, _sr = sla.lstsq(a, b)
    assert np.array_equal(rank, rankr) and rank[2] == 5
    assert np.abs(x - xr).max() < 1e-10 and res.shape == resr.shape


def test_gelsy_and_nan():
    rng = np.random.default_rng(2)
    a = rng.standard_normal((3, 10, 4))
    b = rng.standard_normal((3, 10, 1))
    x, res, rank, s = mpqr.lstsq(a, b, lapack_driver="gelsy")
    xr, resr, rankr, _sr = sla.lstsq(a, b, lapack_driver="gelsy")
    # mpqr's stacks give s=None for gelsy (SciPy 1.17: an object array of Nones)
    assert s is None and res.shape == resr.shape == (3, 0)
    assert np.abs(x - xr).max() < 1e-12 and np.array_equal(rank, rankr)
    a[1, 0, 0] = np.nan
    with pytest.raises(np.linalg.LinAlgError, match="NaN or Inf"):
        mpqr.lstsq(a, b, check_finite=False)


def test_same_outputs_as_the_loop(monkeypatch):
    from mpqr.lstsq import batched

    rng = np.random.default_rng(3)
    a = rng.standard_normal((2, 3, 24, 10))
    b = rng.standard_normal((3, 24, 2))  # broadcast over the first batch axis
    out = mpqr.lstsq(a, b)
    monkeypatch.setattr(batched, "STACK_ROUTE", False)
    with mpqr.explain() as ex:
        loop = mpqr.lstsq(a, b)
    assert not _batched_events(ex)
    for o, r in zip(out, loop):
        assert o.shape == r.shape and o.dtype == r.dtype
        assert np.abs(o - r).max() <= 1e-12 * max(1.0, np.abs(r).max())


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_blocked_members_match_scipy(dtype, monkeypatch):
    # 150 x 140: too wide for one block, its 32-column panels fit (the blocked scheme,
    # taken where the fused kernel is: switched on here)
    from mpqr.backends import get_backend

    be = get_backend(np)
    rng = np.random.default_rng(5)
    a = rng.standard_normal((2, 150, 140)).astype(dtype)
    b = rng.standard_normal((2, 150, 2)).astype(dtype)
    with mpqr.explain() as ex:
        mpqr.lstsq(a, b)
    assert not _batched_events(ex)  # without the kernel: the loop
    monkeypatch.setattr(type(be), "batched_qr_fused", True)
    with mpqr.explain() as ex:
        x, res, rank, _s = mpqr.lstsq(a, b)
    assert [e.data["method"] for e in _batched_events(ex)] == ["householder-batched-blocked"]
    ref = sla.lstsq(a.astype(np.float64), b.astype(np.float64))
    kappa = np.linalg.cond(a.astype(np.float64)).max()
    tol = 10 * np.finfo(dtype).eps * 150 * kappa
    assert x.dtype == dtype and np.array_equal(rank, [140, 140])
    assert np.abs(x - ref[0]).max() <= tol * kappa * max(1.0, np.abs(ref[0]).max())
    assert np.abs(res - ref[1]).max() <= tol * np.abs(ref[1]).max()
