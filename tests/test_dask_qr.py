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


def test_ill_conditioned_falls_back():
    """cond 1e13: CholQR2 breaks down; one TSQR pass gives R_1 and one certified CholQR
    pass on A R_1^-1 makes Q orthonormal (mode "r": the TSQR pass alone)."""
    rng = np.random.default_rng(4)
    m, n = 900, 16
    a = _source(rng, m, n, np.float64, cond=1e13)
    x = da.from_array(a, chunks=(64, n))  # 15 blocks: a tree of depth 2
    with mpqr.explain() as trace:
        q, r = mpqr.qr(x)
        r_only = mpqr.qr(x, mode="r").compute()
    q, r = q.compute(), r.compute()
    fb = [e.data["fallback"] for e in trace.events if e.kind == "fallback"]
    assert fb == ["tsqr-cholqr", "tsqr-r"]
    u = 2.0**-53
    assert backward_error(a, q, r) <= 20 * n * u
    assert orthogonality(q) <= 20 * n * u
    assert np.all(np.diag(r) >= 0)
    # R is unique: both agree with the in-core R to its forward error (cond times u)
    r0 = mpqr.qr(a, mode="r")
    for rr in (r, r_only):
        assert np.abs(rr - r0).max() <= _r_tol(u, n, 1e13) * np.linalg.norm(a, 2)
    with pytest.raises(mpqr.BreakdownError, match="cholqr2 broke down"):
        mpqr.qr(x, method="cholqr2")


def test_rank_deficient_takes_the_tsqr_tree():
    """A numerically singular matrix (a repeated column): the preconditioned CholQR
    breaks down as well, and the TSQR tree with Q (Householder at every node) gives an
    orthonormal Q and a backward-stable R."""
    rng = np.random.default_rng(7)
    m, n = 640, 12
    a = _source(rng, m, n, np.float64).copy()
    a[:, 5] = a[:, 2]
    a.flags.writeable = False
    with mpqr.explain() as trace:
        q, r = mpqr.qr(da.from_array(a, chunks=(80, n)))
    q, r = q.compute(), r.compute()
    assert [e.data["fallback"] for e in trace.events if e.kind == "fallback"] == \
        ["tsqr-cholqr", "tsqr"]
    u = 2.0**-53
    assert backward_error(a, q, r) <= 20 * n * u
    assert orthogonality(q) <= 20 * n * u


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


class _Reads:
    """Instrumented blocks: how often each block of ``a`` is read, and how many graphs
    the calls compute (the threaded scheduler recomputes the blocks in every graph)."""

    def __init__(self, a, rows):
        self.calls = 0
        self.nb = len(range(0, a.shape[0], rows))
        self.x = da.from_array(a, chunks=(rows, a.shape[1])).map_blocks(
            self._read, dtype=a.dtype, meta=np.empty((0, 0), dtype=a.dtype))
        self.computes = 0

    def _read(self, block):
        self.calls += 1
        return block

    @property
    def passes(self):
        assert self.calls % self.nb == 0  # every pass reads every block once
        return self.calls // self.nb

    def __enter__(self):
        from dask.callbacks import Callback

        def start(dsk):
            self.computes += 1

        self._cb = Callback(start=start)
        self._cb.__enter__()
        return self

    def __exit__(self, *exc):
        self._cb.__exit__(*exc)


@pytest.mark.parametrize("cond, passes", [(2.0, 1), (100.0, 2), (1e12, 2)])
def test_mode_r_passes(cond, passes):
    """mode="r": one pass where cond(A) <= 4, CholQR2's two where it is larger; where the
    first pass's Cholesky breaks down, one TSQR pass after it; each pass one graph (one
    gather)."""
    rng = np.random.default_rng(8)
    a = _source(rng, 1200, 10, np.float64, cond=cond)
    with _Reads(a, 150) as reads, mpqr.explain() as trace:
        r = mpqr.qr(reads.x, mode="r")
    assert reads.passes == reads.computes == passes
    assert sum(e.kind == "dask-pass" for e in trace.events) == passes
    r0 = mpqr.qr(a, mode="r")
    u = 2.0**-53
    assert np.abs(r.compute() - r0).max() <= _r_tol(u, 10, cond) * np.linalg.norm(a, 2)


