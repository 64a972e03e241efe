"""mpqr.svd (QR-SVD) and mpqr.orth against float64/extended-precision references."""

from __future__ import annotations

import contextlib
import importlib

import numpy as np
import pytest

import mpqr
from tests._qr_support import geometric, orthogonality, unit_roundoff
from tests._support import to_numpy


@pytest.mark.parametrize("shape", [(200, 30), (30, 200), (2, 90, 12)])
@pytest.mark.parametrize("full", [False, True])
def test_svd_float32_vs_float64_reference(xp, shape, full):
    a = np.random.default_rng(1).standard_normal(shape)
    a32 = a.astype(np.float32)
    u, s, vh = mpqr.svd(xp.asarray(a32), full_matrices=full, precision="fp32")
    m, n = shape[-2:]
    k = min(m, n)
    mu, mv = (m, n) if full else (k, k)
    assert tuple(u.shape)[-2:] == (m, mu) and tuple(vh.shape)[-2:] == (mv, n)
    assert s.dtype == xp.float32
    s_ref = np.linalg.svd(a32.astype(np.float64), compute_uv=False)
    u32 = 2.0**-24
    sn = to_numpy(s)
    # singular values are perfectly conditioned: |ds| <= c k u ||A||
    tol = 4 * k * u32 * s_ref[..., :1]
    assert np.all(np.abs(sn - s_ref) <= tol)
    un, vn = to_numpy(u), to_numpy(vh)
    rec = (un[..., :, :k] * sn[..., None, :]) @ vn[..., :k, :]
    # normwise backward error of Householder QR + SVD grows like m n u (Higham,
    # Thm. 19.4); sqrt(m) k u keeps the test tight for random data
    assert np.linalg.norm(rec - a32) / np.linalg.norm(a32) <= np.sqrt(m) * k * u32
    # cuSOLVER's float32 gesvd is a few u less orthogonal than LAPACK's
    assert orthogonality(un) <= np.sqrt(max(m, 1)) * k * u32
    assert orthogonality(np.swapaxes(vn, -1, -2)) <= np.sqrt(n) * k * u32


def test_svd_low_rank_approximation_is_optimal():
    """Truncated QR-SVD is the best rank-r approximation: error = sigma_{r+1}."""
    rng = np.random.default_rng(2)
    a = geometric(rng, 300, 40, 1e6)
    u, s, vh = mpqr.svd(a, precision="fp64")
    r = 10
    err = np.linalg.norm(a - (u[:, :r] * s[:r]) @ vh[:r], 2)
    s_ref = np.linalg.svd(a, compute_uv=False)
    assert abs(err - s_ref[r]) <= 40 * 2.0**-53 * s_ref[0]


@pytest.mark.parametrize("precision", ["fp16", "fp32-emulated", "fp32", "fp64"])
def test_orth_reaches_working_precision(xp, precision, monkeypatch):
    ns = mpqr._array_api.array_namespace(xp.asarray(1.0))
    backend = mpqr.backends.get_backend(ns)
    if precision in ("fp16", "fp32-emulated") and "fp16" not in backend.capabilities:
        pytest.skip("backend without the fp16 engine")
    # the low-precision QR itself, not the library's float64 QR that `auto` takes at
    # this size on a GPU (library_qr_square_max)
    monkeypatch.setattr(type(backend), "library_qr_square_max", 0)
    monkeypatch.setattr(type(backend), "library_qr_square_max_by_precision", {})
    monkeypatch.setattr(type(backend), "small_max", 0)  # nor the small-input route
    # (whose decisions are cached per backend, dtype, shape and precision: forget those)
    monkeypatch.setattr(mpqr._fast, "_DECISIONS", {})
    a = geometric(np.random.default_rng(3), 256, 48, 1e5)
    with mpqr.explain() as trace:
        q = mpqr.orth(xp.asarray(a), precision=precision)
    assert tuple(q.shape) == (256, 48)
    assert orthogonality(q) <= np.sqrt(48) * unit_roundoff("fp64", np.float64)
    # same column space: the projection of A onto Q recovers A to the QR's accuracy
    qn = to_numpy(q)
    res = np.linalg.norm(a - qn @ (qn.T @ a)) / np.linalg.norm(a)
    assert res <= 2 * np.sqrt(48) * unit_roundoff(precision, np.float64)
    # a reorthogonalisation pass runs exactly where the QR's own Q misses working
    # precision (which QR runs, and so its Q, is the route choice's: not asserted here)
    q0 = to_numpy(mpqr.qr(xp.asarray(a), precision=precision).Q)
    reorth = [e for e in trace.events if e.kind == "reorth"]
    missed = np.linalg.norm(q0.T @ q0 - np.eye(48)) > 48 * unit_roundoff("fp64", np.float64)
    assert bool(reorth) == bool(missed) and not (precision == "fp64" and reorth)


