"""GPU tests of the TSQR tile kernels and the fused fp16 split (CuPy only).

Run on a GPU machine with ``python -m pytest -q tests/test_cupy_tsqr.py``.
Residuals are taken in extended precision on the host; the kernels are also
compared with their NumPy emulation (``tsqr_reference``), which uses the same
tiles, tree and sign conventions and so must agree to rounding.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import GPU

if not GPU:
    pytest.skip("no CUDA GPU visible", allow_module_level=True)
import cupy as cp
from mpqr.backends.cupy.backend import CupyBackend
from mpqr.backends.cupy.tsqr import MAX_N, plan_tree, tsqr, tsqr_reference

from mpqr.engines.tc_sgemm import LO_SHIFT

DTYPES = [np.float32, np.float64]


def _errors(a, q, r):
    """(backward error, orthogonality), residuals in extended precision."""
    ld = np.longdouble
    s = np.max(np.abs(a)) or 1.0
    a_, q_, r_ = (np.asarray(x, dtype=ld) for x in (a, q, r))
    n = a.shape[-1]
    res = ((a_ - q_ @ r_) / ld(s)).astype(np.float64)
    back = np.linalg.norm(res) / (np.linalg.norm(a.astype(np.float64) / s) or 1.0)
    eye = np.eye(n, dtype=ld)
    orth = np.linalg.norm((eye - np.swapaxes(q_, -1, -2) @ q_).astype(np.float64))
    return back, orth


def _tol(dtype, m, n):
    # O(n u) per Householder tile factorization, one more per tree level
    return 10 * (n + len(plan_tree(m, n))) * np.finfo(dtype).eps


def _check(a_host, q, r):
    m, n = a_host.shape[-2:]
    q_h, r_h = q.get(), r.get()
    assert q.shape == (m, n) and r.shape == (n, n)
    assert q.dtype == r.dtype == a_host.dtype
    assert np.all(np.tril(r_h, -1) == 0), "R not upper triangular"
    back, orth = _errors(a_host, q_h, r_h)
    tol = _tol(a_host.dtype, m, n)
    assert back <= tol, f"backward error {back:.3e} > {tol:.3e}"
    assert orth <= tol, f"orthogonality {orth:.3e} > {tol:.3e}"
    return q_h, r_h


@pytest.mark.parametrize("recompute", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 5, 32])
@pytest.mark.parametrize("m", [1, 31, 256, 257, 1000, 2**16 + 5])
def test_tsqr_factorizes(m, n, dtype, recompute):
    if m < n:
        pytest.skip("tsqr needs m >= n")
    a_h = np.random.default_rng(m * 7 + n).standard_normal((m, n)).astype(dtype)
    a = cp.asarray(a_h)
    a_before = a.copy()
    q, r = tsqr(a, recompute=recompute)
    cp.testing.assert_array_equal(a, a_before)  # input untouched
    q_h, r_h = _check(a_h, q, r)
    if m * n <= 40000:  # the emulation is a Python loop per tile
        q_ref, r_ref = tsqr_reference(a_h)
        tol = _tol(dtype, m, n) * max(1.0, np.linalg.cond(a_h.astype(np.float64)))
        np.testing.assert_allclose(r_h, r_ref, rtol=0, atol=tol * np.abs(r_ref).max())
        np.testing.assert_allclose(q_h, q_ref, rtol=0, atol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("m", "n"), [(300, 33), (5000, 48), (70000, 64), (64, 64)])
def test_tsqr_wide_panels_up_to_max_n(m, n, dtype):
    a_h = np.random.default_rng(n).standard_normal((m, n)).astype(dtype)
    q, r = tsqr(cp.asarray(a_h))
    _check(a_h, q, r)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 2, 700, 7), (100, 256, 32), (10, 1, 1), (4, 2**12 + 3, 32),
                                   (5, 40, 5)])
def test_tsqr_stacks_match_per_matrix(shape, dtype):
    a_h = np.random.default_rng(sum(shape)).standard_normal(shape).astype(dtype)
    q, r = tsqr(cp.asarray(a_h))
    q_h, r_h = q.get(), r.get()
    for idx in np.ndindex(*shape[:-2]):
        _check(a_h[idx], cp.asarray(q_h[idx]), cp.asarray(r_h[idx]))
        q1, r1 = tsqr(cp.asarray(a_h[idx]))
        # a stack member is factorized by the same kernels as a single matrix
        np.testing.assert_array_equal(q_h[idx], q1.get())
        np.testing.assert_array_equal(r_h[idx], r1.get())


def test_tsqr_non_contiguous_input():
    a_h = np.random.default_rng(0).standard_normal((40, 3000))
    a = cp.asarray(a_h).T  # F-ordered view, 3000 x 40
    q, r = tsqr(a)
    _check(a_h.T.copy(), q, r)


@pytest.mark.parametrize("scale", [1e-200, 1e-160, 1e160, 1e200])
def test_tsqr_extreme_scaling(scale):
    a_h = np.random.default_rng(3).standard_normal((3000, 8)) * scale
    q, r = tsqr(cp.asarray(a_h))
    assert bool(cp.all(cp.isfinite(q))) and bool(cp.all(cp.isfinite(r)))
    _check(a_h, q, r)


@pytest.mark.parametrize("dtype", DTYPES)
def test_tsqr_zero_and_rank_deficient(dtype):
    rng = np.random.default_rng(5)
    a_h = rng.standard_normal((3000, 6)).astype(dtype)
    a_h[:, 2] = 0
    a_h[:, 4] = a_h[:, 1]
    for mat in (a_h, np.zeros_like(a_h)):
        q, r = tsqr(cp.asarray(mat))
        _check(mat, q, r)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
@pytest.mark.parametrize("row", [0, 1500, 2999])
def test_tsqr_nan_inf_propagate(bad, row):
    a_h = np.random.default_rng(2).standard_normal((3000, 8))
    a_h[row, 5] = bad
    q, r = tsqr(cp.asarray(a_h))
    assert not (bool(cp.all(cp.isfinite(q))) and bool(cp.all(cp.isfinite(r))))


@pytest.mark.parametrize(
    ("a", "err", "match"),
    [
        (lambda: cp.ones((3, 5)), ValueError, "m >= n"),
        (lambda: cp.ones((1000, MAX_N + 1)), ValueError, f"at most {MAX_N} columns"),
        (lambda: cp.ones((10,)), ValueError, "at least 2 dimensions"),
        (lambda: cp.ones((10, 2), dtype=cp.int32), TypeError, "float32 or float64"),
        (lambda: np.ones((10, 2)), TypeError, "CuPy array"),
    ],
)
def test_tsqr_rejects_bad_input(a, err, match):
    with pytest.raises(err, match=match):
        tsqr(a())


def test_tsqr_empty():
    q, r = tsqr(cp.ones((0, 5, 3)))
    assert q.shape == (0, 5, 3) and r.shape == (0, 3, 3)


def test_qr_panel_dispatch():
    be = CupyBackend(cp)
    rng = np.random.default_rng(9)
    a_h = rng.standard_normal((5000, 32))
    q, r = be.qr_panel(cp.asarray(a_h))
    q2, r2 = tsqr(cp.asarray(a_h))
    cp.testing.assert_array_equal(q, q2)
    cp.testing.assert_array_equal(r, r2)
    wide = rng.standard_normal((2, 500, 100))  # beyond MAX_N: cuSOLVER per matrix
    q, r = be.qr_panel(cp.asarray(wide))
    assert q.shape == (2, 500, 100) and r.shape == (2, 100, 100)
    for i in range(2):
        back, orth = _errors(wide[i], q[i].get(), r[i].get())
        assert back <= 100 * 100 * np.finfo(float).eps and orth <= 100 * 100 * np.finfo(float).eps


def _split_reference(x, s):
    with np.errstate(all="ignore"):
        y = np.ldexp(x, s)
        hi = y.astype(np.float16)  # NumPy rounds float64 -> float16 correctly
        resid = y - hi.astype(x.dtype)
        resid = np.where(np.isfinite(resid), resid, 0).astype(x.dtype)
        lo = np.ldexp(resid, LO_SHIFT).astype(np.float16)
    return hi, lo


def _gpu_split(x, shift):
    be = CupyBackend(cp)
    hi = cp.empty(x.shape, cp.float16)
    hf = cp.empty(x.shape, cp.float16)
    lo = cp.empty(x.shape, cp.float16)
    be.split_fp16(cp.asarray(x), cp.asarray(shift), hi, hf=hf, lo=lo, lo_shift=LO_SHIFT)
    return hi.get(), hf.get(), lo.get()


def _same_bits(a, b):
    """Bitwise equal, with any NaN payload counting as the same NaN."""
    both_nan = np.isnan(a) & np.isnan(b)
    np.testing.assert_array_equal(np.where(both_nan, 0, a.view(np.uint16)),
                                  np.where(both_nan, 0, b.view(np.uint16)))


@pytest.mark.parametrize("dtype", DTYPES)
def test_scale_split_fp16_bitwise_vs_numpy(dtype):
    from mpqr.backends.numpy.backend import NumpyBackend

    rng = np.random.default_rng(4)
    x = (rng.standard_normal((300, 70)) * 2.0 ** rng.integers(-30, 30, (300, 70))).astype(dtype)
    x[0, 0], x[1, 1], x[2, 2], x[3, 3] = np.inf, -np.inf, np.nan, 0.0
    if dtype == np.float64:
        # ties after a float32 rounding: double rounding would get these wrong
        x[4, :3] = [1 + 2.0**-11 + 2.0**-40, 1 + 2.0**-11 - 2.0**-40, -(1 + 3 * 2.0**-11 + 2.0**-45)]
    else:
        x[5, :2] = [1e-40, -3e-42]  # float32 subnormals must survive (no flush to zero)
    nb = NumpyBackend(np)
    for shift in (rng.integers(-5, 15, (300, 1)).astype(np.int32),
                  rng.integers(-3, 3, (1, 70)).astype(np.int32)):
        ref = [np.empty(x.shape, np.float16) for _ in range(3)]
        nb.split_fp16(x, shift, ref[0], hf=ref[1], lo=ref[2], lo_shift=LO_SHIFT)
        for got, want in zip(_gpu_split(x, shift), ref):
            _same_bits(got, want)


def _extremes(rng, dtype):
    x = (rng.standard_normal((300, 70)) * 2.0 ** rng.integers(-30, 30, (300, 70))).astype(dtype)
    x[0, 0], x[1, 1], x[2, 2], x[3, 3] = np.inf, -np.inf, np.nan, 0.0
    x[10, :] = 0.0  # a zero row: shift 0
    x[:, 11] = np.nan  # no finite entry: shift 0
    tiny = 1e-310 if dtype == np.float64 else 1e-40  # a subnormal maximum
    x[12, :], x[:, 13] = 0.0, 0.0
    x[12, 5], x[20, 13] = tiny, -tiny
    return x


@pytest.mark.parametrize("shape", [(5, 70), (300, 33), (40000, 3), (2000, 1100), (17, 1)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_strided_max_matches_numpy(shape, dtype):
    """The maxima along a strided axis (runs of rows a thread, a block's runs combined,
    one atomic a column and block) are NumPy's largest finite |x|, for runs shorter than
    a block's and many blocks a column, C arrays and transposed views."""
    from mpqr.backends.cupy import engine_kernels as ek

    rng = np.random.default_rng(9)
    x = (rng.standard_normal(shape) * 2.0 ** rng.integers(-30, 30, shape)).astype(dtype)
    x.flat[::7] = -np.inf
    x.flat[3::11] = np.nan
    x[:, 0] = -0.0  # a column of negative zeros: maximum +0
    if shape[1] > 2:
        x[:, 2] = np.nan  # no finite entry: 0
    x[-1, -1] = np.finfo(dtype).max
    fin = np.where(np.isfinite(x), np.abs(x), 0.0).astype(np.float64)
    for arr, ax in ((x, 0), (x.T, 1)):
        got = ek.max_abs_finite(cp.asarray(x) if arr is x else cp.asarray(x).T, ax)
        want = fin.max(axis=0)
        assert got.dtype == cp.float64
        assert got.shape == ((1, shape[1]) if ax == 0 else (shape[1], 1))
        np.testing.assert_array_equal(got.get().ravel(), want)
        assert not np.signbit(got.get()).any()


@pytest.mark.parametrize("dtype", DTYPES)
def test_pow2_shift_bitwise_vs_numpy(dtype):
    """The fused shift (one reduction, one elementwise launch) is the NumPy backend's."""
    from mpqr.backends.numpy.backend import NumpyBackend

    from mpqr.engines.tc_fp16 import FP16_TARGET_EXP

    x = _extremes(np.random.default_rng(5), dtype)
    nb, gb = NumpyBackend(np), CupyBackend(cp)
    for axis in (-1, -2, 0, 1):
        want = nb.pow2_shift(x, axis, FP16_TARGET_EXP)
        got = gb.pow2_shift(cp.asarray(x), axis, FP16_TARGET_EXP)
        assert got.dtype == cp.int32 and got.shape == want.shape
        np.testing.assert_array_equal(got.get(), want)


