"""mpqr.lstsq against scipy.linalg.lstsq itself, corner by corner.

Tolerances follow SciPy's own lstsq tests: 25 eps of the dtype (500 eps for
float32 square systems), scaled by the condition number of the test matrix.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg as sla

import mpqr
from tests._support import assert_rank_deficient_residues, to_numpy

DTYPES = [np.float32, np.float64, np.complex64, np.complex128]
SHAPES = [(12, 5), (5, 12), (7, 7)]


def _rand(rng, shape, dtype):
    x = rng.standard_normal(shape)
    if np.issubdtype(dtype, np.complexfloating):
        x = x + 1j * rng.standard_normal(shape)
    return x.astype(dtype)


def _eps(dtype):
    return np.finfo(dtype).eps


def _check_against_scipy(out, ref, a, *, factor=25.0):
    x, res, rank, s = (to_numpy(v) if v is not None and not isinstance(v, (int, np.integer))
                       else v for v in out)
    assert isinstance(out[1], type(out[0]))  # residues is an array of the caller's library
    xs, ress, ranks, ss = ref
    assert x.dtype == xs.dtype and x.shape == xs.shape
    kappa = ss[0] / ss[-1] if ss.size and ss[-1] > 0 else 1.0
    tol = factor * _eps(xs.dtype) * kappa
    np.testing.assert_allclose(x, xs, rtol=tol, atol=tol * np.abs(xs).max())
    # the rank's type as the installed SciPy gives it for NumPy results (a NumPy integer
    # from 1.18 on), a Python int for other libraries' results
    assert rank == ranks and (type(rank) is type(ranks) if isinstance(out[0], np.ndarray)
                              else isinstance(rank, int))
    # SciPy < 1.17 returns complex residues for complex input, 1.17 real ones:
    # mpqr follows 1.17; compare the precision and the (real) values
    assert res.shape == np.shape(ress) and res.real.dtype == np.asarray(ress).real.dtype
    if np.size(ress):
        np.testing.assert_allclose(res.real, np.real(ress), rtol=tol * kappa)
    assert s.dtype == ss.dtype and s.shape == ss.shape
    np.testing.assert_allclose(s, ss, rtol=0, atol=factor * _eps(ss.dtype) * ss[0])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("nrhs", [None, 3])
def test_matches_scipy(xp, dtype, shape, nrhs):
    rng = np.random.default_rng(hash((shape, nrhs)) % 2**32)
    a = _rand(rng, shape, dtype)
    b = _rand(rng, (shape[0],) if nrhs is None else (shape[0], nrhs), dtype)
    ref = sla.lstsq(a, b)
    ax, bx = xp.asarray(a), xp.asarray(b)
    out = mpqr.lstsq(ax, bx)
    factor = 500.0 if dtype == np.float32 and shape[0] == shape[1] else 25.0
    _check_against_scipy(out, ref, a, factor=factor)
    # inputs untouched (numpy_readonly would also raise on a write)
    np.testing.assert_array_equal(to_numpy(ax), a)
    np.testing.assert_array_equal(to_numpy(bx), b)


@pytest.mark.parametrize("driver", ["gelsd", "gelss", "gelsy"])
def test_driver_semantics(xp, driver):
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((9, 4)), rng.standard_normal((9, 2))
    ref = sla.lstsq(a, b, lapack_driver=driver)
    x, res, rank, s = mpqr.lstsq(xp.asarray(a), xp.asarray(b), lapack_driver=driver)
    np.testing.assert_allclose(to_numpy(x), ref[0], rtol=25 * _eps(np.float64) * 10)
    assert rank == ref[2]
    assert to_numpy(res).shape == ref[1].shape and to_numpy(res).dtype == ref[1].dtype
    if driver == "gelsy":
        assert s is None and ref[3] is None
    else:
        np.testing.assert_allclose(to_numpy(s), ref[3], rtol=1e-13)


def test_gelsy_complex_residues_dtype():
    a = (np.arange(12.0).reshape(6, 2) + 1j).astype(np.complex128) + np.eye(6, 2)
    b = np.ones(6, np.complex128)
    for drv in ("gelsy", "gelsd"):
        ref = sla.lstsq(a[:2, :], b[:2], lapack_driver=drv)  # square: residues empty
        out = mpqr.lstsq(a[:2, :], b[:2], lapack_driver=drv)
        assert out[1].dtype == ref[1].dtype == np.complex128 and out[1].shape == (0,)


def test_unknown_driver():
    with pytest.raises(ValueError, match='LAPACK driver "foo" is not found'):
        mpqr.lstsq(np.eye(3), np.ones(3), lapack_driver="foo")
    # SciPy answers empty problems before validating the driver
    x, _res, rank, _s = mpqr.lstsq(np.ones((0, 2)), np.ones(0), lapack_driver="foo")
    assert x.shape == (2,) and rank == 0


@pytest.mark.parametrize("m,n", [(0, 0), (0, 3), (3, 0)])
@pytest.mark.parametrize("bshape", ["1d", (2,), (0,)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64, np.int64])
def test_empty_like_scipy(xp, m, n, bshape, dtype):
    a = np.ones((m, n), dtype=dtype)
    b = np.arange(m, dtype=dtype) if bshape == "1d" else \
        np.arange(m * bshape[0], dtype=dtype).reshape(m, bshape[0])
    ref = sla.lstsq(a, b)
    out = mpqr.lstsq(xp.asarray(a), xp.asarray(b))
    for got, want in zip(out, ref):
        if isinstance(want, int):
            assert got == want
            continue
        g = to_numpy(got)
        assert g.shape == np.shape(want) and g.dtype == np.asarray(want).dtype
        np.testing.assert_array_equal(g, want)


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.int64, np.uint8, np.bool_,
                                   np.float16])
def test_dtype_casting_like_scipy(dtype):
    a = (np.arange(12).reshape(4, 3) % 5 + np.eye(4, 3) * 3).astype(dtype)
    b = (np.arange(4) % 2).astype(dtype)
    ref = sla.lstsq(a, b)
    out = mpqr.lstsq(a, b)
    assert out[0].dtype == ref[0].dtype and out[3].dtype == ref[3].dtype
    assert out[2] == ref[2]
    tol = 25 * _eps(ref[0].dtype) * (ref[3][0] / ref[3][-1] if ref[2] == 3 else 1e3)
    np.testing.assert_allclose(out[0], ref[0], rtol=tol, atol=tol)


def test_mixed_dtypes_promote_like_scipy():
    a32 = np.eye(5, 3, dtype=np.float32) + 1
    for b in (np.ones(5, np.float64), np.ones(5, np.complex64), np.ones(5, np.int64)):
        assert mpqr.lstsq(a32, b)[0].dtype == sla.lstsq(a32, b)[0].dtype
    assert mpqr.lstsq(a32.astype(np.complex64), np.ones(5))[0].dtype == np.complex128


def _low_rank(rng, m, n, r, dtype=np.float64):
    return (rng.standard_normal((m, r)) @ rng.standard_normal((r, n))).astype(dtype)


@pytest.mark.parametrize("m,n", [(15, 6), (6, 15), (8, 8)])
def test_rank_deficient_minimum_norm(xp, m, n):
    rng = np.random.default_rng(m * 100 + n)
    a = _low_rank(rng, m, n, 3)
    b = rng.standard_normal((m, 2))
    cond = 1e-10
    ref = sla.lstsq(a, b, cond=cond)
    x, res, rank, s = mpqr.lstsq(xp.asarray(a), xp.asarray(b), cond=cond)
    assert rank == ref[2] == 3
    if m > n:
        assert_rank_deficient_residues(res, ref[1])
    else:
        assert to_numpy(res).shape == (0,)
    sv = ref[3]
    tol = 25 * _eps(np.float64) * sv[0] / sv[2]
    np.testing.assert_allclose(to_numpy(x), ref[0], rtol=tol, atol=tol * np.abs(ref[0]).max())
    np.testing.assert_allclose(to_numpy(s), sv, atol=25 * _eps(np.float64) * sv[0])


def test_rank_deficient_default_cond_exact_zero_column(xp):
    a = np.array([[1.0, 0.0, 2.0], [3.0, 0.0, 1.0], [0.0, 0.0, 1.0], [1.0, 0.0, 1.0]])
    b = np.array([1.0, 2.0, 3.0, 4.0])
    ref = sla.lstsq(a, b)
    x, res, rank, _s = mpqr.lstsq(xp.asarray(a), xp.asarray(b))
    assert rank == ref[2] == 2
    assert_rank_deficient_residues(res, ref[1])
    np.testing.assert_allclose(to_numpy(x), ref[0], rtol=1e-13, atol=1e-14)
    assert to_numpy(x)[1] == 0.0  # the minimum-norm solution, not just a solution


def test_zero_matrix():
    x, _res, rank, s = mpqr.lstsq(np.zeros((4, 3)), np.ones(4))
    ref = sla.lstsq(np.zeros((4, 3)), np.ones(4))
    assert rank == ref[2] == 0
    np.testing.assert_array_equal(x, ref[0])
    np.testing.assert_array_equal(s, ref[3])


@pytest.mark.parametrize("cond", [None, -1.0, 1e-3, 0.5])
def test_cond_cutoff(cond):
    rng = np.random.default_rng(5)
    u, _ = np.linalg.qr(rng.standard_normal((10, 4)))
    v, _ = np.linalg.qr(rng.standard_normal((4, 4)))
    a = (u * np.array([1.0, 0.1, 1e-2, 1e-5])) @ v.T
    b = rng.standard_normal(10)
    try:
        ref = sla.lstsq(a, b, cond=cond)
    except ValueError as exc:  # SciPy >= 1.18 refuses a negative cond: so does mpqr
        assert cond is not None and cond < 0, exc
        with pytest.raises(ValueError, match="must be >= 0 or None"):
            mpqr.lstsq(a, b, cond=cond)
        return
    out = mpqr.lstsq(a, b, cond=cond)
    assert out[2] == ref[2]
    np.testing.assert_allclose(out[0], ref[0], rtol=1e-9, atol=1e-9 * np.abs(ref[0]).max())


def test_batched_like_scipy():
    rng = np.random.default_rng(9)
    a = rng.standard_normal((2, 6, 3))
    for b in (rng.standard_normal(6), rng.standard_normal((2, 6, 1)), rng.standard_normal((6, 2))):
        ref = sla.lstsq(a, b)
        out = mpqr.lstsq(a, b)
        np.testing.assert_allclose(out[0], ref[0], rtol=1e-13, atol=1e-14)
        np.testing.assert_allclose(out[1], ref[1], rtol=1e-12)
        np.testing.assert_array_equal(out[2], ref[2])
        np.testing.assert_allclose(out[3], ref[3], rtol=1e-13)
    with pytest.raises(ValueError, match=r"Shape mismatch: a and b should have the same number of rows \(6 != 2\)\."):
        mpqr.lstsq(a, rng.standard_normal((2, 6)))
    assert mpqr.lstsq(a, rng.standard_normal(6), lapack_driver="gelsy")[3] is None
    with pytest.raises(ValueError, match="`lstsq` does not support zero-size batches."):
        mpqr.lstsq(np.ones((0, 3, 2)), np.ones(3))


def test_shape_errors():
    with pytest.raises(ValueError, match="Input array a should be 2D"):
        mpqr.lstsq(np.ones(3), np.ones(3))
    with pytest.raises(ValueError, match=r"Shape mismatch: a and b should have the same number of rows \(3 != 4\)\."):
        mpqr.lstsq(np.ones((3, 2)), np.ones(4))
    with pytest.raises(ValueError, match="`b` must be 1-D or 2-D"):
        mpqr.lstsq(np.ones((3, 2)), np.asarray(1.0))


def test_check_finite(xp):
    a = np.eye(3, 2)
    bad = np.array([1.0, np.inf, 0.0])
    with pytest.raises(ValueError, match=r"array must not contain infs or NaNs \(`b`\)"):
        mpqr.lstsq(xp.asarray(a), xp.asarray(bad))
    with pytest.raises(ValueError, match=r"array must not contain infs or NaNs \(`a`\)"):
        mpqr.lstsq(xp.asarray(np.full((3, 2), np.nan)), xp.asarray(np.ones(3)))
    # unchecked: Inf/NaN in b never become a finite-looking x
    x = to_numpy(mpqr.lstsq(xp.asarray(a), xp.asarray(bad), check_finite=False)[0])
    assert not np.all(np.isfinite(x))
    with pytest.raises(mpqr.LinAlgError, match="`a` contains NaN or Inf"):
        mpqr.lstsq(xp.asarray(np.full((3, 2), np.nan)), xp.asarray(np.ones(3)),
                   check_finite=False)


def test_argument_errors():
    a, b = np.eye(3), np.ones(3)
    with pytest.raises(ValueError, match="`refine` must be one of 'auto', 'cgls', 'ir' or None; got 'lsqr'"):
        mpqr.lstsq(a, b, refine="lsqr")
    with pytest.raises(ValueError, match="`precision` must be one of"):
        mpqr.lstsq(a, b, precision="fp8")
    with pytest.raises(ValueError, match="`tol` must be a positive number, got -1"):
        mpqr.lstsq(a, b, tol=-1)
    with pytest.raises(ValueError, match="`maxiter` must be a positive integer, got 0"):
        mpqr.lstsq(a, b, maxiter=0)
    with pytest.raises(TypeError, match="`a` must be an array"):
        mpqr.lstsq([[1.0]], np.ones(1))


def test_inputs_untouched_with_overwrite_false():
    rng = np.random.default_rng(2)
    a = np.asfortranarray(rng.standard_normal((8, 3)))
    b = rng.standard_normal(8)
    a0, b0 = a.copy(), b.copy()
    for refine in ("auto", None):
        mpqr.lstsq(a, b, refine=refine)
    np.testing.assert_array_equal(a, a0)
    np.testing.assert_array_equal(b, b0)


def test_trace_records_path():
    # above the small-input size (test_fast_path.py: LAPACK's driver directly below it)
    rng = np.random.default_rng(4)
    with mpqr.explain() as trace:
        mpqr.lstsq(rng.standard_normal((3000, 40)), rng.standard_normal(3000))
    ev = [e for e in trace.events if e.kind == "refine"]
    assert ev and ev[0].data["method"] == "cgls" and ev[0].data["converged"]
    assert all(g.label.startswith(("lstsq:", "panel", "tsqr", "rec", "tile", "qr"))
               for g in trace.gemms)
    assert any(g.label.startswith("lstsq:") for g in trace.gemms)
