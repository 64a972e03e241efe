"""Accuracy of every QR method against extended-precision error measures, with
tolerances derived from the unit roundoff of the precision under test."""

from __future__ import annotations

import contextlib
import importlib
import sys

import numpy as np
import pytest

import mpqr
from mpqr.engines import ENGINES
from tests._qr_support import (
    arithmetic,
    backward_error,
    geometric,
    orthogonality,
    unit_roundoff,
)
from tests._support import to_numpy

api = sys.modules["mpqr.qr.api"]
HOUSEHOLDER = ["householder-recursive", "householder-tiled"]
ALL = [*HOUSEHOLDER, "gram-schmidt-recursive", "cholqr2", "shifted-cholqr3",
       "preconditioned-cholqr", "svqr"]
HAS_OZAKI = "ozaki-int8" in ENGINES


def _engine_ctx(precision):
    if precision == "fp64-emulated":
        if not HAS_OZAKI:
            pytest.skip("the INT8 Ozaki engine is not registered yet")
        try:
            with mpqr.gemm_options(engine="ozaki-int8"):
                mpqr.policy.gemm(np.ones((2, 3, 3)), np.ones((2, 3, 3)))
        except (NotImplementedError, ValueError) as exc:  # the TSQR panel multiplies stacks
            pytest.skip(f"forced ozaki-int8 cannot run stacked products yet: {exc}")
        return mpqr.gemm_options(engine="ozaki-int8")
    return contextlib.nullcontext()


def _needs_fp16(xp, precision):
    if precision in ("fp16", "fp32-emulated", "fp64-emulated"):
        ns = mpqr._array_api.array_namespace(xp.asarray(1.0))
        if "fp16" not in mpqr.backends.get_backend(ns).capabilities:
            pytest.skip("backend without fp16/int8 engines")


@pytest.mark.parametrize("precision", ["fp64", "fp64-emulated", "fp32", "fp32-emulated", "fp16"])
@pytest.mark.parametrize("shape", [(256, 128), (512, 64)])
@pytest.mark.parametrize("method", HOUSEHOLDER)
def test_householder_accuracy(xp, method, shape, precision):
    """TC-QR accuracy table at CI size: backward error <= 2 sqrt(n) u and
    orthogonality ||I - Q^T Q||_F / n <= sqrt(n) u / 4 for the precision's u."""
    _needs_fp16(xp, precision)
    m, n = shape
    a = np.random.default_rng(m + n).standard_normal(shape)
    with _engine_ctx(precision), mpqr.explain() as trace:
        q, r = mpqr.qr(xp.asarray(a), method=method, precision=precision)
    u = unit_roundoff(precision, np.float64)
    be, orth = backward_error(a, q, r), orthogonality(q)
    assert be <= 2 * np.sqrt(n) * u, be
    assert orth <= np.sqrt(n) * u / 4, orth
    if precision == "fp16":  # the updates really ran on the fp16 tensor cores (rounded
        # reflectors, one FP16 GEMM a product; T at working precision)
        assert {g.engine for g in trace.gemms if g.label.startswith(("rec-", "tiled-"))
                and not g.label.endswith("-TC")} == {"tc-fp16"}


@pytest.mark.parametrize("cond", [1e4, 1e8, 1e12])
@pytest.mark.parametrize("method", [*HOUSEHOLDER, "gram-schmidt-recursive"])
def test_orthogonality_vs_condition(xp, method, cond):
    """Householder orthogonality does not depend on cond(A); Gram-Schmidt's
    (with re-orthogonalisation) degrades, bounded by cond(A) u."""
    a = geometric(np.random.default_rng(1), 300, 96, cond)
    q, r = mpqr.qr(xp.asarray(a), method=method, precision="fp64")
    u = 2.0**-53
    assert backward_error(a, q, r) <= 2 * np.sqrt(96) * u
    orth = orthogonality(q)
    if method.startswith("householder"):
        assert orth <= np.sqrt(96) * u / 4
    else:
        assert orth <= cond * u
        if cond >= 1e12:
            assert orth > np.sqrt(96) * u / 4, "documented degradation not seen: update docs"


def _svqr_matrix():
    """Yamazaki et al., Fig. 2: every third column is eps times itself plus the
    two previous columns, cond ~ 1e16."""
    rng = np.random.default_rng(2015)
    b = rng.standard_normal((1000, 15))
    a = b.copy()
    eps = np.finfo(np.float64).eps
    for j in range(2, 15, 3):
        a[:, j] = eps * b[:, j] + a[:, j - 1] + a[:, j - 2]
    return a


