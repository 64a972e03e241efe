"""Edge cases SciPy gets right, checked against SciPy (and NumPy) themselves.

Extended precision (``longdouble``/``clongdouble``), float16 and object input; the
exception classes client code catches; ``b`` with zero columns; masked arrays and
``numpy.matrix``. Tolerances: ``C n u cond(A)`` with ``C = 8`` (docs/guarantees.md)
and ``u`` the unit roundoff of the dtype computed in.
"""

from __future__ import annotations

import warnings

import mpqr.compat.numpy as mcn
import mpqr.compat.scipy as mcs
import numpy as np
import pytest
import scipy.linalg
import scipy.linalg as sla
from _support import from_numpy, to_numpy

import mpqr

C = 8  # the bound constant of docs/guarantees.md
LD, CLD = np.longdouble, np.clongdouble
EXTENDED = pytest.mark.skipif(np.finfo(LD).bits <= 64,
                              reason="longdouble is float64 on this platform")


def _u(dt) -> float:
    return float(np.finfo(dt).eps) / 2


def _problem(m, n, dtype, seed=0):
    """A well-conditioned ``m x n`` matrix and a right-hand side, with a part below
    float64's resolution when ``dtype`` is extended (the cast must round it away)."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, n)) + np.eye(m, n) * 3
    b = rng.standard_normal(m)
    if np.dtype(dtype).kind == "c":
        a = a + 1j * rng.standard_normal((m, n))
        b = b + 1j * rng.standard_normal(m)
    a, b = a.astype(dtype), b.astype(dtype)
    if np.finfo(dtype).bits > 64:
        a = a * (1 + np.finfo(dtype).eps * 7)  # a longdouble-only perturbation
    return a, b


def _r_with_nonnegative_diagonal(r):
    """SciPy/LAPACK leave the phases of diag(R) free; mpqr makes them real >= 0."""
    d = np.ones(r.shape[0], r.dtype)  # rows past min(M, N) are zero
    d[: min(r.shape)] = np.diagonal(r)
    ph = np.where(d == 0, 1, d / np.where(d == 0, 1, np.abs(d)))
    return np.conj(ph)[:, None] * r


def _cond(a) -> float:
    return float(np.linalg.cond(np.asarray(a, dtype=np.complex128)))


def _assert_same_lstsq_types(out, ref):
    """x, residues, rank, s: the same Python types, dtypes and shapes as SciPy's."""
    for got, want in zip(out, ref):
        assert type(got) is type(want), (type(got), type(want))
        if want is not None and not isinstance(want, int):
            assert got.dtype == want.dtype and got.shape == want.shape, (got, want)


# --- extended precision, float16, object ------------------------------------


