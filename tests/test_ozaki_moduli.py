"""The Ozaki engine's number of moduli, chosen per product from the data.

Error measure: max_ij |C - AB|_ij / (|A||B|)_ij against a correctly rounded
reference; the target is DGEMM's (at most 2x its measured error, and its bound
``k u`` on the largest outputs for k-graded operands).
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from mpqr.backends import get_backend

import mpqr
import mpqr.engines.ozaki as oz
from tests._support import exact_matmul, rel_error_vs_abs, to_numpy

U64 = 2.0**-53
FORCE = {"engine": "ozaki-int8"}

pytestmark = pytest.mark.skip_xp_backend(
    "array_api_strict", reason="array-api-strict backend has no int8 GEMM engine"
)


def _run(xp, a, b, **opts):
    with mpqr.explain() as trace:
        c = mpqr.matmul(xp.asarray(a), xp.asarray(b), precision="fp64-emulated",
                        options={**FORCE, **opts})
    lines = [e for e in str(trace).splitlines() if e.startswith("ozaki:")]
    return to_numpy(c), " ".join(lines)


def _terms(line: str) -> int:
    return int(re.search(r"(\d+) moduli", line).group(1))


def _graded(rng, m, k, n, span):
    """``A0 D @ D^-1 B0``, D = 2^e with e uniform in [-span, span]: every product term is
    O(1), but A's columns and B's rows are graded by ``2 span`` bits against each other."""
    d = 2.0 ** rng.integers(-span, span + 1, size=k)
    d[0], d[1] = 2.0**-span, 2.0**span  # the full range occurs
    return rng.standard_normal((m, k)) * d, rng.standard_normal((k, n)) / d[:, None]


def test_k_grading_measures_the_grading_and_ignores_line_scalings():
    be = get_backend(np)
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((8, 64)), rng.standard_normal((64, 6))

    def grade(x, y):
        return int(to_numpy(oz.k_grading(be, x, y)))

    assert grade(a, b) <= 1
    rows = 2.0 ** rng.integers(-60, 61, size=8)[:, None]
    cols = 2.0 ** rng.integers(-60, 61, size=6)[None, :]
    assert grade(a * rows, b * cols) <= 1  # line scalings cost nothing
    for span in (2, 10, 30):
        ga, gb = _graded(rng, 8, 64, 6, span)
        assert abs(grade(ga, gb) - 2 * span) <= 2
    assert grade(np.zeros((3, 4)), b[:4]) == 0


def test_rows_and_columns_scaled_by_2_pm60_hold_accuracy_and_keep_the_count(xp):
    rng = np.random.default_rng(1)
    m, k, n = 20, 300, 18
    a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    _, plain = _run(xp, a, b)
    sa = a * 2.0 ** rng.integers(-60, 61, size=m)[:, None]
    sb = b * 2.0 ** rng.integers(-60, 61, size=n)[None, :]
    c, line = _run(xp, sa, sb)
    exact = exact_matmul(sa, sb)
    assert rel_error_vs_abs(c, exact, sa, sb) <= 2 * max(
        rel_error_vs_abs(sa @ sb, exact, sa, sb), U64)
    assert _terms(line) == _terms(plain)  # per-line scaling absorbs it: no extra moduli
    assert "k-grading" not in line


def test_rows_of_b_scaled_by_2_pm60_raise_the_bits_and_hold_accuracy(xp):
    # rows of B lie along k: a line of B spans 2^120, so its typical entry lies far
    # below its maximum (the spread): more bits per operand
    rng = np.random.default_rng(2)
    m, k, n = 20, 300, 20
    a = rng.standard_normal((m, k)) * 2.0 ** rng.integers(-60, 61, size=m)[:, None]
    b = rng.standard_normal((k, n)) * 2.0 ** rng.integers(-60, 61, size=k)[:, None]
    c, line = _run(xp, a, b)
    _, plain = _run(xp, rng.standard_normal((m, k)), rng.standard_normal((k, n)))
    exact = exact_matmul(a, b)
    assert rel_error_vs_abs(c, exact, a, b) <= 2 * max(rel_error_vs_abs(a @ b, exact, a, b),
                                                      U64)
    need = [int(x) for x in re.search(r"need \((\d+), (\d+)\)", line).groups()]
    need_plain = [int(x) for x in re.search(r"need \((\d+), (\d+)\)", plain).groups()]
    alpha = [int(x) for x in re.search(r"alpha=\((\d+), (\d+)\)", line).groups()]
    # B keeps more bits (its lines are dominated by few entries, so the same moduli
    # leave more room: the count is what those bits need, here no more)
    assert need[1] > need_plain[1] and alpha[1] >= need[1], (line, plain)
    assert "spread (" in line


def test_moderate_k_grading_raises_the_count_and_meets_dgemm(xp):
    rng = np.random.default_rng(3)
    m, k, n = 16, 256, 16
    a, b = _graded(rng, m, k, n, 2)
    c, line = _run(xp, a, b)
    _, plain = _run(xp, rng.standard_normal((m, k)), rng.standard_normal((k, n)))
    assert "raised to" in line and "by the k-grading" in line
    assert _terms(line) > _terms(plain)
    exact = exact_matmul(a, b)
    err = rel_error_vs_abs(c, exact, a, b)
    assert err <= 2 * max(rel_error_vs_abs(a @ b, exact, a, b), U64)
    # and the normwise bound: k u max(|A||B|)
    assert np.max(np.abs(c - exact)) <= k * U64 * np.max(np.abs(a) @ np.abs(b))


def test_strong_k_grading_runs_dgemm_and_says_why(xp):
    rng = np.random.default_rng(4)
    a, b = _graded(rng, 12, 128, 10, 60)  # 2^+-60 along k: no moduli count can hold it
    c, line = _run(xp, a, b)
    assert "native DGEMM instead" in line and "graded by" in line
    np.testing.assert_array_equal(c, to_numpy(get_backend(xp).gemm(xp.asarray(a),
                                                                     xp.asarray(b))))
    exact = exact_matmul(a, b)
    assert rel_error_vs_abs(c, exact, a, b) <= 128 * U64


def test_fixed_terms_are_kept_on_graded_data(xp):
    rng = np.random.default_rng(5)
    a, b = _graded(rng, 8, 64, 8, 30)
    _, line = _run(xp, a, b, ozaki_terms=18)
    assert "18 moduli (fixed)" in line and "DGEMM" not in line


def test_graded_need_threshold():
    assert oz.graded_need(0) == oz.graded_need(oz.GRADING_SLACK - 1) == 0
    assert oz.graded_need(oz.GRADING_SLACK) == 54 + oz.GRADING_SLACK
    assert oz.graded_need(10) == 64
