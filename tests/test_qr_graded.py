"""CholQR on column-graded input: the tests read the column-scaled factor.

At the precisions of ``SCALE_FREE`` every product rounds exactly alike on ``x`` and on
``x D`` for a power-of-two diagonal ``D``, so CholQR's breakdown and inverse-by-GEMM tests
may read ``cond(x D^-1)``: a matrix whose columns merely have different scales (features
in different units; cond(x) far beyond ``u^-1/2``) takes CholQR2 instead of the
preconditioned routes. Tolerances are the tall-skinny tests' (``8 sqrt(n) u`` for
orthogonality and the column-wise backward error, ``u`` of the dtype).
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
from mpqr.backends import ArrayAPIBackend

import mpqr
from mpqr.qr.cholqr_steps import portable_chol_steps

cholqr_mod = sys.modules["mpqr.qr.cholqr"]
U = {"float32": 2.0**-24, "float64": 2.0**-53}


def _graded(rng, m, n, ratio, dtype):
    """Gaussian columns scaled by ``ratio**j``: cond ~ ratio^-(n-1), scaled cond ~ 1."""
    return (rng.standard_normal((m, n)) * ratio ** np.arange(n)).astype(dtype)


def _column_backward(a, q, r):
    a64 = a.astype(np.float64)
    res = a64 - q.astype(np.float64) @ r.astype(np.float64)
    return float(np.max(np.linalg.norm(res, axis=0) / np.linalg.norm(a64, axis=0)))


def _orth(q):
    q = q.astype(np.float64)
    return float(np.linalg.norm(q.T @ q - np.eye(q.shape[1])))


def _events(trace, kind):
    return [e for e in trace.events if e.kind == kind]


@pytest.fixture
def cholqr_at_every_size(monkeypatch):
    monkeypatch.setattr(ArrayAPIBackend, "library_qr_tall_max", 0)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_graded_columns_take_cholqr2(cholqr_at_every_size, dtype):
    n = 24
    # cond ~ 2^23 = 8e6 (float32), 4^23 = 7e13 (float64); the smallest column in range
    a = _graded(np.random.default_rng(0), 2048, n, 0.5 if dtype == "float32" else 0.25, dtype)
    assert np.linalg.cond(a.astype(np.float64)) > 1e3 / np.sqrt(U[dtype])
    with mpqr.explain() as trace:
        q, r = mpqr.qr(a)
    assert not _events(trace, "fallback")
    assert q.dtype == a.dtype and r.dtype == a.dtype
    tol = 8 * np.sqrt(n) * U[dtype]
    assert _orth(q) <= tol
    assert _column_backward(a, q, r) <= tol


def test_power_of_two_grading_changes_no_bit(cholqr_at_every_size):
    """Two gradings by powers of two: the same Q bit for bit, R scaled exactly."""
    rng = np.random.default_rng(1)
    n = 16
    base = rng.standard_normal((1024, n))
    d1 = 2.0 ** -rng.integers(20, 40, n)
    d2 = 2.0 ** rng.integers(-45, -25, n)
    q1, r1 = mpqr.qr(base * d1, method="cholqr2")
    q2, r2 = mpqr.qr(base * d2, method="cholqr2")
    assert np.array_equal(q1, q2)
    assert np.array_equal(r1 / d1, r2 / d2)


def test_unscaled_precisions_keep_the_old_test(monkeypatch):
    """With the scaled tests off (as at fp16, where the products' range matters), the same
    graded matrix is refused by CholQR2."""
    a = _graded(np.random.default_rng(2), 1024, 16, 0.1, "float64")  # cond ~ 1e15
    mpqr.qr(a, method="cholqr2")
    monkeypatch.setattr(cholqr_mod, "SCALE_FREE", frozenset())
    with pytest.raises(mpqr.BreakdownError, match="cholqr2 broke down"):
        mpqr.qr(a, method="cholqr2")
    assert "fp16" not in cholqr_mod.SCALE_FREE and "fp32-emulated" not in cholqr_mod.SCALE_FREE


def test_rank_deficient_graded_is_still_refused():
    """Scaling does not hide a dependent column: the scaled ratio stays large."""
    a = _graded(np.random.default_rng(3), 1024, 12, 0.5, "float64")
    a[:, 7] = a[:, 2] * 2.0**-5  # parallel to another column, scaled
    with pytest.raises(mpqr.BreakdownError):
        mpqr.qr(a, method="cholqr2")


def test_device_steps_accept_graded_columns(monkeypatch, cholqr_at_every_size):
    """The device route (``chol_steps``, here the portable reference) takes the
    column-scaled ratio too, without redoing its steps on the host route."""

    def steps(self, g):
        return None if g.ndim != 2 else portable_chol_steps(self, g)

    monkeypatch.setattr(ArrayAPIBackend, "chol_steps", steps)
    n = 16
    a = _graded(np.random.default_rng(4), 2048, n, 0.2, "float64")  # cond ~ 5^15 = 3e10
    with mpqr.explain() as trace:
        q, r = mpqr.qr(a)
    small = [e.message for e in _events(trace, "small-steps")]
    assert small and not any("host route" in m for m in small)
    assert not _events(trace, "fallback")
    tol = 8 * np.sqrt(n) * U["float64"]
    assert _orth(q) <= tol and _column_backward(a, q, r) <= tol
