"""GPU tests of stacks beyond one thread block (``cupy_geqrf.qr_stack``: cuSOLVER per
member on side streams; ``cholqr2-batched``; ``cholesky_stack``) and of ``mpqr.lstsq``
on stacks through ``householder-batched``.

Run on a GPU machine with ``python -m pytest -q tests/test_cupy_batched_stacks.py``.
Every member against float64 references: backward error and orthogonality in float64,
R against cuSOLVER's float64 R with signs normalised, lstsq against SciPy in float64.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import GPU

if not GPU:
    pytest.skip("no CUDA GPU visible", allow_module_level=True)
import cupy as cp
import scipy.linalg as sla
from mpqr.backends.cupy import geqrf as G

import mpqr


def _ref_r(a):
    r = cp.linalg.qr(a.astype(cp.complex128 if a.dtype.kind == "c" else cp.float64), mode="r")
    d = cp.diagonal(r, axis1=-2, axis2=-1)
    p = cp.where(cp.abs(d) > 0, d / cp.where(cp.abs(d) > 0, cp.abs(d), 1), 1)
    return r * cp.conj(p)[..., :, None]


def _member_errors(a, q, r):
    w = cp.complex128 if a.dtype.kind == "c" else cp.float64
    a64, q64, r64 = (x.astype(w) for x in (a, q, r))
    n, b = r.shape[-1], a.shape[0]
    res = cp.linalg.norm((a64 - q64[..., :n] @ r64).reshape(b, -1), axis=-1) / \
        cp.linalg.norm(a64.reshape(b, -1), axis=-1)
    g = cp.conj(cp.swapaxes(q64, -1, -2)) @ q64 - cp.eye(q.shape[-1])
    return float(res.max()), float((cp.linalg.norm(g.reshape(b, -1), axis=-1)).max())


def _tol(dtype, m):
    return 30 * np.finfo(dtype).eps * m


@pytest.mark.parametrize("streams", [1, 4])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(6, 300, 130), (3, 520, 257), (2, 3, 40, 33)])
def test_qr_stack_every_mode(shape, dtype, streams):
    a = cp.asarray(np.random.default_rng(0).standard_normal(shape).astype(dtype))
    a0 = a.copy()
    m, n = shape[-2:]
    a3 = a.reshape(-1, m, n)
    rr = _ref_r(a3)
    for mode in ("reduced", "complete", "r"):
        q, r = G.qr_stack(a, mode, streams=streams)
        assert r.shape == (*shape[:-2], n, n)
        r3 = r.reshape(-1, n, n)
        assert float(cp.abs(r3 - rr).max() / cp.abs(rr).max()) <= _tol(dtype, m)
        assert bool(cp.all(cp.diagonal(r3, axis1=-2, axis2=-1) >= 0))
        assert bool(cp.all(cp.tril(r3, -1) == 0))
        if mode == "r":
            assert q is None
            continue
        assert q.shape == (*shape[:-2], m, m if mode == "complete" else n)
        be, oe = _member_errors(a3, q.reshape(-1, *q.shape[-2:]), r3)
        assert be <= _tol(dtype, m) and oe <= _tol(dtype, m) * m
    assert bool(cp.all(a == a0))


@pytest.mark.parametrize("dtype", ["float32", "float64", "complex64", "complex128"])
@pytest.mark.parametrize("mode", ["reduced", "complete", "r"])
def test_mpqr_qr_stacks(dtype, mode):
    rng = np.random.default_rng(3)
    for shape in ((5, 300, 200), (8, 48, 40)):
        x = rng.standard_normal(shape)
        if dtype.startswith("complex"):
            x = x + 1j * rng.standard_normal(shape)
        a = cp.asarray(x.astype(dtype))
        out = mpqr.qr(a, mode=mode)
        m, n = shape[-2:]
        r = (out if mode == "r" else out.R)[..., :n, :]
        assert bool(cp.all(cp.diagonal(r, axis1=-2, axis2=-1).real >= 0))
        if mode == "r":
            rr = _ref_r(a)
            assert float(cp.abs(r - rr).max() / cp.abs(rr).max()) <= _tol(np.dtype(dtype), m)
        else:
            be, oe = _member_errors(a, out.Q, r)
            assert be <= _tol(np.dtype(dtype), m) and oe <= _tol(np.dtype(dtype), m) * m


@pytest.mark.parametrize("tdt", ["float16", "bfloat16"])
def test_torch_low_precision_stacks(tdt):
    torch = pytest.importorskip("torch")
    t = torch.randn(16, 64, 64, device="cuda").to(getattr(torch, tdt))
    q, r = mpqr.qr(t)
    a64 = t.double()
    be = float(((a64 - q.double() @ r.double()).flatten(1).norm(dim=1)
                / a64.flatten(1).norm(dim=1)).max())
    # mpqr.qr computes half-precision inputs in float32 and returns float32, as for a
    # single matrix (SciPy's promotion of float16; mpqr.compat.torch returns the input's)
    assert q.dtype == torch.float32 and be <= 10 * 2.0**-24 * 64


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("batch", "m", "n", "k"), [(50, 64, 32, 2), (20, 100, 100, 0),
                                                    (30, 256, 32, 3), (12, 256, 200, 2)])
def test_lstsq_stacks_batched(batch, m, n, k, dtype):
    rng = np.random.default_rng(m * n + k)
    ah = rng.standard_normal((batch, m, n)).astype(dtype)
    bh = rng.standard_normal((m,) if k == 0 else (batch, m, k)).astype(dtype)
    a, b = cp.asarray(ah), cp.asarray(bh)
    with mpqr.explain() as ex:
        out = mpqr.lstsq(a, b)
    assert any(e.data.get("path") == "batched" for e in ex.events)
    ref = sla.lstsq(ah, bh)
    ref64 = sla.lstsq(ah.astype(np.float64), bh.astype(np.float64))
    for o, r in zip(out, ref):
        assert o.shape == r.shape and o.dtype == r.dtype
    kappa = float(np.linalg.cond(ah.astype(np.float64)).max())
    t = 10 * np.finfo(dtype).eps * m * kappa
    x, res, rank, s = (o.get() for o in out)
    assert np.abs(x - ref64[0]).max() <= t * kappa * max(1.0, np.abs(ref64[0]).max())
    if res.size:
        assert np.abs(res - ref64[1]).max() <= t * np.abs(ref64[1]).max()
    assert np.array_equal(rank, ref[2])
    assert np.abs(s - ref64[3]).max() <= 10 * np.finfo(dtype).eps * m * s.max()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("mode", ["reduced", "complete", "r"])
def test_blocked_route_stacks(dtype, mode):
    rng = np.random.default_rng(4)
    for shape in ((6, 256, 200), (4, 180, 180), (3, 256, 256)):
        a = cp.asarray(rng.standard_normal(shape).astype(dtype))
        a0 = a.copy()
        with mpqr.explain() as ex:
            out = mpqr.qr(a, mode=mode)
        assert [e.data["method"] for e in ex.events if e.kind == "method"] == \
            ["householder-batched-blocked"]
        m, n = shape[-2:]
        r = (out if mode == "r" else out.R)[..., :n, :]
        rr = _ref_r(a)
        assert float(cp.abs(r - rr).max() / cp.abs(rr).max()) <= _tol(dtype, m) * 10
        if mode != "r":
            be, oe = _member_errors(a, out.Q, r)
            assert be <= _tol(dtype, m) and oe <= _tol(dtype, m) * m
        assert bool(cp.all(a == a0))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("mode", ["reduced", "complete", "r"])
def test_geqrf_wy_route_stacks(dtype, mode, monkeypatch):
    """Members above 256 rows, more than 64 columns: geqrf per member, Q by batched
    products; a zero column (tau = 0) in one member."""
    from mpqr.backends.cupy.backend import CupyBackend

    monkeypatch.setattr(CupyBackend, "stack_routes", None)  # geqrf-wy throughout
    a = cp.asarray(np.random.default_rng(6).standard_normal((4, 520, 130)).astype(dtype))
    a[0, :, 3] = 0
    a0 = a.copy()
    with mpqr.explain() as ex:
        out = mpqr.qr(a, mode=mode)
    assert [e.data["method"] for e in ex.events if e.kind == "method"] == ["geqrf-wy"]
    r = (out if mode == "r" else out.R)[..., :130, :]
    rr = _ref_r(a)
    assert float(cp.abs(r - rr).max() / cp.abs(rr).max()) <= _tol(dtype, 520)
    assert bool(cp.all(cp.diagonal(r, axis1=-2, axis2=-1) >= 0))
    if mode != "r":
        assert out.Q.shape == (4, 520, 520 if mode == "complete" else 130)
        be, oe = _member_errors(a, out.Q, r)
        assert be <= _tol(dtype, 520) and oe <= _tol(dtype, 520) * 520
    assert bool(cp.all(a == a0))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("k", "r", "lower", "unit"), [(16, 3, False, True),
                                                        (200, 130, False, True),
                                                        (150, 7, True, False),
                                                        (40, 1, False, False)])
def test_trsm_stack(dtype, k, r, lower, unit):
    from mpqr.backends.cupy import trsm_stack

    rng = np.random.default_rng(k)
    ah = rng.standard_normal((5, k, k)) / np.sqrt(k)
    ah = np.tril(ah) if lower else np.triu(ah)
    idx = np.arange(k)
    ah[:, idx, idx] = rng.uniform(1, 2, (5, k))
    a = cp.asarray(ah.astype(dtype))
    b = cp.asarray(rng.standard_normal((5, k, r)).astype(dtype))
    x = trsm_stack.solve(a, b, lower=lower, unit_diagonal=unit)
    a64 = a.get().astype(np.float64)
    if unit:
        a64[:, idx, idx] = 1
    ref = np.stack([sla.solve_triangular(a64[i], b.get()[i].astype(np.float64), lower=lower)
                    for i in range(5)])
    kap = max(np.linalg.cond(a64[i]) for i in range(5))
    assert np.abs(x.get() - ref).max() <= 10 * np.finfo(dtype).eps * k * kap * np.abs(
        ref).max()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("m", "n"), [(33, 33), (64, 64), (128, 128), (80, 40), (40, 80)])
def test_batched_svdvals(dtype, m, n):
    from mpqr.backends.cupy import batched_svdvals as J

    x = np.triu(np.random.default_rng(m + n).standard_normal((6, m, n)))
    x[0] = 0
    x[1, 0, 0] = np.nan
    a = cp.asarray(x.astype(dtype))
    s = J.svdvals(a).get()
    ref = np.linalg.svd(a.get()[2:].astype(np.float64), compute_uv=False)
    assert s.shape == (6, min(m, n)) and s.dtype == dtype
    assert np.all(s[0] == 0) and np.all(np.isnan(s[1]))
    eps = np.finfo(dtype).eps
    assert np.all(np.abs(s[2:] - ref) <= 4 * np.sqrt(max(m, n)) * min(m, n) * eps
                  * ref[:, :1])


def _ill_member(m, n, cond, dtype, seed):
    rng = np.random.default_rng(seed)
    u, _ = np.linalg.qr(rng.standard_normal((m, n)))
    v, _ = np.linalg.qr(rng.standard_normal((n, n)))
    return cp.asarray(((u * np.logspace(0, -np.log10(cond), n)) @ v.T).astype(dtype))


@pytest.mark.parametrize("chol", ["batched", "lanes"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cholqr2_batched_route(dtype, chol, monkeypatch):
    """Tall members past the batched kernels by the table's cholqr2-batched: per member
    against float64 references; one member beyond its reach: geqrf-wy takes the stack."""
    from mpqr.backends.cupy.backend import CupyBackend

    table = {d: {128: {1: "geqrf-wy", 4: "cholqr2-batched"}} for d in ("float32", "float64")}
    monkeypatch.setattr(CupyBackend, "stack_routes", table)
    monkeypatch.setattr(CupyBackend, "stack_cholesky", chol)
    a = cp.asarray(np.random.default_rng(7).standard_normal((5, 640, 150)).astype(dtype))
    a[3] = _ill_member(640, 150, 100, dtype, 11)  # cond_1(R1) > 8: Q1 by substitution
    a[4] = a[4] * cp.asarray(np.logspace(0, 3, 150).astype(dtype))  # graded columns
    a0 = a.copy()
    for mode in ("reduced", "r"):
        with mpqr.explain() as ex:
            out = mpqr.qr(a, mode=mode)
        assert [e.data["method"] for e in ex.events if e.kind == "method"] == \
            ["cholqr2-batched"]
        assert not [e for e in ex.events if e.kind == "fallback"]
        r = out if mode == "r" else out.R
        rr = _ref_r(a)
        assert float(cp.abs(r - rr).max() / cp.abs(rr).max()) <= _tol(dtype, 640) * 10
        if mode == "reduced":
            be, oe = _member_errors(a, out.Q, r)
            assert be <= _tol(dtype, 640) and oe <= _tol(dtype, 640)
    assert bool(cp.all(a == a0))
    a[1] = _ill_member(640, 150, 1e6 if dtype == np.float32 else 1e12, dtype, 8)
    with mpqr.explain() as ex:
        out = mpqr.qr(a)
    assert [e.data["fallback"] for e in ex.events if e.kind == "fallback"] == ["geqrf-wy"]
    be, oe = _member_errors(a, out.Q, out.R)
    assert be <= _tol(dtype, 640) and oe <= _tol(dtype, 640)


@pytest.mark.parametrize("streams", [1, 4])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cholesky_stack(dtype, streams):
    a = cp.asarray(np.random.default_rng(9).standard_normal((6, 500, 300)).astype(dtype))
    g = cp.swapaxes(a, -1, -2) @ a
    g0 = g.copy()
    r = G.cholesky_stack(g, streams=streams)
    assert bool(cp.all(g == g0)) and bool(cp.all(cp.tril(r, -1) == 0))
    g64 = g.astype(cp.float64)
    r64 = r.astype(cp.float64)
    err = float(cp.abs(cp.swapaxes(r64, -1, -2) @ r64 - g64).max() / cp.abs(g64).max())
    assert err <= _tol(dtype, 300)


@pytest.mark.parametrize("threads", [False, True])
def test_lanes_agree(threads, monkeypatch):
    """The members dealt to 4 lanes (issued by one host thread or a thread each) give the
    one-lane results."""
    a = cp.asarray(np.random.default_rng(10).standard_normal((7, 400, 150)))
    q1, r1 = G.qr_stack(a, "reduced", streams=1)
    monkeypatch.setattr(G, "THREADS", threads)
    q4, r4 = G.qr_stack(a, "reduced", streams=4)
    assert float(cp.abs(q4 - q1).max()) <= 1e-13 and float(cp.abs(r4 - r1).max()) <= 1e-12


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [40, 64, 200, 512])
def test_inverse_upper(dtype, n):
    from mpqr.backends.cupy import trsm_stack

    a = cp.asarray(np.random.default_rng(n).standard_normal((3, 2 * n, n)).astype(dtype))
    r = cp.linalg.qr(a, mode="r")
    x = trsm_stack.inverse_upper(r)
    r64 = r.astype(cp.float64)
    res = float(cp.abs(r64 @ x.astype(cp.float64) - cp.eye(n)).max())
    cond = float(np.linalg.cond(cp.asnumpy(r64)).max())
    assert res <= _tol(dtype, n) * cond and bool(cp.all(cp.tril(x, -1) == 0))