def test_svqr_on_cond_1e16_where_cholqr_breaks_down(xp):
    a = _svqr_matrix()
    assert np.linalg.cond(a) > 1e15
    with pytest.raises(mpqr.BreakdownError, match=r"cholqr broke down.*estimated cond\(x\)") \
            as info:
        mpqr.qr(xp.asarray(a), method="cholqr", precision="fp64")
    assert info.value.method == "cholqr" and info.value.cond_estimate > 1e7
    q, r = mpqr.qr(xp.asarray(a), method="svqr", precision="fp64")
    qn = to_numpy(q)
    assert np.linalg.norm(np.eye(15) - qn.T @ qn, 2) <= 1e-13
    assert backward_error(a, q, r) <= 1e-13


def test_svqr_mixed_precision_solve():
    """ds-SVQR: the solve drops to float32 when cond(G) > 1/eps, orthogonality
    stays at working precision, the backward error rises to float32's level."""
    svqr = importlib.import_module("mpqr.qr.svqr").svqr
    a = _svqr_matrix()
    be = mpqr.backends.get_backend(mpqr._array_api.array_namespace(a))
    with mpqr.explain() as trace:
        q, r = svqr(be, a, precision="fp64", prec_name="fp64", mixed=True)
    half = [e for e in trace.events if e.kind == "svqr-pass" and e.data["half"]]
    assert half and half[0].data["cond_gram"] > 1 / np.finfo(np.float64).eps
    assert np.linalg.norm(np.eye(15) - q.T @ q, 2) <= 1e-13
    assert backward_error(a, q, r) <= 15 * 2.0**-24
    # fp32 precision on float64 input turns it on through the public API
    # (the threshold is then 1/eps of the fp32 Gram matrix)
    with mpqr.explain() as trace:
        q, r = mpqr.qr(a, method="svqr", precision="fp32")
    assert any(e.kind == "svqr-pass" and e.data["half"] for e in trace.events)
    assert orthogonality(q) <= 15 * 2.0**-24
    with mpqr.explain() as trace:
        mpqr.qr(a, method="svqr", precision="fp64")
    assert not any(e.data.get("half") for e in trace.events)


@pytest.mark.parametrize("method,cond,breaks", [
    ("cholqr2", 1e6, False), ("cholqr2", 1e10, True),
    ("shifted-cholqr3", 1e12, False), ("shifted-cholqr3", 1e17, True),
    ("svqr", 1e12, False), ("cholqr", 1e3, False),
    ("preconditioned-cholqr", 1e12, False), ("preconditioned-cholqr", 1e15, False),
    ("preconditioned-cholqr", 1e18, True),
])
def test_cholqr_family_reach(xp, method, cond, breaks):
    a = arithmetic(np.random.default_rng(4), 400, 32, cond) if cond < 1e6 else \
        geometric(np.random.default_rng(4), 400, 32, cond)
    if breaks:
        with pytest.raises(mpqr.BreakdownError, match=f"{method} broke down"):
            mpqr.qr(xp.asarray(a), method=method, precision="fp64")
        return
    q, r = mpqr.qr(xp.asarray(a), method=method, precision="fp64")
    u = 2.0**-53
    assert backward_error(a, q, r) <= 2 * np.sqrt(32) * u
    # CholQR alone: orthogonality ~ cond^2 u; the others reach O(u)
    limit = cond**2 * u if method == "cholqr" else np.sqrt(32) * u
    assert orthogonality(q) <= limit


@pytest.mark.parametrize(("cond", "chain"), [
    (1e12, ["preconditioned-cholqr"]),
    (1e18, ["preconditioned-cholqr", "householder-tiled"]),  # numerically rank-deficient
])
def test_auto_never_surfaces_breakdown(monkeypatch, cond, chain):
    a = geometric(np.random.default_rng(5), 200, 40, cond)
    # the in-memory route is the one that chooses
    monkeypatch.setattr(sys.modules["mpqr.qr.in_memory"], "choose_method",
                        lambda *args, **kw: ("cholqr2", "test"))
    with mpqr.explain() as trace:
        q, r = mpqr.qr(a, precision="fp64")
    fb = [e for e in trace.events if e.kind == "fallback"]
    assert [e.data["fallback"] for e in fb] == chain
    assert [e.data["method"] for e in fb] == ["cholqr2", *chain[:-1]]
    assert orthogonality(q) <= np.sqrt(40) * 2.0**-53 / 4
    assert backward_error(a, q, r) <= 2 * np.sqrt(40) * 2.0**-53


