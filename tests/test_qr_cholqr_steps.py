"""The ``n x n`` steps of a CholQR pass on the device (``backend.chol_steps``).

The CuPy backend makes ``R = chol(G)``, ``X = R^-1`` and the checks' numbers in one
launch (``backends/cupy/kernels/chol_steps.cu``); :func:`portable_chol_steps` is the Array
API reference. The ``device_steps`` fixture gives every other backend the reference, so
CI runs the device route's logic (certified GEMM first, checks read once, the host
route's own errors where a check fails) on NumPy.

Tolerances: a Cholesky factor has ``|R^T R - G| <= gamma_{n+1} |R^T| |R|`` and the
row-wise inverse ``|X R - I| <= gamma_n |X| |R|`` (Higham, Thms 10.3 and 8.5); the
tests allow ``2 n u`` for ``gamma`` (``u`` of the dtype; float32 is factored in double
arithmetic and rounded, which is inside that). CholQR2's results use the tall-skinny
tests' ``8 sqrt(n) u``.
"""

from __future__ import annotations

import re
import sys

import numpy as np
import pytest
from mpqr.backends import ArrayAPIBackend, get_backend

import mpqr
from mpqr.qr.cholqr_steps import StepNumbers, passes, portable_chol_steps
from tests._qr_support import backward_error, geometric, inflate_second_gram, orthogonality
from tests._support import to_numpy

cholqr_mod = sys.modules["mpqr.qr.cholqr"]
U = {"float32": 2.0**-24, "float64": 2.0**-53}


def _events(trace, kind):
    return [e for e in trace.events if e.kind == kind]


def _portable_or_none(self, g):
    xp = self.xp
    if g.ndim != 2 or xp.isdtype(g.dtype, "complex floating"):
        return None
    return portable_chol_steps(self, g)


@pytest.fixture
def device_steps(monkeypatch):
    """Every backend without a ``chol_steps`` of its own takes the reference."""
    monkeypatch.setattr(ArrayAPIBackend, "chol_steps", _portable_or_none)
    monkeypatch.setattr(ArrayAPIBackend, "library_qr_tall_max", 0)  # CholQR2 at every size


def _gram(rng, n, cond, dtype):
    a = geometric(rng, max(4 * n, 16), n, cond)
    return (a.T @ a).astype(dtype)


def _check_factors(g, r, x, dtype):
    """The Cholesky and row-wise inverse residual bounds of the module docstring."""
    n = g.shape[0]
    u = U[dtype]
    g, r, x = (np.asarray(v, dtype=np.float64) for v in (g, r, x))
    assert np.array_equal(r, np.triu(r)) and np.array_equal(x, np.triu(x))
    gam = 2 * (n + 1) * u
    assert np.all(np.abs(r.T @ r - g) <= gam * (np.abs(r.T) @ np.abs(r)) + 4 * u * np.abs(g))
    assert np.all(np.abs(x @ r - np.eye(n)) <= gam * (np.abs(x) @ np.abs(r)))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("n", [1, 7, 33, 64])
def test_portable_steps_factor_and_invert_within_their_bounds(dtype, n):
    g = _gram(np.random.default_rng(n), n, 1e2, dtype)
    be = get_backend(sys.modules["mpqr._array_api"].array_namespace(g))
    r, x, st = portable_chol_steps(be, g)
    _check_factors(g, r, x, dtype)
    s = StepNumbers.from_host(st)
    rd = np.abs(np.diag(r))
    assert not s.nonfinite and not s.chol_failed
    assert s.gram_diag_min == np.min(np.diag(g))
    # sums in the dtype's arithmetic: n terms, each within u
    rel = 2 * (n + 1) * U[dtype]
    g64 = g.astype(np.float64)
    assert s.dist_to_identity == pytest.approx(np.linalg.norm(g64 - np.eye(n)), rel=rel)
    assert (s.r_diag_max, s.r_diag_min) == (rd.max(), rd.min())
    assert s.norm1_r == pytest.approx(np.linalg.norm(r.astype(np.float64), 1), rel=rel)
    assert s.norm1_x == pytest.approx(np.linalg.norm(x.astype(np.float64), 1), rel=rel)


