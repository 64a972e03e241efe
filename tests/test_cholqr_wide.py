"""CholQR at wide ``n`` (the GPU's layout, emulated on NumPy at small scale): the
right-looking blocked substitution, the recursive triangular product ``A X``, the
column-sum bound that refuses an inverse before it is made, and float32 CholQR2 at
``fp32-emulated`` with its products over ``x`` on the split-FP16 engine.

References: substitution's row-wise bound ``|W R - A| <= c n u |W||R|``; the correctly
rounded product (``exact_matmul``) for ``A X`` within ``2 n u |A||X|``; orthogonality and
backward error in extended precision against the targets (``1e-15`` / ``2e-15`` at
float64, the same multiples of ``u``, ``9 u`` / ``18 u``, at float32).
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

import mpqr
from tests._qr_support import backward_error, geometric, orthogonality
from tests._support import exact_matmul

cholqr = sys.modules["mpqr.qr.cholqr"]
U64, U32 = 2.0**-53, 2.0**-24


def _numpy_backend(monkeypatch, blk=32):
    """The NumPy backend with the GPU's blocked substitution (``blk``-column leaves)."""
    from mpqr.backends.numpy.backend import NumpyBackend

    monkeypatch.setattr(NumpyBackend, "right_solve_block", blk)
    return NumpyBackend(np)


def _ill_r(rng, n, dtype):
    r = np.linalg.qr(rng.standard_normal((n, n)) * np.logspace(0, -12, n))[1]
    return (r * np.sign(np.diagonal(r))[:, None]).astype(dtype)


@pytest.mark.parametrize("dtype", ["float64", "float32", "complex128"])
def test_right_looking_solve_is_rowwise_backward_stable(monkeypatch, dtype):
    """Past ``RIGHT_LOOKING_MIN_N`` columns the blocked substitution runs by halves with
    its updates accumulated into one temporary: every row within substitution's bound
    whatever cond(R) (1e12), one product per split, every leaf but the first solving
    ``A - T``; inputs untouched."""
    be = _numpy_backend(monkeypatch)
    monkeypatch.setattr(cholqr, "RIGHT_LOOKING_MIN_N", 64)
    subs = []
    solve = type(be).right_solve_upper
    monkeypatch.setattr(type(be), "right_solve_upper", lambda self, a, r, out=None, sub=None:
                        subs.append(sub is not None) or solve(self, a, r, out=out, sub=sub))
    rng = np.random.default_rng(3)
    n = 150
    u = U32 if dtype == "float32" else U64
    a = geometric(rng, 400, n, 1e12).astype(dtype)
    if dtype.startswith("complex"):
        a = a + 1j * geometric(rng, 400, n, 1e12)
    r = _ill_r(rng, n, dtype)
    a0, r0 = a.copy(), r.copy()
    with mpqr.explain() as trace:
        w = cholqr.right_solve_upper(be, a, r)
    leaves = len(subs)
    assert leaves == 5 and subs == [False] + [True] * (leaves - 1)  # 150 = 64+32+32+22
    assert [g.label for g in trace.gemms] == ["trsm-update"] * (leaves - 1)
    assert np.all(np.abs(w @ r - a) <= 4 * n * u * (np.abs(w) @ np.abs(r)))
    np.testing.assert_array_equal(a, a0)
    np.testing.assert_array_equal(r, r0)
    assert w.dtype == a.dtype


def test_recursive_triangular_product(monkeypatch):
    """From ``TRIANGULAR_RECURSE_MIN_N`` columns ``A X`` splits its halves again: every
    entry within the dot product's bound of the correctly rounded product, and fewer
    multiply-adds than the one split (which keeps its two products below the cut)."""
    from mpqr.backends import get_backend

    from mpqr._array_api import array_namespace

    be = get_backend(array_namespace(np.zeros(1)))
    rng = np.random.default_rng(4)
    m, n = 8, 600
    a = rng.standard_normal((m, n))
    x = np.triu(rng.standard_normal((n, n))) + n * np.eye(n)
    ref = exact_matmul(a, x)
    work = {}
    for lim in (None, 512):
        monkeypatch.setattr(cholqr, "TRIANGULAR_RECURSE_MIN_N", lim)
        with mpqr.explain() as trace:
            q = cholqr._times_upper(be, a, x, "t", "fp64")
        assert np.all(np.abs(q - ref) <= 2 * n * U64 * (np.abs(a) @ np.abs(x)))
        work[lim] = sum(g.shape[0] * g.shape[1] * g.shape[2] for g in trace.gemms)
    h = 304  # the one split: A X[:, h:] and A_1 X_11
    assert work[None] == m * (n * (n - h) + h * h)
    assert work[512] < 0.7 * m * n * n