@pytest.mark.parametrize("method", ALL)
def test_methods_agree_modes_and_wide(xp, method):
    rng = np.random.default_rng(8)
    a = rng.standard_normal((150, 50))
    rh = mpqr.qr(xp.asarray(a), method="householder-tiled", precision="fp64").R
    r = mpqr.qr(xp.asarray(a), method=method, precision="fp64").R
    tol = 50 * np.linalg.cond(a) * 2.0**-53
    np.testing.assert_allclose(to_numpy(r), to_numpy(rh), atol=tol * np.linalg.norm(a), rtol=0)
    qc, rc = mpqr.qr(xp.asarray(a), mode="complete", method=method, precision="fp64")
    assert tuple(qc.shape) == (150, 150) and tuple(rc.shape) == (150, 50)
    assert orthogonality(qc) <= 4 * np.sqrt(150) * 2.0**-53
    assert backward_error(a, qc, rc) <= 2 * np.sqrt(50) * 2.0**-53
    w = rng.standard_normal((20, 45))
    qw, rw = mpqr.qr(xp.asarray(w), method=method, precision="fp64")
    assert tuple(qw.shape) == (20, 20) and tuple(rw.shape) == (20, 45)
    # Gram-based methods: backward error ~ n u (the solve is row-wise backward stable)
    c = 2 * np.sqrt(45) if method.startswith("householder") else 45
    assert backward_error(w, qw, rw) <= c * 2.0**-53


@pytest.mark.parametrize("method", ALL)
def test_stacks_are_batched_not_looped(method):
    """A stack of small matrices runs the same GEMM sequence as one matrix:
    the number of policy GEMMs must not grow with the batch size."""
    rng = np.random.default_rng(9)
    counts = []
    for batch in (2, 300):
        a = rng.standard_normal((batch, 64, 16))
        with mpqr.explain() as trace:
            q, r = mpqr.qr(a, method=method, precision="fp64")
        counts.append(len(trace.gemms))
        assert backward_error(a, q, r) <= 2 * 4 * 2.0**-53
        assert orthogonality(q) <= 2 * 4 * 2.0**-53
    assert counts[0] == counts[1]


def test_gram_schmidt_column_scaling_is_exact(xp):
    """Power-of-two column scaling of A scales R's columns exactly; huge and tiny
    columns do not overflow the fp16 engine."""
    _needs_fp16(xp, "fp16")
    rng = np.random.default_rng(10)
    a = rng.standard_normal((128, 48)).astype(np.float32)
    scale = np.float32(2.0) ** rng.integers(-60, 60, size=48).astype(np.float32)
    _, r1 = mpqr.qr(xp.asarray(a), method="gram-schmidt-recursive", precision="fp16")
    q2, r2 = mpqr.qr(xp.asarray(a * scale), method="gram-schmidt-recursive", precision="fp16")
    np.testing.assert_array_equal(to_numpy(r2), to_numpy(r1) * scale)
    assert np.all(np.isfinite(to_numpy(q2)))
    assert orthogonality(q2) <= np.sqrt(48) * 2.0**-11  # fp16 projections


def test_explain_shows_every_gemm_engine():
    a = np.random.default_rng(12).standard_normal((300, 100))
    with mpqr.explain() as trace:
        mpqr.qr(a, precision="fp16", method="householder-recursive")
    text = trace.summary()
    assert "qr: householder-recursive (requested)" in text
    assert all(g.engine in ("tc-fp16", "native-fp64") for g in trace.gemms)
    assert {g.engine for g in trace.gemms if g.label.startswith("rec-")} == {"tc-fp16"}
    # fp16: the vectors' own float16 array stores the triangle's zeros, so the update is
    # one GEMM; the other precisions split the product with Y's triangle (TRMM)
    assert "rec-update-trmm" not in {g.label for g in trace.gemms}
    with mpqr.explain() as trace:
        mpqr.qr(a, precision="fp32-emulated", method="householder-recursive")
    assert "rec-update-trmm" in {g.label for g in trace.gemms}


@pytest.mark.parametrize("mode", ["reduced", "complete", "r"])
@pytest.mark.parametrize("shape", [(300, 100), (100, 100), (60, 150)])
def test_geqrf_method_keeps_the_qr_contract(xp, mode, shape):
    """The library's own QR behind ``method="geqrf"``: same shapes, signs and accuracy as
    the other methods, input untouched."""
    m, n = shape
    a = np.random.default_rng(m + n).standard_normal(shape)
    x = xp.asarray(a)
    with mpqr.explain() as trace:
        out = mpqr.qr(x, mode=mode, method="geqrf")
    assert [e.data["method"] for e in trace.events if e.kind == "method"] == ["geqrf"]
    np.testing.assert_array_equal(to_numpy(x), a)
    k = min(m, n)
    u = 2.0**-53
    r = to_numpy(out if mode == "r" else out[1])
    assert r.shape == ((m, n) if mode == "complete" else (k, n))
    assert np.all(np.diag(r) >= 0) and np.allclose(r, np.triu(r), rtol=0, atol=0)
    if mode == "r":
        ref = np.linalg.qr(a, mode="r")
        ref = ref * np.sign(np.diag(ref))[:, None]
        assert np.max(np.abs(r - ref)) <= 10 * np.sqrt(m) * n * u * np.linalg.norm(a, 2)
        return
    q = to_numpy(out[0])
    assert q.shape == ((m, m) if mode == "complete" else (m, k))
    assert backward_error(a, q, r) <= 2 * np.sqrt(n) * u
    assert orthogonality(q) <= np.sqrt(q.shape[1]) * u / 4