def test_passes_reads_each_check():
    good = StepNumbers(False, 1.0, 0.1, False, 2.0, 1.0, 3.0, 2.0)
    kw = {"u": 2.0**-53, "n": 8, "gram_min": 1e-300, "certified": True}
    assert passes(good, **kw)
    for bad in (dict(nonfinite=True), dict(gram_diag_min=0.0), dict(dist_to_identity=0.6),
                dict(chol_failed=True), dict(r_diag_min=0.0), dict(r_diag_max=np.inf),
                dict(r_diag_max=1e9, r_diag_min=1e-0), dict(gram_diag_min=np.nan)):
        s = StepNumbers(**{**good.__dict__, **bad})
        assert not passes(s, **kw), bad
    # the certificate is read only by a certified pass
    assert passes(StepNumbers(**{**good.__dict__, "dist_to_identity": 9.0}),
                  **{**kw, "certified": False})
    assert good.cond1 == 6.0


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("n", [1, 7, 32, 64, 256, 512])  # the kernel; past 64 library calls
@pytest.mark.parametrize("cond", [1.0, 1e3])
def test_cupy_kernel_matches_the_reference(dtype, n, cond):
    cp = pytest.importorskip("cupy")
    from tests.conftest import GPU

    if not GPU:
        pytest.skip("no CUDA GPU visible")
    g = _gram(np.random.default_rng(n + int(cond)), n, cond, dtype)
    be = get_backend(sys.modules["mpqr._array_api"].array_namespace(cp.zeros(1)))
    r, x, st = be.chol_steps(cp.asarray(g))
    assert r.dtype == x.dtype == cp.dtype(dtype) and st.dtype == cp.float64
    _check_factors(g, r.get(), x.get(), dtype)
    s = StepNumbers.from_host(st.get())
    ref = StepNumbers.from_host(portable_chol_steps(get_backend(
        sys.modules["mpqr._array_api"].array_namespace(g)), g)[2])
    assert (s.nonfinite, s.chol_failed, s.gram_diag_min) == (False, False, ref.gram_diag_min)
    tol = 4 * n * U[dtype] * cond
    for name in ("dist_to_identity", "r_diag_max", "r_diag_min", "norm1_r", "norm1_x"):
        assert getattr(s, name) == pytest.approx(getattr(ref, name), rel=tol, abs=tol), name


@pytest.mark.parametrize("case", ["nan", "indefinite", "zero"])
@pytest.mark.parametrize("n", [16, 200])
def test_cupy_kernel_flags_what_the_checks_refuse(case, n):
    cp = pytest.importorskip("cupy")
    from tests.conftest import GPU

    if not GPU:
        pytest.skip("no CUDA GPU visible")
    g = _gram(np.random.default_rng(5), n, 10.0, "float64")
    if case == "nan":
        g[3, 5] = g[5, 3] = np.nan
    elif case == "indefinite":
        g[7, 7] = -1.0
    else:
        g[:, 2] = g[2, :] = 0.0
    be = get_backend(sys.modules["mpqr._array_api"].array_namespace(cp.zeros(1)))
    s = StepNumbers.from_host(be.chol_steps(cp.asarray(g))[2].get())
    assert s.chol_failed
    assert s.nonfinite == (case == "nan")
    assert not passes(s, u=2.0**-53, n=n, gram_min=1e-300, certified=False)


@pytest.mark.parametrize("method", ["cholqr2", "cholqr", "shifted-cholqr3"])
@pytest.mark.parametrize("n", [20, 64])
def test_device_route_gives_cholqr_accuracy_and_says_so(xp, device_steps, method, n):
    a = geometric(np.random.default_rng(n), 40 * n, n, 1e2 if method != "cholqr" else 10.0)
    x = xp.asarray(a)
    with mpqr.explain() as trace:
        q, r = mpqr.qr(x, method=method, precision="fp64")
    np.testing.assert_array_equal(to_numpy(x), a)  # input untouched
    passes_run = {"cholqr": 1, "cholqr2": 2, "shifted-cholqr3": 3}[method]
    steps = _events(trace, "small-steps")
    # shifted-cholqr3's shifted first pass keeps the host route (its shift is made there)
    expected = passes_run - (method == "shifted-cholqr3")
    assert len(steps) == expected and all("without a host sync" in e.message for e in steps)
    q, r = to_numpy(q), to_numpy(r)
    u = U["float64"]
    bound = 8 * np.sqrt(n) * u
    if method == "cholqr":  # one pass: orthogonality ~ cond^2 u
        bound *= 100.0
    assert orthogonality(q) <= bound
    assert backward_error(a, q, r) <= 8 * np.sqrt(n) * u
    if n == 64 and method == "cholqr2":  # the certified pass's GEMM is in the trace
        inv = [e for e in _events(trace, "apply-inverse") if "certified pass" in e.message]
        assert len(inv) == 1 and inv[0].data["cond_1"] < 8.0


