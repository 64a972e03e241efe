"""``geqrf-wy`` on the host: Q of a stack from LAPACK's reflectors by batched products
(compact WY) against LAPACK's own Q and R, and the route ``method="auto"`` takes where a
backend forms stacks' Q that way."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg as sla
from mpqr.backends import get_backend

import mpqr
from mpqr.bench.batched_sweep import batch_for, sweep_shapes
from mpqr.qr.geqrf_wy import geqrf_wy, q_from_reflectors


def _ref(a):
    """LAPACK's Q and R (float64/complex128) per member with diag(R) >= 0."""
    w = np.complex128 if a.dtype.kind == "c" else np.float64
    q, r = np.linalg.qr(a.astype(w))
    d = np.diagonal(r, axis1=-2, axis2=-1)
    p = np.where(np.abs(d) > 0, d / np.where(np.abs(d) > 0, np.abs(d), 1), 1)
    return q * p[..., None, :], r * np.conj(p)[..., :, None]


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex128])
@pytest.mark.parametrize("shape", [(3, 40, 30), (2, 2, 9, 9), (4, 25, 1)])
def test_matches_lapack_every_mode(shape, dtype):
    rng = np.random.default_rng(sum(shape))
    a = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        a = a + 1j * rng.standard_normal(shape)
    a = a.astype(dtype)
    a.reshape(-1, *shape[-2:])[0, :, 0] = 0  # a zero column: tau = 0 (H = I)
    a0 = a.copy()
    m, n = shape[-2:]
    be = get_backend(np)
    tol = 30 * np.finfo(dtype).eps * m
    kw = {"precision": "auto", "prec_name": "auto"}
    q, r = geqrf_wy(be, a, want_q=True, complete=False, **kw)
    qc, rc = geqrf_wy(be, a, want_q=True, complete=True, **kw)
    q0, r0 = geqrf_wy(be, a, want_q=False, complete=False, **kw)
    qr_, rr = _ref(a)
    assert q.shape == (*shape[:-2], m, n) and qc.shape == (*shape[:-2], m, m) and q0 is None
    assert q.dtype == r.dtype == qc.dtype == dtype
    for rx in (r, rc, r0):
        assert rx.shape == (*shape[:-2], n, n)
        assert np.abs(rx - rr).max() <= tol * np.abs(rr).max()
        assert np.array_equal(np.triu(rx), rx)
        d = np.diagonal(rx, axis1=-2, axis2=-1)
        assert np.all(d.real >= 0) and np.all(d.imag == 0)
    # past the zero column (R_00 = 0: Q's first column is the reflector's choice) Q is
    # LAPACK's
    assert np.abs(q[..., :, 1:] - qr_[..., :, 1:]).max(initial=0.0) <= tol
    assert np.abs(qc[..., :, :n] - q).max() <= tol and np.array_equal(a, a0)
    for qx in (q, qc):
        g = np.conj(qx.swapaxes(-1, -2)).astype(qr_.dtype) @ qx - np.eye(qx.shape[-1])
        assert np.abs(g).max() <= tol
    assert np.abs(q.astype(qr_.dtype) @ r - a).max() <= tol * np.abs(a).max()


def test_q_is_orgqr_of_the_same_reflectors():
    a = np.random.default_rng(3).standard_normal((2, 50, 20))
    h, tau = np.linalg.qr(a, mode="raw")
    be = get_backend(np)
    for complete in (False, True):
        q = q_from_reflectors(be, h, tau, complete=complete, precision="fp64")
        for i in range(2):
            f = np.asfortranarray(h[i].T)
            cols = 50 if complete else 20
            if complete:
                f = np.asfortranarray(np.hstack([f, np.zeros((50, 30))]))
            ref, _, info = sla.lapack.dorgqr(f, tau[i] if not complete else
                                             np.concatenate([tau[i], np.zeros(30)]))
            assert info == 0
            assert np.abs(q[i] - ref[:, :cols]).max() <= 1e-14


def test_method_through_qr_and_wide_members():
    a = np.random.default_rng(4).standard_normal((3, 20, 30))
    q, r = mpqr.qr(a, method="geqrf-wy")
    assert q.shape == (3, 20, 20) and r.shape == (3, 20, 30)
    assert np.abs(q @ r - a).max() <= 1e-13
    assert np.all(np.diagonal(r, axis1=-2, axis2=-1) >= 0)
    r_only = mpqr.qr(a[..., :, :15], mode="r", method="geqrf-wy")
    assert np.abs(r_only - _ref(a[..., :, :15])[1]).max() <= 1e-13


def test_auto_route(monkeypatch):
    be = get_backend(np)
    monkeypatch.setattr(type(be), "batched_qr_fused", True)
    monkeypatch.setattr(type(be), "stack_q_products_min_n", 65)
    a = np.random.default_rng(5).standard_normal((2, 300, 70))
    with mpqr.explain() as ex:
        q, r = mpqr.qr(a)
    assert [e.data["method"] for e in ex.events if e.kind == "method"] == ["geqrf-wy"]
    assert "Q of every matrix at once" in str(ex)
    assert np.abs(q @ r - a).max() <= 1e-12
    with mpqr.explain() as ex:
        mpqr.qr(a[..., :, :64])  # up to 64 columns: the library's route (TSQR on CuPy)
    assert [e.data["method"] for e in ex.events if e.kind == "method"] == ["geqrf"]
    monkeypatch.setattr(type(be), "stack_q_products_min_n", None)
    with mpqr.explain() as ex:
        mpqr.qr(a)
    assert [e.data["method"] for e in ex.events if e.kind == "method"] == ["geqrf"]


def test_sweep_shapes_and_batches():
    shapes = sweep_shapes()
    assert len(shapes) == 35 and (8, 8) in shapes and (8192, 512) in shapes
    assert batch_for(8, 8, 4) == 65536  # capped
    assert batch_for(8192, 512, 8) == 2  # at least two members
    assert batch_for(512, 128, 4) == (64 << 20) // (512 * 128 * 4)
