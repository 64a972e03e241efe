"""Ill-conditioned tall-skinny QR: ``method="auto"`` continues from CholQR2's Gram matrix
with the preconditioned CholQR up to ``cond(A) ~ u^-1`` and falls back to Householder
only for numerically rank-deficient input; ``lstsq`` takes the same route.

Tolerances as in ``test_qr_tall_skinny.py``: ``8 sqrt(n) u`` for the backward error and
``8 sqrt(n) u / n`` for ``||I - Q^H Q||_F / n`` (CholQR-type bounds are ``c (m n + n^2) u``;
a correct run is 10-100x below ours, a lost pass or a wrong factor far above). Errors are
measured in extended precision against the input itself.
"""

from __future__ import annotations

import hashlib
import sys

import numpy as np
import pytest
from mpqr.backends import ArrayAPIBackend

import mpqr
from tests._qr_support import backward_error, geometric, hp_matmul, orthogonality
from tests._support import to_numpy

U64, U32 = 2.0**-53, 2.0**-24
NAME = "preconditioned-cholqr"
precond = sys.modules.get("mpqr.qr.cholqr_precond") or __import__(
    "importlib").import_module("mpqr.qr.cholqr_precond")


@pytest.fixture(autouse=True)
def _cholqr2_at_every_size(monkeypatch):
    """Small tall inputs would take the library's QR (``geqrf``); these tests are about
    the CholQR route."""
    monkeypatch.setattr(ArrayAPIBackend, "library_qr_tall_max", 0)


@pytest.fixture(autouse=True)
def _no_sketch_rescue(monkeypatch):
    """These tests are about the preconditioned chain ``auto`` continues CholQR2 with; the
    sketch rescue that takes its place on tall 2-D inputs is ``test_qr_sketch.py``'s."""
    from mpqr.qr import driver

    monkeypatch.setattr(driver, "SKETCH_RESCUE", None)


def _events(trace, kind):
    return [e for e in trace.events if e.kind == kind]


def _checksum(x) -> str:
    return hashlib.sha256(np.ascontiguousarray(to_numpy(x)).tobytes()).hexdigest()


def _columnwise_backward(a, q, r) -> float:
    """``max_j ||a_j - Q r_j|| / ||a_j||`` in extended precision (scale-free per column)."""
    a, q, r = (np.asarray(to_numpy(v)) for v in (a, q, r))
    res = np.asarray(a.astype(np.clongdouble if np.iscomplexobj(a) else np.longdouble)
                     - hp_matmul(q, r), dtype=np.complex128 if np.iscomplexobj(a)
                     else np.float64)
    return float(np.max(np.linalg.norm(res, axis=0) / np.linalg.norm(a, axis=0)))


def _complex_geometric(rng, m, n, cond):
    u, _ = np.linalg.qr(rng.standard_normal((m, n)) + 1j * rng.standard_normal((m, n)))
    v, _ = np.linalg.qr(rng.standard_normal((n, n)) + 1j * rng.standard_normal((n, n)))
    return (u * cond ** (-np.arange(n) / (n - 1))) @ v.conj().T


def _check_route(trace, cond, u):
    """The fast route for ``cond``: CholQR2 alone within its reach, else CholQR2's Gram
    matrix continued by the preconditioned CholQR (one Gram pass more), never Householder;
    the explain trace names it and estimates cond(x)."""
    fb = _events(trace, "fallback")
    labels = {g.label for g in trace.gemms}
    assert not any(lb.startswith(("hh", "rec-", "tiled", "householder")) for lb in labels), labels
    if cond**2 * u < 1e-3 or (cond**2 * u < 100 and not fb):  # CholQR2 certified
        assert not fb
        return
    assert [e.data["fallback"] for e in fb] == [NAME]
    assert fb[0].data["method"] == "cholqr2"
    (route,) = _events(trace, "route")
    if cond**2 * u >= 100:  # CholQR2's first Cholesky fails: its Gram matrix goes on
        assert "from CholQR2's Gram matrix" in fb[0].message
        assert len(_events(trace, "gram-reuse")) == 1  # ... and is not computed again
        assert route.data["grams"] == 3  # CholQR2: 2 Gram passes
    est = route.data["cond_estimate"]
    assert cond / 10 <= est <= 10 * cond, est
    assert f"estimated cond(x) = {est:.2e}" in route.message


