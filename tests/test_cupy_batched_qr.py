"""GPU tests of the batched small-matrix QR kernel (CuPy only).

Run on a GPU machine with ``python -m pytest -q tests/test_cupy_batched_qr.py``. Every
output is poisoned with NaN before the launch (an unwritten element fails), residuals
are taken in float64, and the kernel is compared with the portable scheme it shares
(:func:`mpqr.qr.batched_small.householder_batched_steps` on the host), which runs the
same steps in the same order and so must agree to rounding.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import GPU

if not GPU:
    pytest.skip("no CUDA GPU visible", allow_module_level=True)
import cupy as cp
from mpqr.backends import get_backend
from mpqr.backends.cupy import batched_qr as K

import mpqr
from mpqr.qr.batched_small import householder_batched_steps

SHAPES = [(1, 1), (8, 8), (37, 5), (64, 64), (100, 40), (128, 128), (256, 32), (96, 96)]


class _Poisoned:
    def __getattr__(self, name):
        return getattr(cp, name)

    @staticmethod
    def empty(shape, dtype):
        return cp.full(shape, cp.nan, dtype=dtype)


def _tol(dtype, m):
    return 50 * np.finfo(dtype).eps * m


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("m", "n"), SHAPES)
def test_kernel_modes_match_the_scheme(m, n, dtype):
    if not K.fits(dtype, m, n):
        pytest.skip("beyond the kernel's registers")
    rng = np.random.default_rng(m * 1000 + n)
    ah = rng.standard_normal((5, m, n)).astype(dtype)
    a = cp.asarray(ah)
    q, r = K._launch(_Poisoned(), a, "reduced")
    assert bool(cp.isfinite(q).all()) and bool(cp.isfinite(r).all())
    a64, q64, r64 = (cp.asnumpy(x).astype(np.float64) for x in (a, q, r))
    tol = _tol(dtype, m)
    assert np.linalg.norm(a64 - q64 @ r64, axis=(-2, -1)).max() <= tol * np.linalg.norm(
        a64, axis=(-2, -1)).min()
    assert np.linalg.norm(np.eye(n) - q64.swapaxes(-1, -2) @ q64, axis=(-2, -1)).max() <= tol * n
    assert (np.tril(r64, -1) == 0).all() and (np.diagonal(r64, axis1=-2, axis2=-1) >= 0).all()
    qs, rs = householder_batched_steps(get_backend(np), ah, "reduced",
                                       precision="fp32" if dtype == np.float32 else "fp64")
    assert np.abs(rs - r64).max() <= tol * np.abs(rs).max()
    assert np.abs(qs - q64).max() <= tol * 10
    qc, rc = K._launch(_Poisoned(), a, "complete")
    qc64 = cp.asnumpy(qc).astype(np.float64)
    assert qc.shape == (5, m, m) and bool(cp.isfinite(qc).all())
    assert np.abs(qc64[..., :n] - q64).max() == 0 and bool((rc == r).all())
    assert np.linalg.norm(np.eye(m) - qc64.swapaxes(-1, -2) @ qc64, axis=(-2, -1)).max() <= tol * m
    qn, rr = K._launch(_Poisoned(), a, "r")
    assert qn is None and bool((rr == r).all())
    b = cp.asarray(rng.standard_normal((5, m, 2)).astype(dtype))
    c, _ = K._launch(_Poisoned(), a, "apply", b)
    ref = qc64.swapaxes(-1, -2) @ cp.asnumpy(b).astype(np.float64)
    assert np.abs(cp.asnumpy(c) - ref).max() <= tol * 10 * np.abs(ref).max()
    assert bool((a == cp.asarray(ah)).all())


def test_nan_spreads_and_zero_columns():
    a = cp.asarray(np.random.default_rng(0).standard_normal((3, 16, 16)))
    a[0, 3, 2] = cp.nan
    a[1, :, 4] = 0
    q, r = K.qr(a)
    assert bool(cp.isnan(r[0]).any())
    assert bool(cp.isfinite(r[1:]).all())
    assert float(cp.abs(q[1] @ r[1] - a[1]).max()) < 1e-13


def test_route_and_explain():
    a = cp.asarray(np.random.default_rng(1).standard_normal((300, 64, 64)).astype(np.float32))
    with mpqr.explain() as tr:
        _, r = mpqr.qr(a)
    assert any(e.kind == "method" and e.data.get("method") == "householder-batched"
               for e in tr.events)
    ref = np.linalg.qr(cp.asnumpy(a).astype(np.float64), mode="r")
    ref *= np.sign(np.diagonal(ref, axis1=-2, axis2=-1))[..., :, None]
    assert np.abs(cp.asnumpy(r) - ref).max() <= _tol(np.float32, 64) * np.abs(ref).max()


def test_bad_input():
    with pytest.raises(ValueError, match="m x n"):
        K.qr(cp.zeros((2, 300, 8), dtype=cp.float32))
    with pytest.raises(TypeError, match="float32 or float64"):
        K.qr(cp.zeros((2, 8, 8), dtype=cp.complex64))
    with pytest.raises(ValueError, match="mode"):
        K.qr(cp.zeros((2, 8, 8)), mode="full")
