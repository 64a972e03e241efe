"""Values: NaN/Inf, extreme magnitudes, subnormals, zero and rank-deficient matrices.

Promises held here (docs/guarantees.md):

* ``check_finite=True`` rejects NaN/Inf with a ValueError (SciPy's rule);
  otherwise NaN/Inf never become a finite-looking answer: the Householder and
  Gram-Schmidt methods propagate NaN into Q or R, the Gram-based methods raise
  their BreakdownError.
* Any finite input, from subnormal to the dtype's max, factors without
  overflow or underflow at every precision (columns are scaled by powers of two).
* Every method either returns a valid factorization or raises BreakdownError;
  ``method="auto"`` never raises for finite input.
"""

from __future__ import annotations

import numpy as np
import pytest

import mpqr
from tests._qr_support import geometric, hp_matmul
from tests._support import exact_matmul

METHODS = ["householder-recursive", "householder-tiled", "gram-schmidt-recursive", "cholqr",
           "cholqr2", "shifted-cholqr3", "svqr", "geqrf"]
PRECISIONS = ["fp64", "fp64-emulated", "fp32", "fp32-emulated", "fp16"]
#: unit roundoff of each precision's products (fp16 rounds its inputs to 11 bits)
U = {"fp64": 2.0**-53, "fp64-emulated": 2.0**-53, "auto": 2.0**-53, "fp32": 2.0**-24,
     "fp32-emulated": 2.0**-24, "fp16": 2.0**-11}
#: the constant of the documented bounds ||A - QR||_F <= C n u ||A||_F and
#: ||I - Q^T Q||_F <= C n u (docs/guarantees.md)
C = 8


def u_of(precision, dtype=np.float64):
    return max(U[precision], 2.0**-24 if np.dtype(dtype) == np.float32 else 2.0**-53)


def fro_errors(a, q, r):
    """(||A - QR||_F / ||A||_F, ||I - Q^T Q||_F), residuals in extended precision."""
    a64 = np.asarray(a, dtype=np.float64)
    q64, r64 = np.asarray(q, dtype=np.float64), np.asarray(r, dtype=np.float64)
    res = a64.astype(np.longdouble) - hp_matmul(q64, r64)
    nres, na = np.linalg.norm(np.asarray(res, dtype=np.float64)), np.linalg.norm(a64)
    be = float(nres / na) if na > 0 else float(nres)  # zero matrix: the residual must be 0
    g = hp_matmul(q64.T, q64) - np.eye(q64.shape[1])
    return be, float(np.linalg.norm(np.asarray(g, dtype=np.float64)))


# --- NaN and Inf -------------------------------------------------------------------

@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_check_finite_raises_scipys_valueerror(xp, bad):
    a = np.ones((5, 3))
    a[2, 1] = bad
    with pytest.raises(ValueError, match=r"^`x` must not contain infs or NaNs "
                                         r"\(check_finite=True\)$"):
        mpqr.qr(xp.asarray(a), check_finite=True)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
@pytest.mark.parametrize("precision", [*PRECISIONS, "auto"])
@pytest.mark.parametrize("method", [*METHODS, "auto"])
def test_nan_inf_never_give_a_finite_looking_qr(bad, precision, method):
    a = geometric(np.random.default_rng(0), 70, 40, 10.0)
    a[13, 37] = bad
    if method in ("cholqr", "cholqr2", "shifted-cholqr3", "svqr"):
        with pytest.raises(mpqr.BreakdownError, match=rf"^{method} broke down: the Gram "
                                                      r"matrix x\^H x is not finite \(x holds "
                                                      r"NaN or Inf\)$"):
            mpqr.qr(a, method=method, precision=precision)
        return
    with np.errstate(invalid="ignore", over="ignore"):
        q, r = mpqr.qr(a, method=method, precision=precision)
    assert np.isnan(q).any() or np.isnan(r).any()
    with np.errstate(invalid="ignore", over="ignore"):
        rr = mpqr.qr(a, mode="r", method=method, precision=precision)
    assert not np.isfinite(rr).all()


