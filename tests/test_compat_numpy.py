"""mpqr.compat.numpy follows numpy.linalg's rules (rcond, residuals, dtypes, errors)."""

from __future__ import annotations

import re
import warnings

import mpqr.compat.numpy as mcn
import numpy as np
import pytest


@pytest.mark.parametrize("shape", [(12, 4), (4, 12), (6, 6)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64, np.int32])
@pytest.mark.parametrize("k", [None, 2])
def test_lstsq_like_numpy(shape, dtype, k):
    rng = np.random.default_rng(0)
    a = (rng.standard_normal(shape) * 4).astype(dtype)
    b = (rng.standard_normal((shape[0],) if k is None else (shape[0], k)) * 4).astype(dtype)
    ref = np.linalg.lstsq(a, b)
    out = mcn.lstsq(a, b)
    for got, want in zip(out, ref):
        assert np.shape(got) == np.shape(want) and np.asarray(got).dtype.kind == np.asarray(want).dtype.kind
    assert out[0].dtype == ref[0].dtype and out[1].dtype == ref[1].dtype
    assert out[2] == ref[2]
    kappa = ref[3][0] / ref[3][-1]
    tol = 25 * np.finfo(ref[0].dtype).eps * kappa
    np.testing.assert_allclose(out[0], ref[0], rtol=tol, atol=tol * np.abs(ref[0]).max())
    np.testing.assert_allclose(out[1], ref[1], rtol=tol * kappa)
    np.testing.assert_allclose(out[3], ref[3], rtol=tol)


def test_default_rcond_is_eps_max_mn():
    # singular value 1e-14: above SciPy's eps cutoff, below NumPy's eps * max(M, N)
    rng = np.random.default_rng(1)
    u, _ = np.linalg.qr(rng.standard_normal((200, 3)))
    a = (u * np.array([1.0, 1.0, 1e-14])) @ np.eye(3)
    b = rng.standard_normal(200)
    assert mcn.lstsq(a, b)[2] == np.linalg.lstsq(a, b)[2] == 2
    assert mcn.lstsq(a, b, rcond=1e-16)[2] == np.linalg.lstsq(a, b, rcond=1e-16)[2] == 3


@pytest.mark.parametrize("shape,bshape", [((0, 3), (0,)), ((3, 0), (3,)), ((0, 0), (0,)),
                                          ((3, 0), (3, 2)), ((0, 3), (0, 2))])
def test_lstsq_empty_like_numpy(shape, bshape):
    a, b = np.ones(shape), np.ones(bshape)
    ref, out = np.linalg.lstsq(a, b), mcn.lstsq(a, b)
    for got, want in zip(out, ref):
        np.testing.assert_array_equal(got, want)
        assert np.shape(got) == np.shape(want)


def test_lstsq_errors_like_numpy():
    with pytest.raises(np.linalg.LinAlgError, match="Incompatible dimensions"):
        mcn.lstsq(np.eye(3, 4), np.ones(4))
    with pytest.raises(np.linalg.LinAlgError, match="1-dimensional array given. Array must be two-dimensional"):
        mcn.lstsq(np.ones(3), np.ones(3))
    with pytest.raises(np.linalg.LinAlgError, match="SVD did not converge in Linear Least Squares"):
        mcn.lstsq(np.full((3, 3), np.nan), np.ones(3))
    with pytest.raises(TypeError, match="array type float16 is unsupported in linalg"):
        mcn.lstsq(np.eye(3, dtype=np.float16), np.ones(3))


@pytest.mark.parametrize("mode", ["reduced", "complete", "r"])
@pytest.mark.parametrize("shape", [(6, 3), (3, 6), (2, 5, 4), (0, 3)])
def test_qr_like_numpy(mode, shape):
    a = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
    ref, out = np.linalg.qr(a, mode=mode), mcn.qr(a, mode=mode)
    if mode == "r":
        assert out.shape == ref.shape and out.dtype == ref.dtype
        np.testing.assert_allclose(np.abs(out), np.abs(ref), atol=1e-5)
        return
    assert type(out).__name__ == "QRResult" and out.Q.dtype == ref.Q.dtype
    assert out.Q.shape == ref.Q.shape and out.R.shape == ref.R.shape
    np.testing.assert_allclose(np.abs(out.R), np.abs(ref.R), atol=1e-5)
    np.testing.assert_allclose(out.Q @ out.R, a, atol=1e-5)


