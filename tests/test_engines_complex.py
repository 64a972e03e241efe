"""Complex products on the emulated engines (real products of the parts).

Error measure: max_ij |C - AB|_ij / (|A||B|)_ij per part (|.| the complex modulus),
against a correctly rounded reference (each part one exact real dot product of
length 2k). Bounds are the real engines' bounds (tests/test_engines.py,
tests/test_ozaki.py) for a real product of length 2k, with
``|Ar||Br| + |Ai||Bi| <= sqrt(2) |A||B|``, and the emulated precisions' target of at
most 2x the native complex GEMM's error.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

import mpqr
from tests._support import exact_matmul_complex, part_errors_vs_abs, to_numpy

U16 = 2.0**-11
U32 = 2.0**-24
U64 = 2.0**-53
SQRT2 = math.sqrt(2.0)

pytestmark = pytest.mark.skip_xp_backend(
    "array_api_strict", reason="array-api-strict has no float16 or int8 GEMM engines"
)

#: precision -> (engine forced, input dtype, native precision of that dtype)
CASES = {
    "fp16": ("tc-fp16", np.complex64, "fp32"),
    "fp32-emulated": ("tc-sgemm", np.complex64, "fp32"),
    "fp64-emulated": ("ozaki-int8", np.complex128, "fp64"),
}


def _operands(rng, m, k, n, dtype):
    a = (rng.standard_normal((m, k)) + 1j * rng.standard_normal((m, k))).astype(dtype)
    b = (rng.standard_normal((k, n)) + 1j * rng.standard_normal((k, n))).astype(dtype)
    return a, b


def _emu(xp, a, b, precision, **opts):
    engine = CASES[precision][0]
    return to_numpy(mpqr.matmul(xp.asarray(a), xp.asarray(b), precision=precision,
                                options={"engine": engine, **opts}))


def _real_bound(precision: str, k: int) -> float:
    """The real engine's elementwise bound for a length-k product (tests/test_engines.py)."""
    if precision == "fp16":
        return 2 * U16 + U16**2 + k * U32
    return k * (U32 if precision == "fp32-emulated" else U64)


def _bound(precision: str, k: int) -> float:
    """4M: the real engine's bound at length 2k, times sqrt(2)."""
    return SQRT2 * _real_bound(precision, 2 * k)


#: (precision, scheme): every engine's schemes (defaults: tc-fp16 4M, tc-sgemm and
#: ozaki-int8 3M, mpqr.engines.complex_product.DEFAULT_SCHEME)
SCHEMES = [("fp16", "4m"), ("fp32-emulated", "4m"), ("fp32-emulated", "3m"),
           ("fp64-emulated", "2m"), ("fp64-emulated", "4m"), ("fp64-emulated", "3m")]
DEFAULTS = {"fp16": "4m", "fp32-emulated": "3m", "fp64-emulated": "3m"}


@pytest.mark.parametrize(("precision", "scheme"), SCHEMES)
@pytest.mark.parametrize(("m", "k", "n"), [(9, 1, 7), (16, 64, 12), (12, 1024, 20), (40, 300, 3)])
def test_scheme_within_engine_bound_and_2x_native(xp, precision, scheme, m, k, n):
    rng = np.random.default_rng(k + m)
    dtype, native = CASES[precision][1], CASES[precision][2]
    a, b = _operands(rng, m, k, n, dtype)
    exact = exact_matmul_complex(a, b)
    default = scheme == DEFAULTS[precision]
    with mpqr.explain() as trace:
        c = _emu(xp, a, b, precision, **({} if default else {"complex_product": scheme}))
    assert c.dtype == dtype
    assert f"complex={scheme}" in str(trace) and scheme.upper() in str(trace)
    if scheme == "2m":  # two int8 GEMMs per Gaussian modulus
        n_mod = int(re.search(r"(\d+) Gaussian moduli", str(trace)).group(1))
        assert f"{2 * n_mod} int8 GEMMs" in str(trace)
    nat = to_numpy(mpqr.matmul(xp.asarray(a), xp.asarray(b), precision=native))
    e_re, e_im = part_errors_vs_abs(c, exact, a, b)
    n_re, n_im = part_errors_vs_abs(nat, exact, a, b)
    # 3M's imaginary part: three products of up to (|Ar|+|Ai|)(|Br|+|Bi|) <= 2|A||B| each
    assert max(e_re, e_im) <= (3 * SQRT2 if scheme == "3m" else 1) * _bound(precision, k), \
        (e_re, e_im)
    if precision == "fp16":  # and it really is half precision (the test can fail)
        assert max(e_re, e_im) > 8 * U32
    elif k > 1:  # no worse than 2x the native complex GEMM (floor: one rounding); at k = 1
        # native rounds once, while tc-sgemm's split keeps ~23 of fp32's 24 bits
        u = U32 if dtype == np.complex64 else U64
        assert e_re <= 2 * max(n_re, u) and e_im <= 2 * max(n_im, u), (e_re, e_im, n_re, n_im)


