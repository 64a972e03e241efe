"""lstsq and compat: parts of the SciPy/NumPy contract the other test files leave out.

* mpqr.lstsq's own positional signature is SciPy's (only the compat front end
  was compared);
* rank-deficient problems on float32 and complex, over-, under- and exactly
  determined (only float64 was compared with SciPy);
* refinement from a *really* low-precision R: the other refinement tests use
  at most 24 columns, one panel, which the panel QR factors at the working
  precision (their trace shows no tensor-core engine at all); 64+ columns run
  the trailing updates on the fp16 engines, so CGLS/IR have work to do;
* the iteration cap, and the warning of refine="ir";
* compat: qr's lwork/overwrite_a accepted, NumPy's residuals rule for rank
  deficiency, and patch() blocks of two threads overlapping.
"""

from __future__ import annotations

import inspect
import threading
import warnings

import mpqr.compat.numpy as mcn
import mpqr.compat.scipy as mcs
import numpy as np
import pytest
import scipy.linalg
import scipy.linalg as sla
from mpqr.compat import _patch

import mpqr
from tests._support import assert_rank_deficient_residues, to_numpy
from tests._support import conditioned_lstsq_problem as _problem
from tests._support import normal_equation_residual as _metric

EPS64 = np.finfo(np.float64).eps
#: unit roundoff of each factorization precision (mpqr.lstsq.solver.UNIT)
UNIT = {"fp16": 2.0**-11, "fp32-emulated": 2.0**-24}


def _events(trace, kind):
    return [e for e in trace.events if e.kind == kind]


def _low_precision_engines(trace):
    """Engines of the trace that are not the native (working-precision) GEMMs."""
    return {e for e in trace.engines() if not e.startswith("native")}



@pytest.fixture
def tensor_core_qr(monkeypatch, xp):
    """Small matrices at fp16/fp32-emulated on a GPU go to the library's QR in their
    own precision (``library_qr_square_max``): switched off, so that the low-precision
    factorization these tests are about runs on every backend."""
    from mpqr._array_api import array_namespace

    backend = mpqr.backends.get_backend(array_namespace(xp.zeros(1)))
    monkeypatch.setattr(type(backend), "library_qr_square_max", 0)
    monkeypatch.setattr(type(backend), "library_qr_square_max_by_precision", {})



# --- 1. SciPy's contract --------------------------------------------------------------