def test_qr_errors_and_raw():
    with pytest.raises(ValueError, match="Unrecognized mode 'x'"):
        mcn.qr(np.eye(2), mode="x")
    with pytest.raises(np.linalg.LinAlgError, match="1-dimensional array given"):
        mcn.qr(np.ones(3))



@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (2, 6, 4), (0, 3), (3, 0)])
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.complex128, np.int64])
def test_qr_raw_is_numpys_layout_from_mpqrs_reflectors(shape, dtype):
    """``mode="raw"``: NumPy's shapes and dtypes (``h`` the transposed LAPACK array,
    ``(..., N, M)``); LAPACK's ``orgqr`` of the reflectors gives the ``Q`` of mpqr's other
    modes (the same signs) to working precision, and ``triu(h^T)`` its ``R``."""
    import scipy.linalg.lapack as lapack

    rng = np.random.default_rng(sum(shape))
    a = rng.standard_normal(shape)
    if dtype is np.complex128:
        a = a + 1j * rng.standard_normal(shape)
    a = a.astype(dtype)
    h, tau = mcn.qr(a, mode="raw")
    h0, tau0 = np.linalg.qr(a, mode="raw")
    assert (h.shape, h.dtype, tau.shape, tau.dtype) == (h0.shape, h0.dtype, tau0.shape,
                                                         tau0.dtype)
    if a.ndim != 2 or 0 in shape:
        return
    m, n = shape
    k = min(m, n)
    ref = mcn.qr(a)
    lapack_h = np.array(np.swapaxes(h, -1, -2), order="F")
    orgqr = lapack.zungqr if np.iscomplexobj(h) else lapack.dorgqr
    q, _, info = orgqr(lapack_h[:, :k].astype(ref.Q.dtype), tau.astype(ref.Q.dtype))
    assert info == 0
    u = np.finfo(h.dtype).eps
    np.testing.assert_allclose(q, ref.Q, atol=10 * max(m, n) * u)
    np.testing.assert_allclose(np.triu(lapack_h[:k, :]), ref.R, atol=10 * max(m, n) * u * 10)


def _scaled_permutation(dtype, f):
    """6 x 4, singular values 1, 1, 1 and ``f * 2**-53`` exactly (one nonzero per column,
    which every QR and SVD keeps exact)."""
    a = np.zeros((6, 4), dtype)
    for col, (row, v) in enumerate(zip([2, 0, 5, 3], [1.0, -1.0, 1.0, f * 2.0**-53])):
        a[row, col] = v
    return a


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.complex128, np.complex64])
def test_rcond_that_lapack_reads_as_epsilon_cuts_at_2_to_the_minus_53_as_numpy(dtype):
    """NumPy hands ``rcond`` to LAPACK's gelsd in double precision (single-precision input
    too), whose xLALSD reads ``rcond <= 0`` and ``rcond >= 1`` as EPSILON = 2**-53 (not
    2**-52): a singular value of 1.5 * 2**-53 counts, one of 0.5 * 2**-53 does not."""
    b = np.arange(1.0, 7.0).astype(dtype)
    for f, rank in [(1.5, 4), (0.5, 3)]:
        a = _scaled_permutation(dtype, f)
        for rcond in (-1, -0.5, -1e-300, -(2.0**-60), 0.0, 1.0, 2.0):
            x, res, got, s = mcn.lstsq(a, b, rcond=rcond)
            xn, resn, want, sn = np.linalg.lstsq(a, b, rcond=rcond)
            assert got == want == rank, (f, rcond, got, want)
            u = float(np.finfo(np.dtype(dtype)).eps) / 2
            np.testing.assert_allclose(s, sn, rtol=4 * u)
            np.testing.assert_allclose(x, xn, rtol=4 * u)
            assert res.shape == resn.shape


def _numpy_error(f, *args):
    with pytest.raises(TypeError) as theirs:
        f(*args)
    return str(theirs.value)


@pytest.mark.parametrize("bad", [np.array([[1.0, 2.0], [3.0, 4.0]], dtype=object),
                                 np.array([["a", "b"], ["c", "d"]])])