def test_cond1_lower_bounds_cond1():
    """``||R||_1 / min |r_jj|`` lies between the diagonal ratio and ``cond_1(R)``, column
    scaled or not."""
    from mpqr.backends import get_backend

    from mpqr._array_api import array_namespace

    be = get_backend(array_namespace(np.zeros(1)))
    rng = np.random.default_rng(5)
    for scale in (1.0, 1e6):
        r = np.linalg.qr(rng.standard_normal((300, 40)) * np.logspace(0, 3, 40) * scale)[1]
        r = r * np.sign(np.diagonal(r))[:, None]
        x = np.linalg.inv(r)
        for scaled in (False, True):
            lo = cholqr._cond1_lower(be, r, scaled)
            assert cholqr._diag_ratio(be, r, scaled) <= lo <= cholqr._cond1(be, r, x, scaled)


def test_wide_cholqr2_refuses_the_inverse_without_making_it(monkeypatch):
    """Where the first factor's column sums already exceed the inverse-by-GEMM limit, no
    inverse is made for it; the result meets the targets."""
    _numpy_backend(monkeypatch, 32)
    monkeypatch.setattr(cholqr, "RIGHT_LOOKING_MIN_N", 64)
    made = []
    inverse = cholqr.inverse_and_cond
    monkeypatch.setattr(cholqr, "inverse_and_cond",
                        lambda *args, **kw: made.append(1) or inverse(*args, **kw))
    rng = np.random.default_rng(6)
    m, n = 2048, 128  # columns of mean 10: R1's first row ~10 sqrt(m), cond_2(x) ~ 10 sqrt(n)
    a = rng.standard_normal((m, n)) + 10
    with mpqr.explain() as trace:
        q, r = mpqr.qr(a, method="cholqr2")
    msgs = [e.message for e in trace.events if e.kind == "apply-inverse"]
    assert "from its column sums and diagonal" in msgs[0] and "by GEMM" in msgs[1]
    assert made == [1]  # the certified pass's inverse only
    assert orthogonality(q) <= 1e-15 and backward_error(a, q, r) <= 2e-15


def _fp32_setup(monkeypatch):
    """The NumPy backend with a GPU's ratio of tensor-core to native float32 rate, memory
    bandwidth and launch latency (50x, 10x and 1/5 the host's), so that the policy predicts tc-sgemm
    faster for tall Gram products; small tall inputs past the library's QR cut, and
    16-column leaves with the right-looking substitution from 32 columns."""
    from mpqr.backends.numpy.backend import NumpyBackend

    rates = NumpyBackend.rates

    def fast(self):
        r = dict(rates(self))
        r.update({"tc-fp16": 50 * r["native-fp32"], "bandwidth": 10 * r["bandwidth"],
                  "launch_s": r["launch_s"] / 5})
        return type(rates(self))(r)

    monkeypatch.setattr(NumpyBackend, "rates", fast)
    # whole products, as on a device with room (the host's default plan caps the split
    # copies, and the route then keeps its products native)
    monkeypatch.setenv("MPQR_MEMORY_PLAN", "fast")
    monkeypatch.setattr(NumpyBackend, "library_qr_tall_max", 2**16)
    monkeypatch.setattr(cholqr, "RIGHT_LOOKING_MIN_N", 32)
    _numpy_backend(monkeypatch, 16)


