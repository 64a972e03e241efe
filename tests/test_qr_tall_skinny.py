"""Tall-skinny QR: ``method="auto"`` takes certified CholQR2, the blocked row-wise
right solve, and the column scaling that native precisions skip when it is not needed.

Tolerances: CholQR2's orthogonality and backward error are ``O(u)`` with constants
growing like ``sqrt(n)`` in practice (Yamamoto et al. 2015 bound them by
``c (m n + n^2) u``; we use ``8 sqrt(n) u``, far below the bound yet 10-100x above
what a correct run gives, so a lost pass or a wrong product fails).
"""

from __future__ import annotations

import dataclasses
import sys

import numpy as np
import pytest
from mpqr.backends import ArrayAPIBackend, get_backend

import mpqr
from tests._qr_support import backward_error, geometric, inflate_second_gram, orthogonality
from tests._support import to_numpy

api = sys.modules["mpqr.qr.api"]
cholqr_mod = sys.modules["mpqr.qr.cholqr"]
U64 = 2.0**-53


def _events(trace, kind):
    return [e for e in trace.events if e.kind == kind]


@pytest.fixture(autouse=True)
def _cholqr2_at_every_size(monkeypatch):
    """These tests are about auto's CholQR2 path: small inputs would take ``geqrf``."""
    monkeypatch.setattr(ArrayAPIBackend, "library_qr_tall_max", 0)


@pytest.mark.parametrize("shape", [(2000, 20), (1600, 100)])
def test_auto_takes_cholqr2_for_tall_skinny_and_it_is_fp64_accurate(xp, shape):
    m, n = shape
    a = geometric(np.random.default_rng(1), m, n, 1e4)
    with mpqr.explain() as trace:
        q, r = mpqr.qr(xp.asarray(a), precision="fp64")
    (ev,) = _events(trace, "method")
    assert ev.data["method"] == "cholqr2" and "certified" in ev.message
    assert not _events(trace, "fallback")
    assert orthogonality(to_numpy(q)) <= 8 * np.sqrt(n) * U64 / n
    assert backward_error(a, to_numpy(q), to_numpy(r)) <= 8 * np.sqrt(n) * U64
    assert np.all(np.diag(to_numpy(r)) >= 0)  # the documented sign convention holds


@pytest.mark.parametrize(("n", "cond", "want"), [
    (64, None, ["gemm", "gemm"]),           # Gaussian (cond_1(R1) = 2.9): both by GEMM
    (64, 1e4, ["substitution", "gemm"]),    # pass 1's R too ill-conditioned for X = R^-1
    (32, None, []),                         # below inverse_gemm_min_n: substitution only
])
def test_cholqr2_applies_a_well_conditioned_inverse_by_gemm(xp, n, cond, want):
    rng = np.random.default_rng(5)
    a = rng.standard_normal((6000, n)) if cond is None else geometric(rng, 3000, n, cond)
    with mpqr.explain() as trace:
        q, r = mpqr.qr(xp.asarray(a), precision="fp64")
    evs = _events(trace, "apply-inverse")
    got = ["gemm" if "by GEMM" in e.message else "substitution" for e in evs]
    assert got == want
    for e in evs:
        assert (e.data["cond_1"] <= cholqr_mod.INVERSE_COND_MAX) == ("by GEMM" in e.message)
    if want:
        gemms = [g.label for g in trace.gemms]
        assert gemms.count("cholqr2-apply-inverse") == want.count("gemm")
    assert orthogonality(to_numpy(q)) <= 8 * np.sqrt(n) * U64 / n
    assert backward_error(a, to_numpy(q), to_numpy(r)) <= 8 * np.sqrt(n) * U64


def test_auto_keeps_householder_below_the_ratio_and_for_stacks():
    be = get_backend(sys.modules["mpqr._array_api"].array_namespace(np.zeros(1)))
    f64 = np.float64
    assert api.choose_method(be, "fp64", f64, 15 * 20, 20)[0] != "cholqr2"
    assert api.choose_method(be, "fp64", f64, 16 * 20, 20)[0] == "cholqr2"
    assert api.choose_method(be, "fp64", f64, 16 * 20, 20, batch=7)[0] != "cholqr2"
    for prec in ("fp16", "fp32-emulated"):
        assert api.choose_method(be, prec, f64, 15 * 20, 20)[0] != "cholqr2"
        assert api.choose_method(be, prec, f64, 16 * 20, 20, batch=7)[0] != "cholqr2"


