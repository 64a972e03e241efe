"""GPU tests of mpqr.compat.array_api on CuPy: array-api-compat's CuPy namespace (and
scikit-learn's copy) plugged, results against CuPy's own on the same device, and a
scikit-learn PCA under the patch.

Run on a GPU machine with ``SCIPY_ARRAY_API=1 python -m pytest -q -n 0
tests/test_cupy_array_api.py``.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from tests.conftest import GPU

if not GPU:
    pytest.skip("no CUDA GPU visible", allow_module_level=True)
import array_api_compat.cupy as ccp
import cupy as cp
from mpqr.compat import array_api as maa

import mpqr


@pytest.mark.parametrize("dtype", ["float32", "float64", "complex64", "complex128"])
@pytest.mark.parametrize("shape", [(4096, 64), (64, 4096), (3, 500, 40)])
def test_cupy_namespace_matches_cupy(dtype, shape):
    rng = np.random.default_rng(0)
    a_np = rng.standard_normal(shape) + (1j * rng.standard_normal(shape) if "complex" in dtype
                                         else 0)
    a = cp.asarray(a_np.astype(dtype))
    mx = maa.namespace(ccp)
    with mpqr.explain() as trace:
        q, r = mx.linalg.qr(a)
        u, s, vh = mx.linalg.svd(a, full_matrices=False)
    routes = [e.data["route"] for e in trace.events if e.kind == "array-api"]
    assert routes == ["mpqr.qr", "mpqr.svd"]
    ref_q, ref_r = ccp.linalg.qr(a)
    ref_s = ccp.linalg.svdvals(a)
    assert type(q) is cp.ndarray and q.dtype == ref_q.dtype and q.shape == ref_q.shape
    assert r.shape == ref_r.shape and s.dtype == ref_s.dtype and q.device == a.device
    tol = 50 * max(shape[-2:]) * np.finfo(dtype).eps * float(cp.max(ref_s))
    assert float(cp.max(cp.abs(q @ r - a))) <= tol
    assert float(cp.max(cp.abs(s - ref_s))) <= tol
    assert float(cp.max(cp.abs((u * s[..., None, :]) @ vh - a))) <= tol


def test_cupy_patch_products_and_nan():
    a = cp.random.default_rng(1).standard_normal((2048, 256))
    with mpqr.explain() as trace, maa.patch(precision="fp32-emulated"):
        c = ccp.matmul(a.T, a)
        s = ccp.linalg.svdvals(a)
    assert "tc-sgemm" in {g.engine for g in trace.gemms}
    assert float(cp.max(cp.abs(c - a.T @ a))) <= 2048 * 2.0**-22 * float(cp.max(cp.abs(c)))
    assert float(cp.max(cp.abs(s - cp.linalg.svd(a, compute_uv=False)))) <= 1e-10 * float(s[0])
    b = a.copy()
    b[3, 4] = cp.nan
    with maa.patch():
        got = ccp.linalg.qr(b)
    ref = ccp.linalg.qr(b)
    assert bool(cp.isnan(got.R).any()) == bool(cp.isnan(ref.R).any())


@pytest.mark.skipif(os.environ.get("SCIPY_ARRAY_API") != "1",
                    reason="scikit-learn's array API needs SCIPY_ARRAY_API=1")
def test_sklearn_pca_on_cupy_under_the_patch():
    from sklearn import config_context
    from sklearn.decomposition import PCA

    x = cp.random.default_rng(2).standard_normal((2**16, 64)) * cp.asarray(0.9 ** np.arange(64))
    with config_context(array_api_dispatch=True):
        ref = PCA(n_components=8, svd_solver="full").fit(x).components_
        with mpqr.explain() as trace, maa.patch():
            got = PCA(n_components=8, svd_solver="full").fit(x).components_
    assert any(e.data.get("route") == "mpqr.svd" for e in trace.events if e.kind == "array-api")
    # svd_flip fixes the signs: components agree entrywise (gap 10%: kappa ~ 10)
    assert float(cp.max(cp.abs(got - ref))) <= 1e3 * 2.0**-52 * 64


@pytest.mark.parametrize("dtype", ["float32", "float64", "complex128"])
def test_cupy_mean_of_a_tall_matrix_by_row_blocks(dtype):
    """Under ``patch()`` the CuPy namespace's ``mean(x, axis=0)`` of a tall C-ordered
    matrix is the sum of row blocks' sums: CuPy's dtype and shape, values to the blocked
    sum's bound in units of ``sum |x_i| / m``; axis 1 stays CuPy's."""
    from mpqr.compat import _xp_functions as xf

    m, n = (1 << 16) + 5, 48
    rng = np.random.default_rng(1)
    a_np = rng.standard_normal((m, n)) + (1j * rng.standard_normal((m, n)) if "complex" in dtype
                                         else 0)
    a = cp.asarray(a_np.astype(dtype))
    with maa.patch(), mpqr.explain() as trace:
        got = ccp.mean(a, axis=0)
        ccp.mean(a, axis=1)
    routes = [e.data["route"] for e in trace.events if e.kind == "array-api"]
    assert routes == ["sum of row blocks' sums"]
    ref = cp.mean(a, axis=0)
    assert got.dtype == ref.dtype and got.shape == ref.shape
    exact = np.mean(a_np.astype(dtype).astype(np.complex128), axis=0)
    bound = (xf.MEAN_BLOCK + m // xf.MEAN_BLOCK + 2) * np.finfo(dtype).eps
    scale = np.mean(np.abs(a_np.astype(dtype)), axis=0)
    assert np.all(np.abs(cp.asnumpy(got) - exact) <= bound * scale)
