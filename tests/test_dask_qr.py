"""mpqr.qr on dask arrays chunked by rows (threaded scheduler): results against the
in-core factorization and float64/extended-precision references, routes, errors."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

da = pytest.importorskip("dask.array")
dask = pytest.importorskip("dask")

import mpqr  # noqa: E402
from tests._qr_support import backward_error, geometric, orthogonality, unit_roundoff  # noqa: E402

pytestmark = pytest.mark.usefixtures("dask_threads")


def _source(rng, m, n, dtype, cond=10.0):
    a = geometric(rng, m, n, cond)
    if np.dtype(dtype).kind == "c":
        a = a + 1j * geometric(rng, m, n, cond)
    a = a.astype(dtype)
    a.flags.writeable = False  # a write into an input block would raise
    return a


def _r_tol(u, n, cond):
    # R is unique (diag > 0); a backward error c n u ||A|| moves it by ~cond(A) times that
    return 40 * n * u * cond


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64, np.complex128])
@pytest.mark.parametrize("chunks", [(97, 61, 240, 2, 200), (600,)], ids=["ragged", "single"])
def test_qr_matches_in_core(dtype, chunks):
    rng = np.random.default_rng(1)
    m, n = sum(chunks), 12
    a = _source(rng, m, n, dtype)
    x = da.from_array(a, chunks=(chunks, n))
    with mpqr.explain() as trace:
        q, r = mpqr.qr(x)
    assert isinstance(q, da.Array) and isinstance(r, da.Array)
    assert q.chunks == x.chunks and r.shape == (n, n)
    q, r = q.compute(), r.compute()
    assert q.dtype == a.dtype and r.dtype == a.dtype
    u = unit_roundoff("auto", dtype)
    assert backward_error(a, q, r) <= 20 * n * u
    assert orthogonality(q) <= 20 * n * u
    r0 = mpqr.qr(a, mode="r")
    scale = np.linalg.norm(a, 2)
    assert np.abs(r - r0).max() <= _r_tol(u, n, 10.0) * scale
    assert np.all(np.diag(r).real > 0) and np.all(np.diag(r).imag == 0)
    route = [e for e in trace.events if e.data.get("route") == "cholqr"]
    assert route and route[0].data["blocks"] == len(chunks)


@pytest.mark.parametrize("precision", ["fp16", "fp32", "fp32-emulated", "fp64", "fp64-emulated"])
@pytest.mark.parametrize("method", ["auto", "cholqr2", "shifted-cholqr3", "householder-tiled"])
def test_precisions_and_methods(precision, method):
    rng = np.random.default_rng(2)
    m, n = 640, 16
    dtype = np.float32 if precision.startswith(("fp16", "fp32")) else np.float64
    a = _source(rng, m, n, dtype)
    x = da.from_array(a, chunks=(150, n))
    q, r = (v.compute() for v in mpqr.qr(x, precision=precision, method=method))
    q0, r0 = mpqr.qr(a, precision=precision, method=method)
    u = unit_roundoff(precision, dtype)
    if method in ("cholqr2", "shifted-cholqr3") and precision in ("fp16", "fp32-emulated"):
        u = 2.0**-11 if precision == "fp16" else u  # Gram matrices from fp16 products
    assert backward_error(a, q, r) <= 20 * n * u
    # the in-core result reaches the same accuracy, so the two R agree to it
    assert np.abs(r - r0).max() <= 2 * _r_tol(u, n, 10.0) * np.linalg.norm(a, 2)
    assert orthogonality(q) <= max(20 * n * u, 4 * orthogonality(q0))


@pytest.mark.parametrize("method", ["auto", "householder-tiled"])
def test_blocks_shorter_than_n(method):
    """Blocks of fewer rows than columns: CholQR sums Gram matrices of any height; the
    TSQR leaves are wide QRs whose R factors stack to at least n rows."""
    rng = np.random.default_rng(3)
    n = 20
    chunks = (7, 13, 5, 19, 40, 3, 200)
    a = _source(rng, sum(chunks), n, np.float64)
    q, r = (v.compute() for v in mpqr.qr(da.from_array(a, chunks=(chunks, n)),
                                            method=method))
    u = 2.0**-53
    assert backward_error(a, q, r) <= 20 * n * u
    assert orthogonality(q) <= 20 * n * u
    assert np.abs(r - mpqr.qr(a, mode="r")).max() <= _r_tol(u, n, 10.0) * np.linalg.norm(a, 2)


@pytest.mark.parametrize(("cond", "chain"), [
    (1e13, ["preconditioned-cholqr"]),
    (1e18, ["preconditioned-cholqr", "tsqr"]),  # numerically rank-deficient
])
def test_ill_conditioned_continues_with_preconditioned_cholqr(cond, chain):
    """Past CholQR2's reach the preconditioned CholQR runs across the blocks from
    CholQR2's Gram matrix (one Gram pass more); only a numerically rank-deficient matrix
    falls back to the TSQR tree."""
    rng = np.random.default_rng(4)
    m, n = 900, 16
    a = _source(rng, m, n, np.float64, cond=cond)
    x = da.from_array(a, chunks=(64, n))  # 15 blocks: a tree of depth 2
    with mpqr.explain() as trace:
        q, r = mpqr.qr(x)
    q, r = q.compute(), r.compute()
    fb = [e for e in trace.events if e.kind == "fallback"]
    assert [e.data["fallback"] for e in fb] == chain
    if len(chain) == 1:
        (route,) = [e for e in trace.events if e.kind == "route"]
        assert route.data["grams"] == 3 and cond / 10 <= route.data["cond_estimate"] <= 10 * cond
        assert "from CholQR2's Gram matrix" in fb[0].message
    else:
        assert "numerically rank-deficient" in fb[1].data["reason"]
    u = 2.0**-53
    assert backward_error(a, q, r) <= 20 * n * u
    assert orthogonality(q) <= 20 * n * u
    assert np.all(np.diag(r) >= 0)
    with pytest.raises(mpqr.BreakdownError, match="cholqr2 broke down"):
        mpqr.qr(x, method="cholqr2")


def test_mode_r_and_integer_input():
    a = np.arange(1.0, 201.0).reshape(50, 4) ** 1.5 % 7 + np.eye(50, 4)
    x = da.from_array(a.astype(np.int64), chunks=(20, 4))
    r = mpqr.qr(x, mode="r")
    assert isinstance(r, da.Array) and r.dtype == np.float64
    r0 = mpqr.qr(a.astype(np.int64), mode="r")
    assert np.abs(r.compute() - r0).max() <= _r_tol(2.0**-53, 4, np.linalg.cond(a)) * \
        np.linalg.norm(a, 2)


def test_nan_propagates_or_is_refused():
    a = np.ones((64, 3)) + np.eye(64, 3)
    a[10, 1] = np.nan
    x = da.from_array(a, chunks=(16, 3))
    with pytest.raises(ValueError, match=r"`x` must not contain infs or NaNs \(check_finite=True\)"):
        mpqr.qr(x, check_finite=True)
    q, r = mpqr.qr(x)
    assert np.isnan(r.compute()).any() and np.isnan(q.compute()).any()


def test_layout_errors():
    a = np.ones((40, 6)) + np.eye(40, 6)
    with pytest.raises(ValueError, match=r"chunked by rows only .* use `x.rechunk\(\{1: -1\}\)`"):
        mpqr.qr(da.from_array(a, chunks=(10, 3)))
    unknown = da.from_array(a, chunks=(10, 6))
    unknown = unknown[unknown[:, 0] > 0]
    with pytest.raises(ValueError, match=r"unknown chunk sizes \(NaN\).*compute_chunk_sizes"):
        mpqr.qr(unknown)
    with pytest.raises(ValueError, match=r"`x` must be a 2-D dask array .* got ndim=3"):
        mpqr.qr(da.ones((2, 40, 6), chunks=(1, 10, 6)))
    with pytest.raises(NotImplementedError, match=r"mode='complete' is not supported"):
        mpqr.qr(da.from_array(a, chunks=(10, 6)), mode="complete")
    with pytest.raises(ValueError, match=r"at least as many rows as columns .* got shape \(6, 40\)"):
        mpqr.qr(da.from_array(a.T.copy(), chunks=(3, 40)))
    with pytest.raises(TypeError, match="`x` must have a floating or integer dtype, got bool"):
        mpqr.qr(da.from_array(a > 1, chunks=(10, 6)))
    with pytest.raises(ValueError, match="`mode` must be one of"):
        mpqr.qr(da.from_array(a, chunks=(10, 6)), mode="full")


def test_empty():
    q, r = mpqr.qr(da.zeros((0, 0), chunks=(1, 1)))
    assert q.shape == (0, 0) and r.shape == (0, 0)


def test_numpy_input_does_not_import_dask():
    code = ("import sys, numpy as np, mpqr; a = np.random.default_rng(0).random((64, 4)); "
            "mpqr.qr(a); mpqr.lstsq(a, a[:, 0]); "
            "bad = sorted(m for m in sys.modules if m == 'dask' or m.startswith('dask.')); "
            "print(bad); sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.gpu
def test_cupy_blocks():
    """CuPy blocks (as on dask_cuda workers): each block's work runs on the CuPy backend
    and Q, R stay CuPy; the results match the in-core CuPy factorization."""
    from tests.conftest import GPU

    if not GPU:
        pytest.skip("no CUDA GPU visible")
    import cupy

    rng = np.random.default_rng(5)
    a = _source(rng, 4096, 64, np.float64)
    x = da.from_array(cupy.asarray(a), chunks=(1000, 64), asarray=False)
    for precision in ("auto", "fp32", "fp64-emulated"):
        with mpqr.explain() as trace:
            q, r = mpqr.qr(x, precision=precision)
            xs, _, rank, s = mpqr.lstsq(x, cupy.asarray(a[:, 0] + 1.0), precision=precision)
        q, r = q.compute(), r.compute()
        assert isinstance(q, cupy.ndarray) and isinstance(r, cupy.ndarray)
        u = unit_roundoff(precision, np.float64)
        assert backward_error(a, q, r) <= 20 * 64 * u
        assert orthogonality(q) <= 20 * 64 * u
        r0 = mpqr.qr(cupy.asarray(a), mode="r", precision=precision)
        assert float(cupy.abs(r - r0).max()) <= _r_tol(u, 64, 10.0) * np.linalg.norm(a, 2)
        assert rank == 64 and any(e.data.get("route") == "cholqr" for e in trace.events)
        x0, _, _, s0 = mpqr.lstsq(a, a[:, 0] + 1.0)  # NumPy float64 reference
        tol = 50 * 64 * 2.0**-53 * 100  # cond(A)^2 = 100; lstsq refines to float64
        assert np.linalg.norm(xs.compute().get() - x0) <= tol * np.linalg.norm(x0)
        # s comes from R at the factorization's precision: |ds| <= c n u ||A|| (Weyl)
        assert np.abs(s.compute().get() - s0).max() <= 50 * 64 * max(u, 2.0**-53) * s0[0]


@pytest.mark.parametrize("method", ["cholqr2", "shifted-cholqr3", "auto"])
def test_columns_out_of_range(method):
    """Columns near 2^600 and 2^-600 (their squares over- and underflow): a requested
    CholQR method runs again on columns scaled by powers of two, as in-core; auto falls
    back to the TSQR tree, whose in-core leaves scale."""
    rng = np.random.default_rng(6)
    n = 6
    base = _source(rng, 480, n, np.float64)
    d = 2.0 ** np.array([600, -600, 0, 300, -300, 5])
    a = base * d
    x = da.from_array(a, chunks=(100, n))
    with mpqr.explain() as trace:
        q, r = (v.compute() for v in mpqr.qr(x, method=method))
    kinds = {e.kind for e in trace.events}
    assert ("scale" in kinds) if method != "auto" else ("fallback" in kinds)
    u = 2.0**-53
    assert orthogonality(q) <= 20 * n * u
    # column-scaled comparison: R D^-1 is the R of the unit-range base
    rb = mpqr.qr(base, mode="r")
    assert np.abs(r / d - rb).max() <= _r_tol(u, n, 10.0) * np.linalg.norm(base, 2)


def test_detection_and_tree_depth():
    from mpqr.backends.dask import is_dask_array
    from mpqr.backends.dask.tree import tree_depth

    assert is_dask_array(da.ones((4, 2), chunks=2))
    assert not is_dask_array(np.ones((4, 2))) and not is_dask_array(None)
    # the depth the explain trace reports: log_8 of the block count, rounded up
    assert [tree_depth(b, 8) for b in (1, 2, 8, 9, 64, 65, 512, 513)] == [0, 1, 1, 2, 2, 3, 3, 4]


def test_bench_dask_is_registered():
    out = subprocess.run([sys.executable, "-m", "mpqr", "bench", "dask", "--help"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "--gpus" in out.stdout and "LocalCUDACluster" in out.stdout
