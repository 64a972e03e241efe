"""Gram matrices ``X^H X`` as one-triangle engine calls (mpqr/engines/gram.py).

Every entry is the same dot product as in the engine's full product, so the
bounds are the engines' (tests/test_engines.py, tests/test_ozaki.py) against
exact references; the result is bitwise Hermitian and the blocks cover the
upper triangle with about half the GEMM's products.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

import mpqr
from mpqr.engines.gram import LEVELS, MIN_LEAF, gram_blocks, product_fraction
from mpqr.policy import gram
from tests._support import exact_matmul, exact_matmul_complex, part_errors_vs_abs, to_numpy

U16 = 2.0**-11
U32 = 2.0**-24
U64 = 2.0**-53

pytestmark = pytest.mark.skip_xp_backend(
    "array_api_strict", reason="array-api-strict has no float16 or int8 GEMM engines"
)

ENGINES = {"fp16": "tc-fp16", "fp32-emulated": "tc-sgemm", "fp64-emulated": "ozaki-int8"}


def _bound(precision: str, k: int) -> float:
    """The real engine's elementwise bound for a length-k product (tc-sgemm: ~23 of
    fp32's 24 bits per input, two more roundings for small k)."""
    if precision == "fp16":
        return 2 * U16 + U16**2 + k * U32
    return (k + 2) * U32 if precision == "fp32-emulated" else k * U64


def _gram(xp, x, precision):
    with mpqr.explain() as trace:
        g = gram(xp.asarray(x), precision=precision, options={"engine": ENGINES[precision]},
                 label="test-gram")
    return to_numpy(g), str(trace)


@pytest.mark.parametrize("n", [1, 16, 63, 64, 100, 256, 300, 512, 600])
def test_blocks_cover_the_upper_triangle_once(n):
    covered = np.zeros((n, n), dtype=int)
    for i0, i1, j0, j1 in gram_blocks(n):
        assert i0 <= j0 and i0 % 16 == 0 and j0 % 16 == 0
        covered[i0:i1, j0:j1] += 1
    assert (np.triu(covered) == np.triu(np.ones((n, n), dtype=int))).all()
    assert covered.sum() == pytest.approx(product_fraction(n) * n * n)
    if n >= 2**LEVELS * MIN_LEAF:  # three levels: 1/2 + 1/16 (blocks on multiples of 16)
        assert product_fraction(n) <= 0.5 + 1 / 16 + 16 / n


@functools.cache
def _real_case(m, n):
    """``(x, x^T x correctly rounded)``: the exact product once for every backend and
    precision."""
    x = np.random.default_rng(m + n).standard_normal((m, n))
    return x, exact_matmul(x.T, x)


@pytest.mark.parametrize("precision", sorted(ENGINES))
@pytest.mark.parametrize(("m", "n"), [(1, 5), (300, 40), (200, 130), (50, 520)])
def test_real_gram_accurate_and_bitwise_symmetric(xp, precision, m, n):
    x, exact = _real_case(m, n)
    g, trace = _gram(xp, x, precision)
    assert g.dtype == np.float64 and g.shape == (n, n)
    np.testing.assert_array_equal(g, g.T)
    assert "gram=upper-triangle" in trace
    err = np.max(np.abs(g - exact) / (np.abs(x.T) @ np.abs(x)))
    assert err <= _bound(precision, m), err
    if precision != "fp16":  # no worse than 2x the native GEMM (floor: one rounding)
        u = U32 if precision == "fp32-emulated" else U64
        nat = (x.astype(np.float32).T @ x.astype(np.float32)).astype(np.float64) \
            if precision == "fp32-emulated" else x.T @ x
        e_nat = np.max(np.abs(nat - exact) / (np.abs(x.T) @ np.abs(x)))
        assert err <= 2 * max(e_nat, u) or m == 1, (err, e_nat)


@pytest.mark.parametrize("precision", sorted(ENGINES))
def test_gram_equals_the_full_engine_product_in_value(xp, precision):
    # same dot products: the one-triangle result is the full product's to a few roundings
    # (ozaki-int8 gives both sides one shift, alpha_A = alpha_B, where the full product may
    # split its bits one apart)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((257, 140))
    g, _ = _gram(xp, x, precision)
    full = to_numpy(mpqr.matmul(xp.asarray(x.T.copy()), xp.asarray(x), precision=precision,
                                options={"engine": ENGINES[precision]}))
    denom = np.abs(x.T) @ np.abs(x)
    assert np.max(np.abs(g - full) / denom) <= 2 * _bound(precision, 257)


@pytest.mark.parametrize("precision", sorted(ENGINES))
def test_complex_gram_hermitian_and_accurate(xp, precision):
    rng = np.random.default_rng(5)
    m, n = 150, 70
    x = rng.standard_normal((m, n)) + 1j * rng.standard_normal((m, n))
    if precision != "fp64-emulated":
        x = x.astype(np.complex64)
    g, trace = _gram(xp, x, precision)
    assert g.dtype == x.dtype
    np.testing.assert_array_equal(g, g.conj().T)
    assert np.all(np.diag(g).imag == 0)
    if precision == "fp64-emulated":  # one 2M product per Gaussian modulus
        assert "gram=2m" in trace and "ozaki-int8 2M gram:" in trace
    else:
        assert "two real triangles of length 2m" in trace
    xh = x.conj().T
    exact = exact_matmul_complex(xh, x)
    assert max(part_errors_vs_abs(g, exact, xh, x)) <= np.sqrt(2) * _bound(precision, 2 * m)