def _auto(xp, n, cond):
    a = geometric(np.random.default_rng(int(np.log10(cond)) + n), 1000, n, cond)
    x = xp.asarray(a)
    before = _checksum(x)
    with mpqr.explain() as trace:
        q, r = mpqr.qr(x)
    assert _checksum(x) == before
    _check_route(trace, cond, U64)
    if cond > 1e8:
        assert bool(_events(trace, "fused-solve")) == (n <= 32)
    assert orthogonality(q) <= 8 * np.sqrt(n) * U64 / n
    assert backward_error(a, q, r) <= 8 * np.sqrt(n) * U64
    assert np.all(np.diag(to_numpy(r)) > 0)


# n = 16: the fused solves (W = A P^-1 never stored); n = 40: W stored
@pytest.mark.parametrize("n", [16, 40])
@pytest.mark.parametrize("cond", [1.0, 1e4, 1e8, 1e12, 1e15])
def test_auto_is_fast_and_fp64_accurate_up_to_the_precisions_limit(n, cond):
    _auto(np, n, cond)


@pytest.mark.parametrize("n", [16, 40])
def test_fast_route_on_every_backend(xp, n):
    """The same at cond 1e13 on every namespace (read-only inputs, the standard alone)."""
    _auto(xp, n, 1e13)


@pytest.mark.parametrize("n", [16, 40])
@pytest.mark.parametrize("cond", [1.0, 1e12, 1e15])
def test_columns_scaled_by_1e150_take_the_fast_route(n, cond):
    """Columns of ``1e150`` and ``1e-150``: CholQR2's unscaled Gram matrix leaves the range,
    the preconditioned CholQR runs on columns scaled by powers of two, and each column
    is reproduced to working accuracy relative to its own norm."""
    a = geometric(np.random.default_rng(7), 1000, n, cond)
    a = a * np.where(np.arange(n) % 2, 1e150, 1e-150)
    with mpqr.explain() as trace:
        q, r = mpqr.qr(a)
    fb = _events(trace, "fallback")
    assert [e.data["fallback"] for e in fb] == [NAME]
    assert "squared column norm" in fb[0].data["reason"] or "not finite" in fb[0].data["reason"]
    assert _events(trace, "scale") or "scaled" in fb[0].message
    (route,) = _events(trace, "route")
    assert route.data["cond_estimate"] <= 10 * cond  # the scale-free cond(A D^-1)
    assert orthogonality(q) <= 8 * np.sqrt(n) * U64 / n
    assert _columnwise_backward(a, q, r) <= 8 * np.sqrt(n) * U64


def test_moderate_column_scaling_needs_no_data_pass(xp):
    """Columns of ``1e±30``: the Gram matrix is in range, so the shift relative to each
    column's norm (not to ``||A||``) handles the scaling without scaling the data."""
    n = 16
    a = geometric(np.random.default_rng(8), 1000, n, 1e10)
    a = a * np.where(np.arange(n) % 2, 1e30, 1e-30)
    with mpqr.explain() as trace:
        q, r = mpqr.qr(xp.asarray(a))
    (fb,) = _events(trace, "fallback")
    assert fb.data["fallback"] == NAME and "from CholQR2's Gram matrix" in fb.message
    assert not _events(trace, "scale")
    assert orthogonality(q) <= 8 * np.sqrt(n) * U64 / n
    assert _columnwise_backward(a, q, r) <= 8 * np.sqrt(n) * U64


