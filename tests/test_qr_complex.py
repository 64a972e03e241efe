"""Complex QR and lstsq at the emulated precisions, against SciPy.

The emulated engines run complex products as real products of the parts
(mpqr/engines/complex_product.py); on the NumPy backend the cost model picks the
native GEMM for ``fp64-emulated``, so those tests force the Ozaki engine.
Bounds: backward error and orthogonality within ``8 sqrt(n) u`` of the
precision (well-conditioned input), and for ``fp64-emulated`` no worse than 2x
the native complex routine (the same method at ``fp64``, and SciPy's).
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg as sla

import mpqr
from mpqr.qr.driver import METHODS
from tests._qr_support import backward_error, hp_matmul, orthogonality
from tests._support import to_numpy

#: NumPy (the reference emulation) and CuPy (the GPU engines); the read-only and
#: strict namespaces add nothing here (tests/test_qr_api.py covers them)
pytestmark = [
    pytest.mark.skip_xp_backend("numpy_readonly", reason="covered by the numpy backend"),
    pytest.mark.skip_xp_backend("array_api_strict", reason="no float16 or int8 engines"),
]

U = {"fp16": 2.0**-11, "fp32-emulated": 2.0**-24, "fp64-emulated": 2.0**-53}
ENGINE = {"fp16": None, "fp32-emulated": None, "fp64-emulated": "ozaki-int8"}
M, N = 120, 24


def _complex(rng, m, n, dtype=np.complex128):
    return (rng.standard_normal((m, n)) + 1j * rng.standard_normal((m, n))).astype(dtype)


def _normal_residual(a, b, x) -> float:
    r = b.astype(np.clongdouble) - hp_matmul(a, x)
    g = hp_matmul(a.conj().T, r.astype(np.complex128))
    return float(np.linalg.norm(g.astype(np.complex128)) /
                 (np.linalg.norm(a, 2) ** 2 * np.linalg.norm(x)))


def _qr(xp, x, precision, method):
    with mpqr.gemm_options(engine=ENGINE.get(precision)), mpqr.explain() as trace:
        q, r = mpqr.qr(xp.asarray(x), precision=precision, method=method)
    return to_numpy(q), to_numpy(r), str(trace)


@pytest.mark.parametrize("precision", sorted(U))
@pytest.mark.parametrize("method", sorted(METHODS))
def test_complex_qr_every_method(xp, precision, method):
    rng = np.random.default_rng(sorted(METHODS).index(method))
    a = _complex(rng, M, N)
    q, r, trace = _qr(xp, a, precision, method)
    assert q.dtype == r.dtype == np.complex128 and q.shape == (M, N) and r.shape == (N, N)
    d = np.diag(r)
    assert np.all(d.imag == 0) and np.all(d.real >= 0)
    be, orth = backward_error(a, q, r), orthogonality(q)
    bound = 8 * np.sqrt(N) * U[precision]
    assert be <= bound and orth <= bound, (be, orth, bound)
    if "gemm " in trace and ENGINE[precision]:  # the emulated engine really ran
        assert "-> ozaki-int8 (" in trace
        assert "complex=3m" in trace or "gram=2m" in trace
    if precision == "fp64-emulated":
        qn, rn, _ = _qr(xp, a, "fp64", method)
        qs, rs = sla.qr(a, mode="economic")
        for e, en, es in [(be, backward_error(a, qn, rn), backward_error(a, qs, rs)),
                          (orth, orthogonality(qn), orthogonality(qs))]:
            assert e <= 2 * max(en, es, U[precision]), (method, e, en, es)


@pytest.mark.parametrize("precision", sorted(U))
def test_complex64_qr_returns_complex64(xp, precision):
    rng = np.random.default_rng(7)
    a = _complex(rng, 64, 12, np.complex64)
    q, r, _ = _qr(xp, a, precision, "auto")
    assert q.dtype == r.dtype == np.complex64
    u = max(U[precision], 2.0**-24)
    assert backward_error(a, q, r) <= 8 * np.sqrt(12) * u
    assert orthogonality(q) <= 8 * np.sqrt(12) * u


def test_complex_stacked_qr_on_the_ozaki_engine(xp):
    rng = np.random.default_rng(8)
    a = _complex(rng, 3 * 50, 8).reshape(3, 50, 8)
    q, r, trace = _qr(xp, a, "fp64-emulated", "householder-recursive")
    assert "ozaki-int8" in trace
    assert backward_error(a, q, r) <= 8 * np.sqrt(8) * U["fp64-emulated"]
    assert orthogonality(q) <= 8 * np.sqrt(8) * U["fp64-emulated"]


@pytest.mark.parametrize("precision", sorted(U))
def test_complex_lstsq_matches_scipy(xp, precision):
    rng = np.random.default_rng(9)
    a = _complex(rng, M, N)
    b = _complex(rng, M, 2)
    ref = sla.lstsq(a, b)
    with mpqr.gemm_options(engine=ENGINE[precision]):
        out = mpqr.lstsq(xp.asarray(a), xp.asarray(b), precision=precision)
    x, res, rank, s = to_numpy(out[0]), to_numpy(out[1]), out[2], to_numpy(out[3])
    # (residues' dtype follows the installed SciPy: tests/test_lstsq.py)
    assert x.dtype == ref[0].dtype and x.shape == ref[0].shape
    assert rank == ref[2]
    # the refinement brings every precision to working accuracy: a normal-equation
    # residual ||A^H (b - A x)|| / (||A||^2 ||x||) (extended precision) within 2x SciPy's
    kappa = s[0] / s[-1]
    err, err_ref = _normal_residual(a, b, x), _normal_residual(a, b, ref[0])
    assert err <= 2 * max(err_ref, 2.0**-53), (err, err_ref)
    np.testing.assert_allclose(res, ref[1], rtol=8 * N * kappa * 2.0**-53)
    np.testing.assert_allclose(s, ref[3], rtol=8 * N * 2.0**-53)


def test_compat_scipy_patch_fp64_emulated_complex_lstsq():
    from mpqr.compat import scipy as compat_scipy

    rng = np.random.default_rng(10)
    a = _complex(rng, 80, 10)
    b = _complex(rng, 80, 1)[:, 0]
    ref = sla.lstsq(a, b)
    original = sla.lstsq
    with compat_scipy.patch(precision="fp64-emulated"), mpqr.explain() as trace:
        got = sla.lstsq(a, b)
    assert sla.lstsq is original
    assert "lstsq" in str(trace)  # mpqr answered, not SciPy
    x = to_numpy(got[0])
    assert x.dtype == np.complex128 and x.shape == (10,)
    kappa = got[3][0] / got[3][-1]
    assert np.linalg.norm(x - ref[0]) <= 16 * kappa * 2.0**-53 * np.linalg.norm(ref[0]) * 10
    np.testing.assert_allclose(got[1], ref[1], rtol=8 * 10 * kappa * 2.0**-53)