@pytest.mark.parametrize("exps", [(0, 0, 0), (40, 0, -40), (100, 0, 0), (0, -70, 0)],
                         ids=["unit", "2^40..2^-40", "2^100", "2^-70"])
@pytest.mark.parametrize("precision", ["fp16", "fp32-emulated"])
def test_geqrf_at_tensor_core_precisions_checks_the_range_after(xp, precision, exps):
    """At ``fp16`` and ``fp32-emulated`` the library's QR runs in the input's own
    precision (float32 here): as at the native precisions, on the unscaled input with the
    range checked after it, again on scaled columns only where a column is beyond
    float32's safe range."""
    from mpqr.qr._kernels import SAFE_EXPONENT

    ns = mpqr._array_api.array_namespace(xp.asarray(1.0))
    if "fp16" not in mpqr.backends.get_backend(ns).capabilities:
        pytest.skip("backend without the fp16 engines")
    m, n = 300, 60
    a0 = np.random.default_rng(6).standard_normal((m, n)).astype(np.float32)
    e = np.resize(np.asarray(exps), n)
    a = np.ldexp(a0, e).astype(np.float32)
    x = xp.asarray(a)
    with mpqr.explain() as trace:
        q, r = mpqr.qr(x, precision=precision, method="geqrf")
    rerun = [ev for ev in trace.events if ev.kind == "scale"]
    col_exp = np.frexp(np.max(np.abs(a), axis=0))[1] - 1
    assert bool(rerun) == (int(np.max(np.abs(col_exp))) > SAFE_EXPONENT["float32"])
    np.testing.assert_array_equal(to_numpy(x), a)
    q, r = to_numpy(q).astype(np.float64), to_numpy(r).astype(np.float64)
    assert np.isfinite(q).all() and np.isfinite(r).all() and np.all(np.diag(r) >= 0)
    u = 2.0**-24
    assert backward_error(a0.astype(np.float64), q, np.ldexp(r, -e)) <= 2 * np.sqrt(n) * u
    assert orthogonality(q) <= np.sqrt(n) * u


@pytest.mark.parametrize("exps", [(0, 0, 0), (1000, 0, -1000), (-1060, -1060, -1060),
                                  (420, 0, 0), (0, -403, 0), (0, -390, 0)],
                         ids=["unit", "2^1000..2^-1000", "subnormal", "2^420", "2^-403",
                              "2^-390"])
@pytest.mark.parametrize("precision", ["auto", "fp64"])
def test_geqrf_range_is_checked_after_the_factorization(xp, precision, exps):
    """``geqrf`` runs on the unscaled input and checks the column range after it (one
    host sync for both); a column beyond 2^+-400 makes it run again on columns scaled by
    powers of two, traced. Either way the factors are those of the input, to the
    dtype's accuracy in the units of each column."""
    m, n = 300, 60
    a0 = np.random.default_rng(5).standard_normal((m, n))
    e = np.resize(np.asarray(exps), n)
    a = np.ldexp(a0, e)
    x = xp.asarray(a)
    with mpqr.explain() as trace:
        q, r = mpqr.qr(x, precision=precision, method="geqrf")
    rerun = [ev for ev in trace.events if ev.kind == "scale"]
    col_exp = np.frexp(np.max(np.abs(a), axis=0))[1] - 1  # max |a_ij| in [2^e, 2^(e+1))
    assert bool(rerun) == (int(np.max(np.abs(col_exp))) > 400)
    if rerun:
        assert rerun[0].message == ("qr: a column's largest entry is above 2^400 or below "
                                    "2^-400: the library's QR runs again on columns scaled "
                                    "by powers of two")
    np.testing.assert_array_equal(to_numpy(x), a)
    q, r = to_numpy(q), to_numpy(r)
    assert np.isfinite(q).all() and np.isfinite(r).all() and np.all(np.diag(r) >= 0)
    u = 2.0**-53
    # R's columns in the units of A's (exact powers of two); the subnormal case keeps
    # only the input's own 10-odd significant bits
    tiny = n * np.ldexp(float(np.finfo(np.float64).smallest_subnormal), -int(e.min()))
    assert backward_error(a0, q, np.ldexp(r, -e)) <= 2 * np.sqrt(n) * u + 10 * tiny
    assert orthogonality(q) <= np.sqrt(n) * u / 4 + 10 * tiny * np.sqrt(m)