def test_lstsq_positional_signature_is_scipys():
    ours = inspect.signature(mpqr.lstsq).parameters
    theirs = inspect.signature(_patch.original("lstsq")).parameters
    pos = [p for p in ours.values() if p.kind is not inspect.Parameter.KEYWORD_ONLY]
    assert [p.name for p in pos] == list(theirs)
    assert [p.default for p in pos] == [p.default for p in theirs.values()]
    extra = {p.name: p.default for p in ours.values() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert {"precision", "refine"} <= set(extra) and extra["refine"] == "auto"
    # all seven positionally, as a SciPy caller writes them
    rng = np.random.default_rng(20)
    a, b = rng.standard_normal((9, 4)), rng.standard_normal(9)
    args = (None, True, True, False, "gelss")
    x, res, rank, s = mpqr.lstsq(a, b, *args)
    xs, ress, ranks, ss = sla.lstsq(a.copy(), b.copy(), *args)
    tol = 25 * EPS64 * ss[0] / ss[-1]
    np.testing.assert_allclose(x, xs, rtol=tol, atol=tol * np.abs(xs).max())
    np.testing.assert_allclose(res, ress, rtol=tol)
    assert rank == ranks
    np.testing.assert_allclose(s, ss, rtol=0, atol=25 * EPS64 * ss[0])


def _rand(rng, shape, dtype):
    x = rng.standard_normal(shape)
    if np.issubdtype(dtype, np.complexfloating):
        x = x + 1j * rng.standard_normal(shape)
    return x


@pytest.mark.parametrize("dtype", [np.float32, np.complex64, np.complex128])
@pytest.mark.parametrize("m,n", [(15, 6), (6, 15), (8, 8)])
@pytest.mark.parametrize("nrhs", [None, 2])
def test_rank_deficient_like_scipy_float32_and_complex(xp, dtype, m, n, nrhs):
    rng = np.random.default_rng(m * 100 + n + (nrhs or 0))
    a = (_rand(rng, (m, 3), dtype) @ _rand(rng, (3, n), dtype)).astype(dtype)  # rank 3
    b = _rand(rng, (m,) if nrhs is None else (m, nrhs), dtype).astype(dtype)
    # the rounding of the rank-3 product leaves singular values near eps * s[0]:
    # a cutoff well above them and well below s[2] makes the rank unambiguous
    cond = 1e-4 if np.finfo(dtype).eps > 1e-10 else 1e-10
    xs, ress, ranks, ss = sla.lstsq(a, b, cond=cond)
    x, res, rank, s = mpqr.lstsq(xp.asarray(a), xp.asarray(b), cond=cond)
    assert rank == ranks == 3 and (type(rank) is type(ranks) if isinstance(x, np.ndarray)
                                   else isinstance(rank, int))
    x, res, s = to_numpy(x), to_numpy(res), to_numpy(s)
    # residues: empty (not 0-D) with x's dtype for rank < N up to SciPy 1.17; NaN in the
    # full-rank shape from SciPy 1.18 on (the GPU machine's SciPy)
    if m > n:
        assert_rank_deficient_residues(res, ress)
    else:
        assert res.shape == ress.shape == (0,)
    if ress.shape == (0,):
        assert res.dtype == ress.dtype
    eps = np.finfo(dtype).eps
    tol = 25 * eps * ss[0] / ss[2]
    assert x.dtype == xs.dtype and x.shape == xs.shape
    np.testing.assert_allclose(x, xs, rtol=tol, atol=tol * np.abs(xs).max())
    assert s.dtype == ss.dtype and s.shape == ss.shape
    np.testing.assert_allclose(s, ss, rtol=0, atol=25 * eps * ss[0])


# --- 2. refinement from a low-precision R -----------------------------------------------


@pytest.mark.parametrize("precision", ["fp32-emulated", "fp16"])
@pytest.mark.parametrize("kappa", [1e1, 1e2, 1e4, 1e6, 1e8])
@pytest.mark.skip_xp_backend("array_api_strict", reason="no float16 GEMM engine in array-api-strict")
def test_auto_refine_with_a_really_low_precision_factorization(xp, tensor_core_qr, precision, kappa):
    m, n = 400, 64  # two panels: the trailing update runs on the low-precision engine
    a, b = _problem(m, n, kappa, seed=30 + int(np.log10(kappa)))
    xs = sla.lstsq(a, b)[0]
    with mpqr.explain() as trace, warnings.catch_warnings():
        warnings.simplefilter("error", mpqr.RefinementWarning)
        x = to_numpy(mpqr.lstsq(xp.asarray(a), xp.asarray(b), precision=precision)[0])
    assert _low_precision_engines(trace), f"no {precision} GEMM ran: {trace.engines()}"
    assert _metric(a, b, x) <= 10 * _metric(a, b, xs)
    resolved = 10 * np.sqrt(n) * UNIT[precision]
    if 1 / kappa > 2 * resolved:
        # CGLS on the low-precision R: it needs more than the one step an R
        # accurate to working precision takes (that is what a 24-column run shows)
        ev = _events(trace, "refine")
        assert ev and ev[0].data["converged"] and 2 <= ev[0].data["iterations"] <= 12
        assert ev[0].data["precision"] == precision
        assert not _events(trace, "fallback")
    elif 1 / kappa < resolved:
        assert _events(trace, "fallback")


@pytest.mark.parametrize("precision", ["fp32-emulated", "fp16"])
@pytest.mark.parametrize("method", ["cgls", "ir"])
@pytest.mark.parametrize("shape", [(400, 64), (64, 400)])
@pytest.mark.skip_xp_backend("array_api_strict", reason="no float16 GEMM engine in array-api-strict")
def test_explicit_methods_refine_a_low_precision_r(xp, tensor_core_qr, precision, method, shape):
    m, n = shape
    a, _ = _problem(max(shape), min(shape), 10.0, seed=21)
    if m < n:  # underdetermined: A^H = Q R is what is factored
        a = np.ascontiguousarray(a.T)
    b = np.random.default_rng(1).standard_normal((m, 2))
    xs, ress, ranks, ss = sla.lstsq(a, b)
    with mpqr.explain() as trace, warnings.catch_warnings():
        warnings.simplefilter("error", mpqr.RefinementWarning)
        x, res, rank, _s = mpqr.lstsq(xp.asarray(a), xp.asarray(b), precision=precision,
                                      refine=method)
    assert _low_precision_engines(trace), f"no {precision} GEMM ran: {trace.engines()}"
    ev = _events(trace, "refine")
    assert len(ev) == 1 and ev[0].data["method"] == method and ev[0].data["converged"]
    assert ev[0].data["iterations"] >= 2 and not _events(trace, "fallback")
    assert rank == ranks == min(shape)
    kappa = ss[0] / ss[-1]
    tol = 25 * EPS64 * kappa**2
    np.testing.assert_allclose(to_numpy(x), xs, rtol=tol, atol=tol * np.abs(xs).max())
    if m > n:
        np.testing.assert_allclose(to_numpy(res), ress, rtol=tol)
    else:  # the minimum-norm solution of a consistent system: no residues
        assert to_numpy(res).shape == (0,)


@pytest.mark.parametrize("method", ["cgls", "ir"])
def test_iteration_cap_warns_and_returns_a_good_iterate(method):
    # fp32-emulated, kappa 100: uncapped, a strict tol=1e-30 runs 6 steps to the stall
    a, b = _problem(400, 64, 1e2, seed=4)
    with mpqr.explain() as trace, pytest.warns(
            mpqr.RefinementWarning,
            match=rf"lstsq: {method} did not reach tol=1\.00e-30 in [0-3] iterations"):
        x = mpqr.lstsq(a, b, precision="fp32-emulated", refine=method, tol=1e-30, maxiter=3)[0]
    ev = _events(trace, "refine")
    assert len(ev) == 1 and ev[0].data["iterations"] <= 3 and not ev[0].data["converged"]
    assert not _events(trace, "fallback")  # only refine="auto" falls back
    assert _metric(a, b, x) <= 10 * _metric(a, b, sla.lstsq(a, b)[0])


# --- 3. compat --------------------------------------------------------------------------


@pytest.mark.parametrize("lwork", [None, -1, 64])
@pytest.mark.parametrize("mode", ["full", "economic", "r"])
def test_compat_qr_accepts_lwork_and_overwrite_a(lwork, mode):
    a0 = np.random.default_rng(22).standard_normal((7, 4))
    a = a0.copy()
    out = mcs.qr(a, False, lwork, mode)  # SciPy's positional order
    ref = sla.qr(a0.copy(), False, lwork, mode)
    np.testing.assert_array_equal(a, a0)  # overwrite_a=False: untouched
    assert [o.shape for o in out] == [r.shape for r in ref]
    tol = 25 * EPS64 * 7
    np.testing.assert_allclose(np.abs(out[-1]), np.abs(ref[-1]), rtol=tol, atol=tol)
    # overwrite_a=True may use a as workspace, but the factorization is of the input
    af = np.asfortranarray(a0)
    out = mcs.qr(af, overwrite_a=True, lwork=lwork, mode=mode)
    np.testing.assert_allclose(np.abs(out[-1]), np.abs(ref[-1]), rtol=tol, atol=tol)
    if mode != "r":
        np.testing.assert_allclose(out[0] @ out[1], a0, atol=tol * np.abs(a0).max())


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex128])
@pytest.mark.parametrize("k", [None, 2])
def test_compat_numpy_rank_deficient_residuals_empty(dtype, k):
    rng = np.random.default_rng(23)
    a = rng.integers(-5, 6, (20, 5)).astype(dtype)
    a[:, 4] = a[:, 0] + a[:, 1]  # exact in every dtype: rank 4 < N
    b = rng.standard_normal((20,) if k is None else (20, k)).astype(dtype)
    x, res, rank, s = mcn.lstsq(a, b)
    xr, resr, rankr, sr = np.linalg.lstsq(a, b)
    assert rank == rankr == 4
    assert res.shape == resr.shape == (0,) and res.dtype == resr.dtype
    assert x.dtype == xr.dtype and s.dtype == sr.dtype
    eps = np.finfo(xr.dtype).eps
    tol = 25 * eps * sr[0] / sr[3]
    np.testing.assert_allclose(x, xr, rtol=tol, atol=tol * np.abs(xr).max())
    np.testing.assert_allclose(s, sr, rtol=0, atol=25 * eps * sr[0])


