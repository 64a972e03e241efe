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
def test_auto_continues_cholqr2_with_the_sketch(monkeypatch, cond):
    """``auto``: CholQR2 within its reach; past it (its first Cholesky fails) the sketch
    route, said in the trace, at working accuracy. With the device's one-launch steps
    (their portable version), a failed first factorization queues the sketch before the
    host redoes the steps, and the route uses it; CholQR2 within reach queues none."""
    from mpqr.backends import ArrayAPIBackend

    from mpqr.qr.cholqr_steps import portable_chol_steps

    a = geometric(np.random.default_rng(40), M, 64, cond)
    res = {}
    for steps in (False, True) if cond > 1e8 else (True,):
        if steps:
            monkeypatch.setattr(ArrayAPIBackend, "chol_steps", portable_chol_steps)
        with mpqr.explain() as trace:
            q, r = mpqr.qr(a)
        fb = [e for e in trace.events if e.kind == "fallback"]
        if cond == 1e4:
            assert not fb
        else:
            assert [(e.data["method"], e.data["fallback"]) for e in fb] == [("cholqr2", NAME)]
            assert "CountSketch" in fb[0].message
            assert any("one CholQR pass" in m for m in _routes(trace))
        assert any(e.kind == "sketch" for e in trace.events) == (steps and cond > 1e8)
        _check(a, q, r, U64)
        res[steps] = r
    if cond > 1e8:  # the prefetched sketch is the one the route would have formed
        np.testing.assert_array_equal(res[True], res[False])


def test_auto_hands_over_after_cholqr2s_first_factor(monkeypatch):
    """``auto`` at cond 1e8: CholQR2's first Cholesky succeeds but its estimated cond says
    the second pass would not be certified, so it stops there (no ``Q1``, no second Gram
    pass) and the sketch route takes over; at 1e6 CholQR2 runs to the end; an explicit
    ``method="cholqr2"`` never stops early."""
    from mpqr.backends import ArrayAPIBackend

    from mpqr.qr import cholqr

    monkeypatch.setattr(ArrayAPIBackend, "library_qr_tall_max", 0)
    seen = []
    solve = cholqr._apply_inverse
    monkeypatch.setattr(cholqr, "_apply_inverse", lambda *a, **k: seen.append(a[4]) or solve(
        *a, **k))
    for cond, early in ((1e6, False), (1e8, True)):
        seen.clear()
        a = geometric(np.random.default_rng(8), 2048, 32, cond)
        with mpqr.explain() as trace:
            q, r = mpqr.qr(a)
        fb = [e for e in trace.events if e.kind == "fallback"]
        if early:
            assert [(e.data["method"], e.data["fallback"]) for e in fb] == [("cholqr2", NAME)]
            assert "stopped after its first pass" in fb[0].data["reason"]
            assert fb[0].data["cond_estimate"] >= (cholqr.EARLY_HAND_OVER / U64) ** 0.5
            assert "cholqr2" not in seen  # Q1 = A R1^-1 was never formed
            # the sketch queued while the host estimated is the one the route used: the
            # same R as the sketch route called alone
            assert any(e.kind == "sketch" for e in trace.events)
            np.testing.assert_array_equal(r, mpqr.qr(a, method=NAME)[1])
        else:
            assert not fb
        _check(a, q, r, U64)
    with mpqr.explain() as trace:
        try:
            mpqr.qr(a, method="cholqr2")
        except mpqr.BreakdownError as exc:
            assert "stopped after" not in str(exc)


def _leaf_backend(monkeypatch, blk=32):
    """The NumPy backend with the GPU's blocked substitution (``blk``-column leaves)."""
    from mpqr.backends.numpy.backend import NumpyBackend

    monkeypatch.setattr(NumpyBackend, "right_solve_block", blk)
    return NumpyBackend(np)


@pytest.mark.parametrize(("dtype", "n"), [("float64", 96), ("float64", 32),
                                          ("complex128", 96)])
def test_right_solve_upper_gram(monkeypatch, dtype, n):
    """``W = A R^-1`` by substitution in blocked halves (leaves of 32 columns, the Gram
    matrix from leaf Grams and cross products: ``BLOCKED_GRAM_FUSED``) has substitution's
    row-wise backward error whatever cond(R), and ``G`` is ``W^H W`` to working accuracy,
    exactly Hermitian."""
    from mpqr.qr import cholqr
    from mpqr.qr.cholqr import right_solve_upper_gram

    monkeypatch.setattr(cholqr, "BLOCKED_GRAM_FUSED", True)
    be = _leaf_backend(monkeypatch)
    rng = np.random.default_rng(n)
    a = geometric(rng, 1000, n, 1e12).astype(dtype)
    if dtype.startswith("complex"):
        a = a + 1j * geometric(rng, 1000, n, 1e12)
    r = np.linalg.qr(rng.standard_normal((n, n)) * np.logspace(0, -12, n))[1]
    r = r * np.sign(np.diagonal(r))[:, None] + 0
    a0, r0 = a.copy(), r.copy()
    w, g = right_solve_upper_gram(be, a, r.astype(dtype), "auto", "auto", "test")
    np.testing.assert_array_equal(a, a0)
    np.testing.assert_array_equal(r, r0)
    bound = 4 * n * U64 * (np.abs(w) @ np.abs(r))
    assert np.all(np.abs(w @ r - a) <= bound + 1e-300)
    np.testing.assert_array_equal(g, g.conj().T)
    assert np.all(np.abs(g - w.conj().T @ w) <= 4 * 1000 * U64 * (np.abs(w.T) @ np.abs(w)))
    if dtype == "float64" and n <= 32:
        w2, g2 = right_solve_upper_gram(be, a, r, "auto", "auto", "test", store=False)
        assert w2 is None
        np.testing.assert_allclose(g2, g, rtol=1e-14, atol=0)