@EXTENDED
@pytest.mark.parametrize("dtype", [LD, CLD])
@pytest.mark.parametrize("mode", ["full", "economic", "r"])
def test_qr_extended_precision_computes_as_scipy(dtype, mode):
    a, _ = _problem(7, 4, dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error", np.exceptions.ComplexWarning)  # no imaginary part lost
        ours = mcs.qr(a, mode=mode)
        core = mpqr.qr(a, mode="r")
    ref = sla.qr(a, mode=mode)
    assert [o.dtype for o in ours] == [r.dtype for r in ref]
    assert ref[0].dtype == (np.complex128 if dtype is CLD else np.float64)
    assert core.dtype == ref[0].dtype
    tol = C * a.shape[1] * _u(np.float64) * _cond(a) * np.linalg.norm(a.astype(complex))
    r_ref = _r_with_nonnegative_diagonal(ref[-1])
    np.testing.assert_allclose(ours[-1], r_ref, atol=tol, rtol=0)
    np.testing.assert_allclose(core, r_ref[:4], atol=tol, rtol=0)
    if mode != "r":
        a64 = a.astype(ours[0].dtype)
        assert np.linalg.norm(ours[0] @ ours[1] - a64) <= tol


@EXTENDED
@pytest.mark.parametrize("a_dt,b_dt", [(LD, LD), (CLD, CLD), (np.float64, CLD),
                                       (np.float32, CLD), (LD, np.complex64), (CLD, LD),
                                       (LD, np.float32)])
@pytest.mark.parametrize("driver", ["gelsd", "gelsy", "gelss"])
def test_lstsq_extended_precision_computes_as_scipy(a_dt, b_dt, driver):
    a, _ = _problem(8, 3, a_dt)
    _, b = _problem(8, 3, b_dt, seed=1)
    ref = sla.lstsq(a, b, lapack_driver=driver)
    with warnings.catch_warnings():
        warnings.simplefilter("error", np.exceptions.ComplexWarning)
        ours = mcs.lstsq(a, b, lapack_driver=driver)
        core = mpqr.lstsq(a, b, lapack_driver=driver)
    _assert_same_lstsq_types(ours, ref)
    assert core[0].dtype == ref[0].dtype and core[2] == ref[2]
    # never a real answer to a complex problem
    assert (ref[0].dtype.kind == "c") == (a.dtype.kind == "c" or b.dtype.kind == "c")
    x, r = ref[0], b.astype(ref[0].dtype) - a.astype(ref[0].dtype) @ ref[0]
    eta = np.linalg.norm(r) / (np.linalg.norm(a.astype(complex), 2) * np.linalg.norm(x))
    k, m = _cond(a), a.shape[0]
    # perturbation bound of least squares: (cond + cond^2 eta) times the backward error
    tol = C * m * _u(np.float64) * (k + k * k * eta) * np.linalg.norm(x)
    np.testing.assert_allclose(ours[0], x, atol=tol, rtol=0)
    np.testing.assert_allclose(core[0], x, atol=tol, rtol=0)
    if driver != "gelsy":
        np.testing.assert_allclose(ours[1], ref[1], rtol=C * m * _u(np.float64) * k)
        np.testing.assert_allclose(ours[3], ref[3], rtol=C * m * _u(np.float64) * k)


@EXTENDED
@pytest.mark.parametrize("dtype", [LD, CLD])
@pytest.mark.parametrize("m,n", [(0, 3), (4, 0), (0, 0)])
def test_empty_extended_precision_keeps_scipys_dtypes(dtype, m, n):
    a, b = np.ones((m, n), dtype), np.ones(m, dtype)
    _assert_same_lstsq_types(mcs.lstsq(a, b), sla.lstsq(a, b))
    for mode in ("full", "economic", "r"):
        ours, ref = mcs.qr(a, mode=mode), sla.qr(a, mode=mode)
        assert [(o.dtype, o.shape) for o in ours] == [(r.dtype, r.shape) for r in ref]


@EXTENDED
@pytest.mark.parametrize("dtype", [LD, CLD, np.float16])
def test_compat_numpy_refuses_extended_precision_as_numpy(dtype):
    a, b = _problem(5, 3, dtype)
    for name, args in (("qr", (a,)), ("lstsq", (a, b))):
        with pytest.raises(TypeError) as want:
            getattr(np.linalg, name)(*args)
        with pytest.raises(TypeError) as got:
            getattr(mcn, name)(*args)
        assert str(got.value) == str(want.value)


def test_float16_computes_in_float32_as_scipy():
    a, b = _problem(6, 3, np.float16)
    q, r = mcs.qr(a)
    qs, rs = sla.qr(a)
    assert q.dtype == qs.dtype == r.dtype == rs.dtype == np.float32
    assert mpqr.qr(a).R.dtype == np.float32
    ref = sla.lstsq(a, b)
    ours = mcs.lstsq(a, b)
    _assert_same_lstsq_types(ours, ref)
    tol = C * 6 * _u(np.float32) * _cond(a) ** 2 * np.linalg.norm(ref[0])
    np.testing.assert_allclose(ours[0], ref[0], atol=tol, rtol=0)


@pytest.mark.parametrize("dtype", [np.bool_, np.int8, np.uint8, np.int16, np.uint16,
                                   np.int32, np.uint64, np.int64, np.float16])
def test_small_and_integer_dtypes_compute_as_scipy(dtype):
    rng = np.random.default_rng(2)
    a = (rng.integers(0, 2, (6, 3)) + np.eye(6, 3, dtype=int)).astype(dtype)
    b = rng.integers(0, 2, 6).astype(dtype)
    for mode in ("full", "economic", "r"):
        ours, ref = mcs.qr(a, mode=mode), sla.qr(a, mode=mode)
        assert [(o.dtype, o.shape) for o in ours] == [(r.dtype, r.shape) for r in ref]
    ref = sla.lstsq(a, b)
    ours = mcs.lstsq(a, b)
    _assert_same_lstsq_types(ours, ref)
    assert ours[2] == ref[2] == 3
    k = _cond(a.astype(np.float64))
    tol = C * 6 * _u(ref[0].dtype) * k * k * np.linalg.norm(ref[0])
    np.testing.assert_allclose(ours[0], ref[0], atol=tol, rtol=0)


def test_full_rank_complex_residues_follow_the_installed_scipy(xp):
    a, b = _problem(7, 3, np.complex128)
    for bb in (b, np.stack([b, 2 * b], axis=1)):
        ref = sla.lstsq(a, bb)
        res = to_numpy(mpqr.lstsq(from_numpy(xp, a), from_numpy(xp, bb))[1])
        # real (SciPy <= 1.17), or x's dtype (SciPy >= 1.18): the installed SciPy's rule
        assert res.dtype == np.asarray(ref[1]).dtype
        assert res.shape == np.shape(ref[1])
        np.testing.assert_allclose(res, ref[1], rtol=C * 7 * _u(np.float64) * _cond(a))
    a32, b32 = a.astype(np.complex64), b.astype(np.complex64)
    res = mpqr.lstsq(from_numpy(xp, a32), from_numpy(xp, b32))[1]
    # single precision either way: float32 (SciPy <= 1.17) or complex64 (SciPy >= 1.18)
    want = np.asarray(sla.lstsq(a32, b32)[1]).dtype
    assert to_numpy(res).dtype == want and want in (np.float32, np.complex64)


def test_object_and_text_arrays_get_clear_errors():
    a_obj = np.array([[1.0, 2.0], [3.0, None], [5.0, 6.0]], dtype=object)
    b = np.ones(3)
    with pytest.raises(ValueError, match="object arrays are not supported") as want:
        sla.lstsq(a_obj, b)
    with pytest.raises(ValueError, match=r"^object arrays are not supported \(`a`\)$"):
        mcs.lstsq(a_obj, b)
    with pytest.raises(ValueError, match=r"^object arrays are not supported \(`b`\)$"):
        mcs.lstsq(np.eye(3, 2), b.astype(object))
    assert str(want.value) == "object arrays are not supported"
    # scipy.linalg.qr converts through float(): None becomes NaN even with check_finite;
    # mpqr refuses instead of returning a NaN factorization
    assert np.isnan(sla.qr(a_obj)[1]).any()
    with pytest.raises(ValueError, match=r"^object arrays are not supported \(`a`\)$"):
        mcs.qr(a_obj)
    with pytest.raises(TypeError, match="^`x` must have a floating or integer dtype, "
                       "got object$"):
        mpqr.qr(a_obj)
    # text: numbers written as text solved as SciPy's wrappers take them (float64), other
    # text refused with SciPy's (NumPy's) ValueError
    t = np.array([["1", "2"], ["3", "4"]])
    np.testing.assert_allclose(mcs.lstsq(t, np.ones(2))[0], sla.lstsq(t, np.ones(2))[0],
                               rtol=1e-13)
    with pytest.raises(ValueError, match="^could not convert string to float"):
        mcs.lstsq(np.array([["a", "2"], ["3", "4"]]), np.ones(2))


# --- exceptions: numpy.linalg.LinAlgError is scipy.linalg.LinAlgError -----------


def test_linalgerror_is_numpys_and_scipys():
    assert scipy.linalg.LinAlgError is np.linalg.LinAlgError
    for cls in (mpqr.LinAlgError, mpqr.BreakdownError):
        assert issubclass(cls, np.linalg.LinAlgError) and issubclass(cls, ValueError)


def test_errors_survive_pickling():
    # as numpy.linalg.LinAlgError does: a worker process's failure reaches the caller
    import pickle

    for err in (mpqr.LinAlgError("singular"),
                mpqr.BreakdownError("broke down", method="cholqr", cond_estimate=1e9)):
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is type(err) and back.args == err.args
        assert vars(back) == vars(err)


def test_raised_errors_are_caught_as_scipys_linalgerror(xp):
    a = from_numpy(xp, np.ones((40, 3)))  # rank 1: CholQR breaks down
    with pytest.raises(scipy.linalg.LinAlgError) as err:
        mpqr.qr(a, method="cholqr")
    assert isinstance(err.value, mpqr.BreakdownError)
    bad = np.eye(5, 3)
    bad[0, 0] = np.nan
    with pytest.raises(np.linalg.LinAlgError, match="`a` contains NaN or Inf"):
        mpqr.lstsq(from_numpy(xp, bad), from_numpy(xp, np.ones(5)), check_finite=False)


def test_compat_and_patch_raise_what_scipy_clients_catch():
    # NaN in `a` with check_finite=False: SciPy's gelsd refuses it with a ValueError, or
    # LAPACK does not terminate (SciPy's docs warn of both), so SciPy is not run here;
    # mpqr's LinAlgError is a ValueError and what `except scipy.linalg.LinAlgError` catches
    bad = np.eye(5, 3)
    bad[1, 1] = np.nan
    b = np.ones(5)
    with pytest.raises(ValueError) as err:
        mcs.lstsq(bad, b, check_finite=False)
    assert isinstance(err.value, scipy.linalg.LinAlgError)
    caught = None
    with mcs.patch():
        try:
            scipy.linalg.lstsq(bad, b, check_finite=False)
        except scipy.linalg.LinAlgError as exc:
            caught = exc
    assert isinstance(caught, mpqr.LinAlgError)
    # NumPy's front end: NumPy's class and message
    with pytest.raises(np.linalg.LinAlgError,
                       match="^SVD did not converge in Linear Least Squares$") as got:
        mcn.lstsq(bad, b)
    assert type(got.value) is np.linalg.LinAlgError


# --- b with zero columns ------------------------------------------------------


def _scipy_zero_rhs(a, b, driver):
    """SciPy's answer for ``b`` of shape (M, 0): SciPy's own for an empty ``a``;
    otherwise its answer for one column, restricted to zero columns (the same formulas
    with K = 0). SciPy 1.17 cannot be asked directly there: LAPACK's gelsd rejects
    NRHS = 0, SciPy's gelsy workspace query fails for real input and complex gelsy
    returns at once with rank 0; only gelss answers (compared in the next test)."""
    if 0 in a.shape:
        return sla.lstsq(a, b, lapack_driver=driver)
    x, res, rank, s = sla.lstsq(a, np.ones((a.shape[0], 1), a.dtype), lapack_driver=driver)
    return x[:, :0], res[:0], rank, s


ZERO_RHS_SHAPES = [(6, 3), (3, 6), (4, 4), (0, 3), (4, 0), (0, 0)]


@pytest.mark.parametrize("m,n", ZERO_RHS_SHAPES)
@pytest.mark.parametrize("dtype", [np.float64, np.complex64, np.int64])
@pytest.mark.parametrize("driver", ["gelsd", "gelsy", "gelss"])
def test_zero_column_b_gives_scipys_shapes_and_dtypes(xp, m, n, dtype, driver):
    rng = np.random.default_rng(m * 10 + n)
    a = (rng.standard_normal((m, n)) * 4).astype(dtype) + np.eye(m, n, dtype=dtype)
    b = np.ones((m, 0), dtype)
    ref = _scipy_zero_rhs(a, b, driver)
    x, res, rank, s = mpqr.lstsq(from_numpy(xp, a), from_numpy(xp, b), lapack_driver=driver)
    x, res = to_numpy(x), to_numpy(res)
    assert (x.shape, x.dtype) == (ref[0].shape, ref[0].dtype)
    assert (res.shape, res.dtype) == (ref[1].shape, ref[1].dtype)
    assert rank == ref[2]
    if ref[3] is None:
        assert s is None
    else:
        s = to_numpy(s)
        assert s.shape == ref[3].shape
        wdt = ref[3].dtype if m and n else np.float64
        np.testing.assert_allclose(s, ref[3], atol=C * max(m, n, 1) * _u(wdt) * s.max(initial=0))
    ours = mcs.lstsq(a, b, lapack_driver=driver)
    _assert_same_lstsq_types(ours, (ref[0], ref[1], ref[2], ref[3]))


@pytest.mark.parametrize("m,n", [(6, 3), (3, 6), (4, 4)])
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.complex64, np.complex128])
def test_zero_column_b_matches_scipys_gelss(xp, m, n, dtype):
    rng = np.random.default_rng(5)
    a = (rng.standard_normal((m, n)) + np.eye(m, n)).astype(dtype)
    b = np.ones((m, 0), dtype)
    ref = sla.lstsq(a, b, lapack_driver="gelss")
    x, res, rank, s = mpqr.lstsq(from_numpy(xp, a), from_numpy(xp, b), lapack_driver="gelss")
    for got, want in ((x, ref[0]), (res, ref[1])):
        got = to_numpy(got)
        assert (got.shape, got.dtype) == (want.shape, want.dtype)
    assert rank == ref[2] == min(m, n)
    s = to_numpy(s)
    assert s.dtype == ref[3].dtype
    np.testing.assert_allclose(s, ref[3], atol=C * max(m, n) * _u(s.dtype) * _cond(a) * s[0])
    _assert_same_lstsq_types(mcs.lstsq(a, b, lapack_driver="gelss"), ref)