def test_svd_orth_bad_input():
    with pytest.raises(ValueError, match=r"`x` must be 2-D or a stack of matrices, got ndim=1"):
        mpqr.svd(np.ones(3))
    with pytest.raises(ValueError, match=r"`x` must be 2-D or a stack of matrices, got ndim=1"):
        mpqr.orth(np.ones(3))
    with pytest.raises(TypeError, match="got bool"):
        mpqr.svd(np.ones((3, 2), dtype=bool))


def _cupy_or_skip():
    cp = pytest.importorskip("cupy")
    try:
        if cp.cuda.runtime.getDeviceCount() == 0:
            pytest.skip("no CUDA GPU visible")
    except Exception:  # CuPy without a driver
        pytest.skip("no CUDA GPU visible")
    return cp


@pytest.mark.parametrize("route", ["gesvdj", "gesvdj-t", "eigh-gesvdj"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "complex128"])
@pytest.mark.parametrize("m", [2000, 1 << 15])
def test_svd_on_the_gpu_with_a_jacobi_factor(monkeypatch, dtype, route, m):
    """mpqr.svd on CuPy with R's SVD by cuSOLVER's gesvdj (n >= 128), each way of running
    it (``small_svd_route``), with the library's QR (2000 rows) and CholQR2 (2^15, U from
    its deferred last solve): singular values as LAPACK's, U diag(s) V^H = x, U and V
    orthonormal, to u x size."""
    cp = _cupy_or_skip()
    backend = mpqr.backends.get_backend(mpqr._array_api.array_namespace(cp.ones(1)))
    monkeypatch.setattr(type(backend), "small_svd_route", route)

    rng = np.random.default_rng(3)
    n = 160
    xh = rng.standard_normal((m, n)) * np.logspace(0, -3, n)
    if dtype.startswith("complex"):
        xh = xh + 1j * rng.standard_normal((m, n)) * np.logspace(0, -3, n)
    xh = xh.astype(dtype)
    with mpqr.explain() as trace:
        u, s, vh = (cp.asnumpy(t) for t in mpqr.svd(cp.asarray(xh)))
    kinds = [e.kind for e in trace.events]
    if m > 2000 and dtype == "float64":  # CholQR2 (cond 1e3), not the library's QR
        assert "deferred-solve" in kinds, kinds
    ref = np.linalg.svd(xh.astype(np.complex128 if dtype.startswith("complex") else np.float64),
                        compute_uv=False)
    eps = np.finfo(xh.dtype).eps
    assert u.shape == (m, n) and s.shape == (n,) and vh.shape == (n, n)
    assert np.all(np.diff(s) <= 0)
    assert np.max(np.abs(s - ref)) <= 20 * n * eps * ref[0]
    assert np.linalg.norm(xh - (u * s) @ vh) <= 20 * n * eps * np.linalg.norm(xh)
    assert np.linalg.norm(u.conj().T @ u - np.eye(n)) <= 20 * n * eps
    assert np.linalg.norm(vh @ vh.conj().T - np.eye(n)) <= 20 * n * eps


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.complex128])
@pytest.mark.parametrize("cond", [1e2, 1e13])
def test_svd_applies_cholqr2s_last_solve_to_the_small_factor(monkeypatch, dtype, cond):
    """The QR-SVD on CholQR2 forms ``U = Q1 (R2^-1 U_r)`` (one product over x) where CholQR2
    ran; where it broke down (cond 1e13) the rescue's own Q is used. Both: singular values
    to k u ||x||, U orthonormal and ``U S V^H = x`` to u x size, and U as the unfactored
    route's to the perturbation bound of well-separated singular vectors."""
    backend = mpqr.backends.get_backend(mpqr._array_api.array_namespace(np.ones(1)))
    monkeypatch.setattr(type(backend), "library_qr_tall_max", 0)  # CholQR2, not geqrf
    deferred = cond < 1e6
    if dtype == np.float32 and not deferred:
        cond = 1e9
    rng = np.random.default_rng(7)
    m, n = 1024, 40
    a = geometric(rng, m, n, cond)
    if dtype == np.complex128:  # times a unitary: the same singular values
        a = a @ np.linalg.qr(rng.standard_normal((n, n)) + 1j * rng.standard_normal((n, n)))[0]
    a = a.astype(dtype)
    with mpqr.explain() as trace:
        u, s, vh = mpqr.svd(a)
    kinds = [e.kind for e in trace.events]
    assert ("deferred-solve" in kinds) == deferred != ("fallback" in kinds)
    eps = np.finfo(dtype).eps
    ref = np.linalg.svd(a.astype(np.complex128), compute_uv=False)
    assert u.shape == (m, n) and s.shape == (n,) and vh.shape == (n, n) and u.dtype == dtype
    assert np.max(np.abs(s - ref)) <= 4 * n * eps * ref[0]
    assert np.linalg.norm(a - (u * s) @ vh) <= 4 * np.sqrt(m) * n * eps * np.linalg.norm(a)
    assert orthogonality(u) <= np.sqrt(m) * n * eps
    # the route that forms Q first: same U up to column signs (phases), columns whose
    # singular value is separated by gap g agree to ~ n u s_0 / g
    monkeypatch.setattr(importlib.import_module("mpqr.qr.applications"), "defer_last_solve",
                        lambda _a: contextlib.nullcontext([None, None]))
    u2, s2, _vh2 = mpqr.svd(a)
    assert np.max(np.abs(s2 - s)) <= 4 * n * eps * ref[0]
    gap = np.minimum(np.abs(np.diff(ref, prepend=np.inf)), np.abs(np.diff(ref, append=-np.inf)))
    phase = np.sum(np.conj(u2) * u, axis=0)
    phase = phase / np.abs(phase)
    dev = np.linalg.norm(u - u2 * phase, axis=0)
    assert np.all(dev <= 16 * n * eps * ref[0] / gap + 16 * n * eps)


