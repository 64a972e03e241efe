"""Certified panels: CholQR2 with float64 Gram matrices and the reconstruction of the
reflectors (``backend.certified_panel``; ``kernels/panel_cholqr.cu`` on CuPy), the leaves of
``householder-recursive`` made of them, the certificate read once per factorization and the
second factorization with ``geqrf`` panels when it fails."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
from mpqr.backends import get_backend
from mpqr.backends._base import ArrayAPIBackend, compact_wy_t

import mpqr
from mpqr._array_api import array_namespace, is_cupy_namespace
from tests._qr_support import (
    backward_error,
    hp_matmul,
    orthogonality,
    two_leaf_case,
    unit_roundoff,
)
from tests._support import from_numpy, to_numpy


@pytest.fixture(autouse=True)
def _leaf_schedules_at_every_size(monkeypatch):
    """The leaf's lookahead and combined W run from this module's small leaves on (the
    library takes them only for tall leaves: CERTIFIED_LEAF_SCHEDULE_MIN_ROWS); the leaf
    panel after panel unless a test asks for the halves (CERTIFIED_LEAF_RECURSIVE), so that
    the right-looking loop's tests keep their subject (the library's below those rows)."""
    from mpqr.backends import panel_cholqr

    monkeypatch.setattr(panel_cholqr, "CERTIFIED_LEAF_SCHEDULE_MIN_ROWS", 0)
    monkeypatch.setattr(panel_cholqr, "CERTIFIED_LEAF_RECURSIVE", False)


def test_leaf_schedules_only_for_tall_leaves(monkeypatch):
    from mpqr.backends import panel_cholqr

    from mpqr.qr.panel_blocked import leaf_combines_w, leaf_lookahead

    monkeypatch.setattr(panel_cholqr, "CERTIFIED_LEAF_SCHEDULE_MIN_ROWS", 12288)
    for rows, want in ((8192, False), (12288, True), (16384, True)):
        assert leaf_lookahead(1024, rows) is want and leaf_combines_w(1024, rows) is want
    monkeypatch.setattr(panel_cholqr, "CERTIFIED_LEAF_LOOKAHEAD", False)
    assert not leaf_lookahead(1024, 16384) and leaf_combines_w(1024, 16384)

recursive = importlib.import_module("mpqr.qr.householder_recursive")


def _u(dtype) -> float:
    return 2.0**-24 if np.dtype(dtype) == np.float32 else 2.0**-53


def _working(xp, a):
    """``(backend, work, w, cert)``: a writable copy of ``a``, a zero W and a fresh
    certificate, from the backend's own namespace (writable on every backend)."""
    backend = get_backend(array_namespace(from_numpy(xp, a[:1])))
    work = backend.xp.asarray(from_numpy(xp, a), copy=True)
    w = backend.xp.zeros(work.shape, dtype=work.dtype)
    return backend, work, w, backend.new_certificate(work)


def _reflector_orthogonality(w, y) -> float:
    """``||I - H^T H||_F / m`` of ``H = I - W Y^T`` (``m x m``) in extended precision, from
    ``H^T H - I = Y (W^T W) Y^T - W Y^T - Y W^T``: ``O(m^2 n)`` where forming ``H^T H``
    costs ``O(m^3)`` (minutes at ``m = 1000`` in long double)."""
    m = y.shape[0]
    wy = hp_matmul(w, y.T)
    g = hp_matmul(hp_matmul(y, hp_matmul(w.T, w)), y.T) - wy - wy.T
    return float(np.linalg.norm(np.asarray(g, dtype=np.float64))) / m


def _panel(xp, a, lo, hi, with_w=True):
    """Factor columns lo:hi of a copy of ``a`` in place; returns the factors on the host
    (the working arrays come from the backend's namespace: writable on every backend)."""
    backend, work, w, cert = _working(xp, a)
    l, tau = backend.certified_panel(work[:, lo:hi], w[:, lo:hi] if with_w else None, cert)
    return backend, to_numpy(work), to_numpy(w), to_numpy(l), to_numpy(tau), int(to_numpy(cert)[0])


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape", [(40, 8), (32, 32), (33, 7), (300, 32), (1000, 1), (97, 19)])
def test_certified_panel_is_a_compact_wy_factorization(xp, shape, dtype):
    """``A = (I - W Y^T)[:, :n] R`` with ``I - W Y^T`` orthogonal to working precision,
    ``Y`` unit lower, ``R`` upper, ``W = Y T`` with ``T`` from ``tau`` by the UT
    transform; the columns around the panel are not touched."""
    m, n = shape
    rng = np.random.default_rng(m + n)
    a = rng.standard_normal((m, n + 5)).astype(dtype)
    _, work, w, l, tau, fails = _panel(xp, a, 2, 2 + n)
    assert fails == 0
    assert np.array_equal(work[:, :2], a[:, :2]) and np.array_equal(work[:, 2 + n:], a[:, 2 + n:])
    p, wp = work[:, 2:2 + n].astype(np.float64), w[:, 2:2 + n].astype(np.float64)
    y = np.tril(p, -1) + np.eye(m, n)
    r = np.triu(p[:n])
    assert np.array_equal(l, np.tril(work[:n, 2:2 + n], -1) + np.eye(n, dtype=dtype))
    u = _u(dtype)
    orth = _reflector_orthogonality(wp, y)
    assert orth <= 10 * m * u, orth
    h1 = np.eye(m, n) - np.asarray(hp_matmul(wp, y[:n].T), dtype=np.float64)  # H[:, :n]
    assert backward_error(a[:, 2:2 + n].astype(np.float64), h1, r) <= 10 * np.sqrt(m * n) * u
    # W = Y T with T upper triangular, diag(T) = tau: the UT transform of (Y, tau) gives T
    t = compact_wy_t(get_backend(array_namespace(np.zeros(1))), y, tau.astype(np.float64))
    assert np.allclose(y @ t, wp, rtol=0, atol=100 * n * u * max(1.0, np.abs(wp).max()))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("cond", [1.0, 1e5])
