"""mpqr.compat.scipy: SciPy's signatures, results and errors; patch() routing."""

from __future__ import annotations

import inspect
import threading

import mpqr.compat.scipy as mcs
import numpy as np
import pytest
import scipy.linalg
import scipy.linalg as sla
from mpqr.compat import _patch
from scipy.linalg import lstsq as imported_lstsq
from scipy.linalg import qr as imported_qr

import mpqr

EPS = np.finfo(np.float64).eps


def test_signatures_match_scipy():
    for name in ("lstsq", "qr"):
        ours = inspect.signature(getattr(mcs, name))
        theirs = inspect.signature(_patch.original(name))
        assert list(ours.parameters) == list(theirs.parameters)
        assert [p.default for p in ours.parameters.values()] == \
            [p.default for p in theirs.parameters.values()]


def test_lstsq_array_like_and_scalar_residues():
    a = [[1, 0], [0, 1], [1, 1]]
    b = [1, 1, 3]
    x, res, rank, _s = mcs.lstsq(a, b)
    # SciPy 1.18's lstsq reads ``a.shape`` before converting: it takes arrays only
    xs, ress, ranks, _ss = sla.lstsq(np.asarray(a), np.asarray(b))
    np.testing.assert_allclose(x, xs, rtol=25 * EPS * 4)
    assert type(res) is type(ress) and np.isclose(res, ress, rtol=1e-13)
    assert rank == ranks and type(rank) is type(ranks)
    with pytest.raises(ValueError, match="object arrays are not supported"):
        mcs.lstsq(np.array([[object()]]), [1])
    with pytest.raises(ValueError, match="array must not contain infs or NaNs"):
        mcs.lstsq([[1.0, np.nan]], [1.0])
    with pytest.raises(ValueError, match='LAPACK driver "x" is not found'):
        mcs.lstsq(a, b, lapack_driver="x")


@pytest.mark.parametrize("new", [False, True])
def test_lstsq_residue_of_a_vector_as_the_installed_scipy_gives_it(monkeypatch, new):
    """A 1-D ``b``'s residue: a NumPy scalar before SciPy 1.18, a 0-d array from 1.18 on
    (its ``residuals[..., 0]``)."""
    from mpqr.lstsq import _scipy_rules as rules

    monkeypatch.setattr(rules, "scipy_1_18_results", lambda: new)
    a = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    res = mcs.lstsq(a, np.array([1.0, 1.0, 3.0]))[1]
    assert type(res) is (np.ndarray if new else np.float64) and np.shape(res) == ()
    assert np.isclose(res, 1 / 3, rtol=1e-13)
    # an empty a: the scalar of SciPy's early return under either rule (||b||^2 for N = 0)
    res = mcs.lstsq(np.ones((3, 0)), np.array([1.0, 2.0, 2.0]))[1]
    assert type(res) is np.float64 and res == 9.0
    res = mcs.lstsq(np.ones((0, 0)), np.ones(0))[1]
    assert type(res) is np.float64 and res == 0.0


@pytest.mark.parametrize("mode", ["full", "qr", "economic", "r"])
@pytest.mark.parametrize("shape", [(7, 4), (4, 7), (5, 5), (0, 3), (3, 0)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex128, np.int64])
def test_qr_modes_like_scipy(mode, shape, dtype):
    rng = np.random.default_rng(1)
    a = (rng.standard_normal(shape) * 5).astype(dtype)
    ref = sla.qr(a, mode=mode)
    out = mcs.qr(a, mode=mode)
    assert isinstance(out, tuple) and len(out) == len(ref)
    for got, want in zip(out, ref):
        assert got.shape == want.shape and got.dtype == want.dtype
    eps = np.finfo(ref[0].dtype).eps if np.issubdtype(ref[0].dtype, np.inexact) else EPS
    tol = 25 * eps * max((*shape, 1))
    r = out[-1]
    # same factorization up to column signs of Q / row signs of R
    np.testing.assert_allclose(np.abs(r), np.abs(ref[-1]), rtol=tol, atol=tol * max(1, np.abs(a).max(initial=0)))
    if mode != "r" and a.size:
        np.testing.assert_allclose(out[0] @ r, a, rtol=tol, atol=tol * np.abs(a).max())
        q = out[0]
        np.testing.assert_allclose(q.conj().T @ q, np.eye(q.shape[1]), atol=tol)


