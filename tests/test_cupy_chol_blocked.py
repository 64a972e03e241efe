"""GPU tests of wide CholQR2 on CuPy: the Cholesky factor and right inverse by halves
(``backends/cupy/chol_blocked.py``) and the 65536 x 4096 routes.

References: ``|R^T R - G| <= c n u |R^T||R|`` (Cholesky's backward error) and ``|X R - I|
<= c n u |X||R|`` (row-wise substitution's), against cuSOLVER's potrf / a trsm on the
identity; orthogonality and backward error of the QR against the targets (float64
``1e-15`` / ``2e-15``, float32 the same multiples of ``u``).
"""

from __future__ import annotations

import pytest

from tests.conftest import GPU

if not GPU:
    pytest.skip("no CUDA GPU visible", allow_module_level=True)
import cupy as cp
from mpqr.backends.cupy import chol_blocked

import mpqr


def _backend():
    from mpqr.backends import get_backend

    from mpqr._array_api import array_namespace

    return get_backend(array_namespace(cp.empty(1)))


@pytest.mark.parametrize("dtype", [cp.float64, cp.float32])
@pytest.mark.parametrize("n", [1100, 2048])
def test_blocked_cholesky_and_inverse(dtype, n):
    u = 2.0**-53 if dtype == cp.float64 else 2.0**-24
    a = cp.random.default_rng(n).standard_normal((3 * n, n)) * cp.logspace(0, -2, n)
    g = (a.T @ a).astype(dtype)
    g0 = g.copy()
    r = chol_blocked.cholesky_upper(g, 256)
    cp.testing.assert_array_equal(g, g0)
    assert r.dtype == dtype and bool(cp.all(cp.tril(r, -1) == 0))
    assert bool(cp.all(cp.abs(r.T @ r - g) <= 4 * n * u * (cp.abs(r.T) @ cp.abs(r))))
    ref = cp.linalg.cholesky(g).T
    assert float(cp.max(cp.abs(r - ref)) / cp.max(cp.abs(ref))) < 1e3 * n * u
    x = chol_blocked.inverse_upper(r, 256)
    assert bool(cp.all(cp.tril(x, -1) == 0))
    eye = cp.eye(n, dtype=dtype)
    assert bool(cp.all(cp.abs(x @ r - eye) <= 4 * n * u * (cp.abs(x) @ cp.abs(r))))
    # the backend's entry points take these from 1024 columns on
    be = _backend()
    be.blocked_chol_min_n = 1024  # an instance attribute: off by default (slower on the H200)
    try:
        assert n >= be.blocked_chol_min_n
        cp.testing.assert_array_equal(be.cholesky(g, upper=True),
                                      chol_blocked.cholesky_upper(g, be.blocked_leaf))
        cp.testing.assert_array_equal(be.right_inverse_upper(r),
                                      chol_blocked.inverse_upper(r, be.blocked_leaf))
    finally:
        del be.blocked_chol_min_n


def test_blocked_cholesky_of_an_indefinite_matrix_raises():
    g = cp.eye(1500)
    g[1400, 1400] = -1.0
    with pytest.raises(mpqr.LinAlgError, match="not positive definite"):
        _backend().cholesky(g, upper=True)


@pytest.mark.parametrize(("dtype", "precision"), [(cp.float64, "auto"),
                                                  (cp.float32, "fp32-emulated")])
def test_wide_tall_qr(dtype, precision):
    """65536 x 4096: CholQR2 with the right-looking substitution and the recursive A X
    (float32 at fp32-emulated: its products over x on tc-sgemm), within the targets."""
    m, n = 65536, 4096
    a = cp.random.default_rng(0).standard_normal((m, n)).astype(dtype)
    with mpqr.explain() as trace:
        q, r = mpqr.qr(a, precision=precision)
    labels = {g.label for g in trace.gemms}
    assert {"cholqr2-gram", "trsm-update"} <= labels
    # the second pass applies R2^-1 unless it keeps Q1 (single precision, Q1 orthonormal
    # to working accuracy: no second factor to apply)
    kept = any(e.kind == "keep-q1" for e in trace.events)
    assert kept == ("cholqr2-apply-inverse" not in labels)
    assert not kept or dtype == cp.float32
    if dtype == cp.float32:
        assert any(e.kind == "precision" for e in trace.events)
        assert {g.engine for g in trace.gemms if g.label == "cholqr2-gram"} == {"tc-sgemm"}
    u = 2.0**-53 if dtype == cp.float64 else 2.0**-24
    q, r, a = (v.astype(cp.float64) for v in (q, r, a))
    orth = float(cp.linalg.norm(q.T @ q - cp.eye(n)) / n)
    back = float(cp.linalg.norm(a - q @ r) / cp.linalg.norm(a))
    assert orth <= 9 * u and back <= 18 * u