def test_fp32_emulated_cholqr2_products_on_tc_sgemm(monkeypatch):
    """float32 at ``fp32-emulated``, tall-skinny: CholQR2 in float32 with its Gram products,
    its blocked substitution's updates and the certified pass's ``Q1 X2`` on tc-sgemm
    (the policy predicts it faster; explain() says so), ``R2 R1`` native; the float32
    targets met."""
    _fp32_setup(monkeypatch)
    rng = np.random.default_rng(7)
    a = geometric(rng, 2048, 96, 1e2).astype(np.float32)
    a0 = a.copy()
    with mpqr.explain() as trace:
        q, r = mpqr.qr(a, precision="fp32-emulated")
    np.testing.assert_array_equal(a, a0)
    assert q.dtype == np.float32 and r.dtype == np.float32
    assert any(e.kind == "precision" and "tc-sgemm" in e.message for e in trace.events)
    assert not any(e.kind == "fallback" for e in trace.events)
    eng = {}
    for g in trace.gemms:
        eng.setdefault(g.label, set()).add(g.engine)
    assert eng["cholqr2-gram"] == {"tc-sgemm"}
    # the first pass by substitution (its updates on tc-sgemm), the certified pass's
    # Q1 X2 on tc-sgemm (an uncertified A X1 by GEMM would keep the working precision:
    # its X1 is graded inversely to A's columns)
    msgs = [e.message for e in trace.events if e.kind == "apply-inverse"]
    assert "by substitution" in msgs[0] and "by GEMM" in msgs[1]
    assert eng["trsm-update"] == eng["cholqr2-apply-inverse"] == {"tc-sgemm"}
    assert eng["cholqr-RR"] == {"native-fp32"}
    assert orthogonality(q) <= 9 * U32 and backward_error(a, q, r) <= 18 * U32


def test_fp16_cholqr2_products_on_tc_sgemm(monkeypatch):
    """float32 at ``fp16``, tall-skinny: the same float32 CholQR2 with its products on
    tc-sgemm (FP32-accurate, more than fp16 asks) where predicted faster; explain() says
    for which request."""
    _fp32_setup(monkeypatch)
    a = geometric(np.random.default_rng(10), 2048, 96, 1e2).astype(np.float32)
    with mpqr.explain() as trace:
        q, r = mpqr.qr(a, precision="fp16")
    ev = [e.message for e in trace.events if e.kind == "precision"]
    assert ev and "precision='fp32-emulated', for precision='fp16'" in ev[0]
    assert {g.engine for g in trace.gemms if g.label == "cholqr2-gram"} == {"tc-sgemm"}
    assert orthogonality(q) <= 9 * U32 and backward_error(a, q, r) <= 18 * U32


@pytest.mark.parametrize("plan", ["fast", "tiled"])
def test_fp32_emulated_tall_products_stay_native(monkeypatch, plan):
    """With the NumPy backend's own rates (the emulated engines are never faster there),
    or under a memory plan that caps the engines' scratch, float32 CholQR2's products
    stay native: no precision event."""
    from mpqr.backends.numpy.backend import NumpyBackend

    if plan == "tiled":
        _fp32_setup(monkeypatch)
    monkeypatch.setenv("MPQR_MEMORY_PLAN", plan)
    monkeypatch.setattr(NumpyBackend, "library_qr_tall_max", 2**16)
    rng = np.random.default_rng(8)
    a = rng.standard_normal((2048, 96)).astype(np.float32)
    with mpqr.explain() as trace:
        mpqr.qr(a, precision="fp32-emulated")
    assert trace.gemms and trace.gemms[0].label == "cholqr2-gram"
    assert not any(e.kind == "precision" for e in trace.events)
    assert {g.engine for g in trace.gemms} == {"native-fp32"}


@pytest.mark.parametrize("cond", [1e6])
def test_fp32_emulated_beyond_cholqr2_reach_is_not_silently_wrong(monkeypatch, cond):
    """Past float32 CholQR2's reach (~u^-1/2): the route hands over (its Grams still on
    tc-sgemm) and the result meets the float32 targets."""
    _fp32_setup(monkeypatch)
    rng = np.random.default_rng(9)
    a = geometric(rng, 2048, 96, cond).astype(np.float32)
    with mpqr.explain() as trace:
        q, r = mpqr.qr(a, precision="fp32-emulated")
    assert any(e.kind == "fallback" for e in trace.events)
    assert orthogonality(q) <= 9 * U32 and backward_error(a, q, r) <= 18 * U32


