"""mpqr.compat.scipy refuses the LAPACK-level arguments SciPy refuses, with SciPy's
exception (class included) and message: ``lwork`` below what ``?geqrf`` and
``?orgqr``/``?ungqr`` need, ``overwrite_a``/``overwrite_b`` that are true but no
integer, or have no truth value. Each value is run through ``scipy.linalg`` itself."""

from __future__ import annotations

import warnings

import mpqr.compat.scipy as mcs
import numpy as np
import pytest
import scipy.linalg as sla

from mpqr.lstsq import _scipy_rules as rules

#: too small for some (dtype, shape, mode) and fine for others; f2py's int conversion
#: (floats truncate, numeric strings parse, sequences give their first item); no huge
#: valid value: SciPy allocates the workspace asked for
LWORKS = [None, -1, -2, 0, 1, 2, 3, 4, 5, 6, 7, 100, True, np.int64(2), -(2**31),
          2**40, 2.5, 4.0, -1.0, -1.5, -0.5, 0.9, np.float32(6.0), 1e30, float("nan"),
          float("inf"), "3", "6", "6.5", "abc", b"6", b"x", [6], [2], [], (6, 1),
          np.array(6), np.array([6, 7]), 6 + 0j, 2 + 0j, object()]
FLAGS = [True, False, 0, 1, 2, None, "", [], np.int64(1), np.array(1), "yes", [1], 1.5,
         1 + 0j, np.bool_(True), np.array([1]), np.array([1, 2])]


def _outcome(f, *args, **kw):
    """``"ok"`` or the exception's class and message."""
    try:
        f(*args, **kw)
    except Exception as exc:  # every outcome is compared with SciPy's
        return type(exc), str(exc)
    return "ok"


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64, np.complex128])
def test_qr_lwork_and_overwrite_a_are_refused_as_scipy(dtype):
    refused = set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # NumPy on int(array([6]))
        for shape in [(6, 4), (4, 6), (5, 5)]:
            a = np.random.default_rng(0).standard_normal(shape).astype(dtype)
            for mode in ("full", "economic", "r"):
                for lwork in LWORKS:
                    want = _outcome(sla.qr, a, lwork=lwork, mode=mode)
                    assert _outcome(mcs.qr, a, lwork=lwork, mode=mode) == want, (shape, mode,
                                                                                  lwork)
                    refused.add(want != "ok")
                for flag in FLAGS:
                    want = _outcome(sla.qr, a, overwrite_a=flag, mode=mode)
                    assert _outcome(mcs.qr, a, overwrite_a=flag, mode=mode) == want, (
                        shape, mode, flag)
    assert refused == {True, False}  # the values tell both outcomes apart


def test_qr_lwork_errors_are_scipys_lapack_error_class_and_message():
    a = np.ones((6, 4))
    for lwork, routine in [(0, "dgeqrf"), (2, "dgeqrf"), (5, "dorgqr")]:
        with pytest.raises(Exception) as ours:
            mcs.qr(a, lwork=lwork)
        with pytest.raises(Exception) as theirs:
            sla.qr(a, lwork=lwork)
        assert type(ours.value) is type(theirs.value)
        assert str(ours.value) == str(theirs.value)
        if not rules.scipy_1_18_results():  # LAPACK's own check (SciPy 1.18: its own)
            assert str(ours.value) == (
                f"(lwork>=n||lwork==-1) failed for 1st keyword lwork: {routine}:lwork={lwork}")
    if rules.scipy_1_18_results():  # the flag's truth value only
        assert _outcome(mcs.qr, a, overwrite_a="yes") == "ok" == \
            _outcome(sla.qr, a, overwrite_a="yes")
    else:
        with pytest.raises(TypeError,
                           match="^'str' object cannot be interpreted as an integer$"):
            mcs.qr(a, overwrite_a="yes")
    # an empty matrix reaches no LAPACK call in SciPy: nothing is checked before 1.18;
    # SciPy 1.18 checks lwork (> M) before it looks at the size
    want = _outcome(sla.qr, np.ones((0, 3)), lwork=0, overwrite_a="yes")
    assert _outcome(mcs.qr, np.ones((0, 3)), lwork=0, overwrite_a="yes") == want
    assert want == ((ValueError, "lwork should be None, -1 or > M, got 0")
                    if rules.scipy_1_18_results() else "ok")