def test_zero_column_b_on_rank_deficient_a_and_numpy(xp):
    a = np.outer(np.arange(1.0, 7.0), [1.0, 2.0, 3.0])  # rank 1
    b = np.zeros((6, 0))
    ref = _scipy_zero_rhs(a, b, "gelsd")
    x, res, rank, s = mpqr.lstsq(from_numpy(xp, a), from_numpy(xp, b))
    assert to_numpy(x).shape == (3, 0) and to_numpy(res).shape == ref[1].shape == (0,)
    assert rank == ref[2] == 1
    np.testing.assert_allclose(to_numpy(s), ref[3], atol=C * 6 * _u(np.float64) * ref[3][0])
    # NumPy answers NRHS = 0 itself
    xn, resn, rankn, sn = np.linalg.lstsq(a, b)
    got = mcn.lstsq(a, b)
    assert (got[0].shape, got[1].shape, got[2]) == (xn.shape, resn.shape, rankn)
    np.testing.assert_allclose(got[3], sn, atol=C * 6 * _u(np.float64) * sn[0])


@pytest.mark.parametrize("a_shape,b_shape", [((2, 5, 3), (5, 0)), ((5, 3), (2, 5, 0)),
                                             ((2, 3, 5), (2, 3, 0))])
def test_zero_column_b_batched(xp, a_shape, b_shape):
    rng = np.random.default_rng(3)
    a = rng.standard_normal(a_shape) + np.eye(*a_shape[-2:])
    b = np.zeros(b_shape)
    x, res, rank, s = mpqr.lstsq(from_numpy(xp, a), from_numpy(xp, b))
    batch = np.broadcast_shapes(a_shape[:-2], b_shape[:-2])
    ab = np.broadcast_to(a, (*batch, *a_shape[-2:]))
    refs = [_scipy_zero_rhs(ab[i], b if b.ndim == 2 else b[i], "gelsd") for i in range(2)]
    assert to_numpy(x).shape == (*batch, *refs[0][0].shape)
    assert to_numpy(res).shape == (*batch, *refs[0][1].shape)
    assert to_numpy(rank).tolist() == [r[2] for r in refs]
    np.testing.assert_allclose(to_numpy(s), np.stack([r[3] for r in refs]),
                               atol=C * 5 * _u(np.float64) * float(np.max(to_numpy(s))))