@pytest.mark.parametrize("shape, precision, dtype", [
    ((300, 300), "fp64", "float64"), ((700, 256), "fp32-emulated", "float32"),
    ((256, 256), "fp64-emulated", "float64"), ((200, 136), "fp64", "complex128")])
def test_folded_spine_gives_the_merged_factors(xp, monkeypatch, shape, precision, dtype):
    """The recursion's right spine left unmerged (``FOLD_SPINE``: Q's formation takes
    ``W2 -= W1 D`` as ``U12 - D U22``) gives the merged W's Q and R to rounding, within
    the precision's accuracy bounds, for fewer product flops (one root merge of
    ``m x n/2 x n/2`` replaced by products of ``n/2`` cubed)."""
    _needs_fp16(xp, precision)
    hr = importlib.import_module("mpqr.qr.householder_recursive")
    monkeypatch.setenv("MPQR_MEMORY_PLAN", "fast")
    rng = np.random.default_rng(sum(shape))
    a = rng.standard_normal(shape)
    if dtype == "complex128":
        a = a + 1j * rng.standard_normal(shape)
    a = a.astype(dtype)
    out, flops = {}, {}
    for on in (False, True):
        monkeypatch.setattr(hr, "FOLD_SPINE", 2 if on else 0)
        with mpqr.explain() as trace:
            q, r = mpqr.qr(xp.asarray(a), precision=precision, method="householder-recursive")
        out[on] = (to_numpy(q), to_numpy(r))
        flops[on] = sum(2 * g.batch * g.shape[0] * g.shape[1] * g.shape[2]
                        for g in trace.gemms if g.label.startswith("rec-"))
        assert any(g.label == "rec-formq-fold-gemm" or g.label == "rec-formq-fold"
                   for g in trace.gemms) == on
    n = shape[1]
    u = unit_roundoff(precision, a.dtype)
    (q0, r0), (q1, r1) = out[False], out[True]
    assert backward_error(a, q1, r1) <= 2 * np.sqrt(n) * u
    assert orthogonality(q1) <= np.sqrt(n) * u / 4
    # a Gaussian matrix is well conditioned: the two orders' Q agree to n u
    assert np.abs(q1 - q0).max() <= n * u
    assert np.abs(r1 - r0).max() <= n * u * np.abs(r0).max()
    assert flops[True] < 0.95 * flops[False]


@pytest.mark.parametrize(("shape", "precision", "dtype"), [
    ((512, 512), "fp32-emulated", "float32"), ((640, 512), "fp64-emulated", "float64"),
    ((512, 512), "fp16", "float32")])