@pytest.mark.parametrize("precision", sorted(ENGINES))
def test_nan_inf_zero_columns(xp, precision):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((90, 40))
    x[3, 5] = np.inf
    x[10, 20] = np.nan
    x[:, 30] = 0.0
    g, _ = _gram(xp, x, precision)
    with np.errstate(invalid="ignore", over="ignore"):
        nat = x.T @ x
    np.testing.assert_array_equal(np.isfinite(g), np.isfinite(nat))
    np.testing.assert_array_equal(g, g.T)
    ok = [j for j in range(40) if j not in (5, 20)]
    assert not g[30, ok].any() and not g[ok, 30].any()
    xs = x[:, ok]
    exact = exact_matmul(xs.T, xs)
    denom = np.abs(xs.T) @ np.abs(xs)
    sub = g[np.ix_(ok, ok)]
    mask = denom > 0
    assert np.max(np.abs(sub - exact)[mask] / denom[mask]) <= _bound(precision, 90)


def test_complex_ozaki_gram_nan_inf_zero_columns(xp):
    rng = np.random.default_rng(15)
    x = rng.standard_normal((60, 12)) + 1j * rng.standard_normal((60, 12))
    x[3, 2] = complex(0.0, np.inf)
    x[7, 9] = complex(np.nan, 0.0)
    x[:, 5] = 0.0
    g, trace = _gram(xp, x, "fp64-emulated")
    assert "2M gram" in trace
    with np.errstate(invalid="ignore", over="ignore"):
        nat = x.conj().T @ x
    for part in (np.real, np.imag):
        np.testing.assert_array_equal(np.isfinite(part(g)), np.isfinite(part(nat)))
    np.testing.assert_array_equal(g, g.conj().T)
    ok = [j for j in range(12) if j not in (2, 9)]
    assert not g[5, ok].any()
    xs = x[:, ok]
    exact = exact_matmul_complex(xs.conj().T, xs)
    sub = g[np.ix_(ok, ok)]
    keep = [i for i, j in enumerate(ok) if j != 5]
    sub, exact = sub[np.ix_(keep, keep)], exact[np.ix_(keep, keep)]
    xk = xs[:, keep]
    assert max(part_errors_vs_abs(sub, exact, xk.conj().T, xk)) <= \
        np.sqrt(2) * _bound("fp64-emulated", 120)


def test_ozaki_gram_one_residue_pass_and_fallback_when_over_the_workspace(xp):
    rng = np.random.default_rng(9)
    x = rng.standard_normal((120, 48))
    _, trace = _gram(xp, x, "fp64-emulated")
    assert "one residue pass" in trace
    with mpqr.explain() as t2:
        g2 = to_numpy(gram(xp.asarray(x), precision="fp64-emulated",
                           options={"engine": "ozaki-int8", "workspace_limit": 4096}))
    assert "exceed the workspace limit" in str(t2)
    np.testing.assert_array_equal(g2, g2.T)
    exact = exact_matmul(x.T, x)
    denom = np.abs(x.T) @ np.abs(x)
    assert np.max(np.abs(g2 - exact) / denom) <= _bound("fp64-emulated", 120)


def test_complex_ozaki_gram_over_the_workspace_takes_two_real_triangles(xp):
    rng = np.random.default_rng(14)
    x = rng.standard_normal((90, 40)) + 1j * rng.standard_normal((90, 40))
    with mpqr.explain() as trace:
        g = to_numpy(gram(xp.asarray(x), precision="fp64-emulated",
                          options={"engine": "ozaki-int8", "workspace_limit": 300_000}))
    assert "2M gram" not in str(trace) and "ozaki-int8 gram:" in str(trace)
    np.testing.assert_array_equal(g, g.conj().T)
    xh = x.conj().T
    exact = exact_matmul_complex(xh, x)
    assert max(part_errors_vs_abs(g, exact, xh, x)) <= np.sqrt(2) * _bound("fp64-emulated", 180)


def test_native_and_stacks_return_none():
    x = np.ones((8, 3))
    assert gram(x, precision="fp64") is None
    assert gram(np.ones((2, 8, 3)), precision="fp32-emulated") is None


def test_cholqr_uses_the_gram_call(xp):
    rng = np.random.default_rng(11)
    a = rng.standard_normal((200, 24))
    with mpqr.explain() as trace:
        q, r = mpqr.qr(xp.asarray(a), precision="fp32-emulated", method="cholqr2")
    assert "cholqr2-gram" in str(trace) and "gram=upper-triangle" in str(trace)
    q, r = to_numpy(q), to_numpy(r)
    assert np.linalg.norm(q @ r - a) / np.linalg.norm(a) <= 8 * np.sqrt(24) * U32


def test_inputs_not_modified(xp):
    rng = np.random.default_rng(12)
    x = rng.standard_normal((64, 20)) + 1j * rng.standard_normal((64, 20))
    x0 = x.copy()
    dx = xp.asarray(x)
    for precision in sorted(ENGINES):
        gram(dx, precision=precision, options={"engine": ENGINES[precision]})
    np.testing.assert_array_equal(to_numpy(dx), x0)


@pytest.mark.skip_xp_backend("numpy", reason="the NumPy backend is the reference itself")
@pytest.mark.skip_xp_backend("numpy_readonly", reason="the NumPy backend is the reference itself")
def test_gpu_ozaki_gram_bit_identical_to_numpy_emulation(xp):
    rng = np.random.default_rng(13)
    x = rng.standard_normal((700, 300))
    xc = x[:, :90] + 1j * rng.standard_normal((700, 90))
    for v in (x, xc):
        got, _ = _gram(xp, v, "fp64-emulated")
        ref, _ = _gram(np, v, "fp64-emulated")
        np.testing.assert_array_equal(got, ref)