@pytest.mark.parametrize("cond", [1e12, 1e15])
def test_complex_ill_conditioned(cond):
    n = 16
    a = _complex_geometric(np.random.default_rng(9), 1000, n, cond)
    with mpqr.explain() as trace:
        q, r = mpqr.qr(a)
    _check_route(trace, cond, U64)
    assert orthogonality(q) <= 8 * np.sqrt(n) * U64 / n
    assert backward_error(a, q, r) <= 8 * np.sqrt(n) * U64


@pytest.mark.parametrize("cond", [1e5, 1e6])
def test_float32_up_to_its_own_limit(cond):
    """float32: CholQR2 reaches ~1e3, the preconditioned CholQR ``0.5 / u`` ~ 8e6."""
    n = 16
    a = geometric(np.random.default_rng(10), 1000, n, cond).astype(np.float32)
    with mpqr.explain() as trace:
        q, r = mpqr.qr(a)
    _check_route(trace, cond, U32)
    assert to_numpy(q).dtype == np.float32
    assert orthogonality(q) <= 8 * np.sqrt(n) * U32 / n
    assert backward_error(a, q, r) <= 8 * np.sqrt(n) * U32


def _repeated_column():
    a = geometric(np.random.default_rng(11), 1000, 16, 100.0)
    a[:, 5] = a[:, 3]
    return a


@pytest.mark.parametrize("case", ["cond1e18", "repeated", "float32-1e9"])
def test_numerically_rank_deficient_falls_back_and_says_so(case):
    """Beyond ``u^-1`` no route determines Q to working accuracy: the preconditioned CholQR
    says "numerically rank-deficient" in the trace and Householder factors the input,
    still orthonormal and backward stable (never silently wrong)."""
    if case == "repeated":
        a, u = _repeated_column(), U64
    elif case == "cond1e18":
        a, u = geometric(np.random.default_rng(12), 1000, 16, 1e18), U64
    else:
        a, u = geometric(np.random.default_rng(12), 1000, 16, 1e9).astype(np.float32), U32
    with mpqr.explain() as trace:
        q, r = mpqr.qr(a)
    fb = _events(trace, "fallback")
    assert [e.data["fallback"] for e in fb] == [NAME, "householder-tiled"]
    assert "numerically rank-deficient" in fb[1].data["reason"]
    assert fb[1].data["cond_estimate"] * u >= precond.RANK_DEFICIENT
    assert not _events(trace, "route")
    assert orthogonality(q) <= 8 * np.sqrt(16) * u / 16
    assert backward_error(a, q, r) <= 8 * np.sqrt(16) * u


def test_rank_deficiency_is_found_within_two_gram_passes():
    """The repeated column is caught from the preconditioner's own condition estimate
    after its second pass, not after the pass limit."""
    with mpqr.explain() as trace, pytest.raises(
            mpqr.BreakdownError, match=r"^preconditioned-cholqr broke down: x is numerically "
            r"rank-deficient \(estimated cond\(x\) (= |>= )\d\.\d\de\+\d\d with its columns "
            r"scaled to unit norm; 0\.5/u = 4\.5e\+15"):
        mpqr.qr(_repeated_column(), method=NAME)
    assert len(_events(trace, "precondition")) <= 2


def test_named_method_refuses_nan():
    a = geometric(np.random.default_rng(13), 500, 8, 10.0)
    a[7, 2] = np.nan
    with pytest.raises(mpqr.BreakdownError, match="preconditioned-cholqr broke down: the "
                       r"Gram matrix x\^H x is not finite"):
        mpqr.qr(a, method=NAME, check_finite=False)


@pytest.mark.parametrize("n", [16, 40])
def test_named_method_mode_r_gives_the_same_r(xp, n):
    a = geometric(np.random.default_rng(14), 1000, n, 1e13)
    r_only = mpqr.qr(xp.asarray(a), mode="r", method=NAME)
    q, r = mpqr.qr(xp.asarray(a), method=NAME)
    np.testing.assert_array_equal(to_numpy(r_only), to_numpy(r))
    assert orthogonality(q) <= 8 * np.sqrt(n) * U64 / n