def test_second_gram_near_identity_takes_first_order_factors(xp, dtype, cond, monkeypatch):
    """Pass 2 takes ``R2`` and its inverse to first order where ``||Q1^T Q1 - I||_F^2 <=
    2^-53`` (a well-conditioned panel) and by Cholesky otherwise (cond 1e5: ``Q1^T Q1 - I``
    is ~ u64 cond^2); either way the panel is a QR to working precision, and the first-order
    factors are Cholesky's to float64's rounding."""
    from mpqr.backends import panel_cholqr

    rng = np.random.default_rng(17)
    q1, _ = np.linalg.qr(rng.standard_normal((300, 32)))
    q2, _ = np.linalg.qr(rng.standard_normal((32, 32)))
    a = ((q1 * np.logspace(0, -np.log10(cond), 32)) @ q2).astype(dtype)
    calls = []
    chol = panel_cholqr._chol_upper
    monkeypatch.setattr(panel_cholqr, "_chol_upper", lambda xp_, g: calls.append(1) or
                        chol(xp_, g))
    out = []
    for near in (panel_cholqr.NEAR_IDENTITY, -1.0):  # -1: Cholesky always
        monkeypatch.setattr(panel_cholqr, "NEAR_IDENTITY", near)
        calls.clear()
        backend, work, w, cert = _working(xp, a)
        ArrayAPIBackend.certified_panel(backend, work, w, cert)
        out.append((to_numpy(work).astype(np.float64), to_numpy(w).astype(np.float64),
                    len(calls), int(to_numpy(cert)[0])))
    (p1, w1, n1, f1), (p2, w2, n2, f2) = out
    assert f1 == f2 == 0
    assert (n1, n2) == ((1, 2) if cond == 1.0 else (2, 2))
    u = _u(dtype)
    assert np.abs(p1 - p2).max() <= 4 * u * np.abs(p2).max()
    assert np.abs(w1 - w2).max() <= 4 * u * np.abs(w2).max()
    # and the panel (on the kernels where the backend has them) is a QR of A
    _, work, w, _, _, fails = _panel(xp, a, 0, 32)
    m = a.shape[0]
    y = np.tril(work.astype(np.float64), -1) + np.eye(m, 32)
    h = np.eye(m) - np.asarray(hp_matmul(w.astype(np.float64), y.T), dtype=np.float64)
    assert fails == 0
    assert orthogonality(h) <= 10 * m * u
    assert backward_error(a.astype(np.float64), h[:, :32],
                          np.triu(work[:32].astype(np.float64))) <= 10 * np.sqrt(m * 32) * u


def test_certified_panel_without_w_gives_the_same_factors(xp):
    a = np.random.default_rng(3).standard_normal((200, 32))
    _, work1, _, _, _, _ = _panel(xp, a, 0, 32)
    _, work2, w2, _, _, _ = _panel(xp, a, 0, 32, with_w=False)
    assert np.array_equal(work1, work2) and not w2.any()


@pytest.mark.parametrize("make", ["duplicate", "zero", "nan", "inf"])
def test_certified_panel_counts_a_failed_certificate(xp, make):
    """A rank-deficient or non-finite panel fails CholQR2's certificate: the count goes
    up by one (the caller then factors the matrix again), never a finite-looking answer
    taken as good."""
    a = np.random.default_rng(5).standard_normal((300, 32))
    if make == "duplicate":
        a[:, 7] = a[:, 3]
    elif make == "zero":
        a[:, 20] = 0.0
    else:
        a[10, 4] = np.nan if make == "nan" else np.inf
    backend = get_backend(array_namespace(from_numpy(xp, a[:1])))
    work = backend.xp.asarray(from_numpy(xp, a), copy=True)
    cert = backend.new_certificate(work)
    backend.certified_panel(work, None, cert)
    assert int(to_numpy(cert)[0]) == 1
    assert backend.certificate_failed(cert)
    work = backend.xp.asarray(from_numpy(xp, a), copy=True)
    backend.certified_panel(work, None, cert)  # failures add up
    assert int(to_numpy(cert)[0]) == 2


def test_certificate_accepts_moderate_conditioning_and_refuses_near_singular(xp):
    """The check is CholQR2's condition: cond(panel) up to ~1e7 passes, ~1e12 fails."""
    rng = np.random.default_rng(8)
    q1, _ = np.linalg.qr(rng.standard_normal((400, 32)))
    q2, _ = np.linalg.qr(rng.standard_normal((32, 32)))
    backend = get_backend(array_namespace(from_numpy(xp, q1[:1])))
    for cond, fails in ((1e6, 0), (1e12, 1)):
        a = (q1 * np.logspace(0, -np.log10(cond), 32)) @ q2
        work = backend.xp.asarray(from_numpy(xp, a), copy=True)
        cert = backend.new_certificate(work)
        backend.certified_panel(work, None, cert)
        assert int(to_numpy(cert)[0]) == fails, cond


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_gpu_kernels_follow_the_portable_steps(xp, dtype):
    """The CUDA kernels and the portable steps give the same factors: float32 storage to
    the last bit here (the float64 arithmetic differs below float32's rounding), float64
    to a few units of roundoff."""
    if not is_cupy_namespace(xp):
        pytest.skip("the kernels run on CuPy")
    a = np.random.default_rng(21).standard_normal((5000, 40)).astype(dtype)
    out = []
    for portable in (False, True):
        backend, work, w, cert = _working(xp, a)
        panel = ArrayAPIBackend.certified_panel if portable else type(backend).certified_panel
        panel(backend, work[:, 3:35], w[:, 3:35], cert)
        out.append((to_numpy(work), to_numpy(w), int(to_numpy(cert)[0])))
    (wk, ww, fk), (wp, wwp, fp) = out
    assert fk == fp == 0
    tol = 0 if dtype == np.float32 else 64 * _u(dtype)
    assert np.abs(wk - wp).max() <= tol * np.abs(wp).max()
    assert np.abs(ww - wwp).max() <= tol * np.abs(wwp).max()