@pytest.mark.parametrize("m,n", [(0, 0), (0, 3)])
def test_one_dimensional_empty_b(xp, m, n):
    a, b = np.ones((m, n)), np.ones(m)
    ref = sla.lstsq(a, b)
    x, res, rank, s = mpqr.lstsq(from_numpy(xp, a), from_numpy(xp, b))
    assert to_numpy(x).shape == ref[0].shape and to_numpy(x).dtype == ref[0].dtype
    assert to_numpy(res).shape == np.shape(ref[1]) and rank == ref[2] == 0
    assert (to_numpy(s).shape, to_numpy(s).dtype) == (ref[3].shape, ref[3].dtype)
    _assert_same_lstsq_types(mcs.lstsq(a, b), ref)


# --- masked arrays and numpy.matrix -------------------------------------------

MASKED = ("masked arrays are not supported (`{}` is a numpy.ma.MaskedArray, whose mask "
          "would be ignored); pass `{}.filled(value)`, choosing the value of the masked "
          "entries")


def _masked_problem():
    a = np.ma.array([[1.0, 2.0], [3.0, 4.0], [5.0, 7.0]])
    a[0, 0] = np.ma.masked
    return a, np.ma.array([1.0, 2.0, 3.0])


def test_masked_arrays_are_refused_naming_the_argument():
    a, b = _masked_problem()
    # SciPy either refuses a masked array or ignores its mask (1.17's batching wrapper
    # converts it first); it never honours the mask
    try:
        ref = sla.lstsq(a, b)
    except ValueError as exc:
        assert str(exc) == "masked arrays are not supported"
    else:
        np.testing.assert_array_equal(ref[0], sla.lstsq(a.data, b.data)[0])
    calls = [("a", lambda: mpqr.qr(a), "x"), ("a", lambda: mpqr.lstsq(a, b.data), "a"),
             ("b", lambda: mpqr.lstsq(a.data, b), "b"),
             ("a", lambda: mpqr.matmul(a, np.eye(2)), "a"),
             ("a", lambda: mcs.qr(a), "a"), ("a", lambda: mcs.lstsq(a, b.data), "a"),
             ("b", lambda: mcs.lstsq(a.data, b), "b"),
             ("a", lambda: mcn.qr(a), "a"), ("b", lambda: mcn.lstsq(a.data, b), "b"),
             ("a", lambda: mpqr.lstsq(np.ma.array(np.stack([a.data] * 2)), b.data), "a")]
    for _, call, name in calls:
        with pytest.raises(ValueError) as err:
            call()
        assert str(err.value) == MASKED.format(name, name)
    # a masked array without any masked entry is refused too: the type says a mask matters
    with pytest.raises(ValueError, match="masked arrays are not supported"):
        mpqr.lstsq(np.ma.array(a.data, mask=False), b.data, check_finite=False)


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")
def test_numpy_matrix_is_computed_as_an_ndarray_as_scipy():
    a = np.matrix([[1.0, 2.0], [3.0, 4.0], [5.0, 7.0]])
    bcol = np.matrix([[1.0], [2.0], [3.0]])
    arr = np.asarray(a)
    tol = C * 3 * _u(np.float64) * _cond(arr) * np.linalg.norm(arr)
    for mode in ("full", "economic", "r"):
        ours, ref = mcs.qr(a, mode=mode), sla.qr(a, mode=mode)
        assert [type(o) for o in ours] == [type(r) for r in ref] == [np.ndarray] * len(ref)
        np.testing.assert_allclose(ours[-1], _r_with_nonnegative_diagonal(ref[-1]), atol=tol)
    q, r = mpqr.qr(a)
    assert type(q) is type(r) is np.ndarray
    np.testing.assert_allclose(q @ r, arr, atol=tol)
    for b in (np.array([1.0, 2.0, 3.0]), bcol):
        ref = sla.lstsq(a, b)
        ours = mcs.lstsq(a, b)
        _assert_same_lstsq_types(ours, ref)
        np.testing.assert_allclose(ours[0], ref[0], atol=tol * np.linalg.norm(ref[0]))
        core = mpqr.lstsq(a, b)
        assert type(core[0]) is np.ndarray and core[0].shape == ref[0].shape
    # a matrix row is (1, M): SciPy's own shape error, not a broadcast failure
    with pytest.raises(ValueError) as want:
        sla.lstsq(a, bcol.T)
    for f in (mcs.lstsq, mpqr.lstsq):
        with pytest.raises(ValueError) as got:
            f(a, bcol.T)
        assert str(got.value) == str(want.value)
    c = mpqr.matmul(a, np.matrix(np.eye(2)), precision="fp64")
    assert type(c) is np.ndarray and np.array_equal(c, arr)


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")
def test_numpy_matrix_through_compat_numpy_is_a_matrix_as_numpy():
    a = np.matrix([[1.0, 2.0], [3.0, 4.0], [5.0, 7.0]])
    b = np.matrix([[1.0], [2.0], [3.0]])
    arr = np.asarray(a)
    tol = C * 3 * _u(np.float64) * _cond(arr) * np.linalg.norm(arr)
    for mode in ("reduced", "complete", "r"):
        ours, ref = mcn.qr(a, mode=mode), np.linalg.qr(a, mode=mode)
        ours, ref = (ours, ref) if mode != "r" else ((ours,), (ref,))
        assert [(type(o), o.shape) for o in ours] == [(type(r), r.shape) for r in ref]
    ours, ref = mcn.lstsq(a, b), np.linalg.lstsq(a, b)
    assert [type(v) for v in ours[:2]] == [type(v) for v in ref[:2]] == [np.matrix] * 2
    assert [v.shape for v in ours[:2]] == [v.shape for v in ref[:2]]
    np.testing.assert_allclose(ours[0], ref[0], atol=tol * np.linalg.norm(ref[0]))


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")  # numpy.matrix itself
def test_svd_and_orth_take_numpy_matrix_as_ndarray():
    a = np.matrix(np.random.default_rng(7).standard_normal((30, 4)))
    u, s, _vh = mpqr.svd(a)
    assert type(u) is np.ndarray and type(s) is np.ndarray
    np.testing.assert_allclose(s, np.linalg.svd(np.asarray(a), compute_uv=False),
                               rtol=C * 30 * _u(np.float64) * np.linalg.cond(np.asarray(a)))
    q = mpqr.orth(a)
    assert type(q) is np.ndarray and q.shape == (30, 4)
    with pytest.raises(ValueError, match="masked arrays are not supported"):
        mpqr.orth(np.ma.masked_array(np.asarray(a)))