@pytest.mark.parametrize("precision", sorted(CASES))
def test_3m_option_runs_three_products_within_its_bound(xp, precision):
    rng = np.random.default_rng(11)
    dtype = CASES[precision][1]
    k = 256
    a, b = _operands(rng, 10, k, 14, dtype)
    exact = exact_matmul_complex(a, b)
    with mpqr.explain() as trace:
        c3 = _emu(xp, a, b, precision, complex_product="3m")
    assert "3M/Karatsuba" in str(trace)
    e_re, e_im = part_errors_vs_abs(c3, exact, a, b)
    # Ci = (T3 - T1) - T2: three products, T3's operands up to sqrt(2)|.| each, plus the
    # rounding of Ar + Ai and Br + Bi in the input precision
    u_in = U32 if dtype == np.complex64 else U64
    real_bound = _real_bound(precision, k)
    assert e_re <= SQRT2 * real_bound
    assert e_im <= 4 * real_bound + 4 * u_in, (e_im, real_bound)


@pytest.mark.parametrize(("precision", "scheme"), [*SCHEMES, ("fp16", "3m"),
                                                   ("fp32-emulated", "3m"),
                                                   ("fp64-emulated", "3m")])
def test_nan_inf_zero_lines(xp, precision, scheme):
    rng = np.random.default_rng(5)
    dtype = CASES[precision][1]
    a, b = _operands(rng, 8, 32, 7, dtype)
    a[1, 3] = complex(np.inf, 0.0)
    a[4, 5] = complex(0.0, np.nan)
    b[2, 2] = complex(0.0, -np.inf)
    a[6] = 0.0
    b[:, 5] = 0.0
    c = _emu(xp, a, b, precision, complex_product=scheme)
    with np.errstate(invalid="ignore", over="ignore"):
        nat = a.astype(np.complex128) @ b.astype(np.complex128)
    # non-finite exactly where native complex GEMM is non-finite, in both parts
    for part in (np.real, np.imag):
        np.testing.assert_array_equal(np.isfinite(part(c)), np.isfinite(part(nat)))
    # zero rows/columns give exact zeros (outside the non-finite lines)
    assert not c[6, :2].any() and not c[6, 3:].any()
    assert not c[[0, 2, 3, 5, 7], 5].any()
    rows, cols = [0, 2, 3, 5, 7], [0, 1, 3, 4, 6]
    ok_a, ok_b = a[rows], b[:, cols]
    sub = c[np.ix_(rows, cols)]
    e = max(part_errors_vs_abs(sub, exact_matmul_complex(ok_a, ok_b), ok_a, ok_b))
    assert e <= 2 * _bound(precision, 32)


@pytest.mark.parametrize("precision", sorted(CASES))
def test_operands_near_the_overflow_threshold(xp, precision):
    rng = np.random.default_rng(8)
    dtype = CASES[precision][1]
    big = np.finfo(dtype).max / 4
    a, b = _operands(rng, 6, 16, 5, dtype)
    a = (a / np.max(np.abs(a)) * big).astype(dtype)  # |a| up to max/4: Ar + Ai may not overflow
    b = (b / np.max(np.abs(b)) * 2.0**-20).astype(dtype)  # AB stays finite
    # the reference with the operands exactly rescaled (same products; the exact
    # product's splitting would overflow at these magnitudes)
    exact = exact_matmul_complex(a.astype(np.complex128) * 2.0**-600,
                                 b.astype(np.complex128) * 2.0**600)
    c = _emu(xp, a, b, precision)
    assert np.all(np.isfinite(c))
    assert max(part_errors_vs_abs(c, exact, a, b)) <= _bound(precision, 16)


