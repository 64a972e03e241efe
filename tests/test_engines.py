"""Accuracy of the GEMM engines against exact references.

Error measure: max_ij |C - AB|_ij / (|A||B|)_ij, computed against a correctly
rounded float64 reference (exact products, math.fsum).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

import mpqr
from tests._support import exact_matmul, exact_matmul_fraction, rel_error_vs_abs, to_numpy

U16 = 2.0**-11
U32 = 2.0**-24

pytestmark = pytest.mark.skip_xp_backend(
    "array_api_strict", reason="array-api-strict has no float16: no tensor-core engines"
)


def _operands(rng, m, k, n, dtype=np.float32):
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    return a, b


@functools.cache
def _seeded_case(seed, m, k, n):
    """``(a, b, a @ b correctly rounded)`` from ``seed``: computed once, shared by the
    backends (the exact product takes seconds at k = 65536)."""
    a, b = _operands(np.random.default_rng(seed), m, k, n)
    return a, b, exact_matmul(a, b)


def test_exact_reference_is_exact():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 7))
    b = rng.standard_normal((7, 2))
    exact = exact_matmul_fraction(a, b)
    ref = exact_matmul(a, b)
    for i in range(3):
        for j in range(2):
            assert ref[i, j] == float(exact[i][j])


@pytest.mark.parametrize("k", [16, 1024, 65536])
def test_tc_sgemm_matches_sgemm_accuracy(xp, k):
    m = n = 16 if k == 65536 else 32
    a, b, exact = _seeded_case(k, m, k, n)
    da, db = xp.asarray(a), xp.asarray(b)
    emu = to_numpy(mpqr.matmul(da, db, precision="fp32-emulated"))
    nat = to_numpy(mpqr.matmul(da, db, precision="fp32"))
    assert emu.dtype == np.float32
    e_emu = rel_error_vs_abs(emu, exact, a, b)
    e_nat = rel_error_vs_abs(nat, exact, a, b)
    # the worst-case bound of any fp32 GEMM, and the 2x-of-SGEMM target
    assert e_emu <= k * U32
    assert e_emu <= 2 * e_nat, (e_emu, e_nat)


@pytest.mark.parametrize("k", [16, 1024, 65536])
def test_tc_fp16_within_documented_bound(xp, k):
    a, b, exact = _seeded_case(k + 1, 16, k, 16)
    c = to_numpy(mpqr.matmul(xp.asarray(a), xp.asarray(b), precision="fp16"))
    err = rel_error_vs_abs(c, exact, a, b)
    assert err <= 2 * U16 + U16**2 + k * U32
    # and it really is half precision: far worse than fp32 (the test can fail)
    assert err > 8 * U32


def test_tc_fp16_unscales_its_product_in_place_with_the_same_bits(xp, monkeypatch):
    # UNSCALE_IN_PLACE: the float32 product unscaled in its own storage, the bits of the
    # unscaled copy; graded rows and columns (their shifts differ), an Inf kept
    from mpqr.engines import tc_fp16

    rng = np.random.default_rng(12)
    a = (rng.standard_normal((96, 200)) * np.exp2(rng.integers(-30, 30, (96, 1))))
    b = (rng.standard_normal((200, 80)) * np.exp2(rng.integers(-30, 30, (1, 80))))
    a, b = a.astype(np.float32), b.astype(np.float32)
    a[3, 7] = np.inf
    out = {}
    for on in (False, True):
        monkeypatch.setattr(tc_fp16, "UNSCALE_IN_PLACE", on)
        with mpqr.gemm_options(engine="tc-fp16"), np.errstate(invalid="ignore"):
            out[on] = to_numpy(mpqr.matmul(xp.asarray(a), xp.asarray(b),
                                           precision="fp16"))
    np.testing.assert_array_equal(out[True], out[False])
    assert not np.isfinite(out[True][3]).any() and np.isfinite(out[True][4]).all()


@pytest.mark.parametrize("precision", ["fp16", "fp32-emulated"])
def test_scaling_keeps_extreme_magnitudes_finite_and_accurate(xp, precision):
    rng = np.random.default_rng(7)
    m, k, n = 12, 64, 10
    a, b = _operands(rng, m, k, n)
    # rows of A spread over [1e-30, 1e30] (far outside fp16), columns of B over
    # [1e-6, 1e6], so every exact product is still a normal float32
    a *= np.logspace(-30, 30, m, dtype=np.float64)[:, None].astype(np.float32)
    b *= np.logspace(6, -6, n, dtype=np.float64)[None, :].astype(np.float32)
    exact = exact_matmul(a, b)
    c = to_numpy(mpqr.matmul(xp.asarray(a), xp.asarray(b), precision=precision))
    assert np.all(np.isfinite(c))
    bound = (2 * U16 + U16**2 + k * U32) if precision == "fp16" else k * U32
    assert rel_error_vs_abs(c, exact, a, b) <= bound


@pytest.mark.parametrize("precision", ["fp16", "fp32-emulated"])
def test_float32_extremes_do_not_overflow(xp, precision):
    a = np.array([[3.0e38, -1.0e38], [1.0e-38, 2.0e-38]], dtype=np.float32)
    b = np.array([[0.5, 1e-3], [0.25, 2.0]], dtype=np.float32)
    exact = exact_matmul(a, b)
    c = to_numpy(mpqr.matmul(xp.asarray(a), xp.asarray(b), precision=precision))
    assert np.all(np.isfinite(c))
    bound = (2 * U16 + U16**2 + 2 * U32) if precision == "fp16" else 2 * U32
    assert rel_error_vs_abs(c, exact, a, b) <= bound


@pytest.mark.parametrize("precision", ["fp16", "fp32-emulated", "fp32", "fp64"])
def test_nan_inf_propagate_like_native(xp, precision):
    rng = np.random.default_rng(3)
    a, b = _operands(rng, 6, 20, 5)
    a[1, 3] = np.inf
    a[4, 0] = np.nan
    b[2, 2] = -np.inf
    ref = a.astype(np.float64) @ b.astype(np.float64)
    c = to_numpy(mpqr.matmul(xp.asarray(a), xp.asarray(b), precision=precision))
    np.testing.assert_array_equal(np.isnan(c), np.isnan(ref))
    np.testing.assert_array_equal(np.isposinf(c), np.isposinf(ref))
    np.testing.assert_array_equal(np.isneginf(c), np.isneginf(ref))


def test_slice_k_option_is_used_and_changes_nothing_numerically_meaningful(xp):
    rng = np.random.default_rng(5)
    a, b = _operands(rng, 8, 3000, 8)
    exact = exact_matmul(a, b)
    errs = []
    for sk in (64, 1024, 3000):
        with mpqr.explain() as tr:
            c = mpqr.matmul(xp.asarray(a), xp.asarray(b), precision="fp32-emulated",
                            options={"slice_k": sk})
        assert tr.gemms[0].params == {"slice_k": sk}
        errs.append(rel_error_vs_abs(to_numpy(c), exact, a, b))
    assert max(errs) <= 3000 * U32


def test_float64_inputs_on_emulated_engines_return_float64(xp):
    rng = np.random.default_rng(11)
    a, b = _operands(rng, 9, 40, 7, dtype=np.float64)
    exact = exact_matmul(a, b)
    c = mpqr.matmul(xp.asarray(a), xp.asarray(b), precision="fp32-emulated")
    assert to_numpy(c).dtype == np.float64
    # fp32-level accuracy, not fp64: the bound and a check that it is not exact fp64
    err = rel_error_vs_abs(to_numpy(c), exact, a, b)
    assert err <= 40 * U32
    assert err > 2.0**-50


@pytest.mark.skip_xp_backend("numpy_readonly", reason="the accumulator is the engine's own")
@pytest.mark.parametrize("contiguous", [True, False])
def test_partial_products_are_added_with_round_to_nearest(xp, contiguous):
    """``add_partials`` (tc-sgemm's slice sums): c + the sum of float32 partials, each
    addition rounded to nearest, on every backend (CuPy: one GEMM with ones), also
    into a strided view and with Inf/NaN where the sum has them."""
    from mpqr.backends import get_backend

    from mpqr._array_api import array_namespace

    rng = np.random.default_rng(11)
    g, m, n = 37, 24, 20
    parts = rng.standard_normal((g, m, n)).astype(np.float32)
    parts[5, 3, 4] = np.inf
    parts[9, 7, 1] = np.nan
    base = rng.standard_normal((m, 2 * n)).astype(np.float32)
    exact = base[:, :n].astype(np.float64) + parts.astype(np.float64).sum(axis=0)
    bound = (g + 1) * U32 * (np.abs(base[:, :n]).astype(np.float64)
                             + np.abs(parts.astype(np.float64)).sum(axis=0))
    big = xp.asarray(base.copy())
    c = big[:, :n] if not contiguous else xp.asarray(base[:, :n].copy())
    backend = get_backend(array_namespace(c))
    backend.add_partials(c, xp.asarray(parts))
    got = to_numpy(c).astype(np.float64)
    finite = np.isfinite(exact)
    assert np.all(np.abs(got[finite] - exact[finite]) <= bound[finite])
    np.testing.assert_array_equal(np.isnan(got), np.isnan(exact))
    np.testing.assert_array_equal(np.isposinf(got), np.isposinf(exact))
    if not contiguous:  # the columns beside the view are untouched
        np.testing.assert_array_equal(to_numpy(big)[:, n:], base[:, n:])