@pytest.mark.parametrize("driver", ["gelsd", "gelss", "gelsy"])
def test_lstsq_overwrite_flags_are_refused_as_scipy(driver):
    """SciPy reads both flags' truth values; gelss hands them to LAPACK as integers."""
    a = np.random.default_rng(1).standard_normal((6, 4))
    b = np.ones(6)
    refused = set()
    for flag in FLAGS:
        for name in ("overwrite_a", "overwrite_b"):
            kw = {name: flag, "lapack_driver": driver}
            want = _outcome(sla.lstsq, a, b, **kw)
            assert _outcome(mcs.lstsq, a, b, **kw) == want, (name, flag)
            refused.add(want != "ok")
    assert refused == {True, False}
    # SciPy's shape errors come first
    assert _outcome(mcs.lstsq, a, b[:5], overwrite_a="yes", lapack_driver="gelss") == \
        _outcome(sla.lstsq, a, b[:5], overwrite_a="yes", lapack_driver="gelss")


@pytest.mark.parametrize("driver", ["gelsd", "gelss", "gelsy"])
def test_lstsq_flags_under_scipy_1_18_rules(monkeypatch, driver):
    """SciPy >= 1.18 reads the flags' truth values only (overwrite_a's before the shape
    checks, overwrite_b's once the problem reaches LAPACK) and hands LAPACK none: a true
    flag that is no integer passes with every driver; an array of several elements is
    refused as its truth value is."""
    monkeypatch.setattr(rules, "scipy_1_18_results", lambda: True)
    a = np.random.default_rng(1).standard_normal((6, 4))
    b = np.ones(6)
    for flag in ("yes", [1], 1.5, 1 + 0j):
        for name in ("overwrite_a", "overwrite_b"):
            x = mcs.lstsq(a, b.copy(), lapack_driver=driver, **{name: flag})[0]
            np.testing.assert_allclose(x, sla.lstsq(a, b, lapack_driver=driver)[0],
                                       rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="truth value of an array"):
        mcs.lstsq(a, b[:5], overwrite_a=np.array([1, 2]), lapack_driver=driver)
    with pytest.raises(ValueError, match="Shape mismatch|same number of rows"):
        mcs.lstsq(a, b[:5], overwrite_b=np.array([1, 2]), lapack_driver=driver)
    with pytest.raises(ValueError, match="truth value of an array"):
        mcs.lstsq(a, b, overwrite_b=np.array([1, 2]), lapack_driver=driver)


def test_qr_under_scipy_1_18_rules(monkeypatch):
    """SciPy >= 1.18's ``qr`` (its source's order): ``lwork``, when given, refused at or
    below ``M`` (but None and -1) and deprecated otherwise; ``overwrite_a`` read for its
    truth value only; an empty input, zero-size batches included, answered in the LAPACK
    dtype (an integer input's float64); a 1-D input's message."""
    sentinel = object()  # SciPy 1.18's "lwork not given"
    monkeypatch.setattr(rules, "scipy_1_18_results", lambda: True)
    monkeypatch.setattr(mcs, "_LWORK", sentinel)
    a = np.random.default_rng(2).standard_normal((6, 4))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        q, r = mcs.qr(a, lwork=sentinel)
        q2, r2 = mcs.qr(a, lwork=sentinel, overwrite_a="yes")  # a truth value only
    np.testing.assert_allclose(q @ r, a, atol=1e-13)
    np.testing.assert_array_equal(q2, q)
    np.testing.assert_array_equal(r2, r)
    for lwork in (-2, 0, 6):
        with pytest.raises(ValueError, match=f"^lwork should be None, -1 or > M, got {lwork}$"):
            mcs.qr(a, lwork=lwork)
    for lwork in (None, -1, 7):
        with pytest.warns(DeprecationWarning, match="the `lwork` keyword is deprecated"):
            q3, _ = mcs.qr(a, lwork=lwork)
        np.testing.assert_array_equal(q3, q)
    with pytest.raises(ValueError, match="^Expected at least a 2-D array$"):
        mcs.qr(np.ones(3), lwork=sentinel)
    for mode in ("full", "economic", "r", "raw"):
        out = mcs.qr(np.ones((0, 3), dtype=np.int64), lwork=sentinel, mode=mode)
        leaves = [x for o in out for x in (o if isinstance(o, tuple) else (o,))]
        assert all(x.dtype == np.float64 for x in leaves), mode
    q, r = mcs.qr(np.ones((0, 3, 3), dtype=np.float32), lwork=sentinel)
    assert q.shape == (0, 3, 3) and r.shape == (0, 3, 3) and q.dtype == np.float32
    q, r = mcs.qr(np.ones((4, 0)), lwork=sentinel)
    np.testing.assert_array_equal(q, np.eye(4))
    assert r.shape == (4, 0)