@pytest.mark.parametrize("b", [np.ones(2), np.ones(2) + 1j, np.ones(2, dtype=np.float32)])
def test_lstsq_without_a_numpy_loop_gets_numpys_type_error(bad, b):
    """Object and text arrays: NumPy's ``TypeError`` (its gufunc has no loop), the dtype
    it would cast to (complex where ``b`` is), the argument named after it."""
    for args, name in (((bad, b), "a"), ((np.ones((2, 2)), bad[:, 0]), "b")):
        want = _numpy_error(np.linalg.lstsq, *args)
        with pytest.raises(TypeError) as ours:
            mcn.lstsq(*args)
        if want.startswith("Cannot cast ufunc"):  # NumPy's wording since 1.x
            assert str(ours.value) == f"{want} (`{name}`)"
        else:  # pragma: no cover - another NumPy's wording: the dtype is named
            assert repr(args[name == "b"].dtype) in str(ours.value)


def test_qr_raw_of_non_finite_input_warns_as_numpy_does():
    """NaN and Inf pass through ``mode="raw"`` without NumPy's floating-point warnings,
    as NumPy's own LAPACK call passes them."""
    import warnings

    a = np.array([[1.0, np.inf], [2.0, 3.0], [4.0, 5.0]])
    with warnings.catch_warnings(record=True) as theirs:
        warnings.simplefilter("always")
        h0, _ = np.linalg.qr(a, mode="raw")
    with warnings.catch_warnings(record=True) as ours:
        warnings.simplefilter("always")
        h, _tau = mcn.qr(a, mode="raw")
    assert [w.category for w in ours] == [w.category for w in theirs] == []
    assert h.shape == h0.shape and np.isnan(h).any()


@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (2, 4, 3), (0, 3)])
@pytest.mark.parametrize("mode", ["full", "f", "economic", "e"])
def test_deprecated_modes_as_numpy(mode, shape):
    """NumPy's deprecated ``mode="full"``/``"f"`` (the reduced factors) and
    ``"economic"``/``"e"`` (LAPACK's reflectors-and-R array): NumPy's
    ``DeprecationWarning`` and message, its shapes and dtypes; the economic array's upper
    triangle R up to the signs of its rows (mpqr's ``diag(R) >= 0``); NumPy's
    ``ValueError`` where the installed NumPy no longer takes the spelling."""
    a = np.random.default_rng(12).standard_normal(shape)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            np.linalg.qr(a, mode=mode)
    except ValueError as exc:  # a NumPy that no longer takes the spelling: its error
        with pytest.raises(ValueError, match=re.escape(str(exc))):
            mcn.qr(a, mode=mode)
        return
    with pytest.warns(DeprecationWarning) as theirs:
        want = np.linalg.qr(a, mode=mode)
    with pytest.warns(DeprecationWarning) as ours:
        got = mcn.qr(a, mode=mode)
    assert str(ours[0].message) == str(theirs[0].message)
    if mode in ("full", "f"):
        assert [(x.shape, x.dtype) for x in got] == [(x.shape, x.dtype) for x in want]
        np.testing.assert_allclose(got[0] @ got[1], a, atol=1e-12)
        return
    assert got.shape == want.shape and got.dtype == want.dtype
    k = min(shape[-2:])
    r_got, r_want = np.triu(got[..., :k, :]), np.triu(want[..., :k, :])
    np.testing.assert_allclose(np.abs(r_got), np.abs(r_want), atol=1e-12)


def test_lstsq_residuals_are_the_solvers_where_x_overflows():
    """The residuals are the solver's squared residual norms (SciPy's front end's), not
    ``||b - a x||^2`` of the returned ``x``: where ``x`` overflows (a subnormal ``a``)
    NumPy still reports the finite residual of the problem, and so does the front end."""
    a = np.random.default_rng(4).standard_normal((6, 4)) * 1e-310
    b = np.ones(6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = np.linalg.lstsq(a, b, rcond=None)
        got = mcn.lstsq(a, b, rcond=None)
    assert not np.isfinite(want[0]).any() and not np.isfinite(got[0]).any()
    assert got[1].dtype == want[1].dtype and got[1].shape == want[1].shape == (1,)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-10)
    assert int(got[2]) == int(want[2]) == 4