@pytest.mark.parametrize("route", ["gesvdj", "gesvdj-t", "eigh-gesvdj"])
@pytest.mark.parametrize("dtype", ["float32", "complex64", "float64"])
def test_small_svd_routes_reach_lapacks_accuracy(dtype, route):
    """Each R-SVD route on a Gaussian 256 x 256 upper-triangular factor against float64
    LAPACK on the same matrix: singular values and the backward error within 30 n u
    (LAPACK's test ratio), U and V orthonormal to ``16 n^1.5 u`` (Jacobi: a column takes
    ~n rotations a sweep, ~10 sweeps; float64 measured ~5 n^1.5 u on an H200). Single
    precision runs in double: cuSOLVER's sgesvdj alone left ~1200 u here."""
    cp = _cupy_or_skip()
    from mpqr.backends.cupy import small_svd

    rng = np.random.default_rng(4)
    n = 256
    a = np.triu(rng.standard_normal((n, n)))
    if dtype.startswith("complex"):
        a = a + 1j * np.triu(rng.standard_normal((n, n)))
    a = a.astype(dtype)
    u, s, vh = (cp.asnumpy(t) for t in small_svd.svd(cp.asarray(a), route))
    assert u.dtype == a.dtype and vh.dtype == a.dtype and s.dtype == np.finfo(dtype).dtype
    wide = a.astype(np.complex128)
    ref = np.linalg.svd(wide, compute_uv=False)
    unit = np.finfo(dtype).eps / 2
    lim, orth = 30 * n * unit, 16 * n**1.5 * unit
    assert np.max(np.abs(s - ref)) <= lim * ref[0]
    assert np.linalg.norm(u.conj().T @ u - np.eye(n)) <= orth
    assert np.linalg.norm(vh @ vh.conj().T - np.eye(n)) <= orth
    assert np.linalg.norm(wide - (u * s) @ vh) <= lim * np.linalg.norm(wide)
    with pytest.raises(ValueError, match="`route` must be one of"):
        small_svd.svd(cp.asarray(a), "gesvd")