def test_dtype_deprecation_under_scipy_1_18_rules(monkeypatch):
    """SciPy 1.18 warns of dtypes beyond integers and LAPACK's four (bool, float16, ...)
    in ``qr`` and ``lstsq`` (the first such array only, after the finiteness check); the
    front ends follow it there and stay silent under SciPy 1.17."""
    a16 = (np.eye(4, 3) * 2 + 1).astype(np.float16)
    b16 = np.ones(4, dtype=np.float16)
    for new in (False, True):
        monkeypatch.setattr(rules, "scipy_1_18_results", lambda new=new: new)
        monkeypatch.setattr(mcs, "_LWORK", None)
        for call, name, char in ((lambda: mcs.qr(a16, lwork=None), "qr", "e"),
                                 (lambda: mcs.qr(a16 > 1, lwork=None), "qr", "?"),
                                 (lambda: mcs.lstsq(a16, b16), "lstsq", "e"),
                                 (lambda: mcs.lstsq(a16.astype(np.int8), b16), "lstsq", "e")):
            with warnings.catch_warnings(record=True) as got:
                warnings.simplefilter("always")
                call()
            msgs = [str(w.message) for w in got if w.category is DeprecationWarning]
            if new:
                assert len(msgs) == 1 and msgs[0].startswith(
                    f"Calling linalg.{name} with arguments of dtype=") and \
                    f"(a.dtype.char = '{char}') is deprecated in SciPy 1.18.0" in msgs[0]
            else:
                assert not msgs
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            mcs.qr(a16.astype(np.int16), lwork=None)
            mcs.lstsq(a16.astype(np.float32), b16.astype(np.float64))
        with pytest.raises(ValueError, match="infs or NaNs"):  # before any warning
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                mcs.lstsq(a16, np.array([np.nan, 1, 1, 1], dtype=np.float16))


@pytest.mark.parametrize("pivoting", [False, True])
@pytest.mark.parametrize("shape", [(2, 3, 6, 4), (3, 4, 6)])
def test_raw_qr_of_a_stack_under_scipy_1_18_rules(monkeypatch, shape, pivoting):
    """SciPy 1.18 gives ``mode="raw"`` for stacks: each matrix's ``((h, tau), R[, P])``
    stacked, the reflectors LAPACK's (its ``orgqr`` rebuilds Q); before, a clear error."""
    from scipy.linalg import lapack

    a = np.random.default_rng(5).standard_normal(shape)
    monkeypatch.setattr(rules, "scipy_1_18_results", lambda: False)
    with pytest.raises(ValueError, match="mode='raw' needs a 2-D `a`"):
        mcs.qr(a, mode="raw", pivoting=pivoting)
    monkeypatch.setattr(rules, "scipy_1_18_results", lambda: True)
    out = mcs.qr(a, mode="raw", pivoting=pivoting)
    (h, tau), r, *p = out
    *batch, m, n = shape
    k = min(m, n)
    assert h.shape == a.shape and tau.shape == (*batch, k) and r.shape == (*batch, k, n)
    for idx in np.ndindex(*batch):
        (h1, t1), r1, *p1 = mcs.qr(a[idx], mode="raw", pivoting=pivoting)
        assert np.array_equal(h[idx], h1) and np.array_equal(tau[idx], t1)
        assert np.array_equal(r[idx], r1)
        q, _, info = lapack.dorgqr(h1[:, :k] if m >= n else h1[:, :m], t1)
        assert info == 0
        cols = p1[0] if pivoting else np.arange(n)
        assert np.allclose(q[:, :k] @ r1, a[idx][:, cols], atol=1e-13)
        if pivoting:
            assert np.array_equal(p[0][idx], p1[0]) and p[0].dtype == np.int32


@pytest.mark.parametrize("new", [False, True])
def test_pivots_of_an_empty_stack_as_the_installed_scipy_gives_them(monkeypatch, new):
    """An empty stack's ``P``: one per matrix before SciPy 1.18 (its batch decorator), one
    ``arange(N)`` in LAPACK's integer from 1.18 on (its own empty-input branch)."""
    from scipy.linalg import lapack

    a = np.zeros((2, 0, 3))
    monkeypatch.setattr(rules, "scipy_1_18_results", lambda: new)
    p = mcs.qr(a, pivoting=True)[-1]
    if new:
        assert p.shape == (3,) and p.dtype == (np.int64 if lapack.HAS_ILP64 else np.int32)
    else:
        installed_1_18 = rules.nan_residues_when_rank_deficient()  # the installed release
        want = None if installed_1_18 else sla.qr(a, pivoting=True)[-1]
        assert p.shape == (2, 3) and p.dtype == np.int32
        if want is not None:
            assert np.array_equal(p, want) and p.dtype == want.dtype
    assert np.array_equal(p[..., :], np.broadcast_to(np.arange(3), p.shape))