@pytest.mark.parametrize(("dtype", "n"), [("float64", 80), ("complex128", 72),
                                          ("float32", 72)])
def test_right_solve_left_looking(monkeypatch, dtype, n):
    """The left-looking blocked substitution (leaves of 32 columns, each update one
    product subtracted in the leaf's solve) has substitution's row-wise backward error
    whatever cond(R) (1e12: the sketch's R0 of an ill-conditioned x), as the halving
    order has; the leaves past the first get their update as ``sub``; inputs untouched."""
    from mpqr.qr import cholqr

    be = _leaf_backend(monkeypatch)
    subs = []
    solve = type(be).right_solve_upper
    monkeypatch.setattr(type(be), "right_solve_upper", lambda self, a, r, out=None, sub=None:
                        subs.append(sub is not None) or solve(self, a, r, out=out, sub=sub))
    rng = np.random.default_rng(n)
    u = U32 if dtype == "float32" else U64
    a = geometric(rng, 300, n, 1e12).astype(dtype)
    if dtype.startswith("complex"):
        a = a + 1j * geometric(rng, 300, n, 1e12)
    r = np.linalg.qr(rng.standard_normal((n, n)) * np.logspace(0, -12, n))[1]
    r = (r * np.sign(np.diagonal(r))[:, None]).astype(dtype)
    a0, r0 = a.copy(), r.copy()
    ws = {}
    for left in (True, False):
        monkeypatch.setattr(cholqr, "LEFT_LOOKING", left)
        subs.clear()
        ws[left] = w = cholqr.right_solve_upper(be, a, r)
        bound = 4 * n * u * (np.abs(w) @ np.abs(r))
        assert np.all(np.abs(w @ r - a) <= bound)
        if left:
            assert subs == [False] + [True] * (-(-n // 32) - 1)
    np.testing.assert_array_equal(a, a0)
    np.testing.assert_array_equal(r, r0)
    assert ws[True].dtype == a.dtype


def test_blocked_leaves_route_q_by_gemm(monkeypatch):
    """The sketch route with blocked leaves (the GPU's layout) at 256 columns: Q from
    ``W inv(R1)`` by one GEMM, accepted by the estimate, to working accuracy; mode "r"
    gives the same R without forming Q."""
    _leaf_backend(monkeypatch, 64)
    n = 256
    a = _wide(np.random.default_rng(5), 8 * n, n, 1e12)
    with mpqr.explain() as trace:
        q, r = mpqr.qr(a, method=NAME)
    orth = np.linalg.norm(np.eye(n) - q.T @ q) / n
    assert orth <= 8 * np.sqrt(n) * U64 / n
    assert backward_error(a, q, r) <= 8 * np.sqrt(n) * U64
    assert any("Q = W @ inv(R1) by GEMM" in e.message for e in trace.events
               if e.kind == "apply-inverse")
    r2 = mpqr.qr(a, mode="r", method=NAME)
    np.testing.assert_allclose(r2, r, rtol=0, atol=64 * U64 * np.abs(r).max())


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
    for k in (96, 48):  # 48: few enough buckets for the private copies in shared memory
        ref = NumpyBackend(np).sketch_rows(a, k, 11)
        tol = (1e-4 if dtype == "float32" else 1e-12) * np.abs(ref).max()
        for ag in (cp.asarray(a), cp.asarray(np.asfortranarray(a))):
            got = cp.asnumpy(get_backend(cp).sketch_rows(ag, k, 11))
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
    # 64 columns: one fused pass; Q by GEMM from the stored W, or (Q_BY_TWO_SOLVES) by
    # the two-solve kernel from A with W unstored
    a = cp.asarray(geometric(np.random.default_rng(10), 2**15, 64, 1e15))
    for two in (False, True):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(sketch, "Q_BY_TWO_SOLVES", two)
            q, r, trace = _qr(a)
        orth = float(cp.linalg.norm(cp.eye(64) - q.T @ q)) / 64
        bwd = float(cp.linalg.norm(a - q @ r) / cp.linalg.norm(a))
        assert orth <= 8 * np.sqrt(64) * U64 / 64 and bwd <= 8 * np.sqrt(64) * U64
        assert any(e.kind == "fused-solve" for e in trace.events) == two
    with pytest.raises(mpqr.BreakdownError, match="rank-deficient"):
        _qr(cp.asarray(geometric(np.random.default_rng(9), 2**14, 64, 1e18)))


@pytest.mark.parametrize("device_steps", [False, True])
def test_device_and_host_namespaces(monkeypatch, device_steps):
    """A device backend whose small steps go to the host (as on CuPy; emulated with
    array-api-strict as the device and NumPy as the host): the rank test's estimate of
    R0 and the n x n steps on the host, W, Q and R = R1 R0 on the device, the same
    factorization as the NumPy backend's. With ``device_steps`` the backend factors
    ``W``'s Gram matrix on the device (``chol_steps``) and only ``R1`` moves."""
    import array_api_strict as xs
    from mpqr.backends import get_backend
    from mpqr.backends.numpy.backend import NumpyBackend

    strict = get_backend(xs)
    host = get_backend(np)
    moved = []

    def small(x, limit=None):
        if x.size > (16 * 16 if limit is None else limit):
            return strict, x
        moved.append(x.shape)
        return host, np.asarray(x)

    monkeypatch.setattr(strict, "small", small)
    if device_steps:
        from mpqr.qr.cholqr_steps import portable_chol_steps

        factored = []

        def steps(g):
            factored.append(g.shape)
            return portable_chol_steps(strict, g)

        monkeypatch.setattr(strict, "chol_steps", steps)
    monkeypatch.setattr(strict, "from_small", lambda x, like: xs.asarray(x))
    monkeypatch.setattr(strict, "precondition_small_max", 64 * 64)
    monkeypatch.setattr(strict, "sketches", True, raising=False)
    monkeypatch.setattr(strict, "sketch_rows", lambda a, k, seed: xs.asarray(
        NumpyBackend.sketch_rows(host, np.asarray(a), k, seed)), raising=False)
    a = geometric(np.random.default_rng(48), 2048, 48, 1e13)
    _, r0, _ = _qr(a)
    with mpqr.explain() as trace:
        q1, r1 = mpqr.qr(xs.asarray(a), mode="reduced", method=NAME)
    assert type(q1) is type(xs.asarray(a)) and type(r1) is type(q1)
    assert (48, 48) in moved and any("one CholQR pass" in m for m in _routes(trace))
    if device_steps:  # W's Gram matrix factored on the device; only R1 moved for it
        assert (48, 48) in factored
    np.testing.assert_allclose(np.asarray(r1), r0, rtol=0, atol=64 * U64 * np.abs(r0).max())
    _check(a, np.asarray(q1), np.asarray(r1), U64)


@pytest.mark.parametrize("two_solves", [True, False])
def test_one_fused_pass_q_by_two_solves(monkeypatch, two_solves):
    """Where W and its Gram matrix come from one fused pass (the GPU's up to 64 columns;
    here the portable kernels), with ``Q_BY_TWO_SOLVES`` W is not stored and Q = (x
    R0^-1) R1^-1 is solved from x in one pass, to working accuracy at cond 1e15; else
    (the default) W is written and Q = W inv(R1) by GEMM. The same R either way."""
    monkeypatch.setattr(sketch, "Q_BY_TWO_SOLVES", two_solves)
    a = geometric(np.random.default_rng(64), M, 64, 1e15)
    q, r, trace = _qr(a)
    _check(a, q, r, U64)
    assert any(e.kind == "fused-solve" for e in trace.events) == two_solves
    assert any("by GEMM" in e.message for e in trace.events
               if e.kind == "apply-inverse") == (not two_solves)
    monkeypatch.setattr(sketch, "Q_BY_TWO_SOLVES", not two_solves)
    np.testing.assert_array_equal(_qr(a)[1], r)


@pytest.mark.parametrize("fail", [False, True])
def test_w_factored_by_the_device_steps(monkeypatch, fail):
    """Where the backend makes the n x n steps without a host sync (``chol_steps``),
    ``R1`` and ``X`` come from them; where a check there fails, the host's steps decide.
    The same factorization either way, to the route's accuracy."""
    from mpqr.backends import ArrayAPIBackend

    from mpqr.qr.cholqr_steps import portable_chol_steps

    a = geometric(np.random.default_rng(12), M, 64, 1e12)
    _, r_host, _ = _qr(a)
    seen = []

    def steps(self, g):
        r, x, st = portable_chol_steps(self, g)
        seen.append(g.shape)
        if fail:
            st = np.array(st)
            st[3] = 1.0
        return r, x, st

    monkeypatch.setattr(ArrayAPIBackend, "chol_steps", steps)
    q, r, trace = _qr(a)
    assert seen == [(64, 64)] and any("one CholQR pass" in m for m in _routes(trace))
    _check(a, q, r, U64)
    np.testing.assert_allclose(r, r_host, rtol=0, atol=64 * U64 * np.abs(r_host).max())
