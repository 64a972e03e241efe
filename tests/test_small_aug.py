"""Least squares by the QR of ``[A | b]`` (``backends/numpy/small.py``: ``aug_solve``, the
host steps the CuPy fast path runs on its copy of R_aug too) against SciPy's ``lstsq``,
and the range check read from R (``r_in_range``)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg as sla
from mpqr.backends.numpy import small
from scipy.linalg import lapack

import mpqr
from mpqr import _fast
from mpqr.lstsq import _scipy_rules as rules

DTYPES = [np.float32, np.float64, np.complex64, np.complex128]


def _rand(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        a = a + 1j * rng.standard_normal(shape)
    return a.astype(dtype)


def _eps(dtype):
    return float(np.finfo(dtype).eps)


def _aug(a, b, driver="gelsd", cond=None, solve_first=False):
    """What the CuPy path hands the host: geqrf of [A | b], its first min(m, n+k) rows."""
    m, n = a.shape
    b2 = b[:, None] if b.ndim == 1 else b
    x = np.asfortranarray(np.concatenate([a, b2], axis=1))
    p = lapack.get_lapack_funcs("geqrf", (x,))
    qr = p(x)[0][:min(m, x.shape[1])]
    if solve_first:  # the device variant: x solved in place before the copy
        qr = qr.copy()
        qr[:n, n:] = sla.solve_triangular(np.triu(qr[:n, :n]), qr[:n, n:])
    eps = _eps(a.dtype)
    cut = rules.cutoff(cond, driver, eps, single=a.dtype.char in "fF")
    return small.aug_solve(qr, m, n, cut, eps / 2, solved=solve_first)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,k,solve_first", [
    ((100, 10), None, False), ((100, 10), 3, True), ((12, 12), 2, False),
    ((12, 12), 2, True), ((21, 20), 4, True), ((1, 1), None, False), ((600, 8), None, True)])
def test_aug_solve_matches_scipy(dtype, shape, k, solve_first):
    m, n = shape
    a = _rand(shape, dtype, 1)
    b = _rand((m,) if k is None else (m, k), dtype, 2)
    x, rsq, rank, s = _aug(a, b, solve_first=solve_first)
    xr, resr, rankr, sr = sla.lstsq(a, b)
    u = _eps(dtype)
    kappa = float(sr[0] / sr[-1])
    tol = 30 * u * kappa * max(m, n)
    assert rank == rankr == n
    assert x.shape == (n, 1 if k is None else k) and x.dtype == a.dtype
    xr2 = xr.reshape(n, -1)
    assert np.linalg.norm(x - xr2) <= tol * np.linalg.norm(xr2)
    assert s.dtype == sr.dtype and s.shape == sr.shape
    assert np.allclose(s, sr, rtol=0, atol=30 * u * max(m, n) * sr[0])
    if m > n:
        assert rsq.dtype == sr.dtype and rsq.shape == (1 if k is None else k,)
        assert np.allclose(rsq, np.atleast_1d(resr), rtol=tol, atol=tol * np.abs(b).max())
    else:
        assert rsq is None


@pytest.mark.parametrize("dtype", DTYPES)
def test_aug_solve_refuses(dtype):
    a, b = _rand((60, 6), dtype, 3), _rand((60, 2), dtype, 4)
    assert _aug(a, b) is not None
    dep = a.copy()
    dep[:, 5] = dep[:, 0]  # rank 5: SciPy's minimum-norm answer, not a triangular solve
    assert _aug(dep, b) is None
    for i, j in [(0, 5), (59, 0), (3, 3)]:  # NaN/Inf anywhere in A: a non-finite R
        for bad in (np.nan, np.inf):
            an = a.copy()
            an[i, j] = bad
            assert _aug(an, b) is None
    for i in (0, 7, 59):  # in b: rows of Q^H b, of R_aug's last column, of its reflector
        bn = b.copy()
        bn[i, 1] = np.nan
        assert _aug(a, bn) is None
    big = 2.0 ** (50 if np.dtype(dtype).char in "fF" else 420)
    for scale in (big, 1 / big):  # columns the general route rescales
        ab = a.copy()
        ab[:, 2] *= scale
        assert _aug(ab, b) is None


def test_aug_solve_cutoff_follows_the_driver():
    # s[-1]/s[0] = 1e-5: gelss with cond 1e-4 counts it as zero (the general route),
    # gelsd's default keeps it
    u_, _, vt = np.linalg.svd(_rand((50, 5), np.float64, 5), full_matrices=False)
    a = (u_ * np.array([1.0, 0.5, 0.1, 0.01, 1e-5])) @ vt
    b = _rand((50,), np.float64, 6)
    assert _aug(a, b) is not None
    assert _aug(a, b, driver="gelss", cond=1e-4) is None


def test_r_in_range_is_sufficient_for_the_column_maxima():
    lo, hi = small._RANGE[False]
    m, n = 100, 4
    assert small.r_in_range(np.array([1.0, 2.0, 0.0, 3.0]), m, n, False)
    assert not small.r_in_range(np.array([1.0, np.nan, 1.0, 1.0]), m, n, False)
    assert not small.r_in_range(np.array([1.0, np.inf, 1.0, 1.0]), m, n, False)
    assert not small.r_in_range(np.array([1.0, hi / 2, 1.0, 1.0]), m, n, False)
    assert not small.r_in_range(np.array([1.0, lo, 1.0, 1.0]), m, n, False)
    # every accepted R means every column maximum of A in [lo, hi)
    rng = np.random.default_rng(7)
    for _ in range(20):
        a = rng.standard_normal((m, n)) * 2.0 ** rng.integers(-420, 420, size=n)
        r = np.linalg.qr(a, mode="r")
        if small.r_in_range(np.abs(r).max(axis=0), m, n, False):
            mx = np.abs(a).max(axis=0)
            assert np.all((mx >= lo) & (mx < hi))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", [None, 2])
@pytest.mark.parametrize("driver", [None, "gelss", "gelsy"])
def test_fast_path_above_aug_min_matches_scipy(dtype, k, driver):
    m, n = 600, 8  # 4800 elements >= AUG_MIN: the augmented QR on the host
    assert m * n >= small.AUG_MIN
    a = _rand((m, n), dtype, 8)
    b = _rand((m,) if k is None else (m, k), dtype, 9)
    a0, b0 = a.copy(), b.copy()
    fast = _fast.lstsq(a, b, None, True, driver, precision=None, refine="auto", tol=None,
                       maxiter=None)
    assert fast is not _fast.MISS
    ref = sla.lstsq(a, b, lapack_driver=driver)
    np.testing.assert_array_equal(a, a0)
    np.testing.assert_array_equal(b, b0)
    u = _eps(dtype)
    for g, r in zip(fast, ref):
        if r is None:
            assert g is None
            continue
        g, r = np.asarray(g), np.asarray(r)
        assert g.dtype == r.dtype and g.shape == r.shape
        assert np.allclose(g, r, rtol=300 * u, atol=300 * u)
    assert type(fast[2]) is type(ref[2])
    assert mpqr.lstsq(a, b, lapack_driver=driver)[2] == ref[2]


def _graded(m, n, kappa, dtype, seed):
    """An m x n matrix of condition number ``kappa`` (singular values log-spaced)."""
    q1 = np.linalg.qr(_rand((m, n), np.complex128 if np.dtype(dtype).kind == "c"
                            else np.float64, seed))[0]
    q2 = np.linalg.qr(_rand((n, n), np.float64, seed + 1))[0]
    return ((q1 * np.logspace(0, -np.log10(kappa), n)) @ q2).astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kappa,taken", [(1.0, True), (10.0, True), (None, False)])
def test_aug_solve_takes_the_gram_factors_singular_values_only_where_they_match(
        dtype, kappa, taken):
    # the CuPy path hands aug_solve the Cholesky factor U of A^H A and U's singular values
    # (computed while R_aug was factored); they stand for R's where U and R agree to
    # GRAM_SVD_TOL n u s1, which bounds every singular value's change (Weyl)
    m, n = 200, 36
    if kappa is None:  # the Gram matrix's rounding shows (kappa^2 u ~ 1e-4 .. 0.1)
        kappa = 1e3 if np.dtype(dtype).char in "fF" else 1e6
    a = _graded(m, n, kappa, dtype, 3)
    b = _rand((m,), dtype, 4)
    g = np.asfortranarray(a.conj().T @ a)
    pre = small.gram_svd(g)
    assert pre is not None
    uf, su = pre
    eps = _eps(dtype)
    assert not np.tril(uf, -1).any()  # upper, U^H U = A^H A
    assert np.linalg.norm(uf.conj().T @ uf - g) <= 10 * n * eps * np.linalg.norm(g)
    x0 = np.asfortranarray(np.concatenate([a, b[:, None]], axis=1))
    qr = lapack.get_lapack_funcs("geqrf", (x0,))(x0)[0][:n + 1]
    cut = rules.cutoff(None, "gelsd", eps, single=np.dtype(dtype).char in "fF")
    with_gram = small.aug_solve(qr, m, n, cut, eps / 2, gram=pre)
    plain = small.aug_solve(qr, m, n, cut, eps / 2)
    assert with_gram is not None and plain is not None
    assert (with_gram[3] is su) == taken  # U's values taken, or R's own
    if not taken:
        np.testing.assert_array_equal(with_gram[3], plain[3])
    sr = np.linalg.svd(a.astype(np.complex128), compute_uv=False)
    u = eps / 2
    # within the certified distance plus a backward-stable SVD's error of the n x n R
    assert np.max(np.abs(with_gram[3] - sr)) <= (small.GRAM_SVD_TOL + 10) * n * u * sr[0]
    np.testing.assert_array_equal(with_gram[0], plain[0])  # x and residues: R_aug's
    np.testing.assert_array_equal(with_gram[1], plain[1])


def test_gram_svd_refuses_a_numerically_singular_gram_matrix():
    a = _rand((50, 6), np.float64, 5)
    g = np.asfortranarray(a.T @ a)
    assert small.gram_svd(g) is not None
    g[5, 5] = -1.0  # indefinite: potrf stops
    assert small.gram_svd(g) is None
    g[5, 5] = np.nan
    assert small.gram_svd(g) is None