@pytest.mark.parametrize(("cond", "kept"), [(1e1, True), (1e5, False)])
def test_float64_first_gram_at_fp32_accuracy(monkeypatch, cond, kept):
    """float64 ``auto``: CholQR2's first Gram product (a preconditioner) on tc-sgemm where
    predicted faster and its factor's diagonal ratio is small, the second (certified)
    Gram native; an ill-conditioned input's first Gram is made again natively. The
    float64 targets either way; an explicit ``fp64`` request keeps every product native."""
    _fp32_setup(monkeypatch)
    rng = np.random.default_rng(10)
    a = geometric(rng, 2048, 96, cond)
    with mpqr.explain() as trace:
        q, r = mpqr.qr(a)
    grams = [g.engine for g in trace.gemms if g.label == "cholqr2-gram"]
    pre = [e.message for e in trace.events if e.kind == "precondition"]
    assert grams == (["tc-sgemm", "native-fp64"] if kept
                     else ["tc-sgemm", "native-fp64", "native-fp64"])
    assert len(pre) == 1 and ("made again" in pre[0]) != kept
    assert not any(e.kind == "fallback" for e in trace.events)
    assert orthogonality(q) <= 1e-15 and backward_error(a, q, r) <= 2e-15
    with mpqr.explain() as trace:
        mpqr.qr(a, precision="fp64")
    assert {g.engine for g in trace.gemms} == {"native-fp64"}


@pytest.mark.parametrize(("cond", "by_gemm"), [(1.0, True), (1e3, False)])
def test_first_pass_inverse_by_estimated_cond2(monkeypatch, cond, by_gemm):
    """With ``FIRST_PASS_COND2_MAX`` set, an uncertified pass whose ``cond_1(R)`` exceeds 8
    applies ``R^-1`` by GEMM where the estimated ``cond_2`` (a lower bound, within a few
    percent of the true one here) is at most the limit, else by substitution; the
    float64 targets either way."""
    from mpqr.backends import get_backend
    from mpqr.backends.numpy.backend import NumpyBackend

    from mpqr._array_api import array_namespace

    monkeypatch.setattr(cholqr, "FIRST_PASS_COND2_MAX", 4.0)
    monkeypatch.setattr(NumpyBackend, "library_qr_tall_max", 2**16)
    rng = np.random.default_rng(11)  # random 2048 x 128: cond_1(R) ~ 12, cond_2 ~ 1.6
    a = rng.standard_normal((2048, 128)) if cond == 1.0 else geometric(rng, 2048, 128, cond)
    with mpqr.explain() as trace:
        q, r = mpqr.qr(a)
    first = next(e.message for e in trace.events if e.kind == "apply-inverse")
    assert ("estimated cond_2" in first) == by_gemm and ("substitution" in first) != by_gemm
    assert orthogonality(q) <= 1e-15 and backward_error(a, q, r) <= 2e-15
    r1 = np.linalg.qr(a, mode="r")
    be = get_backend(array_namespace(a))
    est = cholqr._cond2_estimate(be, r1, np.linalg.inv(r1), False)
    assert 0.85 * np.linalg.cond(a) <= est <= np.linalg.cond(a) * (1 + 1e-12)


