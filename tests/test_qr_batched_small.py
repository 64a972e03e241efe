"""The batched small-matrix scheme (``householder-batched``) on the host: the steps the
GPU kernel runs, against LAPACK in float64, and the route ``method="auto"`` takes."""

from __future__ import annotations

import numpy as np
import pytest
from mpqr.backends import get_backend

import mpqr
from mpqr.qr.batched_small import householder_batched_steps, qr_apply


def _ref(a):
    q, r = np.linalg.qr(a.astype(np.complex128 if np.iscomplexobj(a) else np.float64))
    d = np.diagonal(r, axis1=-2, axis2=-1)
    p = np.where(np.abs(d) > 0, d / np.where(np.abs(d) > 0, np.abs(d), 1), 1)
    return q * p[..., None, :], r * np.conj(p)[..., :, None]


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex128])
@pytest.mark.parametrize(("m", "n"), [(8, 8), (37, 5), (40, 40)])
def test_steps_match_lapack(m, n, dtype):
    rng = np.random.default_rng(m + n)
    a = rng.standard_normal((6, m, n))
    if dtype == np.complex128:
        a = a + 1j * rng.standard_normal((6, m, n))
    a = a.astype(dtype)
    a0 = a.copy()
    be = get_backend(np)
    prec = "fp32" if dtype == np.float32 else "fp64"
    tol = 30 * np.finfo(dtype).eps * m
    qr_, rr = _ref(a)
    q, r = householder_batched_steps(be, a, "reduced", precision=prec)
    assert np.abs(r - rr).max() <= tol * np.abs(rr).max() and np.abs(q - qr_).max() <= tol
    d = np.diagonal(r, axis1=-2, axis2=-1)
    assert np.all(d.real >= 0) and np.all(d.imag == 0)
    qc, rc = householder_batched_steps(be, a, "complete", precision=prec)
    assert qc.shape == (6, m, m) and np.abs(qc[..., :n] - q).max() <= tol
    assert np.array_equal(rc, r)
    eye = np.eye(m)
    assert np.abs(np.conj(qc.swapaxes(-1, -2)) @ qc - eye).max() <= tol
    b = rng.standard_normal((6, m, 2)).astype(dtype)
    r2, c = qr_apply(be, a, b, prec_name=prec)
    assert np.array_equal(r2, r)
    ref = np.conj(qc.swapaxes(-1, -2)).astype(np.complex128) @ b
    assert np.abs(c - ref).max() <= tol * np.abs(ref).max()
    assert np.array_equal(a, a0)


def test_nan_spreads_and_zero_column():
    a = np.random.default_rng(0).standard_normal((3, 10, 6))
    a[0, 4, 1] = np.nan
    a[1, :, 2] = 0
    q, r = householder_batched_steps(get_backend(np), a, "reduced", precision="fp64")
    assert np.isnan(r[0]).any() and np.isfinite(r[1:]).all()
    assert np.abs(q[1] @ r[1] - a[1]).max() < 1e-13


@pytest.mark.parametrize(("shape", "method"), [((4, 64, 64), "householder-batched"),
                                               ((4, 256, 32), "householder-batched"),
                                               ((3, 300, 8), "geqrf"),
                                               ((1, 64, 64), "geqrf"),
                                               ((2, 10, 20), "householder-batched")])
@pytest.mark.parametrize("fused", [True, False])
def test_auto_route(shape, method, fused, monkeypatch):
    """With the fused kernel (CuPy's choice, emulated here by the flag) small stacks take
    ``householder-batched``; without it the library's QR per matrix, whose members equal
    the single-matrix results exactly (SciPy's batch tests compare them)."""
    be = type(get_backend(np))
    monkeypatch.setattr(be, "batched_qr_fused", fused)
    if not fused:
        method = "geqrf"
    a = np.random.default_rng(1).standard_normal(shape)
    with mpqr.explain() as tr:
        q, r = mpqr.qr(a)
    got = next(e.data["method"] for e in tr.events if e.kind == "method")
    assert got == method
    assert np.abs(q @ r - a).max() <= 1e-13 * shape[-1]
    if not fused:
        q1, r1 = mpqr.qr(a[0])
        assert np.array_equal(q[0], q1) and np.array_equal(r[0], r1)
