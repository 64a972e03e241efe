"""The small-input fast path (``mpqr/_fast.py``) gives the general route's results.

The general route is reached with the same inputs through an option the fast path
leaves alone (``method="geqrf"``: the same library QR, chosen explicitly; lstsq:
``refine="cgls"``, or SciPy itself for the driver contract)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg as sla
from mpqr.backends import get_backend

import mpqr
from mpqr import _fast
from mpqr._array_api import array_namespace
from mpqr.qr.choice import choose_method, small_library_route

DTYPES = [np.float32, np.float64, np.complex64, np.complex128]


def _rand(shape, dtype, seed=0, order="C"):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        a = a + 1j * rng.standard_normal(shape)
    return np.asarray(a.astype(dtype), order=order)


def _u(dtype):
    return np.finfo(dtype).eps


def _nb():
    return get_backend(array_namespace(np.zeros(1)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(100, 10), (1, 1), (10, 100), (37, 37), (200, 200)])
@pytest.mark.parametrize("mode", ["reduced", "complete", "r"])
def test_qr_matches_general_route(dtype, shape, mode):
    a = _rand(shape, dtype)
    a0 = a.copy()
    fast = mpqr.qr(a, mode=mode)
    full = mpqr.qr(a, mode=mode, method="geqrf")
    np.testing.assert_array_equal(a, a0)  # never modified
    m, n = shape
    tol = 30 * _u(dtype) * max(m, n)
    rf, rg = (fast, full) if mode == "r" else (fast.R, full.R)
    assert rf.dtype == rg.dtype == a.dtype and rf.shape == rg.shape
    scale = np.linalg.norm(a0)
    assert np.linalg.norm(rf - rg) <= tol * scale
    d = np.diagonal(rf)
    assert np.all(np.real(d) >= 0) and np.all(np.imag(d) == 0)
    assert np.allclose(rf, np.triu(rf))
    if mode != "r":
        assert fast.Q.dtype == full.Q.dtype and fast.Q.shape == full.Q.shape
        assert np.linalg.norm(fast.Q - full.Q) <= tol * max(m, n) ** 0.5
        k = fast.Q.shape[1]
        assert np.linalg.norm(fast.Q.conj().T @ fast.Q - np.eye(k)) <= tol
        assert np.linalg.norm(fast.Q @ fast.R - a0) <= tol * scale


@pytest.mark.parametrize("order", ["F", "noncontig", "readonly"])
def test_qr_layouts(order):
    base = _rand((120, 24), np.float64)
    if order == "F":
        a = np.asfortranarray(base)
    elif order == "noncontig":
        a = _rand((240, 24), np.float64)[::2]
    else:
        a = base.copy()
        a.setflags(write=False)
    a0 = a.copy()
    q, r = mpqr.qr(a)
    np.testing.assert_array_equal(a, a0)
    assert np.linalg.norm(q @ r - a0) <= 100 * _u(np.float64) * np.linalg.norm(a0)
    q2, r2 = mpqr.qr(a, method="geqrf")
    assert np.allclose(r, r2, atol=1e-12) and np.allclose(q, q2, atol=1e-12)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_qr_nonfinite_takes_general_route(bad):
    a = _rand((50, 5), np.float64)
    a[3, 2] = bad
    q, r = mpqr.qr(a)
    assert np.isnan(r).any() or np.isinf(r).any()
    assert not np.isfinite(q).all()
    with pytest.raises(ValueError, match="must not contain infs or NaNs"):
        mpqr.qr(a, check_finite=True)


def test_qr_out_of_range_columns_are_rescaled_as_before():
    a = _rand((40, 4), np.float64)
    a[:, 1] *= 2.0 ** 600
    assert _nb().small_qr(a, "reduced") is None  # the general route scales
    q, r = mpqr.qr(a)
    assert np.isfinite(r).all()
    colmax = np.abs(a).max(axis=0)
    assert np.linalg.norm((q @ r - a) / colmax) <= 100 * _u(np.float64) * 40


def test_empty_and_subclass_take_general_route():
    for shape in [(0, 3), (3, 0)]:
        q, r = mpqr.qr(np.zeros(shape))
        assert q.shape == (shape[0], 0) and r.shape == (0, shape[1])
    m = np.asmatrix(_rand((6, 3), np.float64))
    q, r = mpqr.qr(m)
    assert type(q) is np.ndarray
    assert _fast.qr(m, "reduced", None, "auto", False) is _fast.MISS


@pytest.mark.parametrize("precision", ["fp16", "fp32-emulated", "fp32", "fp64", "fp64-emulated",
                                       "auto"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_precision_requests_met_by_the_dtype(precision, dtype):
    be = _nb()
    # the tensor-core requests keep their own rules (100 x 10 is not tall-skinny)
    covered = precision in ("fp32", "auto") or (
        np.dtype(dtype) == np.float64 and precision in ("fp64", "fp64-emulated"))
    why = small_library_route(be, precision, np.dtype(dtype), 100, 10)
    assert bool(why) == covered
    # choose_method names the same method, so explain() and the fast path agree
    method, reason = choose_method(be, precision, np.dtype(dtype), 100, 10)
    assert (method == "geqrf" and reason == why) if covered else reason != why
    a = _rand((100, 10), dtype)
    with mpqr.explain() as tr:
        r = mpqr.qr(a, mode="r", precision=precision)
    msgs = [e.message for e in tr.records if getattr(e, "kind", None) == "method"]
    assert msgs and (("geqrf" in msgs[0]) if covered else True)
    if covered:
        assert "own precision meets" in msgs[0] and "fast path" in msgs[0]
        assert np.allclose(r, mpqr.qr(a, mode="r", method="geqrf", precision=precision),
                           atol=100 * _u(dtype))


def test_explain_outside_records_nothing_and_large_inputs_take_general_route():
    be = _nb()
    assert not small_library_route(be, "auto", np.dtype(np.float64), 512, 512)
    assert not small_library_route(be, "auto", np.dtype(np.float64), 100, 10, batch=3)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,k", [((100, 10), None), ((100, 10), 3), ((10, 30), None),
                                     ((1, 1), None)])
@pytest.mark.parametrize("driver", [None, "gelsd", "gelsy", "gelss"])
def test_lstsq_matches_scipy(dtype, shape, k, driver):
    a = _rand(shape, dtype, seed=1)
    b = _rand((shape[0],) if k is None else (shape[0], k), dtype, seed=2)
    a0, b0 = a.copy(), b.copy()
    got = mpqr.lstsq(a, b, lapack_driver=driver)
    ref = sla.lstsq(a, b, lapack_driver=driver)
    np.testing.assert_array_equal(a, a0)
    np.testing.assert_array_equal(b, b0)
    for g, r in zip(got, ref):
        if r is None:
            assert g is None
            continue
        g, r = np.asarray(g), np.asarray(r)
        assert g.dtype == r.dtype and g.shape == r.shape
        assert np.allclose(g, r, rtol=100 * _u(dtype), atol=100 * _u(dtype))
    assert type(got[2]) is type(ref[2])
    # and the general route (refined) agrees to the working precision
    full = mpqr.lstsq(a, b, lapack_driver=driver, refine="cgls")
    assert full[2] == got[2]
    cond = np.linalg.cond(a)
    assert np.allclose(full[0], got[0], atol=100 * _u(dtype) * cond * max(shape))


@pytest.mark.parametrize("bad", [np.nan, np.inf])
@pytest.mark.parametrize("where", ["a", "b"])
def test_lstsq_nonfinite_keeps_contract(bad, where):
    a, b = _rand((30, 4), np.float64), _rand((30,), np.float64)
    (a if where == "a" else b)[2] = bad
    with pytest.raises(ValueError, match="must not contain infs or NaNs"):
        mpqr.lstsq(a, b)
    if where == "a":
        with pytest.raises(mpqr.LinAlgError):
            mpqr.lstsq(a, b, check_finite=False)
    else:
        x = mpqr.lstsq(a, b, check_finite=False)[0]
        assert np.isnan(x).all()


def test_lstsq_explain_describes_the_route_that_ran():
    # explain() does not change the route: the fast path runs and says so; the answer
    # is the one an unexplained call gets and matches SciPy's to the problem's condition
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((200, 30)), rng.standard_normal(200)
    with mpqr.explain() as tr:
        x, res, rank, s = mpqr.lstsq(a, b)
    msg = [e.message for e in tr.events if e.kind == "method"]
    assert len(msg) == 1 and msg[0].startswith("lstsq: small-input fast path"), msg
    x2, res2, _, s2 = mpqr.lstsq(a, b)
    np.testing.assert_array_equal(res, res2)
    np.testing.assert_array_equal(x, x2)
    np.testing.assert_array_equal(s, s2)
    xs, ress, ranks, ss = sla.lstsq(a, b)
    u = np.finfo(np.float64).eps
    cond = ss[0] / ss[-1]
    assert np.linalg.norm(x - xs) <= 200 * u * cond**2 * np.linalg.norm(xs)
    np.testing.assert_allclose(s, ss, rtol=200 * u * cond)
    np.testing.assert_allclose(res, ress, rtol=200 * u * cond**2)
    assert rank == ranks == 30


def test_tall_tensor_core_request_takes_the_library_qr_fast():
    # choose_method gives small tall-skinny fp16 requests to geqrf in the input's
    # precision; the fast path runs exactly that
    a = _rand((1000, 20), np.float64)
    with mpqr.explain() as tr:
        r = mpqr.qr(a, mode="r", precision="fp16")
    msg = next(e.message for e in tr.events if e.kind == "method")
    assert msg.startswith("qr: geqrf") and "fast path" in msg
    np.testing.assert_allclose(r, mpqr.qr(a, mode="r", method="geqrf"), atol=1e-12)


class _GpuLike:
    """The NumPy backend's namespace with a tensor-core GPU's capabilities: the route
    choice for wide and complex inputs is backend-independent."""

    def __init__(self):
        nb = _nb()
        self.xp = nb.xp
        self.capabilities = frozenset({"fp16", "int8", "tensor-cores"})
        self.small_max = 0
        self.library_qr_tall_max = nb.library_qr_tall_max
        self.library_qr_square_max = 2**27  # the CuPy backend's cuts
        self.library_qr_square_max_by_precision = {"fp16": 2**25, "fp32-emulated": 3 * 2**24,
                                                   "fp64-emulated": 2**25}
        self.batched_qr_fits = nb.batched_qr_fits
        self.stack_q_products_min_n = 65  # the CuPy backend's (stacks only)


@pytest.mark.parametrize("dtype,prec,m,n,want", [
    (np.float32, "fp32-emulated", 4096, 65536, True),    # wide, met by float32
    (np.complex128, "fp64-emulated", 8192, 8192, True),  # complex, met by complex128
    (np.complex64, "fp32-emulated", 4096, 4096, True),
    (np.float64, "fp64-emulated", 1024, 16384, True),
    (np.float64, "fp64-emulated", 4096, 16384, True),    # m x m block within the cut
    (np.float64, "fp64-emulated", 8192, 32768, False),   # the recursion's block wins
    (np.float32, "fp64-emulated", 4096, 65536, False),   # float32 does not meet fp64
    (np.complex64, "fp64-emulated", 4096, 4096, False),
    (np.float32, "fp16", 4096, 16384, True),             # fp16: the block rule only
    (np.float32, "fp16", 4096, 65536, False),            # wider: the recursion wins
    (np.complex64, "fp16", 4096, 4096, False),
])
def test_wide_and_complex_emulated_requests_take_the_library_qr(dtype, prec, m, n, want):
    from mpqr.qr.choice import library_meets_emulated

    be = _GpuLike()
    why = library_meets_emulated(be, prec, np.dtype(dtype), m, n)
    assert bool(why) == want
    if want:
        assert choose_method(be, prec, np.dtype(dtype), m, n) == ("geqrf", why)
        assert "own precision meets" in why


def test_square_real_and_stacks_keep_the_other_rules():
    from mpqr.qr.choice import library_meets_emulated

    be = _GpuLike()
    assert not library_meets_emulated(be, "fp32-emulated", np.dtype(np.float32), 8192, 8192)
    assert not library_meets_emulated(be, "fp32-emulated", np.dtype(np.float32), 64, 4096,
                                      batch=4)
    assert not library_meets_emulated(_nb(), "fp32-emulated", np.dtype(np.float32), 64, 4096)


def _fast_lstsq(a, b, precision=None):
    return _fast.lstsq(a, b, None, True, None, precision=precision, refine="auto",
                       tol=None, maxiter=None)


def test_lstsq_above_small_max_up_to_its_own_cut(monkeypatch):
    # a backend whose least squares takes the fast path past small_max (CuPy's rule, on
    # the NumPy backend's LAPACK): tall, within small_lstsq_max and small_lstsq_max_n
    # columns, a precision the dtype meets; everything else keeps the general route
    nb = _nb()
    monkeypatch.setattr(nb, "small_max", 1000)
    monkeypatch.setattr(nb, "small_lstsq_max", 40_000)
    monkeypatch.setattr(nb, "small_lstsq_max_n", 32)
    a, b = _rand((1500, 20), np.float64, 3), _rand((1500, 2), np.float64, 4)
    got = _fast_lstsq(a, b)
    assert got is not _fast.MISS
    ref = sla.lstsq(a, b)
    sr = ref[3]
    tol = 30 * _u(np.float64) * float(sr[0] / sr[-1]) * 1500
    np.testing.assert_allclose(got[0], ref[0], rtol=tol, atol=tol)
    np.testing.assert_allclose(got[1], ref[1], rtol=tol)
    np.testing.assert_allclose(got[3], sr, rtol=0, atol=tol * sr[0])
    assert got[2] == ref[2] == 20
    # past the cut, too many columns, wide, a request float32 does not meet
    assert _fast_lstsq(_rand((2100, 20), np.float64), _rand((2100,), np.float64)) \
        is _fast.MISS
    assert _fast_lstsq(_rand((1500, 24), np.float64), _rand((1500,), np.float64)) \
        is not _fast.MISS
    assert _fast_lstsq(_rand((1200, 33), np.float64), _rand((1200,), np.float64)) \
        is _fast.MISS
    assert _fast_lstsq(_rand((20, 1500), np.float64), _rand((20,), np.float64)) \
        is _fast.MISS
    assert _fast_lstsq(a, _rand((1500, 21), np.float64)) is _fast.MISS  # k > n
    a32, b32 = _rand((1500, 20), np.float32), _rand((1500,), np.float32)
    assert _fast_lstsq(a32, b32) is not _fast.MISS
    assert _fast_lstsq(a32, b32, precision="fp64") is _fast.MISS
    # and the same call through the public function gives the fast path's answer
    np.testing.assert_array_equal(mpqr.lstsq(a, b)[0], got[0])


def test_lstsq_above_small_max_needs_the_backend_cut():
    # the NumPy backend keeps SciPy's driver past small_max (no cut of its own)
    nb = _nb()
    assert nb.small_lstsq_max == 0
    m = nb.small_max // 20 + 100
    assert _fast_lstsq(_rand((m, 20), np.float64), _rand((m,), np.float64)) is _fast.MISS
