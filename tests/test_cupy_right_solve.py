"""GPU tests of the row-wise right solve kernel ``Q = A R^{-1}`` (CuPy only).

Each row is a forward substitution, so each row of the result must satisfy the
textbook backward-error bound ``|a_i - q_i R| <= gamma_n |q_i| |R|`` (Higham,
Thm. 8.5), checked on the host in extended precision, for every supported width
and for strided (column-sliced) inputs. The fused CholQR2 kernels (float64,
n <= 32) solve by 8-column blocks: their rows must meet the same bound, the
two-solve kernel must round its intermediate as it rounds a lone solve (solving
with ``I`` is exact, so ``twice(a, r1, r2) == twice(twice(a, r1, I), r2, I)``
bitwise), and the Gram kernel's result must be the Gram matrix of those rows
within the dot-product bound ``gamma_m |Q1|^T |Q1|``.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import GPU

if not GPU:
    pytest.skip("no CUDA GPU visible", allow_module_level=True)
import cupy as cp
from mpqr.backends.cupy.right_solve import (
    GRAM_MAX_N,
    MAX_N,
    right_solve_gram,
    right_solve_twice,
    right_solve_upper,
    supports,
    supports_gram,
)


def _check(a, r, q):
    u = 2.0**-24 if q.dtype == cp.float32 else 2.0**-53
    a, r, q = (np.asarray(v.get(), dtype=np.longdouble) for v in (a, r, q))
    n = r.shape[0]
    gamma = n * u / (1 - n * u)
    res = np.abs(a - q @ r)
    bound = 2 * gamma * (np.abs(q) @ np.abs(r)) + np.finfo(np.float64).tiny
    assert np.all(res <= bound), float((res / bound).max())


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [1, 7, 32, 33, 64])
def test_kernel_rows_are_backward_stable(dtype, n):
    rng = np.random.default_rng(n)
    m = 1000 + 37  # not a multiple of the tile height
    r = np.triu(rng.standard_normal((n, n))) + 3 * np.eye(n)
    a = rng.standard_normal((m, n))
    ad, rd = cp.asarray(a, dtype=dtype), cp.asarray(r, dtype=dtype)
    q = right_solve_upper(ad, rd)
    assert q.dtype == dtype and q.flags.c_contiguous and q.shape == (m, n)
    _check(ad, rd, q)


def test_kernel_takes_column_slices_without_touching_the_input():
    rng = np.random.default_rng(0)
    full = cp.asarray(rng.standard_normal((513, 50)))
    before = full.copy()
    a = full[:, 10:42]  # row stride 50, unit column stride
    r = cp.asarray(np.triu(rng.standard_normal((32, 32))) + 3 * np.eye(32))
    q = right_solve_upper(a, r)
    _check(a, r, q)
    assert bool((full == before).all())


def test_support_rules_and_nan_propagation():
    assert not supports(cp.ones((10, MAX_N + 1)), cp.eye(MAX_N + 1))
    assert not supports(cp.ones((2, 10, 4)), cp.eye(4))
    assert not supports(cp.ones((10, 4), cp.complex128), cp.eye(4, dtype=cp.complex128))
    a = cp.ones((300, 4))
    a[17, 1] = cp.nan
    q = right_solve_upper(a, cp.eye(4) * 2)
    qh = q.get()
    assert np.isnan(qh[17, 1:]).all() and np.isfinite(np.delete(qh, 17, axis=0)).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_native_gemm_of_row_strided_views_matches_matmul(dtype):
    from mpqr.backends.cupy.backend import CupyBackend

    be = CupyBackend(cp)
    rng = np.random.default_rng(1)
    big = cp.asarray(rng.standard_normal((300, 90)), dtype=dtype)
    a, b = big[:, 10:50], big[20:60, 50:87]  # row-strided column blocks: no copy taken
    c = be.gemm(a, b)
    ref = np.asarray(a.get(), np.longdouble) @ np.asarray(b.get(), np.longdouble)
    u = 2.0**-24 if dtype == np.float32 else 2.0**-53
    bound = 2 * a.shape[1] * u * (np.abs(a.get()) @ np.abs(b.get()))
    assert c.dtype == dtype and c.flags.c_contiguous
    assert np.all(np.abs(c.get() - ref) <= bound)
    at = big[:40, :30].T  # a transposed view also goes straight to cuBLAS
    np.testing.assert_allclose(be.gemm(at, b[:40, :]).get(), (at @ b[:40, :]).get(),
                               rtol=64 * u, atol=64 * u * 40)


def _triu_factor(rng, n):
    return np.triu(rng.standard_normal((n, n))) + 3 * np.eye(n)


def _blocked_q1(a, r):
    n = r.shape[0]
    return right_solve_twice(a, r, cp.eye(n))  # solving with I is exact


@pytest.mark.parametrize("n", [1, 7, 16, 20, 32, 40, 64])
@pytest.mark.parametrize("m", [1037, 140_001])  # one partial tile; more tiles than blocks
def test_gram_kernel_is_the_gram_matrix_of_backward_stable_rows(n, m):
    rng = np.random.default_rng(n + m)
    a = cp.asarray(rng.standard_normal((m, n)))
    r = cp.asarray(_triu_factor(rng, n))
    before = a.copy()
    g = right_solve_gram(a, r)
    q1d = _blocked_q1(a, r)
    _check(a, r, q1d)
    q1 = q1d.get()
    ref = q1.T.astype(np.longdouble) @ q1.astype(np.longdouble)
    gamma = m * 2.0**-53 / (1 - m * 2.0**-53)
    bound = gamma * (np.abs(q1).T @ np.abs(q1)) + np.finfo(np.float64).tiny
    gh = g.get()
    assert g.dtype == cp.float64 and g.shape == (n, n)
    assert np.array_equal(gh, gh.T)
    assert np.all(np.abs(gh - ref) <= bound), float((np.abs(gh - ref) / bound).max())
    assert bool((a == before).all())


@pytest.mark.parametrize("n", [20, 48, 64])
def test_gram_kernel_stores_the_rows_whose_gram_matrix_it_forms(n):
    """``out``: the same pass writes ``a R^-1`` (bitwise the blocked solve's rows) and
    returns the same Gram matrix as without it."""
    rng = np.random.default_rng(n + 1)
    a = cp.asarray(rng.standard_normal((140_001, n)))
    r = cp.asarray(_triu_factor(rng, n))
    full = cp.zeros((140_001, n + 3))
    g = right_solve_gram(a, r, out=full[:, 1:n + 1])  # a column slice as the output
    assert bool((full[:, 1:n + 1] == _blocked_q1(a, r)).all())
    assert not bool(full[:, 0].any()) and not bool(full[:, n + 1:].any())
    assert bool((g == right_solve_gram(a, r)).all())


@pytest.mark.parametrize("n", [20, 64])
def test_gram_kernel_solves_a_minus_the_update(n):
    """``sub``: the pass solves ``a - sub`` (each difference rounded once, as the
    subtraction rounds it): bitwise the rows and Gram matrix of the same kernel on the
    formed difference, stored or not, ``a`` a column slice."""
    rng = np.random.default_rng(n + 2)
    full = cp.asarray(rng.standard_normal((140_001, n + 5)))
    a = full[:, 2:n + 2]
    t = cp.asarray(rng.standard_normal((140_001, n)))
    r = cp.asarray(_triu_factor(rng, n))
    out, ref = cp.empty((140_001, n)), cp.empty((140_001, n))
    g = right_solve_gram(a, r, out=out, sub=t)
    g_ref = right_solve_gram(a - t, r, out=ref)
    assert bool((out == ref).all()) and bool((g == g_ref).all())
    assert bool((right_solve_gram(a, r, sub=t) == g).all())


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [20, 64])
def test_row_kernel_solves_a_minus_the_update(dtype, n):
    """``sub`` of the row-per-thread kernel (a left-looking leaf): bitwise the solve of
    the formed ``a - sub``, ``a`` a column slice, written into a column slice of ``out``
    whose other columns stay untouched."""
    rng = np.random.default_rng(n + 9)
    m = 70_001
    full = cp.asarray(rng.standard_normal((m, n + 5)), dtype=dtype)
    a = full[:, 2:n + 2]
    t = cp.asarray(rng.standard_normal((m, n)), dtype=dtype)
    r = cp.asarray(_triu_factor(rng, n), dtype=dtype)
    ref = right_solve_upper(a - t, r)
    assert bool((right_solve_upper(a, r, sub=t) == ref).all())
    wide = cp.zeros((m, n + 7), dtype=dtype)
    right_solve_upper(a, r, out=wide[:, 3:n + 3], sub=t)
    assert bool((wide[:, 3:n + 3] == ref).all()) and not bool(wide[:, :3].any())
    assert not bool(wide[:, n + 3:].any())


@pytest.mark.parametrize("left", [True, False])
def test_blocked_solve_orders_at_256_columns(monkeypatch, left):
    """The blocked substitution at 256 columns, left-looking (each leaf's update one
    product, subtracted in the leaf's pass) or by halves: every row within
    substitution's backward-error bound, the input untouched."""
    from mpqr.backends import get_backend

    from mpqr._array_api import array_namespace
    from mpqr.qr import cholqr

    monkeypatch.setattr(cholqr, "LEFT_LOOKING", left)
    rng = np.random.default_rng(257)
    n, m = 256, 3001
    a = cp.asarray(rng.standard_normal((m, n)) * np.logspace(0, -10, n))
    a0 = a.copy()
    r = cp.asarray(np.linalg.qr(a.get())[1])
    w = cholqr.right_solve_upper(get_backend(array_namespace(a)), a, r)
    _check(a, r, w)
    assert bool((a == a0).all())


@pytest.mark.parametrize("fused", [False, True])
def test_blocked_solve_and_gram_at_256_columns(monkeypatch, fused):
    """The sketch route's ``W = A R^-1`` and ``W^T W`` at 256 columns (``fused``: 64-column
    fused leaves, each subtracting its accumulated update in its pass, cross products by
    GEMM): every row within substitution's backward-error bound, ``G`` the Gram matrix
    of the stored ``W``, exactly symmetric."""
    from mpqr.backends import get_backend

    from mpqr._array_api import array_namespace
    from mpqr.qr import cholqr
    from mpqr.qr.cholqr import right_solve_upper_gram

    monkeypatch.setattr(cholqr, "BLOCKED_GRAM_FUSED", fused)

    rng = np.random.default_rng(256)
    n, m = 256, 3001
    a = cp.asarray(rng.standard_normal((m, n)) * np.logspace(0, -10, n))
    r = cp.asarray(np.linalg.qr(a.get())[1])
    w, g = right_solve_upper_gram(get_backend(array_namespace(a)), a, r, "auto", "auto",
                                  "test")
    _check(a, r, w)
    wh = w.get().astype(np.longdouble)
    gamma = m * 2.0**-53 / (1 - m * 2.0**-53)
    gh = g.get()
    assert np.array_equal(gh, gh.T)
    assert np.all(np.abs(gh - wh.T @ wh) <= gamma * (np.abs(wh).T @ np.abs(wh)) * 2)


def test_gram_kernel_takes_column_slices_and_propagates_nan():
    rng = np.random.default_rng(3)
    full = cp.asarray(rng.standard_normal((2000, 40)))
    a = full[:, 5:29]  # row stride 40
    r = cp.asarray(_triu_factor(rng, 24))
    q1 = _blocked_q1(a, r).get()
    ref = q1.T @ q1
    np.testing.assert_allclose(right_solve_gram(a, r).get(), ref, rtol=1e-12,
                               atol=1e-12 * np.abs(ref).max())
    full[777, 10] = cp.nan  # column 5 of a: rows of Q1 from column 5 on are NaN
    g = right_solve_gram(a, r).get()
    assert np.isnan(g[5:, 5:]).all() and np.isfinite(g[:5, :5]).all()
    assert not supports_gram(cp.ones((10, GRAM_MAX_N + 1)))
    assert not supports_gram(cp.ones((10, 8), cp.float32))


@pytest.mark.parametrize("n", [1, 7, 16, 20, 32, 40, 64])
@pytest.mark.parametrize("m", [1037, 140_001])  # one partial tile; more tiles than blocks
def test_blocked_two_solve_kernel_rounds_the_intermediate_as_one_solve(n, m):
    rng = np.random.default_rng(n)
    a = cp.asarray(rng.standard_normal((m, n)))
    r1 = cp.asarray(_triu_factor(rng, n))
    r2 = cp.asarray(np.eye(n) + 0.01 * np.triu(rng.standard_normal((n, n))))
    q = right_solve_twice(a, r1, r2)
    q1 = _blocked_q1(a, r1)
    _check(a, r1, q1)
    _check(q1, r2, q)
    assert bool((q == right_solve_twice(q1, r2, cp.eye(n))).all())
    full = cp.zeros((m, n + 3))
    right_solve_twice(a, r1, r2, out=full[:, 2:n + 2])  # a column slice as the output
    assert bool((full[:, 2:n + 2] == q).all()) and not bool(full[:, :2].any())


# float64 up to GRAM_MAX_N columns takes the blocked kernel (above)
@pytest.mark.parametrize(("dtype", "n"), [(np.float32, 7), (np.float32, 32), (np.float32, 64)])
def test_row_wise_two_solve_kernel_equals_two_plain_solves_bitwise(dtype, n):
    rng = np.random.default_rng(n)
    a = cp.asarray(rng.standard_normal((1037, n)), dtype=dtype)
    r1 = cp.asarray(_triu_factor(rng, n), dtype=dtype)
    r2 = cp.asarray(np.eye(n) + 0.01 * np.triu(rng.standard_normal((n, n))), dtype=dtype)
    q = right_solve_twice(a, r1, r2)
    ref = right_solve_upper(right_solve_upper(a, r1), r2)
    assert q.dtype == dtype and q.shape == (1037, n)
    assert bool((q == ref).all())
