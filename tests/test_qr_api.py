"""mpqr.qr: modes, shapes, stacks, sign convention, dtypes, bad input, explain trace."""

from __future__ import annotations

import numpy as np
import pytest

import mpqr
from tests._qr_support import backward_error, orthogonality, unit_roundoff
from tests._support import assert_close, to_numpy

HOUSEHOLDER = ["householder-recursive", "householder-tiled"]


def _rand(shape, seed=0, dtype=np.float64):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("method", HOUSEHOLDER)
@pytest.mark.parametrize("shape", [(130, 70), (64, 64), (5, 3), (3, 7), (1, 1), (9, 1)])
@pytest.mark.parametrize("mode", ["reduced", "complete", "r"])
def test_shapes_and_factorization(xp, method, shape, mode):
    a = _rand(shape)
    out = mpqr.qr(xp.asarray(a), mode=mode, method=method, precision="fp64")
    m, n = shape
    k = min(m, n)
    if mode == "r":
        r = out
        assert tuple(r.shape) == (k, n)
        ref = np.linalg.qr(a, mode="r")
        ref = ref * np.where(np.diag(ref) < 0, -1.0, 1.0)[:, None]
        assert_close(r, ref, rtol=0, atol=50 * k * 2.0**-53 * np.linalg.norm(a), xp=xp)
        return
    q, r = out
    assert isinstance(out, mpqr.QRResult)
    qs = (m, m) if mode == "complete" else (m, k)
    rs = (m, n) if mode == "complete" else (k, n)
    assert tuple(q.shape) == qs and tuple(r.shape) == rs
    u = 2.0**-53
    assert backward_error(a, q, r) <= 2 * np.sqrt(n) * u * 4
    assert orthogonality(q) <= np.sqrt(max(m, 1)) * u * 4
    rn = to_numpy(r)
    assert np.array_equal(rn, np.triu(rn)), "R must be upper triangular (zeros stored)"


@pytest.mark.parametrize("method", HOUSEHOLDER)
def test_sign_convention_and_uniqueness(xp, method):
    """diag(R) >= 0 makes the factorization unique: it must match a sign-fixed
    reference computed from the float64 input by LAPACK (via NumPy)."""
    a = _rand((120, 40), seed=3, dtype=np.float32)
    q, r = mpqr.qr(xp.asarray(a), method=method, precision="fp32")
    qr_, rr = np.linalg.qr(a.astype(np.float64))
    sgn = np.where(np.diag(rr) < 0, -1.0, 1.0)
    rn, qn = to_numpy(r), to_numpy(q)
    assert rn.dtype == np.float32
    assert np.all(np.diag(rn) >= 0)
    # perturbation of the unique factors: kappa(A) * backward error
    cond = np.linalg.cond(a.astype(np.float64))
    tol = 40 * cond * np.sqrt(40) * 2.0**-24
    np.testing.assert_allclose(rn, rr * sgn[:, None], atol=tol * np.linalg.norm(a), rtol=0)
    np.testing.assert_allclose(qn, qr_ * sgn, atol=tol, rtol=0)


@pytest.mark.parametrize("method", HOUSEHOLDER)
def test_stack_matches_each_matrix(xp, method):
    a = _rand((3, 2, 80, 20), seed=5)
    q, r = mpqr.qr(xp.asarray(a), method=method, precision="fp64")
    assert tuple(q.shape) == (3, 2, 80, 20) and tuple(r.shape) == (3, 2, 20, 20)
    for idx in np.ndindex(3, 2):
        q1, r1 = mpqr.qr(xp.asarray(a[idx]), method=method, precision="fp64")
        tol = 100 * 2.0**-53 * np.linalg.cond(a[idx])
        np.testing.assert_allclose(to_numpy(q)[idx], to_numpy(q1), atol=tol, rtol=0)
        np.testing.assert_allclose(to_numpy(r)[idx], to_numpy(r1),
                                   atol=tol * np.linalg.norm(a[idx]), rtol=0)
    assert backward_error(a, q, r) <= 8 * np.sqrt(20) * 2.0**-53


@pytest.mark.parametrize("method", HOUSEHOLDER)
def test_wide_complete_stack(xp, method):
    a = _rand((2, 6, 40), seed=6)
    q, r = mpqr.qr(xp.asarray(a), mode="complete", method=method, precision="fp64")
    assert tuple(q.shape) == (2, 6, 6) and tuple(r.shape) == (2, 6, 40)
    assert backward_error(a, q, r) <= 8 * np.sqrt(40) * 2.0**-53
    assert orthogonality(q) <= 8 * 2.0**-53 * np.sqrt(6)