def test_patch_overlapping_threads_keep_their_own_precision():
    # T1 enters with fp16, T2 with the default; T1 leaves while T2 is inside:
    # T2 must still be routed (counted install) and see its own precision
    rng = np.random.default_rng(24)
    a, b = rng.standard_normal((40, 6)), rng.standard_normal(40)
    want = sla.lstsq(a, b)[0]
    both_inside = threading.Barrier(2, timeout=30)
    t1_left = threading.Event()
    seen, errors = {}, []

    def t1():
        try:
            with mcs.patch(precision="fp16"):
                both_inside.wait()
                seen["t1"] = (_patch.current_precision(), scipy.linalg.lstsq is mcs.lstsq)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            t1_left.set()

    def t2():
        try:
            with mcs.patch():
                both_inside.wait()
                assert t1_left.wait(timeout=30)
                seen["t2"] = (_patch.current_precision(), scipy.linalg.lstsq is mcs.lstsq)
                with mpqr.explain() as trace:
                    x = scipy.linalg.lstsq(a, b)[0]
                seen["t2-ran"] = any(e.message.startswith("lstsq") for e in trace.events)
                np.testing.assert_allclose(x, want, rtol=1e-11)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=t1), threading.Thread(target=t2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert seen == {"t1": ("fp16", True), "t2": (None, True), "t2-ran": True}
    assert not _patch.is_patched() and scipy.linalg.lstsq is _patch.original("lstsq")


def test_patch_restores_bindings_made_inside_the_block():
    # a module first imported inside the block binds mpqr's front end; on exit it gets
    # SciPy's back, while a module loaded before that chose mpqr's front end keeps it
    import sys
    import types

    chose = types.ModuleType("_mpqr_test_chose_front_end")
    exec("from mpqr.compat.scipy import lstsq", chose.__dict__)
    late = types.ModuleType("_mpqr_test_imported_inside")
    sys.modules[chose.__name__] = chose
    try:
        with mcs.patch():
            exec("from scipy.linalg import lstsq, qr", late.__dict__)
            sys.modules[late.__name__] = late
            assert late.lstsq is mcs.lstsq and late.qr is mcs.qr
        assert late.lstsq is _patch.original("lstsq") and late.qr is _patch.original("qr")
        assert chose.lstsq is mcs.lstsq
    finally:
        sys.modules.pop(late.__name__, None)
        sys.modules.pop(chose.__name__, None)


@pytest.mark.parametrize("method", ["cgls", "ir"])
@pytest.mark.skip_xp_backend("array_api_strict", reason="no float16 GEMM engine in array-api-strict")
def test_explicit_refine_overridden_by_an_uncertain_rank_warns(xp, tensor_core_qr, method):
    # fp16 resolves singular values to ~10 sqrt(n) 2^-11 ||A|| = 0.039 ||A|| at n = 64:
    # at cond 100 the rank is uncertain, so the named refinement cannot run
    a, b = _problem(400, 64, 1e2, seed=8)
    with mpqr.explain() as trace, pytest.warns(
            mpqr.RefinementWarning,
            match=rf"^lstsq: refine='{method}' was not run: rank uncertain at precision "
                  r"'fp16': .* refactored at the working precision and solved directly"):
        x = to_numpy(mpqr.lstsq(xp.asarray(a), xp.asarray(b), precision="fp16",
                                refine=method)[0])
    assert _events(trace, "fallback") and not _events(trace, "refine")
    assert _metric(a, b, x) <= 10 * _metric(a, b, sla.lstsq(a, b)[0])


@pytest.mark.parametrize("scipy_version, nan", [("1.17.1", False), ("1.18.0", True),
                                                ("1.18.1", True), ("2.0.0rc1", True),
                                                ("1.9.3", False)])
def test_residues_rule_follows_the_installed_scipy(monkeypatch, scipy_version, nan):
    from importlib import metadata

    from mpqr.lstsq import _scipy_rules as rules

    monkeypatch.setattr(metadata, "version", lambda name: scipy_version)
    rules.nan_residues_when_rank_deficient.cache_clear()
    try:
        assert rules.nan_residues_when_rank_deficient() is nan
    finally:
        monkeypatch.undo()
        rules.nan_residues_when_rank_deficient.cache_clear()


@pytest.mark.parametrize("nan", [False, True])
@pytest.mark.parametrize("driver", ["gelsd", "gelss", "gelsy"])
@pytest.mark.parametrize("k", [None, 3])
def test_rank_deficient_residues_under_either_rule(xp, monkeypatch, nan, driver, k):
    """Both SciPy rules on every machine: empty residues (<= 1.17), or NaN in the
    full-rank shape (>= 1.18; never for gelsy, never for M <= N)."""
    from mpqr.lstsq import _scipy_rules as rules

    monkeypatch.setattr(rules, "nan_residues_when_rank_deficient", lambda: nan)
    rng = np.random.default_rng(31)
    a = rng.standard_normal((12, 2)) @ rng.standard_normal((2, 5))  # rank 2 < N = 5
    b = rng.standard_normal((12,) if k is None else (12, k))
    # a cutoff far above the rounding of the rank-2 product: the rank is unambiguous
    x, res, rank, _s = mpqr.lstsq(xp.asarray(a), xp.asarray(b), cond=1e-10,
                                  lapack_driver=driver)
    res = to_numpy(res)
    assert rank == 2
    if nan and driver != "gelsy":
        assert res.shape == (() if k is None else (k,)) and np.isnan(res).all()
    else:
        assert res.shape == (0,)
    # an underdetermined problem keeps empty residues under both rules
    res_u = to_numpy(mpqr.lstsq(xp.asarray(a.T), xp.asarray(b[:5]), cond=1e-10,
                                lapack_driver=driver)[1])
    assert res_u.shape == (0,)
    xs = sla.lstsq(a, b, cond=1e-10, lapack_driver=driver)[0]
    tol = 25 * EPS64 * 1e3
    np.testing.assert_allclose(to_numpy(x), xs, rtol=tol, atol=tol * np.abs(xs).max())


@pytest.mark.parametrize("new", [False, True])
def test_complex_residues_and_rank_type_under_either_scipy_rule(xp, monkeypatch, new):
    """SciPy <= 1.17: full-rank complex residues real, rank a Python int; SciPy >= 1.18:
    residues in x's dtype (complex) and rank a NumPy integer (compat front end)."""
    from mpqr.compat import scipy as mcs

    from mpqr.lstsq import _scipy_rules as rules

    monkeypatch.setattr(rules, "scipy_1_18_results", lambda: new)
    rng = np.random.default_rng(32)
    a = rng.standard_normal((9, 3)) + 1j * rng.standard_normal((9, 3))
    b = rng.standard_normal((9, 2)) + 1j * rng.standard_normal((9, 2))
    _x, res, rank, _s = mpqr.lstsq(xp.asarray(a), xp.asarray(b))
    want = np.complex128 if new else np.float64
    res = np.asarray(to_numpy(res))
    assert res.dtype == want and res.shape == (2,)
    ref = np.sum(np.abs(b - a @ sla.lstsq(a, b)[0]) ** 2, axis=0)
    np.testing.assert_allclose(res.real, ref, rtol=100 * 9 * 2.0**-53)
    assert np.all(res.imag == 0)
    _x2, res2, rank2, _ = mcs.lstsq(a, b)
    assert type(rank2) is (np.int64 if new else int) and rank2 == rank == 3
    assert np.asarray(res2).dtype == want


@pytest.mark.parametrize("new", [False, True])
def test_lstsq_rank_type_follows_the_installed_scipy(monkeypatch, new):
    """``mpqr.lstsq`` itself gives NumPy input's rank as the installed SciPy does: a NumPy
    int64 under SciPy >= 1.18 (small and general routes), a Python int before and for an
    empty ``a``; batched ranks stay arrays. Checked against SciPy where its rule is the
    installed one."""
    from mpqr.lstsq import _scipy_rules as rules

    monkeypatch.setattr(rules, "scipy_1_18_results", lambda: new)
    rng = np.random.default_rng(33)
    want = np.int64 if new else int
    for shape in ((9, 3), (3000, 40)):  # the small-input path and the general route
        a, b = rng.standard_normal(shape), rng.standard_normal(shape[0])
        rank = mpqr.lstsq(a, b)[2]
        assert type(rank) is want and rank == shape[1]
        if new == rules.nan_residues_when_rank_deficient():  # the installed SciPy's rule
            assert type(rank) is type(sla.lstsq(a, b)[2])
    from mpqr import _fast

    a, b = rng.standard_normal((600, 8)), rng.standard_normal(600)  # its augmented QR
    fast = _fast.lstsq(a, b, None, True, None, precision=None, refine="auto", tol=None,
                       maxiter=None)
    assert fast is not _fast.MISS and type(fast[2]) is want and fast[2] == 8
    assert type(mpqr.lstsq(np.zeros((0, 3)), np.zeros(0))[2]) is int
    ranks = mpqr.lstsq(rng.standard_normal((2, 9, 3)), rng.standard_normal((2, 9, 1)))[2]
    assert not isinstance(ranks, (int, np.integer)) and np.asarray(ranks).tolist() == [3, 3]


@pytest.mark.parametrize("new", [False, True])
def test_lstsq_dtype_follows_the_installed_scipy(monkeypatch, new):
    """SciPy <= 1.17 solves in LAPACK's pick of the inputs' dtypes (small integers and bool
    in float32); SciPy >= 1.18 first casts them to their common type, integers and bool to
    float64 (``_ensure_dtype_cdsz``), also for an empty problem (bool then no longer
    refused). Checked against SciPy itself where its rule is the installed one."""
    from mpqr.lstsq import _scipy_rules as rules

    monkeypatch.setattr(rules, "scipy_1_18_results", lambda: new)
    a0 = np.arange(12).reshape(4, 3) % 5 + np.eye(4, 3) * 3
    small = np.float64 if new else np.float32
    cases = [((np.int8, np.int8), small), ((np.bool_, np.bool_), small),
             ((np.uint8, np.int16), small), ((np.float16, np.float16), np.float32),
             ((np.float32, np.int8), np.float32), ((np.complex64, np.int8), np.complex64),
             ((np.float32, np.int32), np.float64), ((np.int64, np.int64), np.float64)]
    installed = new == rules.nan_residues_when_rank_deficient()
    for (ta, tb), want in cases:
        a, b = a0.astype(ta), (np.arange(4) % 2).astype(tb)
        x, res, rank, s = mpqr.lstsq(a, b)
        assert x.dtype == want and rank == 3, (ta, tb, x.dtype, rank)
        if installed:
            ref = sla.lstsq(a, b)
            assert x.dtype == ref[0].dtype and s.dtype == ref[3].dtype
            assert np.asarray(res).dtype == np.asarray(ref[1]).dtype
            np.testing.assert_allclose(x, ref[0], rtol=1e-4, atol=1e-4)
    # empty: x in the solving dtype from 1.18 on (float16 -> float32), numpy.common_type before
    for ta, want in ((np.float16, np.float32 if new else np.float16),
                     (np.int8, np.float64)):
        x, res, _, _ = mpqr.lstsq(np.zeros((3, 0), dtype=ta), np.ones(3, dtype=ta))
        assert x.dtype == want and x.shape == (0,)
        assert float(res) == pytest.approx(3.0, rel=4 * 2.0**-11)  # float16 rounding
    if new:
        x = mpqr.lstsq(np.zeros((0, 2), dtype=np.bool_), np.zeros(0, dtype=np.bool_))[0]
        assert x.dtype == np.float64 and x.shape == (2,)
    else:
        with pytest.raises(TypeError, match="can't get common type for non-numeric array"):
            mpqr.lstsq(np.zeros((0, 2), dtype=np.bool_), np.zeros(0, dtype=np.bool_))