def test_formq_diagonal_blocks_capped(xp, monkeypatch, shape, precision, dtype):
    """Q's formation splits ``Y1``'s triangle until its diagonal blocks are at most
    ``FORMQ_MAX_BLOCK`` wide (each block one GEMM over its triangle's zeros): capped, the
    blocks are that wide, the products' flops fall, and Q and R stay within the
    precision's accuracy bounds and agree with the uncapped split's to rounding."""
    _needs_fp16(xp, precision)
    hr = importlib.import_module("mpqr.qr.householder_recursive")
    monkeypatch.setenv("MPQR_MEMORY_PLAN", "fast")
    a = np.random.default_rng(sum(shape)).standard_normal(shape).astype(dtype)
    n = shape[1]
    assert hr.formq_block(n) == n // hr.TRMM_DEPTH_FRACTION  # these sizes: under the cap
    out, flops, widths = {}, {}, {}
    full = hr.FORMQ_MAX_BLOCK
    for cap in (full, n // 8):
        monkeypatch.setattr(hr, "FORMQ_MAX_BLOCK", cap)
        with mpqr.explain() as trace:
            q, r = mpqr.qr(xp.asarray(a), precision=precision, method="householder-recursive")
        out[cap] = (to_numpy(q), to_numpy(r))
        formq = [g for g in trace.gemms if g.label.startswith("rec-formq")]
        flops[cap] = sum(2 * g.batch * g.shape[0] * g.shape[1] * g.shape[2] for g in formq)
        widths[cap] = {g.shape[0] for g in formq if g.label == "rec-formq-trmm"}
    assert widths[n // 8] == {n // 8}
    assert widths[full] == {n // hr.TRMM_DEPTH_FRACTION}
    assert flops[n // 8] < 0.95 * flops[full]
    u = unit_roundoff(precision, a.dtype)
    (q0, r0), (q1, r1) = out[full], out[n // 8]
    assert backward_error(a, q1, r1) <= 2 * np.sqrt(n) * u
    assert orthogonality(q1) <= np.sqrt(n) * u / 4
    # R is computed before Q's formation: the same bits; Q to rounding
    np.testing.assert_array_equal(r1, r0)
    assert np.abs(q1 - q0).max() <= n * u


@pytest.mark.parametrize(("shape", "precision", "dtype", "block"), [
    ((512, 512), "fp32-emulated", "float32", 64), ((700, 500), "fp64", "float64", 128),
    ((512, 512), "fp64-emulated", "float64", 128), ((384, 384), "fp64", "complex128", 64),
    ((512, 448), "fp16", "float32", 64)])
def test_spine_in_blocks(xp, monkeypatch, shape, precision, dtype, block):
    """The fast plan's spine in blocks (``SPINE_BLOCK``): each block factored by halves,
    its W updating the columns right of it, and Q formed from the blocks' W's backward.
    Q and R within the precision's bounds, equal to the halves' to rounding, fewer flops,
    the input untouched; ``mode="r"`` gives R to rounding."""
    _needs_fp16(xp, precision)
    hr = importlib.import_module("mpqr.qr.householder_recursive")
    monkeypatch.setenv("MPQR_MEMORY_PLAN", "fast")
    monkeypatch.setattr(hr, "SPINE_BLOCKS", 10**6)  # the width is SPINE_BLOCK's
    rng = np.random.default_rng(sum(shape))
    a = rng.standard_normal(shape)
    if dtype == "complex128":
        a = a + 1j * rng.standard_normal(shape)
    a = a.astype(dtype)
    n = shape[1]
    out, flops, labels = {}, {}, {}
    for sb in (None, block):
        monkeypatch.setattr(hr, "SPINE_BLOCK", sb)
        x = xp.asarray(a)
        with mpqr.explain() as trace:
            q, r = mpqr.qr(x, precision=precision, method="householder-recursive")
        r_only = mpqr.qr(x, precision=precision, method="householder-recursive", mode="r")
        np.testing.assert_array_equal(to_numpy(x), a)
        out[sb] = (to_numpy(q), to_numpy(r), to_numpy(r_only))
        flops[sb] = sum(2 * g.batch * g.shape[0] * g.shape[1] * g.shape[2]
                        for g in trace.gemms)
        labels[sb] = {g.label for g in trace.gemms}
    assert "formq-blocked-YhQ" in labels[block] and "formq-blocked-YhQ" not in labels[None]
    assert not any(lb.startswith("rec-merge") and "fold" in lb for lb in labels[block])
    assert flops[block] < 0.9 * flops[None]
    u = unit_roundoff(precision, a.dtype)
    (q0, r0, _), (q1, r1, rr1) = out[None], out[block]
    assert backward_error(a, q1, r1) <= 2 * np.sqrt(n) * u
    assert orthogonality(q1) <= np.sqrt(n) * u / 4
    # the same reflectors, other sums: Q and R equal to the halves' to rounding
    assert np.abs(q1 - q0).max() <= n * u
    assert np.abs(r1 - r0).max() <= n * u * np.abs(r0).max()
    # mode "r": the same blocks (the last one's leaf may run another order without its W)
    assert np.abs(rr1 - r1).max() <= n * u * np.abs(r1).max()


@pytest.mark.parametrize("chunks", [2, 3, 5])
def test_spine_chunks_split_the_updates(monkeypatch, chunks):
    """``SPINE_CHUNKS``: the spine's updates and Q's backward formation take column chunks
    of ``ceil(n / SPINE_CHUNKS)``; Q and R within the precision's bounds and equal to
    those of two chunks to rounding."""
    hr = importlib.import_module("mpqr.qr.householder_recursive")
    monkeypatch.setenv("MPQR_MEMORY_PLAN", "fast")
    monkeypatch.setattr(hr, "SPINE_BLOCKS", 10**6)
    monkeypatch.setattr(hr, "SPINE_BLOCK", 64)
    a = np.random.default_rng(5).standard_normal((448, 384)).astype(np.float32)
    n, step = a.shape[1], -(-a.shape[1] // chunks)
    out = {}
    for c in (2, chunks):
        monkeypatch.setattr(hr, "SPINE_CHUNKS", c)
        with mpqr.explain() as trace:
            out[c] = mpqr.qr(a, precision="fp32-emulated", method="householder-recursive")
        widths = {g.shape[1] for g in trace.gemms if g.label == "formq-blocked-YhQ"}
        assert max(widths) == -(-n // c)
    q, r = out[chunks]
    u = unit_roundoff("fp32-emulated", a.dtype)
    assert backward_error(a, q, r) <= 2 * np.sqrt(n) * u
    assert orthogonality(q) <= np.sqrt(n) * u / 4
    assert max(g.shape[1] for g in trace.gemms if g.label == "formq-blocked-WD") <= step
    assert np.abs(q - out[2][0]).max() <= n * u
    assert np.abs(r - out[2][1]).max() <= n * u * np.abs(r).max()


def test_spine_products_in_stretches(monkeypatch):
    """``SPINE_STRETCH``: at fp32-emulated the spine's updates and Q's backward formation
    run each chunk's products in stretches of rows: ``W^H B`` and ``Y^H Q`` along their
    inner dimension (the stretches' products added), ``B -= Y C`` and ``Q -= W D`` along
    their output's rows with the right operand's parts prepared once, and Q's diagonal
    blocks along W's rows. Every product's
    stretch within the budget, Q and R within the precision's bounds and equal to those
    of whole chunks to rounding, the input untouched."""
    hr = importlib.import_module("mpqr.qr.householder_recursive")
    monkeypatch.setenv("MPQR_MEMORY_PLAN", "fast")
    monkeypatch.setattr(hr, "SPINE_BLOCKS", 10**6)
    monkeypatch.setattr(hr, "SPINE_BLOCK", 64)
    monkeypatch.setattr(hr, "STRETCH_UNIT", 32)
    monkeypatch.setattr(hr, "STRETCH_MIN_ROWS", 32)
    a = np.random.default_rng(5).standard_normal((448, 384)).astype(np.float32)
    m, n = a.shape
    before = a.copy()
    out, gemms = {}, {}
    for share in (None, 0.05):
        monkeypatch.setattr(hr, "SPINE_STRETCH", {"fp32-emulated": share} if share else {})
        with mpqr.explain() as trace:
            out[share] = mpqr.qr(a, precision="fp32-emulated", method="householder-recursive")
        gemms[share] = [g for g in trace.gemms
                        if g.label.startswith(("rec-update", "formq", "rec-formq"))]
    np.testing.assert_array_equal(a, before)
    budget = hr.spine_stretch(m, n, "fp32-emulated")
    assert budget == int(0.05 * m * n)
    inner = [g for g in gemms[0.05] if g.label in ("rec-update-WhB", "formq-blocked-YhQ")]
    outer = [g for g in gemms[0.05] if g.label in ("rec-update-YC", "formq-blocked-WD")]
    # a stretch's rows: whole units within the budget over the row's elements (the
    # chunk's columns and the block's), or all the rows where one stretch holds them
    for g in inner:
        rows, width = g.shape[2], g.shape[1] + g.shape[0]
        assert rows <= max(32, budget // width // 32 * 32), g
    for g in outer:
        rows, width = g.shape[0], g.shape[1] + g.shape[2]
        assert rows <= max(32, budget // width // 32 * 32), g
        assert g.params.get("prepared") == "B" or g.engine != "tc-sgemm", g
    # Q's diagonal blocks (-U W^H, U the block's unit upper triangle): W's rows in
    # stretches (a row's split, the product's column and its unscaled copy), U prepared
    diag = [g for g in gemms[0.05] if g.label == "rec-formq-trmm"]
    assert diag and all(g.shape[1] <= max(32, budget // (3 * g.shape[0]) // 32 * 32)
                        and g.params.get("prepared") == "A" for g in diag), diag
    assert max(g.shape[1] for g in gemms[None] if g.label == "rec-formq-trmm") == m
    assert len(inner) > len([g for g in gemms[None] if g.label.endswith(("WhB", "YhQ"))])
    assert max(g.shape[2] for g in gemms[None] if g.label == "rec-update-WhB") > 32
    # the same flops in more, smaller products
    flops = {k: sum(2 * g.shape[0] * g.shape[1] * g.shape[2] for g in v)
             for k, v in gemms.items()}
    assert flops[0.05] == flops[None]
    u = unit_roundoff("fp32-emulated", a.dtype)
    (q0, r0), (q1, r1) = out[None], out[0.05]
    assert backward_error(a, q1, r1) <= 2 * np.sqrt(n) * u
    assert orthogonality(q1) <= np.sqrt(n) * u / 4
    assert np.abs(q1 - q0).max() <= n * u
    assert np.abs(r1 - r0).max() <= n * u * np.abs(r0).max()


def test_spine_stretch_rows(monkeypatch):
    """A stretch's rows: whole units within the budget over a row's elements, at least
    ``STRETCH_MIN_ROWS``, all the rows where one stretch holds them or there is no
    budget; the spine's estimate counts a stretch at that floor."""
    hr = importlib.import_module("mpqr.qr.householder_recursive")
    monkeypatch.setattr(hr, "STRETCH_UNIT", 1024)
    monkeypatch.setattr(hr, "STRETCH_MIN_ROWS", 2048)
    assert hr._stretch_rows(None, 100, 5000) == 5000
    assert hr._stretch_rows(3 * 1024 * 100 + 5, 100, 16384) == 3072
    assert hr._stretch_rows(10, 100, 16384) == 2048
    assert hr._stretch_rows(10**9, 100, 16384) == 16384
    assert hr.spine_stretch(16384, 16384, "fp32-emulated") == int(
        hr.SPINE_STRETCH["fp32-emulated"] * 16384**2)
    assert hr.spine_stretch(16384, 16384, "fp64-emulated") is None
    w, sb = 8192, 2048
    tail = 8 * sb * w + max(hr.BATCHED_PARTIALS_BYTES, 4 * sb * sb)
    assert hr.spine_scratch(16384, 16384, sb, fp16=False, stretch=2**25) == 4 * 2**25 + tail
    assert hr.spine_scratch(16384, 16384, sb, fp16=False, stretch=10) == \
        4 * 2048 * (w + sb) + tail
    # many rows: a block's own first update over all of them is the larger
    assert hr.spine_scratch(65536, 8192, sb, fp16=False, stretch=2**26) == 6 * 65536 * sb


@pytest.mark.parametrize("precision", ["fp16", "fp32-emulated", "fp64-emulated"])
def test_spine_reserves_its_scratch(monkeypatch, precision):
    """``SPINE_RESERVE``: the fast plan's spine (float32, fp16 or fp32-emulated) asks the
    backend once for a free block of its multiple of :func:`spine_scratch` bytes before it
    factors; the factors are those of a run without it."""
    hr = importlib.import_module("mpqr.qr.householder_recursive")
    backend = mpqr.backends.get_backend(mpqr._array_api.array_namespace(np.zeros(1)))
    monkeypatch.setenv("MPQR_MEMORY_PLAN", "fast")
    monkeypatch.setattr(hr, "SPINE_BLOCKS", 10**6)
    monkeypatch.setattr(hr, "SPINE_BLOCK", 64)
    dtype = np.float64 if precision == "fp64-emulated" else np.float32
    a = np.random.default_rng(3).standard_normal((320, 256)).astype(dtype)
    asked = []
    monkeypatch.setattr(type(backend), "reserve_scratch",
                        lambda self, nbytes: asked.append(nbytes))
    out = {}
    for on in (False, True):
        monkeypatch.setattr(hr, "SPINE_RESERVE", {precision: 1.5} if on else {})
        asked.clear()
        out[on] = mpqr.qr(a, precision=precision, method="householder-recursive")
        if on and precision != "fp64-emulated":
            est = hr.spine_scratch(320, 256, 64, fp16=precision == "fp16",
                                   stretch=hr.spine_stretch(320, 256, precision))
            assert asked == [int(1.5 * est)]
        else:
            assert asked == []
    for x, y in zip(out[True], out[False], strict=True):
        np.testing.assert_array_equal(x, y)
    if precision != "fp64-emulated":
        # a taller input: at least R's bytes (R is copied out at the end, split from it)
        monkeypatch.setattr(hr, "SPINE_RESERVE", {precision: 0.01})
        asked.clear()
        mpqr.qr(a, precision=precision, method="householder-recursive")
        assert asked == [4 * 256 * 256]
    # the fp16 scheme's estimate: the chunk and W as fp16, the vectors, the product
    w = -(-256 // hr.SPINE_CHUNKS)
    assert hr.spine_scratch(320, 256, 64, fp16=True) == 2 * 320 * w + 4 * 320 * 64 + 4 * 64 * w


def test_spine_block_rule(monkeypatch):
    """The spine's blocks: ``max(SPINE_BLOCK, n / SPINE_BLOCKS)`` columns, a multiple of
    the leaf width, where that leaves more than two blocks and the input has at most
    ``SPINE_MAX_ASPECT`` rows a column; None (halves) otherwise or with the constant None."""
    hr = importlib.import_module("mpqr.qr.householder_recursive")
    assert hr.spine_block(32768, 32768, 1024) == 4096
    assert hr.spine_block(16384, 16384, 1024) == 2048
    assert hr.spine_block(8192, 8192, 1024) == 2048
    assert hr.spine_block(16384, 8192, 1024) == 2048
    assert hr.spine_block(12288, 12288, 1536) == 1536  # a leaf's multiple
    assert hr.spine_block(65536, 8192, 512) == 2048  # 8 rows a column
    assert hr.spine_block(131072, 8192, 512) is None  # taller
    assert hr.spine_block(4096, 4096, 512) is None  # two blocks
    monkeypatch.setattr(hr, "SPINE_BLOCK", None)
    assert hr.spine_block(32768, 32768, 1024) is None


def test_formq_block_rule():
    """Q's diagonal blocks: a quarter of the columns, at least the TRMM split's cutoff and
    at most ``FORMQ_MAX_BLOCK`` (4096)."""
    hr = importlib.import_module("mpqr.qr.householder_recursive")
    assert [hr.formq_block(n) for n in (64, 1024, 8192, 16384, 32768, 65536)] == \
        [hr.TRMM_CUTOFF, 256, 2048, 4096, 4096, 4096]