# --- cond values LAPACK reads specially ----------------------------------------------


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.complex128])
@pytest.mark.parametrize("driver", ["gelsd", "gelss", "gelsy"])
def test_cond_that_lapack_reads_specially_cuts_as_scipys_driver(xp, dtype, driver):
    """SciPy hands ``cond`` to its driver in the computation's precision: gelsd reads
    ``cond <= 0`` and ``cond >= 1`` as EPSILON (``eps / 2``), gelss ``cond < 0`` as
    PRECISION (``eps``) and 0 as "every nonzero singular value", gelsy ``cond <= 0`` as
    "every column". Singular values at 0.5, 1.5 and 3 times ``eps / 2`` (exact: one
    nonzero per column) tell the cutoffs apart. gelsy's rank comes from an incremental
    condition estimate, not from singular values: only ``cond < 1`` is compared."""
    u = float(np.finfo(np.dtype(dtype)).eps) / 2
    b = np.arange(1.0, 7.0).astype(dtype)
    conds = [None, -1.0, -0.5, -1e-300, 0.0, 1e-300, 2.0 * u, 0.5, 1.0, 2.0]
    for f in (0.5, 1.5, 3.0):
        a = np.zeros((6, 4), dtype)
        for col, (row, v) in enumerate(zip([2, 0, 5, 3], [1.0, -1.0, 1.0, f * u])):
            a[row, col] = v
        for cond in conds if driver != "gelsy" else [c for c in conds if c is None or c < 1]:
            try:
                want = sla.lstsq(a, b, cond=cond, lapack_driver=driver)[2]
            except ValueError:  # SciPy >= 1.18 refuses a negative cond
                with pytest.raises(ValueError, match=r"`cond` must be >= 0 or None"):
                    mpqr.lstsq(from_numpy(xp, a), from_numpy(xp, b), cond=cond,
                               lapack_driver=driver)
                continue
            got = mpqr.lstsq(from_numpy(xp, a), from_numpy(xp, b), cond=cond,
                             lapack_driver=driver)[2]
            assert got == want, (f, cond, got, want)


