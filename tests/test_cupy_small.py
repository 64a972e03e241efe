"""The CuPy small-input fast path (backends/cupy/small.py) against cupy.linalg.qr, the
general route and a float64/complex128 host reference (skipped without a GPU)."""

from __future__ import annotations

import numpy as np
import pytest

cp = pytest.importorskip("cupy")
try:
    if cp.cuda.runtime.getDeviceCount() < 1:
        pytest.skip("no CUDA device", allow_module_level=True)
except Exception:  # no driver
    pytest.skip("no CUDA device", allow_module_level=True)

import mpqr  # noqa: E402
from mpqr import _fast  # noqa: E402
from mpqr.lstsq import in_memory as lstsq_in_memory  # noqa: E402

DTYPES = [np.float32, np.float64, np.complex64, np.complex128]
SHAPES = [(100, 10), (1000, 20), (300, 300), (4000, 50)]


def _rand(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        a = a + 1j * rng.standard_normal(shape)
    return a.astype(dtype)


def _u(dtype):
    return np.finfo(dtype).eps / 2


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_qr_fast_path_conventions(dtype, shape):
    m, n = shape
    ah = _rand(shape, dtype)
    a = cp.asarray(ah)
    a0 = a.copy()
    before = _fast.qr(a, "reduced", None, "auto", True)
    assert before is not _fast.MISS  # the fast path takes it
    q, r = mpqr.qr(a)
    assert cp.array_equal(a, a0)  # input untouched
    assert type(q) is cp.ndarray and q.shape == (m, n) and r.shape == (n, n)
    assert q.dtype == a.dtype and r.dtype == a.dtype
    d = cp.diagonal(r).get()
    assert np.all(d.real >= 0) and np.all(d.imag == 0)
    rh, qh = r.get().astype(np.complex128), q.get().astype(np.complex128)
    assert np.all(np.tril(rh, -1) == 0)
    tol = 30 * np.sqrt(m * n) * _u(dtype)
    assert np.linalg.norm(qh @ rh - ah) <= tol * np.linalg.norm(ah)
    assert np.linalg.norm(qh.conj().T @ qh - np.eye(n)) <= tol * np.sqrt(n)
    # the same factors as cupy.linalg.qr up to the diagonal's phases
    _, rc = cp.linalg.qr(a)
    ph = np.diagonal(rc.get()).astype(np.complex128)
    ph = np.where(ph != 0, ph / np.abs(ph), 1)
    assert np.linalg.norm(ph.conj()[:, None] * rc.get() - rh) <= tol * np.linalg.norm(rh)
    r_only = mpqr.qr(a, mode="r")
    assert cp.allclose(r_only, r)


@pytest.mark.parametrize("dtype", DTYPES)
def test_qr_nonfinite_takes_general_route(dtype):
    a = cp.asarray(_rand((100, 10), dtype))
    a[3, 4] = np.nan
    assert _fast.qr(a, "reduced", None, "auto", False) is _fast.MISS
    with pytest.raises(ValueError, match="x"):
        mpqr.qr(a, check_finite=True)  # the general route's error
    _, r = mpqr.qr(a)  # NaN propagates, never a finite answer
    assert not bool(cp.isfinite(r).all())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(100, 10), (1000, 20), (4000, 50)])
@pytest.mark.parametrize("vec", [True, False])
def test_lstsq_fast_path_matches_general_route(dtype, shape, vec):
    m, n = shape
    ah = _rand(shape, dtype, 1)
    bh = _rand((m,) if vec else (m, 3), dtype, 2)
    a, b = cp.asarray(ah), cp.asarray(bh)
    fast = _fast.lstsq(a, b, None, True, None, precision=None, refine="auto", tol=None,
                       maxiter=None)
    assert fast is not _fast.MISS
    gen = lstsq_in_memory.lstsq(a, b)  # the general route
    x, res, rank, s = fast
    for got, want in zip(fast, gen):
        if isinstance(want, int):
            assert type(got) is int and got == want
        else:
            assert type(got) is type(want) and got.shape == want.shape \
                and got.dtype == want.dtype
    # a higher-precision reference
    xr = np.linalg.lstsq(ah.astype(np.complex128), bh.astype(np.complex128), rcond=None)[0]
    tol = 100 * np.sqrt(m * n) * _u(dtype) * np.linalg.cond(ah.astype(np.complex128))
    assert np.linalg.norm(x.get() - xr) <= tol * np.linalg.norm(xr)
    sr = np.linalg.svd(ah.astype(np.complex128), compute_uv=False)
    assert np.allclose(s.get(), sr, rtol=tol, atol=0)
    assert rank == n
    rr = bh.astype(np.complex128) - ah.astype(np.complex128) @ x.get()
    assert np.allclose(res.get(), np.sum(np.abs(rr) ** 2, axis=0), rtol=tol * 10)