def test_qr_errors_like_scipy():
    with pytest.raises(ValueError, match=r"Mode argument should be one of \['full', 'r', 'economic', 'raw'\]"):
        mcs.qr(np.eye(2), mode="nope")
    with pytest.raises(ValueError) as theirs:
        sla.qr(np.ones(3))
    with pytest.raises(ValueError, match="xpected (at least )?a 2-D array") as ours:
        mcs.qr(np.ones(3))
    assert str(ours.value) == str(theirs.value)
    with pytest.raises(ValueError, match="array must not contain infs or NaNs"):
        mcs.qr(np.array([[np.inf]]))


def test_patch_routes_every_binding_and_restores():
    orig_lstsq, orig_qr = _patch.original("lstsq"), _patch.original("qr")
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((20, 4)), rng.standard_normal(20)
    with mpqr.explain() as trace, mcs.patch():
        assert scipy.linalg.lstsq is mcs.lstsq and scipy.linalg._basic.lstsq is mcs.lstsq
        assert scipy.linalg._decomp_qr.qr is mcs.qr and scipy.linalg.qr is mcs.qr
        assert globals()["imported_lstsq"] is mcs.lstsq and globals()["imported_qr"] is mcs.qr
        x = imported_lstsq(a, b)[0]
        imported_qr(a)
    assert any("lstsq" in e.message for e in trace.events)
    assert any(e.message.startswith("qr:") for e in trace.events)
    assert scipy.linalg.lstsq is orig_lstsq and imported_lstsq is orig_lstsq
    assert scipy.linalg.qr is orig_qr and imported_qr is orig_qr
    np.testing.assert_allclose(x, sla.lstsq(a, b)[0], rtol=1e-12)


def test_patch_decorator_precision_nesting_and_exceptions():
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal((30, 5)), rng.standard_normal(30)

    @mcs.patch(precision="fp32-emulated")
    def fit():
        return scipy.linalg.lstsq(a, b)[0]

    with mpqr.explain() as trace:
        fit()
    assert any(e.data.get("precision") == "fp32-emulated" for e in trace.events)
    assert scipy.linalg.lstsq is _patch.original("lstsq")
    with mcs.patch():
        with mcs.patch(precision="fp16"):
            assert _patch.current_precision() == "fp16"
        assert _patch.current_precision() is None
        assert scipy.linalg.lstsq is mcs.lstsq  # inner exit does not restore
    assert scipy.linalg.lstsq is _patch.original("lstsq")
    with pytest.raises(RuntimeError), mcs.patch():
        raise RuntimeError
    assert scipy.linalg.lstsq is _patch.original("lstsq")
    with pytest.raises(ValueError, match="`precision` must be one of"):
        mcs.patch(precision="fp7")


def test_patch_thread_safe():
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((40, 6)), rng.standard_normal(40)
    want = sla.lstsq(a, b)[0]
    errors = []

    def worker():
        try:
            for _ in range(5):
                with mcs.patch():
                    x = scipy.linalg.lstsq(a, b)[0]
                    np.testing.assert_allclose(x, want, rtol=1e-11)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert not _patch.is_patched() and scipy.linalg.lstsq is _patch.original("lstsq")


def test_lstsq_of_text_arrays_as_scipy_takes_them():
    """Numbers written as text are solved as SciPy's LAPACK wrappers take them (float64);
    other text gets NumPy's ValueError, as in SciPy."""
    a = np.array([["1", "2"], ["3", "4"], ["5", "7"]])
    b = np.array(["1", "2", "3"])
    want, got = sla.lstsq(a, b), mcs.lstsq(a, b)
    assert got[0].dtype == want[0].dtype == np.float64
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12)
    with pytest.raises(ValueError) as theirs:
        sla.lstsq(np.array([["a", "b"], ["c", "d"]]), np.ones(2))
    with pytest.raises(ValueError) as ours:
        mcs.lstsq(np.array([["a", "b"], ["c", "d"]]), np.ones(2))
    assert str(ours.value) == str(theirs.value)