# --- byte-swapped data --------------------------------------------------------

SWAPPED = [np.dtype(">f4"), np.dtype(">f8"), np.dtype(">c8"), np.dtype(">c16")]
if np.little_endian is False:  # pragma: no cover - a big-endian host swaps the other way
    SWAPPED = [d.newbyteorder("<") for d in SWAPPED]


def _swapped_problem(dtype):
    rng = np.random.default_rng(31)
    a = rng.standard_normal((7, 4))
    if dtype.kind == "c":
        a = a + 1j * rng.standard_normal((7, 4))
    return a.astype(dtype), np.arange(7.0).astype(dtype)


@pytest.mark.parametrize("dtype", SWAPPED)
def test_byte_swapped_input_computes_as_native_like_scipy_and_numpy(dtype):
    """Data in the other byte order (FITS files, network order) is factored in its own
    precision, as NumPy and SciPy do: results in native order, of SciPy's and NumPy's
    dtypes, close to theirs on the same values in native order (SciPy 1.18.1's ``qr``
    reads a byte-swapped array's bytes as native ones: garbage of 1e200 and up, so the
    references take a native copy) and bit for bit mpqr's own on that copy; the input
    untouched."""
    a, b = _swapped_problem(dtype)
    a0, b0 = a.copy(), b.copy()
    native = dtype.newbyteorder("=")
    an, bn = a.astype(native), b.astype(native)
    u = float(np.finfo(native).eps) / 2
    tol = 50 * u * 7
    q, r = mpqr.qr(a)
    assert q.dtype == r.dtype == native
    assert np.linalg.norm(q @ r - a) <= tol * np.linalg.norm(a)
    qn, rn = mpqr.qr(an)
    assert np.array_equal(q, qn) and np.array_equal(r, rn)
    for ours, ref in ((mcs.qr(a), sla.qr(an)), (mcs.rq(a), sla.rq(an)),
                      (mcn.qr(a), np.linalg.qr(an)),
                      (mcs.qr(a, pivoting=True)[:2], sla.qr(an, pivoting=True)[:2])):
        assert [(o.dtype, o.shape) for o in ours] == [(w.dtype, w.shape) for w in ref]
        np.testing.assert_allclose(np.abs(np.diagonal(ours[-1] if len(ours) == 2 else ours[0],
                                                      axis1=-2, axis2=-1)),
                                   np.abs(np.diagonal(ref[-1] if len(ref) == 2 else ref[0],
                                                      axis1=-2, axis2=-1)),
                                   rtol=tol * 10)
    for ours, ref in ((mcs.lstsq(a, b), sla.lstsq(an, bn)),
                      (mcn.lstsq(a, b, rcond=None), np.linalg.lstsq(an, bn, rcond=None))):
        assert ours[0].dtype == ref[0].dtype and ours[0].shape == ref[0].shape
        np.testing.assert_allclose(ours[0], ref[0], rtol=tol * 100, atol=tol * 100)
    x = mpqr.lstsq(a, b)[0]
    assert x.dtype == native
    assert a.tobytes() == a0.tobytes() and b.tobytes() == b0.tobytes()
    assert a.dtype == dtype


@pytest.mark.parametrize("scale", [1e300, 1e200, 1e-300, 1e-310])
@pytest.mark.parametrize("shape", [(7, 4), (4, 7), (70, 40)])
def test_raw_qr_far_from_one_stays_finite_and_orthogonal(scale, shape):
    """``mode="raw"`` of a matrix near either end of float64's range: finite reflectors
    (the squares of entries near 1e200 and up overflow), Q orthogonal to u n (subnormal
    entries too), QR = A to u n ||A|| plus the subnormal spacing of R's entries; NumPy's
    raw layout as well."""
    from scipy.linalg import lapack

    a = np.random.default_rng(32).standard_normal(shape) * scale
    m, n = shape
    k = min(shape)
    u = np.finfo(np.float64).eps / 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow on the way
        (h, tau), r = mcs.qr(a, mode="raw")
        hn, taun = mcn.qr(a, mode="raw")
    for hh, tt in ((h, tau), (hn.T, taun)):
        assert np.all(np.isfinite(hh)) and np.all(np.isfinite(tt))
        q, _, info = lapack.dorgqr(np.asfortranarray(hh[:, :k]), tt)
        assert info == 0
        assert np.max(np.abs(q.T @ q - np.eye(k))) <= 20 * u * m
        # norms of the scaled difference (a's own norm would overflow near 1e300)
        err = np.linalg.norm((q @ np.triu(hh[:k, :]) - a) / scale)
        assert err <= 20 * u * m * np.linalg.norm(a / scale) + 20 * m * n * 5e-324 / scale
    np.testing.assert_array_equal(r, np.triu(h[:k, :]))
    ref = np.abs(np.diagonal(sla.qr(a, mode="r")[0]))
    np.testing.assert_allclose(np.abs(np.diagonal(r)), ref, rtol=1e-10 if scale > 1e-305
                               else 1e-6)


