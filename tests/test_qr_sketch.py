"""Sketch-preconditioned CholQR (``method="sketch-cholqr"``) on the NumPy backend: every
condition number below ``u^-1`` factored to working accuracy, numerically rank-deficient
input refused (never silently wrong), column scaling, complex and float32.

Tolerances as in ``test_qr_ill_conditioned.py``: ``8 sqrt(n) u`` (backward error) and
``8 sqrt(n) u / n`` (``||I - Q^H Q||_F / n``), measured in extended precision against the
input (the 1024-column case in float64: its measurement error is ``~ sqrt(n) u / n``,
far below the bound).
"""

from __future__ import annotations

import numpy as np
import pytest
from mpqr.backends.sketch_hash import row_hash

import mpqr
from mpqr.qr import sketch
from tests._qr_support import backward_error, geometric, orthogonality

U64, U32 = 2.0**-53, 2.0**-24
M = 4096
NAME = "sketch-cholqr"


@pytest.fixture
def _cholqr2_at_every_size(monkeypatch):
    """Small tall inputs would take the library's QR under ``auto``."""
    from mpqr.backends import ArrayAPIBackend

    monkeypatch.setattr(ArrayAPIBackend, "library_qr_tall_max", 0)


def _qr(a):
    with mpqr.explain() as trace:
        q, r = mpqr.qr(a, mode="reduced", method=NAME)
    return q, r, trace


def _routes(trace):
    return [e.message for e in trace.events if e.kind == "route"]


def _check(a, q, r, u):
    n = a.shape[1]
    assert orthogonality(q) <= 8 * np.sqrt(n) * u / n
    assert backward_error(a, q, r) <= 8 * np.sqrt(n) * u
    d = np.diagonal(r)
    assert np.all(d.real > 0) and np.all(d.imag == 0)


@pytest.mark.parametrize("cond", [1.0, 1e4, 1e8, 1e12, 1e15])
def test_every_condition_below_u_inverse_one_pass(cond):
    rng = np.random.default_rng(int(np.log10(cond)))
    a = geometric(rng, M, 64, cond)
    a0 = a.copy()
    q, r, trace = _qr(a)
    np.testing.assert_array_equal(a, a0)  # input untouched
    _check(a, q, r, U64)
    assert any("one CholQR pass" in m for m in _routes(trace))


def _wide(rng, m, n, cond):
    """Gaussian columns scaled geometrically, then mixed by one reflector (so that column
    scaling does not undo the conditioning): cond within ~3x of ``cond``, no large QR."""
    v = rng.standard_normal((n, 1))
    v /= np.linalg.norm(v)
    return (rng.standard_normal((m, n)) * cond ** (-np.arange(n) / (n - 1))) @ (
        np.eye(n) - 2 * v @ v.T)


@pytest.mark.parametrize(("n", "cond"), [(256, 1e15), (1024, 1e12)])
def test_wide(n, cond):
    a = _wide(np.random.default_rng(n), 8 * n, n, cond)
    q, r, trace = _qr(a)
    orth = np.linalg.norm(np.eye(n) - q.T @ q) / n
    bwd = np.linalg.norm(a - q @ r) / np.linalg.norm(a)
    assert orth <= 8 * np.sqrt(n) * U64 / n and bwd <= 8 * np.sqrt(n) * U64
    assert any(NAME in m for m in _routes(trace))


@pytest.mark.usefixtures("_cholqr2_at_every_size")
@pytest.mark.parametrize("case", ["cond1e18", "repeated-column"])
def test_rank_deficient_refused_and_auto_falls_back(case):
    rng = np.random.default_rng(18)
    a = geometric(rng, M, 64, 1e18)
    if case == "repeated-column":
        a = geometric(rng, M, 64, 10.0)
        a[:, 40] = a[:, 7]
    with pytest.raises(mpqr.BreakdownError, match="rank-deficient") as exc:
        _qr(a)
    assert str(exc.value).startswith(f"{NAME} broke down") or case == "repeated-column"
    assert exc.value.cond_estimate * U64 >= 0.5
    with mpqr.explain() as trace:
        q, r = mpqr.qr(a, mode="reduced")  # auto: a Householder route, orthonormal Q
    fb = [e for e in trace.events if e.kind == "fallback"]
    if case == "cond1e18":  # CholQR2's first Cholesky fails: the sketch, then Householder
        assert [e.data["fallback"] for e in fb] == [NAME, "householder-tiled"]
        assert "numerically rank-deficient" in fb[1].data["reason"]
    assert orthogonality(q) <= 8 * np.sqrt(64) * U64 / 64
    assert backward_error(a, q, r) <= 8 * np.sqrt(64) * U64