def test_stack_with_mixed_conditioning():
    """A stack: every pass is one product over the whole stack; each matrix gets its own
    plain or shifted factor."""
    rng = np.random.default_rng(15)
    a = np.stack([geometric(rng, 400, 12, c) for c in (10.0, 1e13, 1e6)])
    with mpqr.explain() as trace:
        q, r = mpqr.qr(a, method=NAME)
    assert [e.data["gram_pass"] for e in _events(trace, "precondition")] == [1, 2]
    assert orthogonality(q) <= 8 * np.sqrt(12) * U64 / 12
    assert backward_error(a, q, r) <= 8 * np.sqrt(12) * U64


def test_condition_estimate_against_the_svd():
    rng = np.random.default_rng(16)
    be = mpqr.backends.get_backend(mpqr._array_api.array_namespace(np.zeros(1)))
    for cond in (1.0, 1e3, 1e9, 1e14):
        r = np.linalg.qr(geometric(rng, 300, 20, cond))[1]
        rn = r / np.linalg.norm(r, axis=0)
        ref = np.linalg.cond(rn)
        est = float(precond.estimate_cond(be, r))
        assert ref / 1.5 <= est <= ref * (1 + 1e-6)  # a lower bound, close to the SVD's
    r = np.triu(rng.standard_normal((5, 5)))
    r[2, 2] = 0.0
    assert float(precond.estimate_cond(be, r)) == np.inf


@pytest.mark.parametrize("cond", [1e12])
def test_lstsq_takes_the_fast_route(cond):
    """The lstsq QR route continues from its declined Gram matrix through CholQR2 into the
    preconditioned CholQR (one Gram product over A for all three), then refines; the
    normal-equation residual is as small as SciPy's."""
    import scipy.linalg as sl

    rng = np.random.default_rng(17)
    m, n = 1000, 32
    a = geometric(rng, m, n, cond)
    b = rng.standard_normal(m)
    with mpqr.explain() as trace:
        x, _res, rank, _s = mpqr.lstsq(a, b)
    assert rank == n
    fb = _events(trace, "fallback")
    assert [e.data.get("fallback") for e in fb] == [NAME]
    assert len(_events(trace, "route")) == 1 and _events(trace, "refine")
    grams = [g.label for g in trace.gemms if g.label.endswith("gram")]
    assert len([lb for lb in grams if not lb.startswith(NAME)]) == 1  # the one Gram of A

    def ne(x):
        return np.linalg.norm(a.T @ (b - a @ x)) / (np.linalg.norm(a, 2) ** 2
                                                    * np.linalg.norm(x))

    assert ne(x) <= max(2 * ne(sl.lstsq(a, b)[0]), 4 * np.sqrt(n) * U64)


def test_lstsq_within_rounding_of_the_cutoff_solves_by_the_svd():
    """At cond 1e15 (n = 32) R's smallest singular value lies within the factorization's
    rounding (10 sqrt(n) u ||A||) of the default cutoff: R may be exactly singular, so no
    triangular solve or preconditioned refinement; the SVD of R gives SciPy's answer."""
    import scipy.linalg as sl

    rng = np.random.default_rng(17)
    m, n = 1000, 32
    a = geometric(rng, m, n, 1e15)
    b = rng.standard_normal(m)
    with mpqr.explain() as trace:
        x, _res, rank, _s = mpqr.lstsq(a, b)
    xs, _, rank_s, _ = sl.lstsq(a, b)
    assert rank == rank_s == n
    assert any("SVD" in e.message for e in _events(trace, "fallback"))
    assert not _events(trace, "refine")
    # both solve the same ill-conditioned problem: agreement to u cond(A) (the
    # perturbation bound of the solution), the residual norms to working precision
    assert np.linalg.norm(x - xs) <= 1e15 * 10 * np.sqrt(n) * U64 * np.linalg.norm(xs)
    assert np.linalg.norm(b - a @ x) <= (1 + 1e-10) * np.linalg.norm(b - a @ xs)


