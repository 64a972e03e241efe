"""CPU checks of the TSQR tree and tile arithmetic the CuPy kernels implement.

``mpqr.backends.cupy.tsqr`` plans the tree (``plan_tree``) and emulates the
tile kernel (``householder_tile`` / ``apply_householder``) in NumPy; these
tests run them against LAPACK (numpy.linalg.qr) and against residuals taken
in extended precision, so the tree, the tile bounds and the Q assembly the GPU
uses are tested in CI without a GPU.
"""

from __future__ import annotations

import numpy as np
import pytest
from mpqr.backends.cupy.tsqr import (
    MAX_N,
    TILE_ROWS,
    apply_householder,
    householder_tile,
    plan_tree,
    tsqr_reference,
)

SHAPES = [(1, 1), (31, 5), (256, 32), (257, 32), (1000, 5), (1000, 1), (3000, 32), (600, 64),
          (5000, 33), (70000, 2)]


def _errors(a, q, r):
    """(backward error, orthogonality) in extended precision: the residuals we
    measure are O(u) of the working precision, so they must not be computed in it."""
    ld = np.longdouble
    s = np.max(np.abs(a)) or 1.0  # norms of 1e-200-sized entries underflow: rescale first
    a_, q_, r_ = (np.asarray(x, dtype=ld) for x in (a, q, r))
    n = a.shape[-1]
    res = ((a_ - q_ @ r_) / ld(s)).astype(np.float64)
    back = np.linalg.norm(res) / (np.linalg.norm(a.astype(np.float64) / s) or 1.0)
    orth = np.linalg.norm((np.eye(n, dtype=ld) - np.swapaxes(q_, -1, -2) @ q_).astype(np.float64))
    return back, orth


def _tol(dtype, n, levels):
    # Householder QR of a tile: backward error O(n u); each tree level adds one
    # more tile factorization and one product with an orthogonal factor.
    return 10 * (n + levels) * np.finfo(dtype).eps


@pytest.mark.parametrize(("m", "n"), [*SHAPES, (255, 32), (513, 17), (100000, 64)])
def test_plan_tiles_cover_rows_and_fit_one_block(m, n):
    levels = plan_tree(m, n)
    assert levels[0].unit == 1 and levels[0].rows == m
    assert levels[-1].ntiles == 1
    for lvl, below in zip(levels[1:], levels[:-1]):
        assert lvl.unit == n and lvl.rows == below.ntiles * n
    for lvl in levels:
        nxt = 0
        for t in range(lvl.ntiles):
            start, rows = lvl.bounds(t)
            assert start == nxt  # contiguous, in order
            assert n <= rows <= TILE_ROWS  # fits one thread block, at least n rows
            assert rows % lvl.unit == 0
            nxt = start + rows
        assert nxt == lvl.rows
        assert lvl.max_tile_rows == max(lvl.bounds(t)[1] for t in range(lvl.ntiles))


@pytest.mark.parametrize(("m", "n", "match"), [(3, 5, "m >= n"), (100, 0, "1 <= n"),
                                               (1000, MAX_N + 1, "1 <= n")])
def test_plan_rejects_unsupported_shapes(m, n, match):
    with pytest.raises(ValueError, match=match):
        plan_tree(m, n)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("rows", "n"), [(1, 1), (7, 7), (40, 5), (256, 32), (129, 64)])
def test_tile_householder_matches_lapack(rows, n, dtype):
    """Same conventions as dgeqrf/dorgqr: R and Q agree with numpy.linalg.qr, signs included."""
    a = np.random.default_rng(rows * 100 + n).standard_normal((rows, n)).astype(dtype)
    compact, tau = householder_tile(a)
    q = apply_householder(compact, tau, None)
    q_np, r_np = np.linalg.qr(a.astype(np.float64))
    cond = np.linalg.cond(a.astype(np.float64))
    tol = 10 * n * np.finfo(dtype).eps * cond
    np.testing.assert_allclose(np.triu(compact[:n]), r_np, rtol=0, atol=tol * np.abs(r_np).max())
    np.testing.assert_allclose(q, q_np, rtol=0, atol=tol)
    assert np.all(np.abs(tau) <= 2) and np.all(tau >= 0)  # LAPACK: 1 <= tau <= 2 or tau = 0


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_apply_to_parent_block_is_q_times_c(dtype):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((200, 6)).astype(dtype)
    c = rng.standard_normal((6, 6)).astype(dtype)
    compact, tau = householder_tile(a)
    q = apply_householder(compact, tau, None)
    got = apply_householder(compact, tau, c)
    want = q.astype(np.float64) @ c.astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=0, atol=20 * 6 * np.finfo(dtype).eps * np.abs(c).max())