@pytest.mark.parametrize("shape", [(4, 3), (3, 4)])
@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("dtype", [int, float])
@pytest.mark.parametrize("pivoting", [False, True])
@pytest.mark.parametrize("mode", ["raw", "r", "economic", "full"])
def test_qr_overwrite_a_under_scipy_1_18_rules(monkeypatch, shape, order, dtype, pivoting, mode):
    """SciPy >= 1.18 factors a 2-D F-ordered float ``a`` in place under ``overwrite_a``:
    the raw reflectors, R (modes "r", "full") or Q ("economic") in ``a``'s memory, the
    factors right; any other ``a`` shares no memory with the results. Before 1.18 the
    input is never touched. The raw reflectors F-ordered, as LAPACK leaves them."""
    rng = np.random.default_rng(5)
    base = rng.normal(size=shape[::-1] if order == "F" else shape).astype(dtype)
    for new in sorted({True, rules.scipy_1_18_results()}):  # the installed rules and 1.18's
        monkeypatch.setattr(rules, "scipy_1_18_results", lambda new=new: new)
        a = base.T if order == "F" else base.copy()
        a = a.copy(order=order)
        a_ref = a.copy()
        out = mcs.qr(a, mode=mode, pivoting=pivoting, overwrite_a=True)
        shared = new and order == "F" and dtype is float
        if mode == "raw":
            (h, tau), r, *p = out
            assert h.flags.f_contiguous
            q = sla.lapack.dorgqr(h[:, :min(shape)], tau)[0]
            cols = p[0] if pivoting else slice(None)
            np.testing.assert_allclose(q @ r, a_ref[:, cols], atol=1e-12)
            assert np.shares_memory(a, h) == shared
            continue
        if mode == "r":  # R^T R is the Gram matrix of a's (permuted) columns
            assert np.shares_memory(a, out[0]) == shared
            ap = a_ref[:, out[1]] if pivoting else a_ref
            np.testing.assert_allclose(out[0].T @ out[0], ap.T @ ap, atol=1e-10)
            continue
        q, r = out[0], out[1]
        cols = out[2] if pivoting else slice(None)
        np.testing.assert_allclose(q @ r, a_ref[:, cols], atol=1e-12)
        assert np.shares_memory(a, out[0 if mode == "economic" else 1]) == shared
        if not shared:
            assert np.array_equal(a, a_ref)


@pytest.mark.parametrize("shape", [(4, 3), (3, 4)])
@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("nrhs", [None, 1, 5])
@pytest.mark.parametrize("driver", ["gelsd", "gelss", "gelsy"])
def test_lstsq_overwrite_under_scipy_1_18_rules(monkeypatch, shape, order, nrhs, driver):
    """SciPy >= 1.18's lstsq under ``overwrite_a``/``overwrite_b``: a 2-D F-ordered ``a``
    of the problem's dtype is destroyed (LAPACK works in it), an F-ordered ``b`` with
    ``M >= N`` holds ``x`` in its first ``N`` rows and the ``x`` returned is that view;
    anything else untouched, ``x`` its own array; the solution right either way. Before
    1.18 neither input is touched."""
    rng = np.random.default_rng(6)
    m, n = shape
    for new in sorted({True, rules.scipy_1_18_results()}):  # the installed rules and 1.18's
        monkeypatch.setattr(rules, "scipy_1_18_results", lambda new=new: new)
        a = np.asarray(rng.normal(size=shape), order=order)
        b = rng.normal(size=m if nrhs is None else (m, nrhs))
        b = np.asarray(b, order=order)
        a_ref, b_ref = a.copy(), b.copy()
        x = mcs.lstsq(a, b, overwrite_a=True, overwrite_b=True, lapack_driver=driver)[0]
        want = sla.lstsq(a_ref, b_ref, lapack_driver=driver)[0]
        np.testing.assert_allclose(x, want, atol=1e-10)
        over_a = new and order == "F"
        over_b = new and (b.ndim == 1 or b.flags.f_contiguous) and m >= n
        assert np.array_equal(a, a_ref) != over_a
        assert np.array_equal(b, b_ref) != over_b
        assert np.shares_memory(x, b) == over_b


def test_lstsq_driver_read_first_under_scipy_1_18_rules(monkeypatch):
    """SciPy >= 1.18 validates ``lapack_driver`` before anything else (a shape mismatch
    too); the installed SciPy's order otherwise (before 1.18 the shapes first)."""
    a, b = np.ones((3, 4)), np.ones(4)
    installed = rules.scipy_1_18_results()
    monkeypatch.setattr(rules, "scipy_1_18_results", lambda: True)
    with pytest.raises(ValueError, match='LAPACK driver "krampus" is not found'):
        mcs.lstsq(a, b, lapack_driver="krampus")
    monkeypatch.setattr(rules, "scipy_1_18_results", lambda: installed)
    with pytest.raises(ValueError) as theirs:
        sla.lstsq(a, b, lapack_driver="krampus")
    with pytest.raises(ValueError) as ours:
        mcs.lstsq(a, b, lapack_driver="krampus")
    assert str(ours.value) == str(theirs.value)
