"""``mpqr.compat.scipy``: ``qr(pivoting=True)``, ``qr(mode="raw")``, ``qr_multiply`` and
``rq`` computed by mpqr, against SciPy itself, and a patched program mixing them."""

from __future__ import annotations

import warnings

import mpqr.compat.scipy as mcs
import numpy as np
import pytest
import scipy.linalg as sla
from mpqr.compat import _patch
from scipy.linalg import lapack

import mpqr

U64 = np.finfo(np.float64).eps / 2


def _sig(out):
    """Nested (dtype, shape) of a result, as SciPy nests it (its batched functions return
    lists)."""
    if isinstance(out, (tuple, list)):
        return tuple(_sig(o) for o in out)
    return (out.dtype, out.shape)


def _q_from_raw(h, tau):
    k = tau.shape[0]
    f = lapack.zungqr if np.iscomplexobj(h) else lapack.dorgqr
    q, _, info = f(np.asfortranarray(h[:, :k]), tau)
    assert info == 0
    return q


@pytest.mark.parametrize("shape", [(7, 5), (5, 7), (0, 3), (3, 0), (6, 6)])
@pytest.mark.parametrize("mode", ["full", "economic", "r", "raw"])
@pytest.mark.parametrize("pivoting", [False, True])
def test_qr_matches_scipy_results(shape, mode, pivoting):
    rng = np.random.default_rng(0)
    a = rng.standard_normal(shape) * rng.uniform(0.5, 5, shape[-1:])  # distinct norms
    a0 = a.copy()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # computed by mpqr: no delegation warning
        out = mcs.qr(a, mode=mode, pivoting=pivoting)
    ref = sla.qr(a, mode=mode, pivoting=pivoting)
    assert _sig(out) == _sig(ref)
    np.testing.assert_array_equal(a, a0)
    if 0 in shape:
        return
    p = out[-1] if pivoting else np.arange(shape[1])
    if pivoting:
        np.testing.assert_array_equal(p, ref[-1])  # small, distinct norms: geqp3's order
    k = min(shape)
    if mode == "raw":
        (h, tau), r = out[0], out[1]
        q = _q_from_raw(h, tau)
        np.testing.assert_array_equal(np.triu(h[:k]), r)
    elif mode == "r":
        q, r = None, out[0]
    else:
        q, r = out[0], out[1]
    assert np.all(np.diagonal(r) >= 0)  # mpqr's sign convention, raw reflectors too
    q2, r2 = mpqr.qr(a[:, p])
    assert np.linalg.norm(r[:k] - r2) <= 20 * max(shape) * U64 * np.linalg.norm(a)
    if q is not None:
        assert np.linalg.norm(q[:, :k] - q2) <= 20 * max(shape) * U64 * np.linalg.cond(a)
        assert np.linalg.norm(a[:, p] - q[:, :r.shape[0]] @ r) <= \
            20 * max(shape) * U64 * np.linalg.norm(a)


def test_qr_complex_raw_and_pivoting():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((9, 6)) + 1j * rng.standard_normal((9, 6))
    (h, tau), r, p = mcs.qr(a, mode="raw", pivoting=True)
    assert _sig(((h, tau), r, p)) == _sig(sla.qr(a, mode="raw", pivoting=True))
    q = _q_from_raw(h, tau)
    assert np.all(np.diagonal(r).imag == 0) and np.all(np.diagonal(r).real >= 0)
    assert np.linalg.norm(a[:, p] - q @ r) <= 20 * 9 * U64 * np.linalg.norm(a)
    q2, _r2, p2 = mcs.qr(a, mode="economic", pivoting=True)
    np.testing.assert_array_equal(p, p2)
    assert np.linalg.norm(q - q2) <= 20 * 9 * U64 * np.linalg.cond(a)


def test_qr_raw_of_a_stack_as_the_installed_scipy():
    """Before SciPy 1.18 a stack has no raw QR (SciPy fails in its batch decorator; mpqr
    says why); from 1.18 each matrix's reflectors, stacked as SciPy stacks them."""
    a = np.random.default_rng(3).standard_normal((2, 5, 3))
    try:
        ref = sla.qr(a, mode="raw")
    except ValueError:
        with pytest.raises(ValueError, match="mode='raw' needs a 2-D `a`"):
            mcs.qr(a, mode="raw")
        return
    (h, tau), r = mcs.qr(a, mode="raw")
    assert _sig(((h, tau), r)) == _sig(ref)
    for i in range(2):
        q = _q_from_raw(h[i], tau[i])
        assert np.linalg.norm(q @ r[i] - a[i]) <= 50 * U64 * np.linalg.norm(a[i])