@pytest.mark.skip_xp_backend("array_api_strict", reason="no float16 GEMM engine there")
@pytest.mark.parametrize("precision", ["fp16", "fp32-emulated"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_auto_tall_skinny_at_the_fp16_precisions_runs_cholqr2_in_the_inputs_own(
        xp, precision, dtype):
    """At ``fp16``/``fp32-emulated`` a tall-skinny matrix gets CholQR2 with native Gram
    products in its own precision: at least as accurate as asked (here: to the dtype's
    own ``u``), and the explain trace says so."""
    m, n = 3000, 60
    a = geometric(np.random.default_rng(11), m, n, 100.0).astype(dtype)
    with mpqr.explain() as trace:
        q, r = mpqr.qr(xp.asarray(a), precision=precision)
    (ev,) = _events(trace, "method")
    own = "fp32" if dtype == np.float32 else "fp64"
    assert ev.message.startswith(f"qr: cholqr2 (tall-skinny (m >= 16 n) at precision="
                                 f"{precision!r}: CholQR2 in the input's own, at least as "
                                 f"accurate precision ({own}), ")
    engines = {g.engine for g in trace.gemms}
    assert engines and all(e.startswith("native") for e in engines), engines
    u = 2.0**-24 if dtype == np.float32 else U64
    assert orthogonality(to_numpy(q)) <= 8 * np.sqrt(n) * u
    assert backward_error(a, to_numpy(q), to_numpy(r)) <= 8 * np.sqrt(n) * u


@pytest.mark.skip_xp_backend("array_api_strict", reason="no float16 GEMM engine there")
def test_fp16_tall_skinny_beyond_cholqr2_falls_back_to_the_requested_precision(xp):
    """cond = 1e9 in float32 is beyond CholQR2 (``u^(-1/2)`` ~ 4e3) and numerically
    rank-deficient (``u^-1`` ~ 2e7), so beyond the preconditioned CholQR too: the QR falls
    back to the method fp16 runs without the tall-skinny rule (tiled on a backend without
    tensor cores, the recursion on one), at fp16, and the trace says so."""
    m, n = 3000, 60
    a = geometric(np.random.default_rng(12), m, n, 1e9).astype(np.float32)
    with mpqr.explain() as trace:
        q, r = mpqr.qr(xp.asarray(a), precision="fp16")
    be = get_backend(sys.modules["mpqr._array_api"].array_namespace(xp.asarray(a)))
    want = "householder-recursive" if "tensor-cores" in be.capabilities else \
        "householder-tiled"
    first, fb = _events(trace, "fallback")
    assert first.message.startswith("qr: cholqr2 broke down (estimated cond(x) >= ")
    assert first.data["fallback"] == ("sketch-cholqr" if be.sketches else
                                      "preconditioned-cholqr")  # tall: the sketch rescue
    assert fb.message.startswith(f"qr: {first.data['fallback']} broke down (estimated cond(x) ")
    assert "numerically rank-deficient" in fb.data["reason"]
    assert fb.message.endswith(f"); falling back to {want} at precision='fp16'")
    assert any(not g.engine.startswith("native") for g in trace.gemms)  # fp16 engines ran
    u16 = 2.0**-11
    assert backward_error(a, to_numpy(q), to_numpy(r)) <= 2 * np.sqrt(n) * u16


@pytest.mark.parametrize(("engine", "want"), [("ozaki-int8", True), ("native-fp64", True),
                                             ("tc-sgemm", False), ("tc-fp16", False)])
def test_auto_takes_cholqr2_when_the_gram_engine_is_fp64_accurate(monkeypatch, engine, want):
    # fp64-emulated puts a large Gram product on the INT8 Ozaki engine (error <= 2x
    # DGEMM's): CholQR2 stays right; the fp16-based engines' Gram matrices are not
    import mpqr.policy as policy

    real = policy.decide

    def fake(*args, **kw):
        return dataclasses.replace(real(*args, **kw), engine=engine)

    monkeypatch.setattr(policy, "decide", fake)
    be = get_backend(sys.modules["mpqr._array_api"].array_namespace(np.zeros(1)))
    got = api.choose_method(be, "fp64-emulated", np.float64, 16 * 20, 20)[0]
    assert (got == "cholqr2") == want


def test_ill_conditioned_tall_continues_with_a_traced_reason(xp):
    n = 30
    a = geometric(np.random.default_rng(2), 1000, n, 1e12)  # cond^2 u >> 1: CholQR2 cannot
    with mpqr.explain() as trace:
        q, r = mpqr.qr(xp.asarray(a), precision="fp64")
    (fb,) = _events(trace, "fallback")
    be = get_backend(sys.modules["mpqr._array_api"].array_namespace(xp.asarray(a)))
    want = "sketch-cholqr" if be.sketches else "preconditioned-cholqr"  # a scatter-add?
    assert fb.data["method"] == "cholqr2" and fb.data["fallback"] == want
    assert orthogonality(to_numpy(q)) <= 8 * np.sqrt(n) * U64 / n
    assert backward_error(a, to_numpy(q), to_numpy(r)) <= 8 * np.sqrt(n) * U64


def test_cholqr2_certificate_refuses_an_uncertified_result():
    # cond = 2e7: the first Cholesky succeeds (cond^2 u n ~ 0.9e0 is borderline) but
    # Q1 is far from orthonormal; the certificate must turn this into a BreakdownError
    rng = np.random.default_rng(3)
    raised = 0
    for cond in (3e7, 1e8, 1e9):
        a = geometric(rng, 400, 12, cond)
        try:
            q, r = mpqr.qr(a, method="cholqr2", precision="fp64")
        except mpqr.BreakdownError as exc:
            assert str(exc).startswith("cholqr2 broke down")
            raised += 1
        else:  # whatever is returned must be a valid factorization
            assert orthogonality(q) <= 8 * np.sqrt(12) * U64 / 12
            assert backward_error(a, q, r) <= 8 * np.sqrt(12) * U64
    assert raised >= 1


# n = 10: the fused second pass (the backend's right_solve_gram); n = 40: Q1 stored
# (fused_cholqr_max_n = 32)
@pytest.mark.parametrize(("n", "dist"), [(10, r"6\.3\de\+00"), (40, r"1\.2\de\+01")])
def test_certificate_message_names_the_distance_and_the_method(monkeypatch, n, dist):
    a = geometric(np.random.default_rng(4), 300, n, 10.0)
    inflate_second_gram(monkeypatch, a)  # ||G2 - I||_F = 2 sqrt(n) > 1/2
    with pytest.raises(mpqr.BreakdownError,
                       match=r"^cholqr2 broke down: after the first pass \|\|Q1\^H Q1 - I\|\|_F "
                             rf"= {dist} > 0\.5, so the result would not be orthonormal "
                             r"to working accuracy \(estimated cond\(x\) >= "):
        mpqr.qr(a, method="cholqr2", precision="fp64")


def test_mode_r_skips_the_last_solve_and_gives_the_same_r(xp):
    a = geometric(np.random.default_rng(6), 800, 16, 1e3)
    r_only = mpqr.qr(xp.asarray(a), mode="r", precision="fp64")
    _, r = mpqr.qr(xp.asarray(a), precision="fp64")
    np.testing.assert_array_equal(to_numpy(r_only), to_numpy(r))


@pytest.mark.parametrize("block", [1, 3, 8])
def test_blocked_right_solve_is_rowwise_backward_stable(monkeypatch, block):
    xp_np = sys.modules["mpqr._array_api"].array_namespace(np.zeros(1))
    be = get_backend(xp_np)
    monkeypatch.setattr(type(be), "right_solve_block", block)
    rng = np.random.default_rng(7)
    n = 21
    r = np.triu(rng.standard_normal((n, n))) + 4 * np.eye(n)
    a = rng.standard_normal((300, n))
    with mpqr.explain() as trace:
        q = cholqr_mod.right_solve_upper(be, a, r, "fp64")
    assert len(trace.gemms) >= 1 and all(g.label == "trsm-update" for g in trace.gemms)
    # row-wise backward error |a - q r| <= c n u |q| |r|
    res = np.abs(a - q @ r)
    bound = 4 * n * U64 * (np.abs(q) @ np.abs(r))
    assert np.all(res <= bound)


def test_native_precisions_scale_only_extreme_columns(xp):
    rng = np.random.default_rng(9)
    a = rng.standard_normal((640, 8))
    big = a * np.array([2.0**500, 1, 2.0**-520, 1, 1, 2.0**300, 1, 1])
    q, r = mpqr.qr(xp.asarray(big), precision="fp64")  # the Gram of `big` would overflow
    q0, r0 = mpqr.qr(xp.asarray(a), precision="fp64")
    scale = np.array([2.0**500, 1, 2.0**-520, 1, 1, 2.0**300, 1, 1])
    assert np.all(np.isfinite(to_numpy(r)))
    np.testing.assert_allclose(to_numpy(q), to_numpy(q0), atol=64 * U64, rtol=0)
    rel = np.abs(to_numpy(r) - to_numpy(r0) * scale) / (np.abs(to_numpy(r0)).max() * scale)
    assert rel.max() <= 64 * U64


# array-api-strict runs NumPy underneath and warns about the probe's overflow to inf
# (mpqr's own NumPy backend silences it: backend.ignore_fp_warnings)
@pytest.mark.filterwarnings("ignore:overflow encountered in matmul:RuntimeWarning")
@pytest.mark.parametrize("col_scale,why", [(2.0**-700, "squared column norm"),
                                           (2.0**600, "not finite")])
def test_auto_cholqr2_runs_unscaled_and_falls_back_on_range(xp, col_scale, why):
    rng = np.random.default_rng(10)
    a = rng.standard_normal((640, 8))
    scale = np.ones(8)
    scale[3] = col_scale
    with mpqr.explain() as trace:
        q, r = mpqr.qr(xp.asarray(a * scale), precision="fp64")
    (fb,) = _events(trace, "fallback")
    assert fb.data["method"] == "cholqr2" and why in fb.data["reason"]
    q0, r0 = mpqr.qr(xp.asarray(a), precision="fp64")
    np.testing.assert_allclose(to_numpy(q), to_numpy(q0), atol=64 * U64, rtol=0)
    rel = np.abs(to_numpy(r) - to_numpy(r0) * scale) / (np.abs(to_numpy(r0)).max() * scale)
    assert rel.max() <= 64 * U64
    # an explicit method gets its columns scaled first, so it does not break down
    _, r2 = mpqr.qr(xp.asarray(a * scale), method="cholqr2", precision="fp64")
    assert np.all(np.isfinite(to_numpy(r2)))


def test_small_steps_on_another_namespace_give_the_same_factors(monkeypatch):
    """The CuPy backend runs CholQR's n x n steps on the host (``backend.small``): the
    core must move R back (``from_small``) and never mix namespaces. Emulated here with
    array-api-strict handing its small steps to NumPy: same factors, bit for bit, and
    the results stay in the caller's namespace."""
    import array_api_strict as xs

    a = geometric(np.random.default_rng(9), 1500, 24, 1e5)
    strict = get_backend(xs)
    host = get_backend(mpqr._array_api.array_namespace(np.zeros(1)))
    q0, r0 = mpqr.qr(xs.asarray(a), precision="fp64")
    moved = []

    def small(x):
        moved.append(x.shape)
        return host, np.asarray(x)

    monkeypatch.setattr(strict, "small", small)
    monkeypatch.setattr(strict, "from_small", lambda x, like: xs.asarray(x))
    q1, r1 = mpqr.qr(xs.asarray(a), precision="fp64")
    assert moved == [(24, 24), (24, 24)]  # both CholQR2 passes
    assert type(q1) is type(q0) and type(r1) is type(r0)
    np.testing.assert_array_equal(to_numpy(r1), to_numpy(r0))
    np.testing.assert_array_equal(to_numpy(q1), to_numpy(q0))