@pytest.mark.parametrize("shape,mode,qs,rs", [
    ((0, 3), "reduced", (0, 0), (0, 3)), ((4, 0), "reduced", (4, 0), (0, 0)),
    ((4, 0), "complete", (4, 4), (4, 0)), ((0, 0), "r", None, (0, 0)),
    ((0, 5, 3), "reduced", (0, 5, 3), (0, 3, 3)), ((2, 0, 3), "complete", (2, 0, 0), (2, 0, 3)),
])
def test_empty(xp, shape, mode, qs, rs):
    out = mpqr.qr(xp.zeros(shape), mode=mode)
    if mode == "r":
        assert tuple(out.shape) == rs
        return
    q, r = out
    assert tuple(q.shape) == qs and tuple(r.shape) == rs
    if mode == "complete" and qs[-1] > 0 and shape[0] != 0:
        assert_close(q, np.broadcast_to(np.eye(qs[-1]), qs), rtol=0, xp=xp)


def test_integer_input_is_float64(xp):
    a = np.arange(1, 13).reshape(4, 3) ** 2
    q, r = mpqr.qr(xp.asarray(a))
    assert q.dtype == xp.float64 and r.dtype == xp.float64
    assert backward_error(a.astype(np.float64), q, r) <= 20 * 2.0**-53


@pytest.mark.parametrize("method", HOUSEHOLDER)
def test_complex_native(xp, method):
    rng = np.random.default_rng(7)
    a = rng.standard_normal((90, 40)) + 1j * rng.standard_normal((90, 40))
    q, r = mpqr.qr(xp.asarray(a), method=method, precision="fp64")
    assert q.dtype == xp.complex128
    d = np.diag(to_numpy(r))
    assert np.all(d.imag == 0) and np.all(d.real >= 0)
    assert backward_error(a, q, r) <= 8 * np.sqrt(40) * 2.0**-53
    assert orthogonality(q) <= 8 * np.sqrt(90) * 2.0**-53


@pytest.mark.parametrize("precision", ["fp16", "fp32-emulated", "fp64-emulated"])
def test_complex_emulated_precisions_factor(precision):
    # complex products on the emulated engines (tests/test_qr_complex.py: accuracy)
    rng = np.random.default_rng(3)
    a = rng.standard_normal((40, 6)) + 1j * rng.standard_normal((40, 6))
    q, r = mpqr.qr(a, precision=precision)
    assert q.dtype == r.dtype == np.complex128
    u = 2.0**-11 if precision == "fp16" else 2.0**-24
    assert backward_error(a, q, r) <= 8 * np.sqrt(6) * u


def test_bad_input_messages(xp):
    with pytest.raises(ValueError, match=r"`x` must be 2-D or a stack of matrices, got ndim=1"):
        mpqr.qr(xp.ones(3))
    with pytest.raises(TypeError, match="`x` must have a floating or integer dtype, got bool"):
        mpqr.qr(xp.ones((3, 2), dtype=xp.bool))
    with pytest.raises(ValueError, match="`mode` must be one of 'reduced', 'complete', 'r'; "
                       "got 'full'"):
        mpqr.qr(xp.ones((3, 2)), mode="full")
    with pytest.raises(ValueError, match="`method` must be one of 'auto', .*got 'givens'"):
        mpqr.qr(xp.ones((3, 2)), method="givens")
    with pytest.raises(ValueError, match="`precision` must be one of .*got 'fp8'"):
        mpqr.qr(xp.ones((3, 2)), precision="fp8")
    with pytest.raises(TypeError, match="`x` must be an array"):
        mpqr.qr([[1.0, 2.0], [3.0, 4.0]])


@pytest.mark.parametrize("bad", [np.nan, np.inf])
@pytest.mark.parametrize("method", HOUSEHOLDER)
def test_nonfinite(xp, bad, method):
    a = _rand((50, 20))
    a[7, 3] = bad
    with pytest.raises(ValueError, match=r"`x` must not contain infs or NaNs"):
        mpqr.qr(xp.asarray(a), method=method, check_finite=True)
    q, r = mpqr.qr(xp.asarray(a), method=method)
    # IEEE propagation: the factor depending on the bad column is not finite
    assert not np.all(np.isfinite(to_numpy(r)))
    assert not np.all(np.isfinite(to_numpy(q)))


@pytest.mark.parametrize("method", HOUSEHOLDER)
def test_rank_deficient_still_valid(xp, method):
    rng = np.random.default_rng(11)
    a = rng.standard_normal((100, 10)) @ rng.standard_normal((10, 60))  # rank 10
    a[:, 5] = 0.0
    q, r = mpqr.qr(xp.asarray(a), method=method, precision="fp64")
    assert backward_error(a, q, r) <= 8 * np.sqrt(60) * 2.0**-53
    assert orthogonality(q) <= 8 * np.sqrt(100) * 2.0**-53
    assert np.all(np.diag(to_numpy(r)) >= 0)