def test_cholqr2_breakdown_hands_on_its_gram_matrix_but_does_not_pickle_it():
    """The error of a failed first CholQR2 pass carries the input and its Gram matrix for
    ``qr``'s next route; pickled (across processes) it leaves them behind."""
    import pickle

    a = geometric(np.random.default_rng(18), 500, 8, 1e12)
    with pytest.raises(mpqr.BreakdownError) as info:
        mpqr.qr(a, method="cholqr2")
    x, _sb, g = info.value.first_gram
    assert x.shape == a.shape and g.shape == (8, 8)
    np.testing.assert_allclose(g, a.T @ a, rtol=0, atol=64 * U64 * np.linalg.norm(a) ** 2)
    back = pickle.loads(pickle.dumps(info.value))
    assert not hasattr(back, "first_gram") and back.method == "cholqr2"
    assert str(back) == str(info.value)


# cond(A) just past CholQR2's reach, where its first Cholesky succeeds and its second Gram
# matrix may miss the certificate (which cases do depends on the BLAS's rounding, so a few
# are tried; n = 16: W fused, 40: stored, 70: stored, R^-1 by GEMM)
@pytest.mark.parametrize(("n", "m"), [(16, 1000), (40, 2000), (70, 2000)])
def test_uncertified_cholqr2_is_continued_not_restarted(n, m):
    """CholQR2's first factor and second Gram matrix go on into the preconditioned CholQR:
    three Gram products over A in all (a restart would take five), FP64 accuracy."""
    handed = 0
    for cond in (10**8.3, 10**8.4, 10**8.44, 10**8.48):
        for seed in (0, 1, 2, 3):
            a = geometric(np.random.default_rng(seed), m, n, cond)
            before = _checksum(a)
            with mpqr.explain() as trace:
                q, r = mpqr.qr(a)
            assert _checksum(a) == before
            assert orthogonality(q) <= 8 * np.sqrt(n) * U64 / n
            assert backward_error(a, q, r) <= 8 * np.sqrt(n) * U64
            assert np.all(np.diag(r) > 0)
            fb = _events(trace, "fallback")
            if not fb or "first factor" not in fb[0].message:
                continue
            handed += 1
            (fb,) = fb
            assert "from CholQR2's first factor and second Gram matrix" in fb.message
            assert any("continues from CholQR2's first factor" in e.message
                       for e in _events(trace, "gram-reuse"))
            assert sum(g.label.endswith("gram") for g in trace.gemms) == 3
            (route,) = _events(trace, "route")
            assert route.data["grams"] == 3
            assert cond / 10 <= route.data["cond_estimate"] <= 10 * cond
    assert handed >= 2  # 1 to 8 of the first 8 hand over, by the BLAS build (2-core CPU)


def test_uncertified_cholqr2_hands_on_its_chain_but_does_not_pickle_it():
    import pickle

    for seed in range(20):
        a = geometric(np.random.default_rng(seed), 1000, 16, 10**8.48)
        with pytest.raises(mpqr.BreakdownError) as info:
            mpqr.qr(a, method="cholqr2")
        if hasattr(info.value, "chain"):
            break
    x, _sb, g, factors, w = info.value.chain
    assert x is a and g.shape == (16, 16) and len(factors) == 1 and w is None
    # g is the Gram matrix of a R1^-1: close to I, but not within the certificate's 1/2
    w1 = np.linalg.solve(np.asarray(factors[0]).T, a.T).T
    np.testing.assert_allclose(g, w1.T @ w1, rtol=0, atol=1e-6)
    assert np.linalg.norm(g - np.eye(16)) > 0.5
    back = pickle.loads(pickle.dumps(info.value))
    assert not hasattr(back, "chain") and not hasattr(back, "certify_gram")
    assert str(back) == str(info.value)


