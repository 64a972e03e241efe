"""``householder-batched-blocked`` on the host: the panel steps the GPU runs (the
portable scheme of the fused kernel on every member's panel, batched products for the
trailing update and Q) against LAPACK in float64, and the route ``method="auto"`` takes
where a backend has the fused kernel."""

from __future__ import annotations

import numpy as np
import pytest
from mpqr.backends import get_backend

import mpqr
from mpqr.qr.batched_blocked import BLOCK, fits, householder_batched_blocked


def _ref_r(a):
    r = np.linalg.qr(a.astype(np.float64), mode="r")
    return r * np.where(np.diagonal(r, axis1=-2, axis2=-1) < 0, -1.0, 1.0)[..., :, None]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("m", "n"), [(80, 70), (2 * BLOCK + 5, 2 * BLOCK + 5)])
def test_scheme_matches_lapack(m, n, dtype):
    a = np.random.default_rng(m + n).standard_normal((3, m, n)).astype(dtype)
    a0 = a.copy()
    be = get_backend(np)
    tol = 30 * np.finfo(dtype).eps * m
    kw = {"precision": "auto", "prec_name": "auto"}
    q, r = householder_batched_blocked(be, a, want_q=True, complete=False, **kw)
    qc, rc = householder_batched_blocked(be, a, want_q=True, complete=True, **kw)
    q0, r0 = householder_batched_blocked(be, a, want_q=False, complete=False, **kw)
    rr = _ref_r(a)
    assert q.shape == (3, m, n) and qc.shape == (3, m, m) and q0 is None
    assert q.dtype == r.dtype == dtype
    for rx in (r, rc, r0):
        assert np.abs(rx - rr).max() <= tol * np.abs(rr).max()
        assert np.array_equal(np.triu(rx), rx)
    a64 = a.astype(np.float64)
    assert np.abs(q.astype(np.float64) @ r - a64).max() <= tol * np.abs(a64).max()
    for qx in (q, qc):
        g = qx.swapaxes(-1, -2).astype(np.float64) @ qx - np.eye(qx.shape[-1])
        assert np.abs(g).max() <= tol
    assert np.array_equal(qc[..., :n], q) and np.array_equal(a, a0)


def test_auto_route_with_fused_kernel(monkeypatch):
    be = get_backend(np)
    assert fits(be, np.float32, 256, 200) and not fits(be, np.float32, 300, 200)
    assert not fits(be, np.complex64, 256, 200)
    monkeypatch.setattr(type(be), "batched_qr_fused", True)
    a = np.random.default_rng(1).standard_normal((2, 150, 140))
    with mpqr.explain() as ex:
        q, r = mpqr.qr(a)
    assert [e.data["method"] for e in ex.events if e.kind == "method"] == \
        ["householder-batched-blocked"]
    assert np.abs(q @ r - a).max() < 1e-12
    with mpqr.explain() as ex:
        mpqr.qr(a[:, :, :20])  # one block: the fused kernel itself
    assert [e.data["method"] for e in ex.events if e.kind == "method"] == \
        ["householder-batched"]