def _with_route(monkeypatch, backend, on: bool):
    monkeypatch.setattr(type(backend), "certified_panels", on)


@pytest.mark.parametrize("precision", ["fp64", "fp32-emulated", "fp16", "fp64-emulated"])
def test_recursive_qr_with_certified_leaves(xp, monkeypatch, precision):
    """128-wide leaves of four certified panels keep the accuracy of ``geqrf`` leaves; the
    trace says which leaves ran."""
    a, ax, backend = two_leaf_case(xp, monkeypatch, precision)
    results = {}
    for on in (True, False):
        _with_route(monkeypatch, backend, on)
        with mpqr.explain() as trace:
            q, r = mpqr.qr(ax, precision=precision, method="householder-recursive")
        events = [e for e in trace.events if e.kind == "panel"]
        assert [e.data.get("leaf") for e in events] == ([128] if on else [])
        results[on] = (backward_error(a, q, r), orthogonality(q))
    u = unit_roundoff(precision, np.float64)
    back, orth = results[True]
    assert back <= 2 * np.sqrt(256) * u, results
    assert orth <= np.sqrt(256) * max(u, 2.0**-24) / 4, results
    assert back <= 4 * results[False][0] + np.sqrt(256) * 2.0**-53, results


@pytest.mark.parametrize("mode", ["reduced", "r", "complete"])
def test_certified_leaves_in_every_mode(xp, mode):
    a = np.random.default_rng(19).standard_normal((300, 200))
    res = mpqr.qr(from_numpy(xp, a), precision="fp64", method="householder-recursive",
                  mode=mode)
    ref_r = np.linalg.qr(a, mode="r")
    ref_r = ref_r * np.sign(np.diag(ref_r))[:, None]
    r = to_numpy(res if mode == "r" else res[1])[:200]
    assert np.allclose(r, ref_r, rtol=0, atol=1e-12 * np.abs(ref_r).max())
    if mode != "r":
        q = to_numpy(res[0])
        assert orthogonality(q) <= 300 * 2.0**-53


@pytest.mark.parametrize("make", ["duplicate", "zero-column", "rank-deficient"])
def test_a_failed_certificate_factors_the_matrix_again(xp, make):
    """A panel that fails its certificate sends the whole factorization to ``geqrf``
    panels (one host sync decides, at the end): the result is Householder-accurate, the
    trace says so, and the input is untouched."""
    rng = np.random.default_rng(23)
    a = rng.standard_normal((260, 200))
    if make == "duplicate":
        a[:, 70] = a[:, 66]
    elif make == "zero-column":
        a[:, 150] = 0.0
    else:
        a = a[:, :100] @ rng.standard_normal((100, 200))
    ax = from_numpy(xp, a)
    before = a.copy()
    with mpqr.explain() as trace:
        q, r = mpqr.qr(ax, precision="fp64", method="householder-recursive")
    again = [e for e in trace.events if e.kind == "panel" and "factored again" in e.message]
    assert len(again) == 1
    assert backward_error(a, q, r) <= 10 * np.sqrt(260 * 200) * 2.0**-53
    assert orthogonality(q) <= 10 * np.sqrt(200) * 2.0**-53
    assert np.array_equal(to_numpy(ax), before)


def test_scaled_tensor_core_input_is_factored_again_from_the_caller_array(monkeypatch):
    """At the tensor-core precisions the columns are scaled into a copy the method may
    overwrite; a failed certificate scales the caller's array again."""
    a = np.random.default_rng(29).standard_normal((260, 200)) * 1e3
    a[:, 70] = a[:, 66]
    with mpqr.explain() as trace:
        q, r = mpqr.qr(a, precision="fp32-emulated", method="householder-recursive")
    assert any("factored again" in e.message for e in trace.events)
    assert backward_error(a, q, r) <= 10 * np.sqrt(260 * 200) * 2.0**-24


def test_overwrite_a_takes_geqrf_panels():
    """With ``overwrite_a=True`` (and no scaled copy) nothing is left to factor again, so
    the leaves keep ``geqrf`` panels."""
    a = np.asfortranarray(np.random.default_rng(31).standard_normal((300, 200)))
    a0 = a.copy()
    with mpqr.explain() as trace:
        q, r = mpqr.qr(a, precision="fp64", method="householder-recursive", overwrite_a=True)
    assert not [e for e in trace.events if e.kind == "panel"]
    assert backward_error(a0, q, r) <= 10 * np.sqrt(300 * 200) * 2.0**-53


def test_complex_and_stacked_inputs_keep_geqrf_panels(xp):
    if not hasattr(xp, "complex128"):
        pytest.skip("namespace without complex dtypes")
    rng = np.random.default_rng(37)
    for a in (rng.standard_normal((100, 80)) + 1j * rng.standard_normal((100, 80)),
              rng.standard_normal((3, 100, 80))):
        with mpqr.explain() as trace:
            q, r = mpqr.qr(from_numpy(xp, a), precision="fp64", method="householder-recursive")
        assert not [e for e in trace.events if e.kind == "panel"]
        assert backward_error(a, q, r) <= 10 * np.sqrt(100 * 80) * 2.0**-53