def test_qr_pivoting_batched_and_nonfinite():
    rng = np.random.default_rng(2)
    a = rng.standard_normal((3, 6, 4)) * rng.uniform(0.5, 5, (3, 1, 4))
    out = mcs.qr(a, pivoting=True)
    ref = sla.qr(a, pivoting=True)
    assert _sig(out) == _sig(ref)
    np.testing.assert_array_equal(out[2], ref[2])
    a[0, 1, 1] = np.nan
    with pytest.raises(ValueError, match="array must not contain infs or NaNs"):
        mcs.qr(a, pivoting=True)


@pytest.mark.parametrize("shape", [(7, 4), (4, 7)])
@pytest.mark.parametrize("mode,cshape", [("left", "k2"), ("left", "k"), ("right", "2m"),
                                         ("right", "m")])
@pytest.mark.parametrize("pivoting", [False, True])
@pytest.mark.parametrize("conjugate", [False, True])
def test_qr_multiply_matches_scipy(shape, mode, cshape, pivoting, conjugate):
    rng = np.random.default_rng(3)
    m, n = shape
    k = min(m, n)
    a = rng.standard_normal(shape) + 1j * rng.standard_normal(shape)
    cs = {"k2": (k, 2), "k": (k,), "2m": (2, m), "m": (m,)}[cshape]
    c = rng.standard_normal(cs) + 1j * rng.standard_normal(cs)
    c0 = c.copy()
    out = mcs.qr_multiply(a, c, mode=mode, pivoting=pivoting, conjugate=conjugate)
    ref = sla.qr_multiply(a, c, mode=mode, pivoting=pivoting, conjugate=conjugate)
    assert _sig(out) == _sig(ref)
    np.testing.assert_array_equal(c, c0)
    # the Q of qr(): one factorization, one convention
    q = mcs.qr(a, mode="economic", pivoting=pivoting)[0]
    q = np.conj(q) if conjugate else q
    c2 = c if c.ndim == 2 else (c[:, None] if mode == "left" else c[None, :])
    want = q @ c2 if mode == "left" else c2 @ q
    assert np.linalg.norm(out[0] - want.reshape(out[0].shape)) <= \
        20 * m * U64 * np.linalg.norm(c)
    # SciPy's product up to its Q's column signs (diag of its R)
    d = np.diagonal(ref[1]) / np.abs(np.diagonal(ref[1]))
    qs = sla.qr(a, mode="economic", pivoting=pivoting)[0] * d
    qs = np.conj(qs) if conjugate else qs
    want_s = qs @ c2 if mode == "left" else c2 @ qs
    assert np.linalg.norm(out[0] - want_s.reshape(out[0].shape)) <= \
        20 * m * U64 * np.linalg.cond(a) * np.linalg.norm(c)


@pytest.mark.parametrize("args,kw,msg", [
    ((np.ones((4, 3)), np.ones((3, 2))), dict(mode="x"),
     "Mode argument can only be 'left' or 'right' but not 'x'"),
    ((np.ones((4, 3)), np.ones((4, 2))), dict(mode="left"),
     r"Array shapes are not compatible for Q @ c operation: \(4, 3\) vs \(4, 2\)"),
    ((np.ones((4, 3)), np.ones((3, 2))), dict(mode="right"),
     r"Array shapes are not compatible for c @ Q operation: \(3, 2\) vs \(4, 3\)"),
    ((np.ones((4, 3)), np.full((3, 2), np.nan)), dict(mode="left"),
     "array must not contain infs or NaNs"),
])
def test_qr_multiply_errors_as_scipy(args, kw, msg):
    for f in (mcs.qr_multiply, sla.qr_multiply):
        with pytest.raises(ValueError, match=msg):
            f(*args, **kw)


def test_qr_multiply_overwrite_c_full_q_and_empty():
    rng = np.random.default_rng(4)
    a, c = rng.standard_normal((6, 3)), rng.standard_normal((6, 2))
    out = mcs.qr_multiply(a, c.copy(), mode="left", overwrite_c=True)
    ref = sla.qr_multiply(a, c.copy(), mode="left", overwrite_c=True)
    assert _sig(out) == _sig(ref)
    qf = mcs.qr(a)[0]
    assert np.linalg.norm(out[0] - qf @ c) <= 20 * 6 * U64 * np.linalg.norm(c)
    for a2, c2, md in ((np.zeros((0, 3)), np.ones((2, 0)), "right"),
                       (np.ones((4, 3)), np.ones((3, 0)), "left")):
        assert _sig(mcs.qr_multiply(a2, c2, mode=md)) == _sig(sla.qr_multiply(a2, c2, mode=md))