def test_input_not_modified(xp):
    a = _rand((70, 40), seed=2)
    x = xp.asarray(a)
    for method in HOUSEHOLDER:
        mpqr.qr(x, method=method)
        mpqr.qr(x, mode="complete", method=method)
    np.testing.assert_array_equal(to_numpy(x), a)


def test_explain_records_method_and_gemms():
    a = _rand((400, 200))  # beyond the small-input route (library QR)
    with mpqr.explain() as trace:
        mpqr.qr(a, precision="fp32")
    methods = [e for e in trace.events if e.kind == "method"]
    assert len(methods) == 1 and methods[0].data["method"] == "householder-tiled"
    assert "no tensor-core engines" in methods[0].message
    labels = {g.label for g in trace.gemms}
    assert {"tiled-update-WhB", "tiled-update-YC", "tiled-formq-WC", "panel-wy"} <= labels
    assert {g.engine for g in trace.gemms if g.label.startswith("tiled")} == {"native-fp32"}
    # panels stay in the working precision (float64 input)
    assert {g.engine for g in trace.gemms if g.label == "panel-wy"} == {"native-fp64"}


def test_precision_none_resolves_in_gemm_seam():
    a = _rand((100, 40))
    with mpqr.precision("fp32"), mpqr.explain() as trace:
        mpqr.qr(a, method="householder-recursive")
    upd = [g for g in trace.gemms if g.label.startswith("rec-")]
    assert upd and all(g.precision == "fp32" and g.precision_source == "context" for g in upd)


@pytest.mark.parametrize("precision", ["fp64", "fp32", "fp32-emulated", "fp16"])
@pytest.mark.parametrize("method", HOUSEHOLDER)
def test_float32_input_precisions(xp, method, precision):
    if precision in ("fp16", "fp32-emulated") and "fp16" not in mpqr.backends.get_backend(
            mpqr._array_api.array_namespace(xp.asarray(1.0))).capabilities:
        with pytest.raises(NotImplementedError, match="no float16 GEMM"):
            mpqr.qr(xp.asarray(_rand((40, 20), dtype=np.float32)), precision=precision,
                    method=method)
        return
    a = _rand((200, 96), seed=4, dtype=np.float32)
    q, r = mpqr.qr(xp.asarray(a), method=method, precision=precision)
    assert q.dtype == xp.float32
    u = unit_roundoff(precision, np.float32)
    assert backward_error(a, q, r) <= 2 * np.sqrt(96) * u
    assert orthogonality(q) <= np.sqrt(96) * u


@pytest.mark.parametrize("method", ["cholqr", "cholqr2", "shifted-cholqr3"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64, np.complex128])
@pytest.mark.parametrize(("shape", "mode"), [((300, 12), "reduced"), ((2, 90, 8), "reduced"),
                                             ((10, 30), "reduced"), ((60, 6), "complete")])
def test_cholesky_methods_give_a_positive_real_diagonal(xp, method, dtype, shape, mode):
    """The Cholesky-based methods skip the sign pass (diag(R) > 0 by construction):
    the convention must still hold exactly, imaginary parts included, and match the
    unique sign-fixed factors of LAPACK."""
    rng = np.random.default_rng(12)
    a = rng.standard_normal(shape)
    if np.issubdtype(dtype, np.complexfloating):
        a = a + 1j * rng.standard_normal(shape)
    a = a.astype(dtype)
    q, r = mpqr.qr(xp.asarray(a), mode=mode, method=method)
    qn, rn = to_numpy(q), to_numpy(r)
    k = min(shape[-2:])
    d = np.diagonal(rn, axis1=-2, axis2=-1)[..., :k]
    assert np.all(d.real > 0) and np.all(d.imag == 0)
    # unique factors: LAPACK's with diag(R) made positive (float64 / complex128 reference)
    wide = a.astype(np.complex128 if np.iscomplexobj(a) else np.float64)
    _q, rr = np.linalg.qr(wide, mode=mode)
    ph = np.diagonal(rr, axis1=-2, axis2=-1)[..., :k]
    ph = ph / np.abs(ph)
    rr = rr[..., :k, :] * np.conj(ph)[..., :, None]
    u = np.finfo(dtype).eps / 2
    cond = max(np.linalg.cond(w[:, :k]) for w in wide.reshape(-1, *wide.shape[-2:]))
    tol = 40 * cond * np.sqrt(shape[-1]) * u
    np.testing.assert_allclose(rn[..., :k, :], rr, atol=tol * np.abs(a).max() * np.sqrt(shape[-2]),
                               rtol=0)
    # one CholQR pass leaves Q orthonormal only to ~cond^2 u, and a wide input's
    # R2 = Q^H A2 inherits that (CuPy: 5.7e-14 at complex128, cond of the 10 x 10 block)
    reach = cond**2 if method == "cholqr" else 1.0
    assert backward_error(a, qn, rn) <= 32 * np.sqrt(shape[-1]) * u * reach