@pytest.mark.parametrize("tile", ["householder", "numpy"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("m", "n"), SHAPES)
def test_reference_tree_is_a_qr_factorization(m, n, dtype, tile):
    if tile == "householder" and m * n > 200000:
        pytest.skip("the pure-Python tile loop is slow; the numpy tile covers this size")
    a = np.random.default_rng(m + n).standard_normal((m, n)).astype(dtype)
    a0 = a.copy()
    q, r = tsqr_reference(a, tile=tile)
    assert q.shape == (m, n) and r.shape == (n, n) and q.dtype == r.dtype == dtype
    np.testing.assert_array_equal(a, a0)  # input untouched
    assert np.all(np.tril(r, -1) == 0)
    back, orth = _errors(a, q, r)
    tol = _tol(dtype, n, len(plan_tree(m, n)))
    assert back <= tol, (back, tol)
    assert orth <= tol, (orth, tol)


@pytest.mark.parametrize(("m", "n"), [(257, 32), (3000, 7)])
def test_reference_r_equals_lapack_r_up_to_row_signs(m, n):
    a = np.random.default_rng(7).standard_normal((m, n))
    _, r = tsqr_reference(a)
    _, r_np = np.linalg.qr(a)
    signs = np.sign(np.diag(r)) * np.sign(np.diag(r_np))
    cond = np.linalg.cond(a)
    np.testing.assert_allclose(signs[:, None] * r, r_np, rtol=0,
                               atol=10 * n * np.finfo(float).eps * cond * np.abs(r_np).max())


def test_reference_handles_stacks():
    a = np.random.default_rng(3).standard_normal((2, 3, 700, 4))
    q, r = tsqr_reference(a, tile="numpy")
    assert q.shape == a.shape and r.shape == (2, 3, 4, 4)
    for idx in np.ndindex(2, 3):
        q1, r1 = tsqr_reference(a[idx], tile="numpy")
        np.testing.assert_array_equal(q[idx], q1)
        np.testing.assert_array_equal(r[idx], r1)


@pytest.mark.parametrize("scale", [1e-200, 1e-160, 1.0, 1e160, 1e200])
def test_reference_tiles_survive_extreme_scaling(scale):
    """Sums of squares that under/overflow take the rescaled path, as in the kernel."""
    a = np.random.default_rng(11).standard_normal((600, 5)) * scale
    q, r = tsqr_reference(a)
    assert np.all(np.isfinite(q)) and np.all(np.isfinite(r))
    back, orth = _errors(a, q, r)
    tol = _tol(np.float64, 5, 2)
    assert back <= tol and orth <= tol, (back, orth)


def test_reference_zero_and_rank_deficient_columns():
    rng = np.random.default_rng(5)
    a = rng.standard_normal((700, 6))
    a[:, 2] = 0.0
    a[:, 4] = a[:, 1]
    tol = _tol(np.float64, 6, 2)
    for mat in (a, np.zeros((700, 6))):
        q, r = tsqr_reference(mat)
        back, orth = _errors(mat, q, r)
        assert back <= tol and orth <= tol, (back, orth)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_reference_nan_inf_are_not_hidden(bad):
    a = np.random.default_rng(2).standard_normal((1000, 4))
    a[517, 2] = bad
    q, r = tsqr_reference(a)
    assert not (np.all(np.isfinite(q)) and np.all(np.isfinite(r)))