@pytest.mark.parametrize(("cond", "kept"), [(1.0, True), (1e2, False), (1e4, False)])
def test_fp32_emulated_cholqr2_keeps_an_orthonormal_q1(monkeypatch, cond, kept):
    """float32 ``fp32-emulated``: where the second pass's Gram matrix (on tc-sgemm) shows
    ``Q1`` within ``KEEP_Q1_MAX u`` of orthonormal (a random, well-conditioned input), the
    route returns ``Q1, R1`` (no second factor, no ``Q1 X2``; explain() says so, and the
    distance it read is the true orthogonality's to within ``u``); else (cond 1e2: ~25 u
    after one pass) the second pass runs, and past CholQR2's reach (1e4) the route hands
    over as before. The float32 targets (against extended precision) every time."""
    _fp32_setup(monkeypatch)
    rng = np.random.default_rng(12)
    a = (rng.standard_normal((2048, 96)) if cond == 1.0
         else geometric(rng, 2048, 96, cond)).astype(np.float32)
    with mpqr.explain() as trace:
        q, r = mpqr.qr(a, precision="fp32-emulated")
    keep = [e for e in trace.events if e.kind == "keep-q1"]
    assert bool(keep) == kept
    labels = [g.label for g in trace.gemms]
    if kept:
        assert labels.count("cholqr2-gram") == 2 and "cholqr-RR" not in labels
        assert abs(keep[0].data["distance"] - orthogonality(q)) <= U32
        with mpqr.explain() as tr_r:  # mode "r" keeps R1 as well
            r_only = mpqr.qr(a, mode="r", precision="fp32-emulated")
        assert any(e.kind == "keep-q1" for e in tr_r.events)
        np.testing.assert_array_equal(np.asarray(r_only), r)
    orth, back = orthogonality(q), backward_error(a, q, r)
    assert orth <= 9 * U32 and back <= 18 * U32
    assert np.all(np.diagonal(r) > 0) and np.array_equal(r, np.triu(r))
    monkeypatch.setattr(cholqr, "KEEP_Q1_MAX", None)
    with mpqr.explain() as trace:
        q2, r2 = mpqr.qr(a, precision="fp32-emulated")
    assert not any(e.kind == "keep-q1" for e in trace.events)
    if kept:  # R1 against R2 R1: R2 = I + O(||Q1^T Q1 - I||)
        assert np.max(np.abs(r2 - r)) <= 18 * U32 * np.max(np.abs(r2))
    else:
        assert np.array_equal(r2, r) and np.array_equal(q2, q)


def test_complex64_cholqr2_keeps_an_orthonormal_q1(monkeypatch):
    """complex64 at ``fp32``: the same keep (the column-scaled bound before it stays real:
    no complex-to-real cast), float32 targets against extended precision."""
    import warnings

    from mpqr.backends.numpy.backend import NumpyBackend

    monkeypatch.setattr(NumpyBackend, "library_qr_tall_max", 2**10)
    rng = np.random.default_rng(13)
    a = (rng.standard_normal((2048, 64)) + 1j * rng.standard_normal((2048, 64))).astype(
        np.complex64)
    with warnings.catch_warnings():
        warnings.simplefilter("error", np.exceptions.ComplexWarning)
        with mpqr.explain() as trace:
            q, r = mpqr.qr(a, precision="fp32")
    assert any(e.kind == "keep-q1" for e in trace.events)
    assert q.dtype == r.dtype == np.complex64
    assert orthogonality(q) <= 9 * U32 and backward_error(a, q, r) <= 18 * U32


@pytest.mark.parametrize("host_max", [512, 64])
def test_early_condition_estimate_stays_with_a_wide_factor(monkeypatch, host_max):
    """CholQR2's first-pass condition estimate (float32 at cond 1e2 reaches its gate) moves
    the factor to the host only up to ``EARLY_HOST_MAX_N`` columns; a wider one is asked
    to stay where it is (a GPU's host took ~1 s for 4096 columns). Same answer either way."""
    from mpqr.backends.numpy.backend import NumpyBackend

    _fp32_setup(monkeypatch)
    monkeypatch.setattr(cholqr, "EARLY_HOST_MAX_N", host_max)
    limits = []
    small = NumpyBackend.small
    monkeypatch.setattr(NumpyBackend, "small", lambda self, x, limit=None: (
        limits.append((x.shape, limit)), small(self, x, limit))[1])
    a = geometric(np.random.default_rng(14), 2048, 96, 1e2).astype(np.float32)
    q, r = mpqr.qr(a, precision="fp32-emulated")
    moved = [lim for shape, lim in limits if shape == (96, 96) and lim is not None]
    assert moved == ([96 * 96] if host_max == 512 else [0])
    assert orthogonality(q) <= 9 * U32 and backward_error(a, q, r) <= 18 * U32