@pytest.mark.parametrize("shape", [(4, 6), (6, 4), (5, 5), (0, 3), (3, 0), (2, 3, 5)])
@pytest.mark.parametrize("mode", ["full", "economic", "r"])
@pytest.mark.parametrize("dtype", ["float32", "complex128"])
def test_rq_matches_scipy(shape, mode, dtype):
    rng = np.random.default_rng(5)
    a = rng.standard_normal(shape).astype(dtype)
    if dtype == "complex128":
        a = a + 1j * rng.standard_normal(shape)
    a0 = a.copy()
    out = mcs.rq(a, mode=mode)
    ref = sla.rq(a, mode=mode)
    assert _sig(out) == _sig(ref)
    np.testing.assert_array_equal(a, a0)
    if 0 in shape or len(shape) > 2:
        return
    u = np.finfo(a.dtype).eps / 2
    m, n = shape
    r = out if mode == "r" else out[0]
    rr = ref if mode == "r" else ref[0]
    off = n - m if (mode != "economic" or n < m) else 0
    np.testing.assert_array_equal(np.triu(r, off), r)
    d = np.diagonal(r, offset=off)
    assert np.all(d.real >= 0) and np.all(d.imag == 0)  # mpqr's convention
    # R is unique up to the signs of its rows (full rank)
    assert np.linalg.norm(np.abs(r) - np.abs(rr)) <= 50 * max(shape) * u * np.linalg.norm(a)
    if mode != "r":
        q = out[1]
        assert np.linalg.norm(r @ q - a) <= 50 * max(shape) * u * np.linalg.norm(a)
        assert np.linalg.norm(q @ q.conj().T - np.eye(q.shape[0])) <= 50 * max(shape) * u


@pytest.mark.parametrize("a", [np.zeros((2, 2)), np.zeros((2, 4)), np.zeros((4, 2)),
                               np.random.default_rng(6).standard_normal((3, 5))],
                         ids=["zero", "zero-wide", "zero-tall", "wide"])
@pytest.mark.parametrize("mode", ["full", "economic"])
def test_rq_takes_rows_from_the_last_as_lapack(a, mode):
    # where RQ is not unique (a zero A, or the rows of a wide A's full Q beyond its rank)
    # the rows are taken from the last, as LAPACK's gerqf takes them: a zero A gets SciPy's
    # Q exactly (I's last rows), a wide A's full Q SciPy's up to row signs. (Where rounding
    # decides, a rank-deficient A, LAPACK builds differ among themselves: not compared.)
    r, q = mcs.rq(a, mode=mode)
    rr, qq = sla.rq(a, mode=mode)
    u = np.finfo(np.float64).eps / 2
    assert r.shape == rr.shape and q.shape == qq.shape
    if not a.any():
        np.testing.assert_array_equal(np.abs(q), np.abs(qq))
        np.testing.assert_array_equal(np.abs(q), np.eye(q.shape[1])[-q.shape[0]:])
    assert np.abs(np.abs(q) - np.abs(qq)).max() <= 50 * max(a.shape) * u
    assert np.abs(np.abs(r) - np.abs(rr)).max() <= 50 * max(a.shape) * u * max(1, np.abs(a).max())
    assert np.abs(r @ q - a).max() <= 50 * max(a.shape) * u * max(1, np.abs(a).max())


def test_rq_errors_as_scipy():
    for f in (mcs.rq, sla.rq):
        with pytest.raises(ValueError, match="expected matrix"):
            f(np.ones(3))
        with pytest.raises(ValueError, match=r"Mode argument should be one of"):
            f(np.ones((2, 2)), mode="raw")
        with pytest.raises(ValueError, match="array must not contain infs or NaNs"):
            f(np.array([[1.0, np.inf]]))


def test_patched_program_sees_one_convention():
    """A program mixing qr, qr(pivoting=True), qr_multiply and rq under patch(): every Q
    comes from mpqr, with diag(R) >= 0, so the factors agree column for column."""
    import scipy.linalg

    rng = np.random.default_rng(6)
    a = rng.standard_normal((30, 12))
    before = {n: _patch.original(n) for n in ("qr", "qr_multiply", "rq", "lstsq")}
    with mpqr.explain() as trace, mcs.patch():
        q1, r1, p = scipy.linalg.qr(a, mode="economic", pivoting=True)
        q2, r2 = scipy.linalg.qr(a[:, p], mode="economic")
        cq, _r3, p3 = scipy.linalg.qr_multiply(a, np.eye(12), mode="left", pivoting=True)
        cq2, _ = scipy.linalg.qr_multiply(a[:, p], np.eye(12), mode="left")
        rr, qr_ = scipy.linalg.rq(a.T[p])
    tol = 50 * 30 * U64 * np.linalg.cond(a)
    np.testing.assert_array_equal(p, p3)
    for q in (q2, cq, cq2):
        assert np.linalg.norm(q - q1) <= tol
    assert np.linalg.norm(r1 - r2) <= tol * np.linalg.norm(a)
    # rq of (A P)^T = R^T Q^T: its R is the flipped conjugate transpose of qr's
    assert np.all(np.diagonal(rr, offset=rr.shape[1] - rr.shape[0]) >= 0)
    assert np.linalg.norm(rr @ qr_ - a.T[p]) <= tol * np.linalg.norm(a)
    assert any(e.message.startswith("qr(pivoting=True)") for e in trace.events)
    for name, f in before.items():
        assert getattr(scipy.linalg, name) is f  # restored