@pytest.mark.parametrize("precision", ["auto", "fp16", "fp32-emulated", "fp64-emulated"])
def test_square_lstsq_of_huge_entries_warns_of_nothing(precision):
    """A square system with entries near 1e300: SciPy computes no residues (``M = N``) and
    warns of nothing; neither does mpqr, at any precision (the refinement's residual is
    not squared for residues nobody gets), and ``x`` is the solution."""
    rng = np.random.default_rng(33)
    a = rng.standard_normal((60, 60)) * 1e300
    b = rng.standard_normal(60) * 1e300
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        x, res, rank, _ = mpqr.lstsq(a, b, precision=precision)
    want = np.linalg.solve(a / 1e300, b / 1e300)
    cond = np.linalg.cond(a)
    assert res.shape == (0,) and rank == 60
    assert np.linalg.norm(x - want) <= 100 * 2**-53 * 60 * cond * np.linalg.norm(want)


@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
@pytest.mark.parametrize("exp", [1000, -500, -1030, 0])
def test_fp32_products_of_float64_data_beyond_float32s_range(xp, exp, dtype):
    """``precision="fp32"`` on float64 (complex128) data past float32's range (Inf after
    a cast) or below it (zero after a cast): the product to FP32 accuracy, not Inf/NaN or
    a finite zero; inside the range the plain cast's bits (the backend's own float32
    product), on every backend."""
    rng = np.random.default_rng(34)
    a = rng.standard_normal((50, 40)).astype(dtype)
    b = rng.standard_normal((40, 30)).astype(dtype)
    if np.dtype(dtype).kind == "c":
        a, b = a + 1j * rng.standard_normal(a.shape), b + 1j * rng.standard_normal(b.shape)
    def times(x, e):  # x 2^e in two exact steps
        return (x * 2.0 ** (e // 2)) * 2.0 ** (e - e // 2)

    a0 = a
    a = times(a, exp)
    xa, xb = from_numpy(xp, a), from_numpy(xp, b)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        c = to_numpy(mpqr.matmul(xa, xb, precision="fp32"))
    want = times(a, -exp) @ b  # a's own rounding (subnormal at 2^-1030) included
    bound = 80 * 2**-23 * (np.abs(a0) @ np.abs(b))
    assert c.dtype == dtype
    assert np.all(np.abs(times(c, -exp) - want) <= bound)
    if exp == 0:
        low = xp.float32 if dtype == np.float64 else xp.complex64
        plain = xp.astype(xp.astype(xa, low) @ xp.astype(xb, low), xa.dtype)
        np.testing.assert_array_equal(c, to_numpy(plain))


@pytest.mark.parametrize("method", ["householder-recursive", "cholqr2", "auto"])
def test_fp32_qr_of_float64_data_scales_once(monkeypatch, method):
    """A QR at ``precision="fp32"`` of float64 data far from 1: the driver brings the
    columns to unit magnitude once and the factorization's FP32 products cast their
    operands as they are (no scaling of their own: its entries stay in float32's range);
    the factors as accurate as FP32 products make them; a product outside a QR still
    scales its operands."""
    from mpqr.engines import native

    calls = []
    real = native.pow2_shift

    def counted(*args, **kw):
        calls.append(1)
        return real(*args, **kw)

    monkeypatch.setattr(native, "pow2_shift", counted)
    rng = np.random.default_rng(36)
    a = rng.standard_normal((400, 120)) * 2.0**900
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        q, r = mpqr.qr(a, precision="fp32", method=method)
    assert not calls
    assert np.linalg.norm(q @ r - a) <= 50 * 2**-24 * np.sqrt(400) * np.linalg.norm(a)
    assert np.linalg.norm(q.T @ q - np.eye(120)) <= 50 * 2**-24 * 120
    c = mpqr.matmul(a, rng.standard_normal((120, 30)), precision="fp32")
    assert calls and np.all(np.isfinite(c))


@pytest.mark.parametrize("dtype,exp", [(np.float64, 1000), (np.float64, -1000),
                                       (np.complex128, 1000), (np.float32, 64),
                                       (np.float32, -100), (np.float64, 300)])
@pytest.mark.parametrize("shape", [(200, 30), (40, 40), (30, 90)])
def test_pivoted_qr_is_scale_invariant_to_the_range_ends(dtype, exp, shape):
    """``qr(pivoting=True)`` of ``A 2^e`` near either end of the range: the pivots of ``A``
    and ``R(A) 2^e`` bit for bit (the column norms' squares of such a matrix overflow or
    lose their digits: it is factored at unit scale), Q the same."""
    rng = np.random.default_rng(35)
    a = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        a = a + 1j * rng.standard_normal(shape)
    a = a.astype(dtype)
    big = (a * np.asarray(2.0, dtype=a.real.dtype) ** exp).astype(dtype)
    assert np.all(np.isfinite(big)) and np.all(big != 0)
    q0, r0, p0 = mpqr.qr(a, pivoting=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        q1, r1, p1 = mpqr.qr(big, pivoting=True)
    np.testing.assert_array_equal(p1, p0)
    np.testing.assert_array_equal(q1, q0)
    np.testing.assert_array_equal(r1, (r0 * np.asarray(2.0, dtype=a.real.dtype) ** exp)
                                  .astype(dtype))


@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
def test_pivoted_qr_of_subnormal_data(dtype):
    """Entries of ~1e-310 (subnormal): Q orthonormal, ``A P = Q R`` to the subnormal
    spacing, ``|diag(R)|`` non-increasing (the norms' squares underflow entirely)."""
    rng = np.random.default_rng(36)
    a = rng.standard_normal((200, 30))
    if np.dtype(dtype).kind == "c":
        a = a + 1j * rng.standard_normal((200, 30))
    a = (a * 1e-310).astype(dtype)
    q, r, p = mpqr.qr(a, pivoting=True)
    u = np.finfo(np.float64).eps / 2
    assert np.linalg.norm(q.conj().T @ q - np.eye(30)) <= 100 * u * 200
    def up(x):  # times 2^1030 in two exact steps (the check at unit scale)
        return (x * 2.0**515) * 2.0**515

    err = np.linalg.norm(up(q @ r) - up(a[:, p])) / np.linalg.norm(up(a))
    assert err <= 1e-12  # ~ 5e-324 / 1e-310 per entry
    d = np.abs(np.diagonal(r))
    assert np.all(d[1:] <= d[:-1])


@pytest.mark.parametrize("precision", ["auto", "fp16", "fp32-emulated"])
@pytest.mark.parametrize("dtype,exp", [(np.complex64, -135), (np.float32, -135),
                                       (np.complex64, 60), (np.complex128, -1040)])
@pytest.mark.parametrize("m", [80, 60])
def test_lstsq_near_the_range_ends_solved_at_unit_scale(precision, dtype, exp, m):
    """A least-squares problem of entries near either end of the range (float32 data of
    2^-135 is subnormal: at fp16 a square one's refactored direct solve divided by a
    complex subnormal diagonal, ``1/|d|^2`` overflowed, x came back NaN): R solved at
    unit scale, ``x`` finite and accurate, ``s`` of the unscaled problem."""
    rng = np.random.default_rng(37)
    a = rng.standard_normal((m, 60)) + 1j * rng.standard_normal((m, 60))
    a = (a * 2.0 ** (exp // 2) * 2.0 ** (exp - exp // 2)).astype(dtype)
    wide = np.complex128
    b = (a.astype(wide) @ np.ones(60)).astype(dtype)
    x, _, rank, s = mpqr.lstsq(a, b, precision=precision)
    assert np.all(np.isfinite(x)) and rank == 60
    u = np.finfo(dtype).eps / 2
    # subnormal data carries fewer digits: the error of its own rounding, times cond
    digits = u if exp > -126 or (dtype == np.complex128 and exp > -1022) else 2.0**-10
    assert np.max(np.abs(x - 1)) <= 200 * 60 * digits * np.linalg.cond(a.astype(wide))
    s_ref = np.linalg.svd((a.astype(wide) * 2.0 ** (-exp // 2)) * 2.0 ** (-exp + exp // 2),
                          compute_uv=False)
    got = (s.astype(np.float64) * 2.0 ** (-exp // 2)) * 2.0 ** (-exp + exp // 2)
    np.testing.assert_allclose(got, s_ref, rtol=max(1e-3, 100 * digits))


@pytest.mark.parametrize("dtype,exp", [(np.complex128, -1040), (np.complex64, -135),
                                       (np.float64, -1040), (np.complex128, -1000)])
def test_out_of_core_lstsq_near_the_range_ends(dtype, exp):
    """Out of core (a memory budget far below the matrix): R's solves at unit scale (a
    complex subnormal diagonal gave a NaN solution) and the refinement's convergence
    measure in float64 (for float32 data near its subnormals its denominator underflowed
    to 0/0); no warning, x accurate."""
    rng = np.random.default_rng(38)
    a = rng.standard_normal((4000, 12))
    if np.dtype(dtype).kind == "c":
        a = a + 1j * rng.standard_normal((4000, 12))
    a = (a * 2.0 ** (exp // 2) * 2.0 ** (exp - exp // 2)).astype(dtype)
    b = (a.astype(np.complex128 if a.dtype.kind == "c" else np.float64)
         @ np.ones(12)).astype(dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        x = mpqr.lstsq(a, b, memory_budget="64KB")[0]
    u = np.finfo(dtype).eps / 2
    sub = exp < (-126 if dtype == np.complex64 else -1022)
    assert np.max(np.abs(x - 1)) <= (1e-3 if sub else 1000 * u)


@pytest.mark.parametrize("dtype", [np.int8, np.bool_, np.float16, np.complex64, np.float32])
@pytest.mark.parametrize("shape", [(0, 0), (0, 3), (3, 0)])
@pytest.mark.parametrize("mode", ["full", "economic", "r"])
def test_rq_of_an_empty_matrix_keeps_its_dtype_as_scipy(dtype, shape, mode):
    """An empty ``a`` reaches no LAPACK routine in SciPy's ``rq``: its factors come in
    ``a``'s own dtype (an integer, boolean or float16 ``a`` too), ``Q`` the identity in
    the full mode, as the installed SciPy gives them."""
    a = np.ones(shape, dtype=dtype)
    ours, ref = mcs.rq(a, mode=mode), sla.rq(a, mode=mode)
    ours, ref = ((ours,), (ref,)) if mode == "r" else (ours, ref)
    assert [(o.dtype, o.shape) for o in ours] == [(w.dtype, w.shape) for w in ref]
    for o, w in zip(ours, ref, strict=True):
        if w.size and o is ours[-1]:  # Q (R has no elements; SciPy's is uninitialised)
            assert np.array_equal(o, w)