@pytest.mark.parametrize("precision", ["fp64", "fp32", "fp16", "fp32-emulated", "fp64-emulated"])
def test_matmul_nan_inf_land_exactly_where_native_puts_them(precision):
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((9, 40)), rng.standard_normal((40, 7))
    a[2, 5], a[6, 1], b[3, 4] = np.nan, np.inf, -np.inf
    with np.errstate(invalid="ignore"):
        native = a @ b
        c = mpqr.matmul(a, b, precision=precision)
    np.testing.assert_array_equal(np.isfinite(c), np.isfinite(native))
    np.testing.assert_array_equal(np.isnan(c), np.isnan(native))


def test_svd_propagates_nan():
    a = np.ones((6, 3))
    a[1, 1] = np.nan
    u, s, vh = mpqr.svd(a)
    assert np.isnan(s).all() and np.isnan(u).all() and np.isnan(vh).all()


# --- extreme magnitudes --------------------------------------------------------------

SCALES = [2.0**1000, 1e300, 1e-300, 2.0**-1060]  # the last one is subnormal


@pytest.mark.parametrize("scale", SCALES, ids=["2^1000", "1e300", "1e-300", "subnormal"])
@pytest.mark.parametrize("precision", ["fp16", "fp32-emulated", "fp32"])
@pytest.mark.parametrize("method", [*METHODS, "auto"])
def test_float64_extremes_never_overflow_or_underflow(method, precision, scale):
    """float64 data far outside fp16's (and fp32's) range: finite, accurate factors."""
    a = geometric(np.random.default_rng(2), 70, 40, 10.0)
    x = a * scale
    q, r = mpqr.qr(x, method=method, precision=precision)
    assert np.isfinite(q).all() and np.isfinite(r).all()
    # measure against x exactly: scale up by a power of two (exact, even for subnormals)
    e = -int(np.frexp(scale)[1])
    be, orth = fro_errors(np.ldexp(x, e), q, np.ldexp(r, e))
    u = u_of(precision)
    assert be <= C * 40 * u + _subnormal_floor(x, e, np.float64), be
    assert orth <= C * 40 * u * (10.0 if method == "cholqr" else 1.0) ** 2, orth


def _subnormal_floor(x, e, dtype):
    """Relative error that rounding R's entries to the subnormal grid alone can cause
    (half a unit of the smallest subnormal per entry), in the units of x * 2**e."""
    tiny = float(np.finfo(dtype).smallest_subnormal)
    return x.shape[1] * np.ldexp(tiny, e) / np.linalg.norm(np.ldexp(x.astype(np.float64), e))


@pytest.mark.parametrize("scale", [np.float32(3e38) / 4, np.float32(1e-30),
                                   np.float32(2.0**-140)], ids=["f32max/4", "1e-30", "subnormal"])
@pytest.mark.parametrize("precision", ["fp16", "fp32-emulated", "fp32"])
@pytest.mark.parametrize("method", [*METHODS, "auto"])
def test_float32_extremes_never_overflow_or_underflow(method, precision, scale):
    a = geometric(np.random.default_rng(3), 70, 40, 10.0).astype(np.float32)
    x = a * scale
    q, r = mpqr.qr(x, method=method, precision=precision)
    assert q.dtype == np.float32 and np.isfinite(q).all() and np.isfinite(r).all()
    e = -int(np.frexp(np.float64(scale))[1])
    be, orth = fro_errors(np.ldexp(x.astype(np.float64), e), q, np.ldexp(r.astype(np.float64), e))
    u = u_of(precision, np.float32)
    assert be <= C * 40 * u + _subnormal_floor(x, e, np.float32), be
    assert orth <= C * 40 * u * (100.0 if method == "cholqr" else 1.0), orth


