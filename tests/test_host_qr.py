"""The NumPy backend's library QR calls LAPACK's geqrf/orgqr directly (SciPy's wrappers,
backends/numpy/lapack_qr.py) instead of ``numpy.linalg.qr``: NumPy's modes, shapes and dtypes,
``diag(R) >= 0``, the input untouched; and ``bench qr --cpu --lapack`` times it against
NumPy's and SciPy's QR."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from mpqr.backends import get_backend
from mpqr.backends.numpy.lapack_qr import lapack_qr

import mpqr

ROOT = Path(__file__).resolve().parents[1]


def _a(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        a = a + 1j * rng.standard_normal(shape)
    return a.astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64, np.complex128])
@pytest.mark.parametrize("shape", [(40, 13), (13, 40), (25, 25), (1, 1), (30, 1), (1, 30)])
@pytest.mark.parametrize("mode", ["reduced", "complete", "r"])
def test_lapack_qr_matches_numpy(dtype, shape, mode):
    a = _a(shape, dtype)
    a0 = a.copy()
    q, r = lapack_qr(a, mode)
    assert np.array_equal(a, a0)  # the input is not touched
    ref = np.linalg.qr(a.astype(np.complex128 if a.dtype.kind == "c" else np.float64),
                       mode=mode)
    rr = ref if mode == "r" else ref[1]
    assert r.dtype == a.dtype and r.shape == rr.shape
    d = np.diagonal(r)
    assert np.all(d.real >= 0) and np.all(d.imag == 0)
    # against the float64 reference with its signs made the same: the same factor
    k = min(shape)
    s = np.diagonal(rr)[:k].copy()
    s = np.where(s == 0, 1, s / np.abs(s))
    u = np.finfo(dtype).eps
    tol = 30 * u * max(shape) * np.linalg.cond(a.astype(rr.dtype))
    scale = np.abs(rr).max()
    assert np.abs(r[:k] - rr[:k] * s.conj()[:, None]).max() <= tol * scale
    if mode != "r":
        qq = ref[0]
        assert q.dtype == a.dtype and q.shape == qq.shape
        assert np.abs(q[:, :k] - qq[:, :k] * s[None, :]).max() <= tol
        assert np.abs(q.conj().T @ q - np.eye(q.shape[1])).max() <= 30 * u * max(shape)


def test_numpy_backend_library_qr_takes_lapack_not_numpy(monkeypatch):
    """LAPACK dtypes never reach numpy.linalg.qr (its copies made mpqr.qr slower than
    scipy.linalg.qr on a square float64 matrix); stacks take the same LAPACK per member,
    so a member's factors equal the single-matrix call's (SciPy's batch tests)."""
    backend = get_backend(np)
    assert backend.library_qr_positive
    calls = []
    real = np.linalg.qr
    monkeypatch.setattr(np.linalg, "qr", lambda *a, **k: calls.append(a) or real(*a, **k))
    a = _a((64, 64), np.float64)
    q, r = mpqr.qr(a, method="geqrf")
    assert calls == []
    assert np.linalg.norm(a - q @ r) <= 64 * 2.0**-53 * 64 * np.linalg.norm(a)
    assert np.all(np.diagonal(r) >= 0)
    qs, rs = mpqr.qr(np.stack([a, 2 * a]), method="geqrf")
    assert calls == []
    q2, r2 = mpqr.qr(2 * a, method="geqrf")
    assert np.array_equal(qs[0], q) and np.array_equal(rs[1], r2) and np.array_equal(qs[1], q2)


def test_nan_is_not_a_finite_answer():
    a = _a((20, 20), np.float64)
    a[3, 4] = np.nan
    q, r = lapack_qr(a, "reduced")
    assert not np.isfinite(r).all() and not np.isfinite(q).all()


def test_bench_qr_cpu_lapack_rows(tmp_path):
    from mpqr.bench.qr import main

    out = tmp_path / "qr.json"
    assert main(["--cpu", "--lapack", "--shapes", "48x32", "--repeat", "1",
                 "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["results"]
    assert [r["implementation"] for r in rows] == [
        "numpy.linalg.qr", "scipy.linalg.qr economic", "mpqr.qr"]
    assert all(len(r["runs_s"]) == 1 and r["shape"] == [48, 32] for r in rows)
    assert rows[2]["backward_error"] <= 32 * 48 * 2.0**-53


def test_committed_cpu_bench_has_mpqr_at_lapack_speed():
    """The committed 4000^2 runs (interleaved, medians): mpqr.qr faster than
    numpy.linalg.qr; with one BLAS thread a call (the runs least disturbed by the other
    processes on a shared machine) no slower than scipy.linalg.qr(mode="economic"), and
    with the BLAS's own threads within the spread of SciPy's runs."""
    files = sorted((ROOT / "bench" / "results").glob("qr_lapack_cpu-*.json"))
    assert files, "run: python -m mpqr bench qr --cpu --lapack --json ..."
    single = 0
    for path in files:
        payload = json.loads(path.read_text())
        rows = {r["implementation"]: r for r in payload["results"]}
        mp, sp = rows["mpqr.qr"], rows["scipy.linalg.qr economic"]
        assert mp["shape"] == [4000, 4000] and len(mp["runs_s"]) >= 3, path.name
        assert mp["vs_numpy"] < 1.0, (path.name, mp)
        if payload.get("blas_threads") == 1:
            single += 1
            assert mp["vs_scipy"] <= 1.0, (path.name, mp)
        else:
            assert mp["median_s"] <= max(sp["runs_s"]), (path.name, mp, sp)
    assert single, "no single-thread run committed"