def test_stacked_complex_operands(xp):
    rng = np.random.default_rng(4)
    a = (rng.standard_normal((3, 8, 40)) + 1j * rng.standard_normal((3, 8, 40)))
    b = (rng.standard_normal((3, 40, 6)) + 1j * rng.standard_normal((3, 40, 6)))
    for precision in ("fp32-emulated", "fp64-emulated"):  # stacks: the policy's seam
        c = to_numpy(mpqr.policy.gemm(xp.asarray(a), xp.asarray(b), precision=precision,
                                      options={"engine": CASES[precision][0]}))
        assert c.shape == (3, 8, 6) and c.dtype == np.complex128
        for i in range(3):
            exact = exact_matmul_complex(a[i], b[i])
            assert max(part_errors_vs_abs(c[i], exact, a[i], b[i])) <= _bound(precision, 40)


def test_orientation_duplicates_the_smaller_operand(xp):
    # m > n: B is written twice; m <= n: A is. Both orientations meet the bound.
    rng = np.random.default_rng(12)
    for m, n in [(30, 4), (4, 30)]:
        a, b = _operands(rng, m, 128, n, np.complex128)
        c = _emu(xp, a, b, "fp64-emulated")
        assert max(part_errors_vs_abs(c, exact_matmul_complex(a, b), a, b)) <= \
            _bound("fp64-emulated", 128)


def test_mixed_complex_and_real_operands_promote(xp):
    rng = np.random.default_rng(13)
    a, _ = _operands(rng, 5, 24, 3, np.complex64)
    b = rng.standard_normal((24, 3))
    c = to_numpy(mpqr.matmul(xp.asarray(a), xp.asarray(b), precision="fp64-emulated",
                             options={"engine": "ozaki-int8"}))
    assert c.dtype == np.complex128
    assert max(part_errors_vs_abs(c, exact_matmul_complex(a, b), a, b)) <= \
        _bound("fp64-emulated", 24)


def test_policy_predicts_the_real_products_and_auto_stays_native():
    from mpqr.backends import get_backend

    from mpqr.policy import decide
    from mpqr.policy.options import GemmOptions

    be = get_backend(np)
    d = decide(be, np.complex128, 64, 64, 64, 1, "fp64-emulated", "argument",
               GemmOptions(engine="ozaki-int8"))
    assert d.engine == "ozaki-int8" and d.params["complex"] == "3m"
    d4 = decide(be, np.complex128, 64, 64, 64, 1, "fp64-emulated", "argument",
                GemmOptions(engine="ozaki-int8", complex_product="4m"))
    real = decide(be, np.float64, 128, 64, 128, 1, "fp64-emulated", "argument",
                  GemmOptions(engine="ozaki-int8"))
    # 4M: the real product of (2m, n, 2k) and the passes around it; 3M: three real products
    assert d4.predicted_s["ozaki-int8"] > real.predicted_s["ozaki-int8"]
    big3, big4 = (decide(be, np.complex128, 1024, 1024, 1024, 1, "fp64-emulated", "argument",
                         GemmOptions(engine="ozaki-int8", complex_product=s)).predicted_s[
                             "ozaki-int8"] for s in ("3m", "4m"))
    assert big3 < big4  # three real products against one of four times the work
    auto = decide(be, np.complex128, 64, 64, 64, 1, "auto", "argument", GemmOptions())
    assert auto.engine == "native-complex128"
    with pytest.raises(ValueError, match="GemmOptions.complex_product must be '4m', '3m', "
                                         "'2m' or None, got '5m'"):
        GemmOptions(complex_product="5m")
    with pytest.raises(ValueError, match="complex_product='2m' needs modular arithmetic "
                                         r"\(ozaki-int8\); the tc-sgemm engine takes"):
        decide(be, np.complex64, 4, 4, 4, 1, "fp32-emulated", "argument",
               GemmOptions(complex_product="2m"))
    with pytest.raises(ValueError, match="options.engine='native-fp64' is a real engine"):
        decide(be, np.complex128, 4, 4, 4, 1, "fp64", "argument",
               GemmOptions(engine="native-fp64"))