def test_q_is_one_lazy_pass():
    """With Q: two passes for R (the second applies R_1^-1 and forms its Gram matrix in
    the same block task), then Q costs exactly one more read of each block."""
    rng = np.random.default_rng(9)
    a = _source(rng, 1200, 10, np.float64, cond=100.0)
    with _Reads(a, 150) as reads:
        q, r = mpqr.qr(reads.x, check_finite=True)  # the check rides along with pass 1
        assert reads.passes == reads.computes == 2
        q = q.compute()
        assert reads.passes == 3
    u = 2.0**-53
    assert backward_error(a, q, r.compute()) <= 20 * 10 * u
    assert orthogonality(q) <= 20 * 10 * u


@pytest.mark.parametrize("cond, merged", [(2.0, True), (1e4, False)])
def test_q_pass_takes_one_gemm_where_r_allows(cond, merged):
    """The lazy Q pass applies R^-1 itself (one GEMM per block) where cond_1(R) <= 8,
    else R_1^-1 and R_2^-1 in turn as the passes did; the factors travel inside the
    block tasks (the Q graph adds one task per block and nothing else)."""
    from mpqr.backends.dask import _blocks

    from mpqr.qr import cholqr as c

    rng = np.random.default_rng(11)
    n = 12
    a = _source(rng, 1440, n, np.float64, cond=cond)
    x = da.from_array(a, chunks=(180, n))
    with mpqr.explain() as trace:
        q, r = mpqr.qr(x)
    ev = [e for e in trace.events if e.kind == "apply-inverse" and "qr (dask)" in e.message]
    assert bool(ev) == merged, [e.message for e in trace.events]
    if merged:
        assert ev[0].data["factors"] == 2 and ev[0].data["cond_1"] <= c.INVERSE_COND_MAX
    assert set(q.dask.layers) - set(x.dask.layers) == {q.name}
    assert len(q.dask.layers[q.name]) == len(x.chunks[0])
    qv, rv = q.compute(), r.compute()
    u = 2.0**-53
    assert backward_error(a, qv, rv) <= 20 * n * u
    assert orthogonality(qv) <= 20 * n * u
    # the same Q as applying R^-1 to each block by the in-core rule, to rounding
    inv = c.inverse_and_cond(_blocks.host_backend(), rv)
    q1 = _blocks.apply_inverses(np.asarray(a), ((rv, inv),), "cholqr2", "fp64", True)
    assert np.abs(qv - q1).max() <= 20 * n * u * cond


def test_device_copies_of_small_operands_are_kept_per_key():
    """A worker moves a keyed operand tuple to its blocks' device once (a few keys
    kept); unkeyed operands are moved every time."""
    from mpqr.backends.dask import _blocks
    from mpqr.backends.dask._graph import Small

    backend = _blocks.host_backend()
    a = np.ones((4, 2))
    value = (np.eye(2), (np.eye(2), 1.0), "cholqr2", None)
    first = _blocks.on_device(Small(value, key="k0"), a, backend)
    # NumPy blocks: the host arrays themselves
    assert first[0] is value[0] and first[1][0] is value[1][0] and first[2:] == value[2:]
    assert _blocks.on_device(Small(value, key="k0"), a, backend) is first
    for i in range(1, 6):
        _blocks.on_device(Small(value, key=f"k{i}"), a, backend)
    assert ("k0", str(a.device)) not in _blocks._ON_DEVICE
    assert len(_blocks._ON_DEVICE) <= _blocks._ON_DEVICE_KEEP
    assert _blocks.on_device(Small(value), a, backend) is not first


def test_check_finite_rides_along_with_pass_one():
    a = np.ones((64, 3)) + np.eye(64, 3)
    a[40, 2] = np.inf
    with _Reads(a, 16) as reads:
        with pytest.raises(ValueError, match=r"`x` must not contain infs or NaNs"):
            mpqr.qr(reads.x, mode="r", check_finite=True)
    assert reads.passes == 1