def test_condition_estimate_by_power_iteration_past_the_svd_width():
    """Past ``_SVD_MAX_N`` columns the estimate is the power iterations' lower bound."""
    rng = np.random.default_rng(19)
    be = mpqr.backends.get_backend(mpqr._array_api.array_namespace(np.zeros(1)))
    n = precond._SVD_MAX_N + 16
    for cond in (1.0, 1e6, 1e13):
        r = np.linalg.qr(geometric(rng, 4 * n, n, cond))[1]
        ref = np.linalg.cond(r / np.linalg.norm(r, axis=0))
        est = float(precond.estimate_cond(be, r))
        assert ref / 1.5 <= est <= ref * (1 + 1e-6)


def test_wide_chain_moves_its_steps_to_the_host(xp):
    """160 columns: on a GPU, CholQR2's Gram matrix stays on the device (past the host's
    n x n limit) and the preconditioned chain moves it and its factors to the host
    (``precondition_small_max``); every backend gives the FP64-accurate factorization."""
    n = 160
    a = geometric(np.random.default_rng(21), 16 * n + 40, n, 1e12)
    with mpqr.explain() as trace:
        q, r = mpqr.qr(xp.asarray(a))
    (route,) = _events(trace, "route")
    assert route.data["grams"] == 3 and 1e11 <= route.data["cond_estimate"] <= 1e13
    assert orthogonality(to_numpy(q)) <= 8 * np.sqrt(n) * U64 / n
    assert backward_error(a, to_numpy(q), to_numpy(r)) <= 8 * np.sqrt(n) * U64
    assert np.all(np.diag(to_numpy(r)) > 0)


@pytest.mark.parametrize("cond", [1e12, 10**8.48])
def test_chain_takes_device_steps_to_the_host(monkeypatch, cond):
    """A backend whose n x n steps stay on the device past ``small``'s own limit, with a
    larger ``precondition_small_max`` (as on CuPy): the chain moves CholQR2's Gram matrix
    and factors over and continues there. Emulated with array-api-strict as the device
    and NumPy as the host: the same factorization as without the move."""
    import array_api_strict as xs
    from mpqr.backends import get_backend

    strict = get_backend(xs)
    host = get_backend(mpqr._array_api.array_namespace(np.zeros(1)))
    for seed in range(8):  # at 10^8.48: a matrix whose CholQR2 hands its chain over
        a = geometric(np.random.default_rng(seed), 1500, 24, cond)
        with mpqr.explain() as trace:
            q0, r0 = mpqr.qr(xs.asarray(a))
        if cond > 1e10 or any("first factor" in e.message for e in _events(trace, "fallback")):
            break
    moved = []

    def small(x, limit=None):
        if x.size > (16 * 16 if limit is None else limit):
            return strict, x
        moved.append(limit)
        return host, np.asarray(x)

    monkeypatch.setattr(strict, "small", small)
    monkeypatch.setattr(strict, "from_small", lambda x, like: xs.asarray(x))
    monkeypatch.setattr(strict, "precondition_small_max", 64 * 64)
    with mpqr.explain() as trace:
        q1, r1 = mpqr.qr(xs.asarray(a))
    assert moved and all(lim == 64 * 64 for lim in moved)
    assert type(q1) is type(q0) and type(r1) is type(r0)
    (fb,) = _events(trace, "fallback")
    assert ("first factor" in fb.message) == (cond < 1e10)  # the handed-over factor moved
    (route,) = _events(trace, "route")
    assert route.data["grams"] == 3
    np.testing.assert_allclose(to_numpy(r1), to_numpy(r0), rtol=0,
                               atol=64 * U64 * np.linalg.norm(a))
    assert orthogonality(to_numpy(q1)) <= 8 * np.sqrt(24) * U64 / 24
    assert backward_error(a, to_numpy(q1), to_numpy(r1)) <= 8 * np.sqrt(24) * U64