@pytest.mark.skip_xp_backend("numpy", reason="the NumPy backend is the reference itself")
@pytest.mark.skip_xp_backend("numpy_readonly", reason="the NumPy backend is the reference itself")
def test_gpu_ozaki_bit_identical_to_numpy_emulation(xp):
    rng = np.random.default_rng(21)
    cases = [(rng.standard_normal((33, 300)), rng.standard_normal((300, 17)), None),
             (*_operands(rng, 20, 200, 35, np.complex128), "2m"),
             (*_operands(rng, 20, 200, 35, np.complex128), "4m"),
             (*_operands(rng, 40, 100, 5, np.complex128), "3m")]
    for a, b, scheme in cases:
        got = _emu(xp, a, b, "fp64-emulated", complex_product=scheme)
        ref = to_numpy(mpqr.matmul(a, b, precision="fp64-emulated",
                                   options={"engine": "ozaki-int8", "complex_product": scheme}))
        np.testing.assert_array_equal(got, ref)


def test_inputs_are_not_modified(xp):
    rng = np.random.default_rng(22)
    a, b = _operands(rng, 6, 20, 5, np.complex128)
    a0, b0 = a.copy(), b.copy()
    da, db = xp.asarray(a), xp.asarray(b)
    for precision in sorted(CASES):
        for scheme in ("4m", "3m", "2m" if precision == "fp64-emulated" else "4m"):
            mpqr.matmul(da, db, precision=precision,
                        options={"engine": CASES[precision][0], "complex_product": scheme})
    np.testing.assert_array_equal(to_numpy(da), a0)
    np.testing.assert_array_equal(to_numpy(db), b0)


def test_cost_model_counts_the_complex_flops(monkeypatch):
    # ZGEMM runs 8 mnk real flops at the DGEMM rate; 4M runs one real product of
    # (2m, n, 2k): with int8-rich rates the emulation wins at 8192^3, not at 512^3
    from mpqr.backends import get_backend
    from mpqr.backends._base import EngineRates

    from mpqr.policy import decide
    from mpqr.policy.options import GemmOptions

    be = get_backend(np)
    hopper = EngineRates({"native-fp64": 55e12, "native-fp32": 48e12, "tc-fp16": 600e12,
                          "int8": 1400e12, "bandwidth": 3.5e12, "launch_s": 8e-6})
    monkeypatch.setattr(be, "rates", lambda: hopper)
    big = decide(be, np.complex128, 8192, 8192, 8192, 1, "fp64-emulated", "t", GemmOptions())
    small = decide(be, np.complex128, 512, 512, 512, 1, "fp64-emulated", "t", GemmOptions())
    assert big.engine == "ozaki-int8" and "3M" in big.reason
    assert small.engine == "native-complex128"
    zgemm = big.predicted_s["native-complex128"]
    dgemm = decide(be, np.float64, 8192, 8192, 8192, 1, "fp64", "t",
                   GemmOptions()).predicted_s["native-fp64"]
    assert 3.5 < zgemm / dgemm < 4.5


def test_2m_blocking_changes_nothing(xp):
    rng = np.random.default_rng(23)
    a, b = _operands(rng, 50, 96, 40, np.complex128)
    whole = _emu(xp, a, b, "fp64-emulated")
    with mpqr.explain() as trace:
        blocked = _emu(xp, a, b, "fp64-emulated", workspace_limit=200_000)
    assert re.search(r"blocks (\d+)x(\d+)", str(trace)).groups() != ("50", "40")
    np.testing.assert_array_equal(blocked, whole)


def test_strongly_k_graded_runs_native(xp):
    rng = np.random.default_rng(24)
    d = 2.0 ** rng.integers(-40, 41, size=64)
    a, b = _operands(rng, 6, 64, 5, np.complex128)
    a, b = a * d, b / d[:, None]
    with mpqr.explain() as trace:
        c = _emu(xp, a, b, "fp64-emulated")
    # the default 3M runs real products: each falls back to DGEMM (2M: one ZGEMM)
    assert "native DGEMM instead" in str(trace) or "native ZGEMM instead" in str(trace)
    exact = exact_matmul_complex(a, b)
    assert max(part_errors_vs_abs(c, exact, a, b)) <= 3 * SQRT2 * _bound("fp64-emulated", 64)