def test_certified_leaves_are_wider():
    lw = recursive.leaf_width
    cap = recursive.MAX_CERTIFIED_LEAF_WIDTH
    assert [lw(n, cap) for n in (4096, 8192, 16384, 32768, 65536)] == \
        [256, 512, 1024, 1024, 1024]
    # few rows: up to FEW_LEAVES leaves while a leaf's rows x width stays within
    # CERTIFIED_LEAF_ELEMENTS; many rows keep MAX_LEAVES
    assert recursive.FEW_LEAVES < recursive.MAX_LEAVES
    assert [lw(n, cap, rows=n) for n in (4096, 6144, 8192, 16384, 32768)] == \
        [512, 1024, 1024, 1024, 1024]
    assert lw(8192, cap, rows=16384) == 1024
    assert lw(8192, cap, rows=65536) == 512
    assert lw(4096, cap, rows=100000) == 256
    for n, rows in ((8192, 8192), (8192, 16384), (6144, 12288), (4096, 4096)):
        nb = lw(n, cap, rows=rows)
        assert rows * nb <= recursive.CERTIFIED_LEAF_ELEMENTS or nb == lw(n, cap)
        assert -(-n // nb) <= recursive.FEW_LEAVES


def test_fused_leaf_matches_the_portable_loop(xp):
    """CuPy's leaf (raw launches, direct cuBLAS) and the portable loop of
    :func:`mpqr.qr.panel_blocked.certified_leaf` agree."""
    if not is_cupy_namespace(xp):
        pytest.skip("the fused leaf runs on CuPy")
    from mpqr.qr import panel_blocked

    a = np.random.default_rng(41).standard_normal((3000, 300))
    out = []
    for fused in (True, False):
        backend, work, w, cert = _working(xp, a)
        if fused:
            tau = panel_blocked.certified_leaf(backend, work, w, 40, 290, cert=cert,
                                               precision="fp64")
        else:
            orig = type(backend).certified_leaf
            type(backend).certified_leaf = ArrayAPIBackend.certified_leaf
            try:
                tau = panel_blocked.certified_leaf(backend, work, w, 40, 290, cert=cert,
                                                   precision="fp64")
            finally:
                type(backend).certified_leaf = orig
        out.append((to_numpy(work), to_numpy(tau), int(to_numpy(cert)[0]), to_numpy(w)))
    (w1, t1, f1, ww1), (w2, t2, f2, ww2) = out
    assert f1 == f2 == 0
    assert np.abs(w1 - w2).max() <= 1e-12 * np.abs(w2).max()
    assert np.abs(t1 - t2).max() <= 1e-12
    assert np.abs(ww1 - ww2).max() <= 1e-12 * np.abs(ww2).max()  # the panels' W


def _cupy_panels(xp):
    if not is_cupy_namespace(xp):
        pytest.skip("the one-launch panel runs on CuPy")
    return importlib.import_module("mpqr.backends.cupy.panel_cholqr")


@pytest.mark.parametrize("steps", ["warp", "block", "block, rows apart"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape", [(5000, 40), (33, 40), (40000, 40)])
def test_one_launch_panel_gives_the_three_launches_factors(xp, monkeypatch, steps, dtype, shape):
    """``kernels/panel_fused.cu`` (the three launches as phases of one grid, the n x n steps
    in one warp or by the whole block) takes the same tiles, block count and summation order
    as the three launches: the same factors to the last bit, the barrier counter left at
    zero."""
    cupy_panels = _cupy_panels(xp)
    monkeypatch.setattr(cupy_panels, "ONE_LAUNCH_ROWS", "apart" not in steps)
    a = np.random.default_rng(43).standard_normal(shape).astype(dtype)
    out = []
    for one in (None, steps.split(",")[0]):
        monkeypatch.setattr(cupy_panels, "ONE_LAUNCH", one)
        backend, work, w, cert = _working(xp, a)
        l, tau = backend.certified_panel(work[:, 3:35], w[:, 3:35], cert)
        out.append([to_numpy(x) for x in (work, w, l, tau, cert)])
    for got, ref in zip(out[1], out[0], strict=True):
        assert np.array_equal(got, ref)
    assert out[1][4].tolist() == [0, 0, 0, 0]


@pytest.mark.parametrize("n", [1, 2, 13, 31])
def test_one_launch_gives_the_three_launches_factors_for_narrow_panels(xp, monkeypatch, n):
    """The one launch (the whole block's n x n steps, each pass's in every block) for
    panels of fewer than 32 columns, a NaN entry included: the three launches' bits (NaN
    where they give NaN) and the same failed certificate, counted once."""
    cupy_panels = _cupy_panels(xp)
    a = np.random.default_rng(53).standard_normal((3000, 40))
    out = []
    for one in (None, "block"):
        monkeypatch.setattr(cupy_panels, "ONE_LAUNCH", one)
        for bad in (False, True):
            b = a.copy()
            if bad:
                b[17, 3] = np.nan
            backend, work, w, cert = _working(xp, b)
            l, tau = backend.certified_panel(work[:, 3:3 + n], w[:, 3:3 + n], cert)
            out.append([to_numpy(x) for x in (work, w, l, tau, cert)])
    for got, ref in zip(out[2:], out[:2], strict=True):
        for g, r in zip(got, ref, strict=True):
            assert np.array_equal(g, r, equal_nan=True)
    assert out[3][4][0] == 1  # the NaN fails the certificate: the caller factors again


@pytest.mark.parametrize("steps", ["warp", "block"])
def test_one_launch_panel_counts_a_failed_certificate(xp, monkeypatch, steps):
    cupy_panels = _cupy_panels(xp)
    monkeypatch.setattr(cupy_panels, "ONE_LAUNCH", steps)
    a = np.random.default_rng(47).standard_normal((3000, 32))
    a[:, 20] = a[:, 7]
    *_, fails = _panel(xp, a, 0, 32)
    assert fails == 1


@pytest.mark.parametrize("precision", ["fp64", "fp32-emulated"])
def test_recursive_qr_with_one_launch_panels(xp, monkeypatch, precision):
    """The leaves' loop with one launch a panel gives the three launches' factorization
    (to working precision: the rest of the call is not promised bit for bit)."""
    cupy_panels = _cupy_panels(xp)
    a, ax, _ = two_leaf_case(xp, monkeypatch, precision)
    out = []
    for one in (None, "block"):
        monkeypatch.setattr(cupy_panels, "ONE_LAUNCH", one)
        q, r = mpqr.qr(ax, precision=precision, method="householder-recursive")
        out.append((to_numpy(q), to_numpy(r)))
    u = unit_roundoff(precision, np.float64)
    for got, ref in zip(out[1], out[0], strict=True):
        assert np.abs(got - ref).max() <= 64 * u * np.abs(ref).max()
    assert backward_error(a, *out[1]) <= 2 * np.sqrt(256) * unit_roundoff(precision, np.float64)


@pytest.mark.parametrize("sub", [64, 96, 128])
def test_leaf_in_sub_blocks_matches_the_portable_loop(xp, monkeypatch, sub):
    """CuPy's leaf in sub-blocks (each panel updates its sub-block, the sub-block's combined
    W the later columns) gives the portable right-looking loop's factors to rounding."""
    _cupy_panels(xp)
    from mpqr.backends import panel_cholqr as portable_panels

    from mpqr.qr import panel_blocked

    a = np.random.default_rng(53).standard_normal((3000, 300))
    out = []
    for leaf_sub in (sub, None):
        monkeypatch.setattr(portable_panels, "CERTIFIED_LEAF_SUB", leaf_sub)
        backend, work, w, cert = _working(xp, a)
        if leaf_sub is None:
            monkeypatch.setattr(type(backend), "certified_leaf", ArrayAPIBackend.certified_leaf)
        tau = panel_blocked.certified_leaf(backend, work, w, 40, 290, cert=cert,
                                           precision="fp64")
        out.append((to_numpy(work), to_numpy(tau), int(to_numpy(cert)[0])))
    (w1, t1, f1), (w2, t2, f2) = out
    assert f1 == f2 == 0
    assert np.abs(w1 - w2).max() <= 1e-12 * np.abs(w2).max()
    assert np.abs(t1 - t2).max() <= 1e-12


def test_portable_leaf_in_sub_blocks_gives_the_right_looking_factors(monkeypatch):
    """The portable leaf in sub-blocks (panels update their sub-block; the sub-block's
    combined W, ``W_j - W_<j (Y_<j^T W_j)``, the leaf's later columns) factors the leaf as
    the right-looking loop does, to rounding, and its W is the sub-block's compact WY
    factor: ``H_s0 ... H_se = I - W Y^T``."""
    from mpqr.backends import panel_cholqr as portable_panels

    from mpqr.qr import panel_blocked

    a = np.random.default_rng(59).standard_normal((120, 110))
    c0, c1, sub = 4, 100, 64
    out = []
    for leaf_sub in (sub, None):
        monkeypatch.setattr(portable_panels, "CERTIFIED_LEAF_SUB", leaf_sub)
        backend, work, w, cert = _working(np, a)
        tau = panel_blocked.certified_leaf(backend, work, w, c0, c1, cert=cert,
                                           precision="fp64")
        out.append((work, tau, w, int(cert[0])))
    (w1, t1, ww1, f1), (w2, t2, _, f2) = out
    assert f1 == f2 == 0
    u = 2.0**-53
    assert np.abs(w1 - w2).max() <= 200 * u * np.abs(w2).max()
    assert np.abs(t1 - t2).max() <= 200 * u
    # the first sub-block's W (the last one's is not combined: nothing after it reads it)
    m = 120 - c0
    y = (np.tril(w1[c0:, c0:c1], -1) + np.eye(m, c1 - c0))[:, :sub]
    h = np.eye(m)
    for j in range(sub):  # H_1 ... H_sub, one rank-1 update each
        h -= t1[j] * np.outer(h @ y[:, j], y[:, j])
    assert np.abs(np.eye(m) - ww1[c0:, c0:c0 + sub] @ y.T - h).max() <= 1000 * u


@pytest.mark.skip_xp_backend("array_api_strict", reason="the NumPy loop's steps: numpy")
@pytest.mark.skip_xp_backend("numpy_readonly", reason="the NumPy loop's steps: numpy")
@pytest.mark.parametrize("cols", [(6, 134), (0, 32)])
def test_leaf_with_lookahead_matches_the_leaf_without(xp, monkeypatch, cols):
    """The leaf with lookahead (each panel updates the next panel's columns apart from the
    rest) gives the right-looking loop's factors to rounding, on every backend's own loop;
    on CuPy the panels on the side stream give the one-stream launches' bits."""
    from mpqr.backends import panel_cholqr as portable_panels

    from mpqr.qr import panel_blocked

    a = np.random.default_rng(61).standard_normal((400, 140))
    c0, c1 = cols
    runs = [(False, True), (True, True)]
    if is_cupy_namespace(xp):
        runs.append((True, False))
    out = []
    for ahead, stream in runs:
        monkeypatch.setattr(portable_panels, "CERTIFIED_LEAF_LOOKAHEAD", ahead)
        if is_cupy_namespace(xp):
            monkeypatch.setattr(_cupy_panels(xp), "LOOKAHEAD_STREAM", stream)
        backend, work, w, cert = _working(xp, a)
        tau = panel_blocked.certified_leaf(backend, work, w, c0, c1, cert=cert,
                                           precision="fp64")
        out.append((to_numpy(work), to_numpy(tau), to_numpy(w), int(to_numpy(cert)[0])))
    ref = out[0]
    u = 2.0**-53
    for got in out[1:]:
        assert got[3] == ref[3] == 0
        for x, y in zip(got[:3], ref[:3], strict=True):
            assert np.abs(x - y).max() <= 200 * u * max(np.abs(y).max(), 1.0)
    if len(out) == 3:  # the side stream changes no bit
        for x, y in zip(out[1][:3], out[2][:3], strict=True):
            assert np.array_equal(x, y)


@pytest.mark.parametrize("ahead", [False, True])
def test_leaf_with_z_untransposed_matches_the_portable_loop(xp, monkeypatch, ahead):
    """CuPy's leaf with ``W^T B`` formed as ``Z`` (not ``Z^T``) gives the portable loop's
    factors to rounding, with and without lookahead."""
    cupy_panels = _cupy_panels(xp)
    from mpqr.backends import panel_cholqr as portable_panels

    from mpqr.qr import panel_blocked

    monkeypatch.setattr(portable_panels, "CERTIFIED_LEAF_LOOKAHEAD", ahead)
    a = np.random.default_rng(67).standard_normal((3000, 300))
    out = []
    for layout in ("z", None):
        monkeypatch.setattr(cupy_panels, "LEAF_Z_LAYOUT", layout or "zt")
        backend, work, w, cert = _working(xp, a)
        if layout is None:
            monkeypatch.setattr(type(backend), "certified_leaf", ArrayAPIBackend.certified_leaf)
        tau = panel_blocked.certified_leaf(backend, work, w, 40, 290, cert=cert,
                                           precision="fp64")
        out.append((to_numpy(work), to_numpy(tau), to_numpy(w), int(to_numpy(cert)[0])))
    (w1, t1, ww1, f1), (w2, t2, ww2, f2) = out
    assert f1 == f2 == 0
    assert np.abs(w1 - w2).max() <= 1e-12 * np.abs(w2).max()
    assert np.abs(t1 - t2).max() <= 1e-12
    assert np.abs(ww1 - ww2).max() <= 1e-12 * np.abs(ww2).max()


@pytest.mark.skip_xp_backend("array_api_strict", reason="the NumPy loop's steps: numpy")
@pytest.mark.skip_xp_backend("numpy_readonly", reason="the NumPy loop's steps: numpy")
@pytest.mark.parametrize("ahead", [False, True])
def test_leaf_combines_its_w_into_the_compact_wy_factor(xp, monkeypatch, ahead):
    """A leaf asked to combine its panels' W (``W_j - W_<j (Y_<j^T W_j)`` after each panel)
    leaves the leaf's ``W = Y T`` (T from ``Y`` and ``tau`` by the UT transform), and the
    same R and Y as the leaf that does not, with and without lookahead (CuPy's own loop and
    the portable one)."""
    from mpqr.backends import panel_cholqr as portable_panels

    from mpqr.qr import panel_blocked

    monkeypatch.setattr(portable_panels, "CERTIFIED_LEAF_LOOKAHEAD", ahead)
    monkeypatch.setattr(portable_panels, "CERTIFIED_LEAF_COMBINED_W", True)
    a = np.random.default_rng(71).standard_normal((400, 140))
    c0, c1 = 6, 134
    out = []
    for combine in (True, False):
        backend, work, w, cert = _working(xp, a)
        tau = panel_blocked.certified_leaf(backend, work, w, c0, c1, cert=cert,
                                           precision="fp64", combine=combine)
        out.append((to_numpy(work), to_numpy(tau), to_numpy(w), int(to_numpy(cert)[0])))
    (wk1, t1, w1, f1), (wk2, t2, _, f2) = out
    assert f1 == f2 == 0
    u = 2.0**-53
    assert np.abs(wk1 - wk2).max() <= 200 * u * np.abs(wk2).max()
    assert np.abs(t1 - t2).max() <= 200 * u
    y = np.tril(wk1[c0:, c0:c1], -1) + np.eye(400 - c0, c1 - c0)
    ref = y @ to_numpy(compact_wy_t(get_backend(np), y, t1))
    assert np.abs(w1[c0:, c0:c1] - ref).max() <= 200 * u * np.abs(ref).max()
    assert not np.any(w1[:c0, c0:c1])


@pytest.mark.skip_xp_backend("array_api_strict", reason="the NumPy loop's steps: numpy")
@pytest.mark.skip_xp_backend("numpy_readonly", reason="the NumPy loop's steps: numpy")
@pytest.mark.parametrize("ahead", [False, True])
@pytest.mark.parametrize("cols", [(6, 262), (0, 300), (32, 96)])
def test_leaf_by_halves_gives_the_leaf_panel_after_panel(xp, monkeypatch, cols, ahead):
    """The leaf by halves (``CERTIFIED_LEAF_RECURSIVE``: left half, the right half's
    update, right half, W joined) leaves the right-looking combined leaf's R, Y and tau
    (with and without its lookahead) to rounding and the leaf's ``W = Y T`` (T from ``Y``
    and ``tau`` by the UT transform), W's rows above the leaf and the columns outside the
    leaf untouched, on every backend's own loop."""
    from mpqr.backends import panel_cholqr as portable_panels

    from mpqr.qr import panel_blocked

    monkeypatch.setattr(portable_panels, "CERTIFIED_LEAF_COMBINED_W", True)
    monkeypatch.setattr(portable_panels, "CERTIFIED_LEAF_LOOKAHEAD", ahead)
    m = 500
    a = np.random.default_rng(79).standard_normal((m, 300))
    c0, c1 = cols
    out = []
    for by_halves in (True, False):
        monkeypatch.setattr(portable_panels, "CERTIFIED_LEAF_RECURSIVE", by_halves)
        assert panel_blocked.leaf_recursive(c1 - c0, m - c0) is by_halves
        backend, work, w, cert = _working(xp, a)
        w[...] = 7.0  # W's storage as the recursion leaves it: not zero
        tau = panel_blocked.certified_leaf(backend, work, w, c0, c1, cert=cert,
                                           precision="fp64", combine=True)
        out.append((to_numpy(work), to_numpy(tau), to_numpy(w), int(to_numpy(cert)[0])))
    (wk1, t1, w1, f1), (wk2, t2, w2, f2) = out
    assert f1 == f2 == 0
    u = 2.0**-53
    assert np.abs(wk1 - wk2).max() <= 200 * u * np.abs(wk2).max()
    assert np.abs(t1 - t2).max() <= 200 * u
    assert np.array_equal(wk1[:, c1:], a[:, c1:]) and np.array_equal(wk1[:, :c0], a[:, :c0])
    y = np.tril(wk1[c0:, c0:c1], -1) + np.eye(m - c0, c1 - c0)
    ref = y @ to_numpy(compact_wy_t(get_backend(np), y, t1))
    assert np.abs(w1[c0:, c0:c1] - ref).max() <= 200 * u * np.abs(ref).max()
    assert np.abs(w1[c0:, c0:c1] - w2[c0:, c0:c1]).max() <= 200 * u * np.abs(ref).max()
    assert np.all(w1[:c0, c0:c1] == 7.0) and np.all(w1[:, c1:] == 7.0)
    # the leaf's Householder QR itself: A's leaf columns = (I - Y T Y^T)[:, :k] R
    k = c1 - c0
    r = np.triu(wk1[c0:c1, c0:c1])
    qk = (np.eye(m - c0) - ref @ y.T)[:, :k]
    panel = a[c0:, c0:c1]
    assert np.abs(qk @ r - panel).max() <= 100 * np.sqrt(m) * u * np.abs(panel).max()


@pytest.mark.skip_xp_backend("array_api_strict", reason="the NumPy loop's steps: numpy")
@pytest.mark.skip_xp_backend("numpy_readonly", reason="the NumPy loop's steps: numpy")
@pytest.mark.parametrize("precision", ["fp32-emulated"])
def test_recursive_qr_with_lookahead_and_combined_w(xp, monkeypatch, precision):
    """The recursive QR with its leaves' lookahead and combined W gives the factorization
    without them to working precision."""
    from mpqr.backends import panel_cholqr as portable_panels

    a, ax, _ = two_leaf_case(xp, monkeypatch, precision)
    out = []
    for on in (False, True):
        monkeypatch.setattr(portable_panels, "CERTIFIED_LEAF_LOOKAHEAD", on)
        monkeypatch.setattr(portable_panels, "CERTIFIED_LEAF_COMBINED_W", on)
        q, r = mpqr.qr(ax, precision=precision, method="householder-recursive")
        out.append((to_numpy(q), to_numpy(r)))
    u = unit_roundoff(precision, np.float64)
    for got, ref in zip(out[1], out[0], strict=True):
        assert np.abs(got - ref).max() <= 64 * u * np.abs(ref).max()
    assert backward_error(a, *out[1]) <= 2 * np.sqrt(256) * u
    assert orthogonality(out[1][0]) <= np.sqrt(256) * max(u, 2.0**-24) / 4


@pytest.mark.skip_xp_backend("array_api_strict", reason="the NumPy loop's steps: numpy")
@pytest.mark.skip_xp_backend("numpy_readonly", reason="the NumPy loop's steps: numpy")
@pytest.mark.parametrize("precision", ["fp32-emulated", "fp64"])
def test_recursive_qr_with_leaves_by_halves(xp, monkeypatch, precision):
    """The recursive QR with its leaves by halves (where their W is read later) gives the
    factorization with leaves panel after panel to the precision's rounding, and meets its
    bounds."""
    from mpqr.backends import panel_cholqr as portable_panels

    from mpqr.qr import panel_blocked

    a, ax, _ = two_leaf_case(xp, monkeypatch, precision)
    asked = panel_blocked.leaf_recursive
    halves = []  # the leaves that went by halves (the portable loop's and CuPy's ask this)
    monkeypatch.setattr(panel_blocked, "leaf_recursive",
                        lambda *args: halves.append(asked(*args)) or halves[-1])
    out = []
    for on in (False, True):
        monkeypatch.setattr(portable_panels, "CERTIFIED_LEAF_RECURSIVE", on)
        halves.clear()
        with mpqr.explain() as trace:
            q, r = mpqr.qr(ax, precision=precision, method="householder-recursive")
        assert any(e.kind == "panel" for e in trace.events)  # certified panels
        assert halves == [on, on]  # both leaves
        out.append((to_numpy(q), to_numpy(r)))
    u = unit_roundoff(precision, np.float64)
    lo = max(u, 2.0**-53)
    for got, ref in zip(out[1], out[0], strict=True):
        assert np.abs(got - ref).max() <= 64 * np.sqrt(256) * lo * np.abs(ref).max()
    assert backward_error(a, *out[1]) <= 2 * np.sqrt(256) * u
    assert orthogonality(out[1][0]) <= np.sqrt(256) * max(u, 2.0**-24) / 4


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_gpu_native_near_square_takes_the_certified_recursion(xp, monkeypatch, dtype):
    """On CuPy, ``auto`` at the input's own precision gives a near-square matrix within
    ``native_recursion_square`` to the recursion (native GEMMs, certified panels), others
    to cuSOLVER; the route's factors at the precision's level (checked on a 600 x 500
    matrix with the range moved down to it: the extended-precision reference of a
    matrix in the range itself would take minutes on the host)."""
    if not is_cupy_namespace(xp):
        pytest.skip("the rule's range is the CuPy backend's")
    from mpqr.qr.choice import choose_method

    backend = get_backend(xp)
    lo, hi = backend.native_recursion_square
    dt = getattr(xp, dtype)
    own = "fp64" if dtype == "float64" else "fp32"  # every product native
    assert lo < 6144 * 6144 <= hi
    assert choose_method(backend, own, dt, 6144, 6144)[0] == "householder-recursive"
    assert choose_method(backend, own, dt, 8192, 6144)[0] == "householder-recursive"
    assert choose_method(backend, own, dt, 4096, 4096)[0] == "geqrf"
    assert choose_method(backend, own, dt, 16384, 16384)[0] == "householder-recursive"
    assert choose_method(backend, own, dt, 20480, 20480)[0] == "householder-recursive"
    assert choose_method(backend, own, dt, 24576, 24576)[0] == "geqrf"
    monkeypatch.setattr(type(backend), "native_recursion_square", (0, 2**20))
    a = np.random.default_rng(43).standard_normal((600, 500)).astype(dtype)
    with mpqr.explain() as trace:
        q, r = mpqr.qr(xp.asarray(a), precision=own)
    assert [e.data["method"] for e in trace.events if e.kind == "method"] == \
        ["householder-recursive"]
    assert any(e.kind == "panel" for e in trace.events)  # certified panels
    assert {g.engine for g in trace.gemms} <= {"native-fp64", "native-fp32"}
    qn, rn = to_numpy(q), to_numpy(r)
    u = float(np.finfo(dtype).eps) / 2
    assert qn.dtype == np.dtype(dtype) and np.all(np.diag(rn) >= 0)
    assert backward_error(a.astype(np.float64), qn, rn) <= 4 * np.sqrt(500) * u
    assert orthogonality(qn) <= 4 * np.sqrt(500) * u


@pytest.mark.parametrize("ahead", [False, True])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_gpu_leaf_products_in_own_kernels_give_cublas_leaf(xp, monkeypatch, dtype, ahead):
    """The leaf's rank-32 products in ``kernels/leaf_update.cu`` (``W^T B`` over row chunks
    summed in a fixed order, ``B -= Y Z``, the combined W's ``G``) give the cuBLAS leaf's
    factors to rounding (the sums in another order, over at most the leaf's rows, each
    panel's update then factored by the next panel), and the same bits run to run."""
    cupy_panels = _cupy_panels(xp)
    own = importlib.import_module("mpqr.backends.cupy.leaf_update")
    from mpqr.backends import panel_cholqr as portable_panels

    from mpqr.qr import panel_blocked

    monkeypatch.setattr(portable_panels, "CERTIFIED_LEAF_LOOKAHEAD", ahead)
    monkeypatch.setattr(own, "MIN_ROWS", 0)  # every product of this small leaf
    monkeypatch.setattr(own, "MIN_COLUMNS", 0)
    assert cupy_panels.LEAF_Z_LAYOUT in ("z", "zt")
    # 3000 rows: W^T B in several row chunks; 250 columns: a last panel of 26
    a = np.random.default_rng(73).standard_normal((3000, 300)).astype(dtype)
    name = np.dtype(dtype).name
    out = []
    for on in (True, True, False):
        monkeypatch.setattr(own, "UPDATE_KERNEL", (name,) if on else ())
        monkeypatch.setattr(own, "JOIN_KERNEL", (name,) if on else ())
        backend, work, w, cert = _working(xp, a)
        tau = panel_blocked.certified_leaf(backend, work, w, 40, 290, cert=cert,
                                           precision="fp64" if name == "float64" else "fp32",
                                           combine=True)
        out.append((to_numpy(work), to_numpy(tau), to_numpy(w), int(to_numpy(cert)[0])))
    for x, y in zip(out[0], out[1], strict=True):
        assert np.array_equal(x, y)
    (wk1, t1, w1, f1), (wk2, t2, w2, f2) = out[0], out[2]
    assert f1 == f2 == 0
    tol = 64 * np.sqrt(3000) * _u(dtype)
    assert np.abs(wk1 - wk2).max() <= tol * np.abs(wk2).max()
    assert np.abs(t1 - t2).max() <= tol
    assert np.abs(w1 - w2).max() <= tol * np.abs(w2).max()


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("r,nb,q", [(70000, 32, 1000), (300, 26, 33), (40, 32, 130), (5000, 1, 64)])
def test_gpu_leaf_kernels_products_against_float64(xp, dtype, r, nb, q):
    """``W^T B`` and ``B - Y Z`` of the leaf kernels on strided views, against the float64
    products: within the dtype's rounding of sums of ``r`` (and ``nb``) terms; a second
    launch on the same workspace gives the same bits."""
    if not is_cupy_namespace(xp):
        pytest.skip("the leaf kernels run on CuPy")
    import cupy as cp

    own = importlib.import_module("mpqr.backends.cupy.leaf_update")
    rng = np.random.default_rng(r + q)
    big = cp.asarray(rng.standard_normal((r + 3, q + 50)).astype(dtype))
    wbig = cp.asarray(rng.standard_normal((r + 3, nb + 7)).astype(dtype))
    l = cp.asarray(np.tril(rng.standard_normal((nb, nb)), -1).astype(dtype) + np.eye(nb,
                                                                                   dtype=dtype))
    b, w = big[3:, 5:5 + q], wbig[3:, 2:2 + nb]
    margins = cp.asnumpy(big[:3]), cp.asnumpy(big[:, :5]), cp.asnumpy(big[:, 5 + q:])
    it = big.itemsize
    prod = own.LeafProducts(big.dtype, max(q, 32))
    pb, ldb = big.data.ptr + (3 * big.shape[1] + 5) * it, big.shape[1]
    pw, ldw = wbig.data.ptr + (3 * wbig.shape[1] + 2) * it, wbig.shape[1]
    pz = prod.wtb(pb, ldb, pw, ldw, r, nb, q)
    z = prod.z[:nb * q].reshape(nb, q).copy()
    b64, w64 = cp.asnumpy(b).astype(np.float64), cp.asnumpy(w).astype(np.float64)
    want = w64.T @ b64
    bound = r * _u(dtype) * (np.abs(w64).T @ np.abs(b64))
    assert np.all(np.abs(cp.asnumpy(z) - want) <= bound)
    prod.wtb(pb, ldb, pw, ldw, r, nb, q)
    assert cp.array_equal(prod.z[:nb * q].reshape(nb, q), z)
    # B -= Y Z with Y = [L; rows of wbig from nb] (a strided Y2)
    y2 = wbig[3 + nb:, 2:2 + nb]
    before = b64.copy()
    prod.apply(pb, ldb, l.data.ptr, y2.data.ptr, wbig.shape[1], pz, r, nb, q)
    y64 = np.concatenate([cp.asnumpy(l), cp.asnumpy(y2)]).astype(np.float64)
    z64 = cp.asnumpy(z).astype(np.float64)
    want = before - y64 @ z64
    bound = (nb + 1) * _u(dtype) * (np.abs(before) + np.abs(y64) @ np.abs(z64))
    assert np.all(np.abs(cp.asnumpy(b).astype(np.float64) - want) <= bound)
    # the margins of the strided views are untouched
    for x, y in zip(margins, (big[:3], big[:, :5], big[:, 5 + q:]), strict=True):
        assert np.array_equal(x, cp.asnumpy(y))