@pytest.mark.parametrize("dtype", DTYPES)
def test_lstsq_rank_deficient_and_nan_take_general_route(monkeypatch, dtype):
    from mpqr.backends.cupy import small

    monkeypatch.setattr(small, "HOST_MAX", 0)  # the device's route (the host's: SciPy's)
    ah = _rand((100, 10), dtype, 3)
    ah[:, 9] = ah[:, 0]
    a, b = cp.asarray(ah), cp.asarray(_rand((100,), dtype, 4))
    assert _fast.lstsq(a, b, None, True, None, precision=None, refine="auto", tol=None,
                       maxiter=None) is _fast.MISS
    rank = mpqr.lstsq(a, b)[2]
    assert rank == 9
    bn = b.copy()
    bn[5] = np.nan
    assert _fast.lstsq(cp.asarray(_rand((100, 10), dtype)), bn, None, False, None,
                       precision=None, refine="auto", tol=None, maxiter=None) is _fast.MISS


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("where", [(3, 4), (0, 9), (99, 0), (5, 5)])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("early", [True, False])
def test_qr_nonfinite_anywhere_is_seen(monkeypatch, dtype, where, bad, early):
    # the check reads A's column maxima from the copy kernel (early) or R after the
    # factorization (non-finite input leaves R non-finite): both see every entry
    from mpqr.backends.cupy import small

    monkeypatch.setattr(small, "EARLY_CHECK", early)
    a = cp.asarray(_rand((400, 10), dtype, 5))  # past HOST_MAX: the device's check
    assert a.size > small.HOST_MAX
    a[where] = bad
    assert _fast.qr(a, "reduced", None, "auto", False) is _fast.MISS
    assert _fast.qr(a, "r", None, "auto", False) is _fast.MISS


@pytest.mark.parametrize("dtype", DTYPES)
def test_qr_early_check_reads_magnitudes_not_signs(dtype):
    # the maxima are gathered as sign-cleared bit patterns: -0.0, negative NaN and
    # negative entries must order as their magnitudes
    big = 2.0 ** (50 if np.dtype(dtype).char in "fF" else 420)
    ah = _rand((400, 10), dtype, 8)  # past HOST_MAX: the device's check
    ah[:, 2] = -0.0
    a = cp.asarray(ah)
    got = _fast.qr(a, "reduced", None, "auto", True)
    assert got is not _fast.MISS  # a zero column (of -0.0) is factored exactly
    q, r = got
    ref = mpqr.qr(a, method="geqrf")
    tol = 30 * np.sqrt(4000) * _u(dtype)
    assert float(cp.linalg.norm(r - ref[1]) / cp.linalg.norm(ref[1])) <= tol
    assert float(cp.linalg.norm(q @ r - a) / cp.linalg.norm(a)) <= tol
    ah[7, 2] = -big  # a column of -0.0 and one huge negative entry: out of range
    assert _fast.qr(cp.asarray(ah), "reduced", None, "auto", True) is _fast.MISS
    ah[7, 2] = np.copysign(np.nan, -1.0)
    assert _fast.qr(cp.asarray(ah), "r", None, "auto", False) is _fast.MISS
    ah[7, 2] = -1.0  # in range again: taken
    assert _fast.qr(cp.asarray(ah), "r", None, "auto", True) is not _fast.MISS


@pytest.mark.parametrize("dtype", DTYPES)
def test_qr_out_of_range_columns_take_general_route(dtype):
    big = 2.0 ** (50 if np.dtype(dtype).char in "fF" else 420)
    for scale in (big, 1 / big):
        ah = _rand((100, 10), dtype, 7)
        ah[:, 3] *= scale
        a = cp.asarray(ah)
        assert _fast.qr(a, "reduced", None, "auto", True) is _fast.MISS
        q, r = mpqr.qr(a)
        assert float(cp.linalg.norm(q @ r - a) / cp.linalg.norm(a)) <= \
            100 * np.finfo(dtype).eps


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_qr_direct_call_large_real(dtype):
    # beyond small_max the direct call takes the tiled-copy library QR; same conventions
    m = n = 1024
    ah = _rand((m, n), dtype, 11)
    a = cp.asarray(ah)
    assert _fast.qr(a, "reduced", None, "auto", True) is not _fast.MISS
    q, r = mpqr.qr(a)
    d = cp.diagonal(r).get()
    assert np.all(d >= 0) and not bool(cp.tril(r, -1).any())
    tol = 30 * np.sqrt(m * n) * _u(dtype)
    assert float(cp.linalg.norm(q @ r - a) / cp.linalg.norm(a)) <= tol
    assert cp.array_equal(mpqr.qr(a, mode="r"), r)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,bshape", [((21, 20), (21, 4)), ((30, 30), (30, 2)),
                                          ((1, 1), (1,)), ((200, 7), (200, 5))])
