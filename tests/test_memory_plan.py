"""The workspace check before a device call and the NumPy backend's peak memory."""

import pickle
import tracemalloc

import numpy as np
import pytest
from mpqr.backends import get_backend

import mpqr
from mpqr.qr import memory_plan


def _peak_bytes(fn):
    """Peak of NumPy's live data buffers (NumPy reports them to tracemalloc) during
    ``fn()``, beyond what was live before."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        res = fn()
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    del res
    return peak


@pytest.fixture
def small_device(monkeypatch):
    """The NumPy backend pretending to be a device with ``free`` bytes free."""
    free = {"bytes": None}
    backend = get_backend(np)
    monkeypatch.setattr(type(backend), "device_memory_free", lambda self: free["bytes"])
    return free


def test_oversize_input_raises_device_memory_error(small_device):
    a = np.random.default_rng(0).standard_normal((96, 96))
    small_device["bytes"] = a.nbytes  # the fp64-emulated plan: 3x and the Ozaki scratch
    with pytest.raises(mpqr.DeviceMemoryError) as info:
        mpqr.qr(a, precision="fp64-emulated", method="householder-recursive")
    err = info.value
    assert isinstance(err, MemoryError)
    # the leanest plan's estimate is what it says it needs
    assert err.free == a.nbytes and err.needed == memory_plan.estimate_bytes(
        "householder-recursive", "fp64-emulated", a.shape, 8, "lean") > 3 * a.nbytes
    msg = str(err)
    assert f"{err.needed:,} bytes" in msg and f"{err.free:,} are free" in msg
    assert "memory_budget=" in msg
    assert "no precision of this route fits" in msg
    # a pickled error keeps what it says
    back = pickle.loads(pickle.dumps(err))
    assert (back.needed, back.free, str(back)) == (err.needed, err.free, msg)


def test_hint_names_a_precision_that_fits(small_device):
    a = np.random.default_rng(1).standard_normal((96, 96)).astype(np.float32)
    need = {p: memory_plan.estimate_bytes("householder-recursive", p, a.shape, 4, "lean")
            for p in ("fp16", "fp32-emulated", "fp64-emulated")}
    asked = max(need, key=need.get)
    small_device["bytes"] = sorted(need.values())[1]  # fits the two smaller plans
    fits = min(need, key=need.get)
    with pytest.raises(mpqr.DeviceMemoryError, match=f"precision='{fits}' would fit"):
        mpqr.qr(a, precision=asked, method="householder-recursive")


def test_fitting_call_runs_and_switch_turns_the_check_off(small_device, monkeypatch):
    a = np.random.default_rng(2).standard_normal((96, 96))
    small_device["bytes"] = 20 * a.nbytes
    with mpqr.explain() as trace:
        q, r = mpqr.qr(a, precision="fp64-emulated", method="householder-recursive")
    assert any("plan" in str(e) for e in trace.events)
    np.testing.assert_allclose(q @ r, a, atol=1e-12 * np.linalg.norm(a))
    small_device["bytes"] = 0
    monkeypatch.setenv("MPQR_MEMORY_PLAN", "0")
    _q2, r2 = mpqr.qr(a, precision="fp64-emulated", method="householder-recursive")
    np.testing.assert_array_equal(r2, r)


def test_host_backend_is_never_refused():
    assert get_backend(np).device_memory_free() is None
    a = np.random.default_rng(3).standard_normal((96, 96))
    mpqr.qr(a, precision="fp64-emulated", method="householder-recursive")


def test_tall_route_peak_within_its_bound():
    # tall route: Q (the input's size) and a few n x n blocks; bound 2.5x the input
    a = np.random.default_rng(4).standard_normal((8192, 32))
    peak = _peak_bytes(lambda: mpqr.qr(a, method="cholqr2"))
    assert peak <= 2.5 * a.nbytes, peak / a.nbytes


def _cupy():
    cp = pytest.importorskip("cupy")
    try:
        if cp.cuda.runtime.getDeviceCount() == 0:
            pytest.skip("no CUDA device")
    except cp.cuda.runtime.CUDARuntimeError:
        pytest.skip("no CUDA device")
    return cp


@pytest.mark.parametrize("plan", ["1", "0"])
def test_gpu_oversize_input_raises_device_memory_error(plan, monkeypatch):
    # plan on: refused before the work; off: CuPy's out-of-memory error from inside, as
    # mpqr's error
    cp = _cupy()
    monkeypatch.setenv("MPQR_MEMORY_PLAN", plan)
    pool = cp.get_default_memory_pool()
    a = cp.random.default_rng(0).standard_normal((2048, 2048))
    pool.free_all_blocks()
    pool.set_limit(size=3 * a.nbytes)
    try:
        with pytest.raises(mpqr.DeviceMemoryError) as info:
            mpqr.qr(a, precision="fp64-emulated", method="householder-recursive")
    finally:
        pool.set_limit(size=0)
        pool.free_all_blocks()
    if plan == "1":
        assert info.value.needed > info.value.free >= 0
        assert "are free" in str(info.value)


def test_gpu_pool_high_water_within_plan():
    # the estimate the check uses is at least what one call takes from the pool: with room
    # on the device the fp16 engines' products are whole (the untiled estimate); under a
    # pool limit that only the tiled plan fits, the call tiles them and stays within it
    cp = _cupy()
    from mpqr.bench.memory import measure_call
    from mpqr.qr.memory_plan import estimate_bytes

    pool = cp.get_default_memory_pool()
    for dt, prec in (("float32", "fp32-emulated"), ("float32", "fp16"),
                     ("float64", "fp64-emulated")):
        a = cp.random.default_rng(1).standard_normal((4096, 4096)).astype(dt)
        got = measure_call(cp, lambda x, pr=prec: mpqr.qr(x, precision=pr), a)
        whole = estimate_bytes("householder-recursive", prec, a.shape, a.itemsize, "fast")
        assert got["pool_multiple"] * a.nbytes <= whole, (prec, got, whole / a.nbytes)
        tiled = estimate_bytes("householder-recursive", prec, a.shape, a.itemsize)
        if tiled < whole:  # 4096^2 float32: the cap (64 MiB, the input's size) tiles
            pool.free_all_blocks()
            pool.set_limit(size=pool.total_bytes() + (tiled + whole) // 2)
            try:
                q, r = mpqr.qr(a, precision=prec)
                assert pool.total_bytes() <= pool.get_limit()
                err = float(cp.linalg.norm(q @ r - a) / cp.linalg.norm(a))
                assert err <= 4096 * 2.0**-11, (prec, err)
                del q, r
            finally:
                pool.set_limit(size=0)
                pool.free_all_blocks()
        del a


def test_ozaki_scratch_cap_blocks_products_and_changes_no_bit(monkeypatch):
    a = np.random.default_rng(5).standard_normal((128, 96))
    monkeypatch.setattr(memory_plan, "OZAKI_FLOOR", 1 << 14)

    def run():
        with mpqr.explain() as trace, mpqr.gemm_options(engine="ozaki-int8"):
            q, r = mpqr.qr(a, precision="fp64-emulated", method="householder-recursive")
        return q, r, [e.data["block"] for e in trace.events if e.kind == "ozaki"]

    q, r, blocks = run()
    monkeypatch.setenv("MPQR_MEMORY_PLAN", "0")
    q0, r0, blocks0 = run()
    # the cap blocked the products (the caller's forced engine kept); not a bit changed
    assert len(blocks) == len(blocks0) > 0
    assert sum(b0 * b1 for b0, b1 in blocks) < sum(b0 * b1 for b0, b1 in blocks0)
    np.testing.assert_array_equal(q, q0)
    np.testing.assert_array_equal(r, r0)


@pytest.mark.parametrize("engine", ["tc-sgemm", "tc-fp16", "tc-fp16-splitb"])
def test_split_engine_products_tile_to_the_workspace_limit(engine):
    # a product on an engine that splits its operands whole runs in output tiles whose
    # scratch fits the limit: same numbers within the engine's bound, less peak memory;
    # gemm_sub / gemm_into write through a transposed view
    rng = np.random.default_rng(6)
    a = rng.standard_normal((512, 64)).astype(np.float32)
    b = rng.standard_normal((64, 512)).astype(np.float32)
    bits = 11 if engine != "tc-sgemm" else 22
    tol = (2.0**-bits * 4 + 64 * 2.0**-24) * (np.abs(a) @ np.abs(b))
    limit = 800 << 10  # the whole product's scratch is ~2.4 MB: 2 x 2 tiles

    def run(opts):
        with mpqr.gemm_options(engine=engine, **opts):
            return mpqr.policy.gemm(a, b, precision="fp32-emulated")

    whole = run({})
    p_whole = _peak_bytes(lambda: run({}))
    tiled = run({"workspace_limit": limit})
    p_tiled = _peak_bytes(lambda: run({"workspace_limit": limit}))
    assert np.all(np.abs(tiled - whole) <= 2 * tol)
    assert p_tiled < 0.6 * p_whole, (p_tiled, p_whole)
    c = rng.standard_normal((512, 512)).astype(np.float32)
    ct_ = np.array(c.T)
    with mpqr.gemm_options(engine=engine, workspace_limit=limit):
        mpqr.policy.gemm_sub(ct_.T, a, b, precision="fp32-emulated")
        out = np.empty_like(c)
        mpqr.policy.gemm_into(out.T, b.T, a.T, precision="fp32-emulated")
    assert np.all(np.abs(ct_.T - (c - whole)) <= 2 * tol + 4 * 2.0**-24 * np.abs(c))
    assert np.all(np.abs(out - whole) <= 2 * tol)


@pytest.mark.parametrize("dtype,precision", [("float32", "fp32-emulated"),
                                             ("float32", "fp16"),
                                             ("float64", "fp64-emulated"),
                                             ("float64", "fp64")])
def test_square_route_peak_within_the_documented_bound(dtype, precision, monkeypatch):
    # the bytes counted on the NumPy backend (its fp16 GEMM's float32 widening counted by
    # the policy's tiles) stay within the plan's budget of the route (docs/memory.md), the
    # caps' floors lowered to this size; the plan off goes past it where it splits
    # operands whole
    import mpqr.policy.policy as pol

    monkeypatch.setattr(memory_plan, "SPLIT_FLOOR", 1 << 12)
    monkeypatch.setattr(memory_plan, "OZAKI_FLOOR", 1 << 12)
    monkeypatch.setattr(pol, "MIN_TILE", 32)
    a = np.random.default_rng(7).standard_normal((256, 256)).astype(dtype)

    def call():
        return mpqr.qr(a, precision=precision, method="householder-recursive")

    call()  # first-call caches out of the count
    peak = _peak_bytes(call)
    bound = memory_plan.estimate_bytes("householder-recursive", precision, a.shape,
                                       a.itemsize)
    # NumPy forms the product of an in-place update first (cuBLAS accumulates into it):
    # one more block of the top level's update, m x n/2
    numpy_products = a.shape[0] * (a.shape[1] // 2) * a.itemsize
    assert peak <= bound + numpy_products, (peak / a.nbytes, bound / a.nbytes)
    # the factors are the input's size each (Q, and R in the working copy's storage)
    assert bound <= (4.0 if precision in ("fp16", "fp64-emulated") else 3.5) * a.nbytes
    if precision == "fp32-emulated":
        monkeypatch.setenv("MPQR_MEMORY_PLAN", "0")
        assert _peak_bytes(call) > bound + numpy_products