@pytest.mark.parametrize("cond", [1e9, 1e12])
def test_device_route_raises_the_host_routes_errors(device_steps, cond):
    a = geometric(np.random.default_rng(3), 400, 12, cond)
    with pytest.raises(mpqr.BreakdownError) as dev, mpqr.explain() as trace:
        mpqr.qr(a, method="cholqr2", precision="fp64")
    assert any("failed; the pass redoes them on the host route" in e.message
               for e in _events(trace, "small-steps"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ArrayAPIBackend, "chol_steps", lambda self, g: None)
        with pytest.raises(mpqr.BreakdownError) as host:
            mpqr.qr(a, method="cholqr2", precision="fp64")
    assert str(dev.value) == str(host.value)
    assert str(dev.value).startswith("cholqr2 broke down")


def test_device_route_refuses_nan_with_the_host_message(xp, device_steps):
    a = geometric(np.random.default_rng(8), 500, 10, 10.0)
    a[17, 4] = np.nan
    with pytest.raises(mpqr.BreakdownError,
                       match=r"^cholqr2 broke down: the Gram matrix x\^H x is not finite"):
        mpqr.qr(xp.asarray(a), method="cholqr2", precision="fp64")


@pytest.mark.parametrize("n", [10, 40])
def test_device_route_certificate_failure_names_the_distance(monkeypatch, device_steps, n):
    a = geometric(np.random.default_rng(4), 300, n, 10.0)
    inflate_second_gram(monkeypatch, a)
    dist = 2 * np.sqrt(n)
    with pytest.raises(mpqr.BreakdownError,
                       match=r"^cholqr2 broke down: after the first pass \|\|Q1\^H Q1 - I\|\|_F "
                             rf"= {re.escape(f'{dist:.2e}')} > 0\.5"):
        mpqr.qr(a, method="cholqr2", precision="fp64")


@pytest.mark.parametrize("n", [20, 64])
def test_device_and_host_routes_agree(xp, n, device_steps, monkeypatch):
    """The same R to working accuracy (float64), whichever route the steps took."""
    from mpqr.backends.cupy.backend import CupyBackend

    a = geometric(np.random.default_rng(11), 30 * n, n, 1e3)
    with mpqr.explain() as trace:
        _, r_dev = mpqr.qr(xp.asarray(a), method="cholqr2", precision="fp64")
    assert len(_events(trace, "small-steps")) == 2
    monkeypatch.setattr(ArrayAPIBackend, "chol_steps", lambda self, g: None)
    monkeypatch.setattr(CupyBackend, "chol_steps", lambda self, g: None)
    with mpqr.explain() as trace:
        _, r_host = mpqr.qr(xp.asarray(a), method="cholqr2", precision="fp64")
    assert not _events(trace, "small-steps")
    r_host, r_dev = to_numpy(r_host), to_numpy(r_dev)
    # both are R factors of A: they agree to O(u cond(A)) relative, column by column
    err = np.linalg.norm(r_dev - r_host, axis=0) / np.linalg.norm(r_host, axis=0)
    assert np.max(err) <= 8 * n * U["float64"] * 1e3


@pytest.mark.parametrize("graded", [True, False])
def test_early_hand_over_gate_reads_the_column_scaled_ratio(monkeypatch, device_steps, graded):
    """``auto``'s CholQR2 estimates its first factor's (column-scaled) condition number only
    where a free lower bound of it is large: graded columns (Gaussian times 0.6^j, cond
    ~1e7, column-scaled ~1) gate on the scaled diagonal ratio and skip the estimate;
    a truly ill-conditioned matrix (cond 1e8 with unit columns) still runs it and hands
    over to the sketch route."""
    import importlib

    precond = importlib.import_module("mpqr.qr.cholqr_precond")
    calls = []
    est = precond.estimate_cond
    monkeypatch.setattr(precond, "estimate_cond", lambda *a, **k: calls.append(1) or est(*a, **k))
    rng = np.random.default_rng(5)
    m, n = 2048, 32
    if graded:
        a = rng.standard_normal((m, n)) * 0.6 ** np.arange(n)
    else:
        a = geometric(rng, m, n, 1e8)
    with mpqr.explain() as trace:
        q, r = mpqr.qr(a)
    fb = _events(trace, "fallback")
    if graded:
        assert not calls and not fb
    else:
        assert calls and fb and "stopped after its first pass" in fb[0].data["reason"]
    assert orthogonality(q) <= 8 * np.sqrt(n) * U["float64"]
    assert backward_error(a, q, r) <= 8 * np.sqrt(n) * U["float64"]