@pytest.mark.parametrize("on_device,pack", [(True, True), (False, True), (True, False)])
def test_lstsq_augmented_shapes(monkeypatch, dtype, shape, bshape, on_device, pack):
    # m <= n + k (R_aug a trapezoid), square, 1 x 1; the solve on the host or by trsm,
    # R_aug packed on the device or copied strided
    from mpqr.backends.cupy import small

    monkeypatch.setattr(small, "SOLVE_ON_DEVICE", on_device)
    monkeypatch.setattr(small, "PACK_ON_DEVICE", pack)
    monkeypatch.setattr(small, "HOST_MAX", 0)  # the device's route at these sizes too
    m, n = shape
    ah, bh = _rand(shape, dtype, 12), _rand(bshape, dtype, 13)
    a, b = cp.asarray(ah), cp.asarray(bh)
    fast = _fast.lstsq(a, b, None, True, None, precision=None, refine="auto", tol=None,
                       maxiter=None)
    assert fast is not _fast.MISS
    gen = lstsq_in_memory.lstsq(a, b)  # the general route
    for got, want in zip(fast, gen):
        if isinstance(want, (int, np.integer)):
            assert type(got) is type(want) and got == want
        else:
            assert type(got) is type(want) and got.shape == want.shape \
                and got.dtype == want.dtype
    x, res, rank, s = fast
    a128, b128 = ah.astype(np.complex128), bh.astype(np.complex128)
    xr = np.linalg.lstsq(a128, b128, rcond=None)[0]
    tol = 100 * np.sqrt(m * n) * _u(dtype) * np.linalg.cond(a128)
    assert np.linalg.norm(x.get() - xr) <= tol * np.linalg.norm(xr)
    assert rank == n
    sr = np.linalg.svd(a128, compute_uv=False)
    assert np.allclose(s.get(), sr, rtol=0, atol=tol * sr[0])
    if m > n:
        rr = b128 - a128 @ x.get()
        assert np.allclose(res.get(), np.sum(np.abs(rr) ** 2, axis=0), rtol=tol * 10,
                           atol=tol * np.sum(np.abs(b128) ** 2))
    else:
        assert res.shape == (0,)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("host_max", [0, None])
def test_lstsq_nonfinite_anywhere_takes_general_route(monkeypatch, dtype, host_max):
    from mpqr.backends.cupy import small

    if host_max is not None:  # the device's route (else the host's for this size)
        monkeypatch.setattr(small, "HOST_MAX", host_max)
    a = cp.asarray(_rand((100, 10), dtype, 6))
    b = cp.asarray(_rand((100, 2), dtype, 4))

    def fast(a, b):
        return _fast.lstsq(a, b, None, False, None, precision=None, refine="auto",
                           tol=None, maxiter=None)

    assert fast(a, b) is not _fast.MISS
    for bad in (np.nan, np.inf):
        for where in [(0, 9), (99, 0), (4, 4)]:
            an = a.copy()
            an[where] = bad
            assert fast(an, b) is _fast.MISS
        # b's rows of Q^H b, of R_aug's last column and of its reflector (below R_aug)
        for where in [(0, 1), (11, 1), (99, 1), (99, 0)]:
            bn = b.copy()
            bn[where] = bad
            assert fast(a, bn) is _fast.MISS