@pytest.mark.parametrize("precision,c_k", [("fp16", None), ("fp32-emulated", 4)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_matmul_beyond_fp16_range(precision, c_k, dtype):
    """Rows of A up to the dtype's max, columns of B tiny: no inf/NaN, and the
    elementwise bound |C - AB| <= (2 u16 + k u32) |A||B| (fp16) or
    c k u32 |A||B| (fp32-emulated) holds."""
    rng = np.random.default_rng(4)
    k = 96
    hi = np.finfo(dtype).max / (4 * k)
    a = (rng.standard_normal((12, k)) * np.logspace(-3, 0, 12)[:, None] * hi).astype(dtype)
    b = (rng.standard_normal((k, 9)) / hi).astype(dtype)
    c = mpqr.matmul(a, b, precision=precision)
    assert c.dtype == dtype and np.isfinite(c).all()
    exact = exact_matmul(a.astype(np.float64) * 2.0**-100, b.astype(np.float64)) * 2.0**100
    bound = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))
    u32 = 2.0**-24
    tol = (2 * 2.0**-11 + k * u32) if c_k is None else c_k * k * u32
    assert np.all(np.abs(c - exact) <= tol * bound + 2 * u32 * np.abs(exact))


# --- zero and rank-deficient matrices --------------------------------------------------

def _rank_deficient(rng, m, n, rank):
    u, _ = np.linalg.qr(rng.standard_normal((m, n)))
    v, _ = np.linalg.qr(rng.standard_normal((n, n)))
    s = np.zeros(n)
    s[:rank] = np.logspace(0, -1, rank)
    return (u * s) @ v.T


def _valid_or_breakdown(a, method, precision, cond):
    """The method's promise: a valid factorization within its documented bound, or
    BreakdownError naming it. Returns True if it factored."""
    try:
        q, r = mpqr.qr(a, method=method, precision=precision)
    except mpqr.BreakdownError as exc:
        assert exc.method == method and str(exc).startswith(f"{method} broke down")
        return False
    n = a.shape[1]
    u = u_of(precision)
    be, orth = fro_errors(a, q, r)
    assert np.isfinite(q).all() and np.isfinite(r).all()
    assert np.array_equal(np.triu(r), r)
    assert be <= C * n * u, (be, C * n * u)
    # the orthogonality each method documents: O(u), cond(x) u (Gram-Schmidt), cond^2 u
    # (CholQR); the last two are what their breakdown checks keep below 1
    limit = {"gram-schmidt-recursive": C * n * u * cond, "cholqr": C * n * u * cond**2,
             "svqr": 32 * n * u}.get(method, C * n * u)
    assert orth <= min(limit, 1.0) if method in ("gram-schmidt-recursive", "cholqr") \
        else orth <= limit, (orth, limit)
    return True


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("method", METHODS)
def test_zero_matrix(method, precision):
    a = np.zeros((70, 40))
    if not _valid_or_breakdown(a + 0.0, method, precision, 1.0) and method.startswith("house"):
        pytest.fail("Householder must factor the zero matrix")
    q, r = mpqr.qr(a, precision=precision)  # auto never raises
    np.testing.assert_array_equal(r, 0.0)
    _, orth = fro_errors(np.eye(70, 40), q, np.eye(40))
    assert orth <= C * 40 * u_of(precision)


@pytest.mark.parametrize("cond", [1e8, 1e12, 1e16, 1e20, np.inf],
                         ids=["1e8", "1e12", "1e16", "1e20", "rank25"])
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("method", [*METHODS, "auto"])
def test_ill_conditioned_valid_or_breakdown(method, precision, cond):
    rng = np.random.default_rng(5)
    a = _rank_deficient(rng, 70, 40, 25) if np.isinf(cond) else geometric(rng, 70, 40, cond)
    factored = _valid_or_breakdown(a, method, precision, cond)
    if method == "auto" or method.startswith("householder"):
        assert factored, "auto and Householder never break down on finite input"