@pytest.mark.usefixtures("_cholqr2_at_every_size")
@pytest.mark.parametrize("cond", [1e4, 1e12])
def test_auto_continues_cholqr2_with_the_sketch(cond):
    """``auto``: CholQR2 within its reach; past it (its first Cholesky fails) the sketch
    route, said in the trace, at working accuracy."""
    a = geometric(np.random.default_rng(40), M, 64, cond)
    with mpqr.explain() as trace:
        q, r = mpqr.qr(a)
    fb = [e for e in trace.events if e.kind == "fallback"]
    if cond == 1e4:
        assert not fb
    else:
        assert [(e.data["method"], e.data["fallback"]) for e in fb] == [("cholqr2", NAME)]
        assert "CountSketch" in fb[0].message
        assert any("one CholQR pass" in m for m in _routes(trace))
    _check(a, q, r, U64)


def test_column_scalings_1e150():
    rng = np.random.default_rng(150)
    d = 10.0 ** rng.choice([-150, 150], size=64)
    a = geometric(rng, M, 64, 1e8) * d
    q, r, _ = _qr(a)
    assert orthogonality(q) <= 8 * np.sqrt(64) * U64 / 64
    # backward error column by column (the columns' norms differ by 1e300)
    res = (a - q @ r) / np.linalg.norm(a, axis=0)
    assert np.linalg.norm(res) <= 8 * np.sqrt(64) * U64 * np.sqrt(64)


def test_complex():
    rng = np.random.default_rng(7)
    a = geometric(rng, M, 48, 1e12) + 1j * geometric(rng, M, 48, 1e12)
    a = a @ np.diag(np.exp(1j * rng.uniform(0, 6, 48)))
    q, r, _ = _qr(a)
    assert q.dtype == np.complex128
    _check(a, q, r, U64)


def test_float32_at_its_own_limit():
    a = geometric(np.random.default_rng(32), M, 64, 1e6).astype(np.float32)
    q, r, _ = _qr(a)
    assert q.dtype == np.float32
    _check(a, q, r, U32)
    with pytest.raises(mpqr.BreakdownError, match="rank-deficient"):
        _qr(geometric(np.random.default_rng(33), M, 64, 1e9).astype(np.float32))


def test_nan_never_finite():
    a = geometric(np.random.default_rng(1), M, 32, 10.0)
    a[100, 3] = np.nan
    with pytest.raises(mpqr.BreakdownError):
        _qr(a)


def test_few_rows_take_the_preconditioned_method():
    a = geometric(np.random.default_rng(2), 300, 64, 1e10)
    q, r, trace = _qr(a)
    _check(a, q, r, U64)
    assert any("no sketch here" in m for m in _routes(trace))


def test_sketch_rows_is_the_count_sketch():
    """The backend's scatter-add equals S @ a with S built densely from the same hash."""
    rng = np.random.default_rng(3)
    a = rng.standard_normal((500, 7)) + 1j * rng.standard_normal((500, 7))
    k = 28
    b, s = row_hash(np.arange(500, dtype=np.uint64), k, sketch.SEED)
    dense = np.zeros((k, 500))
    dense[b, np.arange(500)] = s
    from mpqr.backends.numpy.backend import NumpyBackend

    got = NumpyBackend(np).sketch_rows(a, k, sketch.SEED)
    np.testing.assert_allclose(got, dense @ a, rtol=0, atol=1e-13)
    assert set(np.unique(s)) == {-1, 1} and b.min() >= 0 and b.max() < k


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float64", "float32", "complex128"])
def test_cupy_sketch_kernel_and_route(dtype):
    """The CUDA kernel's sketch equals the NumPy backend's (same hash), any layout; the
    route on CuPy factors cond 1e15 (float64) to working accuracy and refuses 1e18."""
    from tests.conftest import GPU

    if not GPU:
        pytest.skip("no CUDA GPU visible")
    import cupy as cp
    from mpqr.backends import get_backend
    from mpqr.backends.numpy.backend import NumpyBackend

    rng = np.random.default_rng(4)
    a = rng.standard_normal((5000, 24)).astype(dtype)
    if dtype.startswith("complex"):
        a = a + 1j * rng.standard_normal((5000, 24))
    ref = NumpyBackend(np).sketch_rows(a, 96, 11)
    tol = (1e-4 if dtype == "float32" else 1e-12) * np.abs(ref).max()
    for ag in (cp.asarray(a), cp.asarray(np.asfortranarray(a))):
        got = cp.asnumpy(get_backend(cp).sketch_rows(ag, 96, 11))
        assert np.abs(got - ref).max() <= tol
    if dtype != "float64":
        return
    a = cp.asarray(_wide(np.random.default_rng(8), 2**15, 128, 1e15))
    q, r, trace = _qr(a)
    n = 128
    orth = float(cp.linalg.norm(cp.eye(n) - q.T @ q)) / n
    bwd = float(cp.linalg.norm(a - q @ r) / cp.linalg.norm(a))
    assert orth <= 8 * np.sqrt(n) * U64 / n and bwd <= 8 * np.sqrt(n) * U64
    assert any(NAME in m for m in _routes(trace))
    with pytest.raises(mpqr.BreakdownError, match="rank-deficient"):
        _qr(cp.asarray(geometric(np.random.default_rng(9), 2**14, 64, 1e18)))