@pytest.mark.parametrize("dtype", [np.float64, np.complex64])
@pytest.mark.parametrize("layout", ["C", "F", "columns of a wider array"])
def test_lstsq_beyond_small_max_takes_the_augmented_qr(dtype, layout):
    # past small_max (2^18) up to small_lstsq_max, tall with at most small_lstsq_max_n
    # columns: the one geqrf of [A | b], SciPy's tuple, against a complex128 reference
    from mpqr.backends import get_backend

    be = get_backend(cp)
    m, n = 10000, 50
    assert be.small_max < m * n <= be.small_lstsq_max and n <= be.small_lstsq_max_n
    ah, bh = _rand((m, n), dtype, 1), _rand((m,), dtype, 2)
    a, b = cp.asarray(ah), cp.asarray(bh)
    if layout == "F":
        a = cp.asfortranarray(a)
    elif layout != "C":  # row-major with a leading dimension past n (the tiled copy)
        wide = cp.zeros((m, n + 7), dtype=dtype)
        wide[:, 3:n + 3] = a
        a = wide[:, 3:n + 3]
    fast = _fast.lstsq(a, b, None, True, None, precision=None, refine="auto", tol=None,
                       maxiter=None)
    assert fast is not _fast.MISS
    x, res, rank, s = fast
    a128, b128 = ah.astype(np.complex128), bh.astype(np.complex128)
    xr = np.linalg.lstsq(a128, b128, rcond=None)[0]
    sr = np.linalg.svd(a128, compute_uv=False)
    tol = 100 * np.sqrt(m * n) * _u(dtype) * float(sr[0] / sr[-1])
    # SciPy: a scalar for a 1-D b (NumPy would give shape (1,))
    assert rank == n and x.shape == (n,) and res.shape == () and s.shape == (n,)
    assert np.linalg.norm(x.get() - xr) <= tol * np.linalg.norm(xr)
    assert np.allclose(s.get(), sr, rtol=0, atol=tol * sr[0])
    rr = b128 - a128 @ x.get()
    assert np.allclose(res.get(), np.sum(np.abs(rr) ** 2), rtol=tol * 10)
    # more columns than the host SVD takes: the general route
    w = cp.asarray(_rand((10000, be.small_lstsq_max_n + 8), dtype, 3))
    assert _fast.lstsq(w, b, None, True, None, precision=None, refine="auto", tol=None,
                       maxiter=None) is _fast.MISS


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,k,driver,dep", [
    ((100, 10), None, None, False), ((21, 20), 4, "gelss", False),
    ((10, 30), None, None, False), ((100, 10), 3, "gelsy", False), ((40, 8), None, None, True)])
def test_tiny_inputs_take_the_host_lapack_with_scipys_results(dtype, shape, k, driver, dep):
    # up to HOST_MAX elements: one download, SciPy's driver call, one upload; wide,
    # rank-deficient and every driver as SciPy gives them
    import scipy.linalg as sla
    from mpqr.backends.cupy import small

    m, n = shape
    ah = _rand(shape, dtype, 11)
    if dep:
        ah[:, n - 1] = ah[:, 1]
    bh = _rand((m,) if k is None else (m, k), dtype, 12)
    a, b = cp.asarray(ah), cp.asarray(bh)
    assert a.size + b.size <= small.HOST_MAX
    assert _fast.lstsq(a, b, None, True, driver, precision=None, refine="auto", tol=None,
                       maxiter=None) is not _fast.MISS
    got = mpqr.lstsq(a, b, lapack_driver=driver)
    ref = sla.lstsq(ah, bh, lapack_driver=driver)
    assert got[2] == ref[2]
    eps = np.finfo(dtype).eps
    for g, r in ((got[0], ref[0]), (got[1], ref[1]), (got[3], ref[3])):
        if r is None:
            assert g is None
            continue
        assert isinstance(g, cp.ndarray) and g.shape == r.shape and g.dtype == r.dtype
        scale = float(np.nanmax(np.abs(r))) if r.size else 1.0
        assert np.allclose(g.get(), r, rtol=50 * eps, atol=50 * eps * scale, equal_nan=True)
    qa = cp.asarray(_rand((100, 10), dtype, 13))
    q, r = mpqr.qr(qa)
    assert q.flags.f_contiguous and r.flags.c_contiguous  # cuSOLVER's layouts
    tol = 30 * np.sqrt(1000) * _u(dtype)
    assert float(cp.linalg.norm(q @ r - qa) / cp.linalg.norm(qa)) <= tol
    assert bool((cp.diagonal(r).real >= 0).all()) and not bool(cp.tril(r, -1).any())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("early", [True, False])
def test_qr_direct_call_past_the_fused_check_sees_nonfinite_and_range(monkeypatch, dtype,
                                                                       early):
    # past EARLY_CHECK_MAX the maxima take a pass of their own (or R is read afterwards)
    from mpqr.backends.cupy import small

    monkeypatch.setattr(small, "EARLY_CHECK", early)
    m, n = 1200, 300
    assert m * n > small.EARLY_CHECK_MAX
    ah = _rand((m, n), dtype, 21)
    a = cp.asarray(ah)
    assert _fast.qr(a, "r", None, "auto", True) is not _fast.MISS
    big = -(2.0 ** (60 if np.dtype(dtype).char in "fF" else 500))
    for v in (np.nan, -np.inf, big):
        bad = ah.copy()
        bad[777, 123] = v
        assert _fast.qr(cp.asarray(bad), "reduced", None, "auto", False) is _fast.MISS
