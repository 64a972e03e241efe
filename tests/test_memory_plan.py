"""The workspace check before a device call and the NumPy backend's peak memory."""

import importlib
import math
import os
import pickle
import tracemalloc

import numpy as np
import pytest
from mpqr.backends import get_backend

import mpqr
from mpqr.qr import memory_plan


def _peak_bytes(fn, keep=False):
    """Peak of NumPy's live data buffers (NumPy reports them to tracemalloc) during
    ``fn()``, beyond what was live before (and ``fn()``'s result where ``keep``)."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        res = fn()
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    if keep:
        return peak, res
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


def test_refusal_raised_as_the_backend_raises_device_faults(small_device, monkeypatch):
    # the plan's refusal goes through the backend's translate_error hook (on CuPy it is
    # CuPy's OutOfMemoryError as well), its message, needed and free kept
    class Translated(mpqr.DeviceMemoryError):
        pass

    def translate(self, exc, what):
        if isinstance(exc, mpqr.DeviceMemoryError) and not isinstance(exc, Translated):
            return Translated(f"{what}: {exc}", needed=exc.needed, free=exc.free)
        return None

    monkeypatch.setattr(type(get_backend(np)), "translate_error", translate)
    a = np.random.default_rng(0).standard_normal((96, 96))
    small_device["bytes"] = a.nbytes
    with pytest.raises(Translated, match=r"^mpqr\.qr: mpqr\.qr of a 96 x 96 float64 array "
                                         r"at precision='fp64-emulated'") as info:
        mpqr.qr(a, precision="fp64-emulated", method="householder-recursive")
    assert info.value.free == a.nbytes and info.value.needed > a.nbytes
    assert info.value.__cause__ is None


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


def test_fp64_emulated_takes_the_lean_plan_first_from_its_size(small_device, monkeypatch):
    hr = "householder-recursive"
    assert memory_plan.lean_first(hr, "fp64-emulated", (16384, 16384))
    assert memory_plan.lean_first(hr, "fp64-emulated", (8192, 8192))
    assert memory_plan.lean_first(hr, "fp64-emulated", (65536, 8192))  # tall
    assert memory_plan.lean_first(hr, "fp64-emulated", (16384, 40000))  # wide
    assert not memory_plan.lean_first(hr, "fp64-emulated", (4096, 4096))
    assert not memory_plan.lean_first(hr, "fp64-emulated", (65536, 4096))
    assert not memory_plan.lean_first(hr, "fp64-emulated", (16384, 16384), want_q=False)
    assert not memory_plan.lean_first(hr, "fp64-emulated", (2, 16384, 16384))  # a stack
    assert not memory_plan.lean_first(hr, "fp32-emulated", (16384, 16384))
    assert not memory_plan.lean_first("geqrf", "fp64-emulated", (16384, 16384))
    # on a device with room for the fast plan: the lean plan from the threshold up
    a = np.random.default_rng(5).standard_normal((96, 96))
    small_device["bytes"] = 100 * a.nbytes
    plans = {}
    for least in (16384, 64):
        monkeypatch.setattr(memory_plan, "LEAN_FIRST_MIN_N", {"fp64-emulated": least})
        with mpqr.explain() as trace:
            q, r = mpqr.qr(a, precision="fp64-emulated", method=hr)
        plans[least] = [e.data["plan"] for e in trace.events
                        if e.kind == "memory" and "plan" in e.data]
        np.testing.assert_allclose(q @ r, a, atol=1e-13 * np.linalg.norm(a))
        np.testing.assert_allclose(q.T @ q, np.eye(96), atol=1e-13)
    assert plans == {16384: ["fast"], 64: ["lean"]}
    with mpqr.explain() as trace:  # mode "r": the fast plan (no Q to form)
        r = mpqr.qr(a, mode="r", precision="fp64-emulated", method=hr)
    assert [e.data["plan"] for e in trace.events
            if e.kind == "memory" and "plan" in e.data] == ["fast"]
    # fp32-emulated keeps the fast plan
    with mpqr.explain() as trace:
        mpqr.qr(a.astype(np.float32), precision="fp32-emulated", method=hr)
    assert [e.data["plan"] for e in trace.events
            if e.kind == "memory" and "plan" in e.data] == ["fast"]


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
    pool.free_all_blocks()
    # a chunk that a live array pins keeps its free part cached after free_all_blocks, and
    # the pool serves from it under any limit: the input outgrows that part
    n = max(2048, math.isqrt(pool.free_bytes() // 8) + 64)
    a = cp.random.default_rng(0).standard_normal((n, n))
    # half the input beyond what the pool holds: the route's working copy and Q alone are
    # 2x (at 3x, the plan-off call can fit, depending on what the pool holds, and the
    # test then checks nothing)
    pool.set_limit(size=pool.total_bytes() + a.nbytes // 2)
    try:
        with pytest.raises(mpqr.DeviceMemoryError) as info:
            mpqr.qr(a, precision="fp64-emulated", method="householder-recursive")
    finally:
        pool.set_limit(size=0)
        pool.free_all_blocks()
    if plan == "1":
        assert info.value.needed > info.value.free >= 0
        assert "are free" in str(info.value)


@pytest.mark.parametrize("before", [None, "1", "off"])
def test_memory_measured_on_calls_as_they_run(monkeypatch, before):
    # a replayed call (or the capture, the second call of a shape) runs in a CUDA graph's
    # pool of its own, which the default pool's high-water would not count
    from mpqr.bench.memory import calls_as_they_run

    if before is None:
        monkeypatch.delenv("MPQR_GRAPHS", raising=False)
    else:
        monkeypatch.setenv("MPQR_GRAPHS", before)
    with pytest.raises(RuntimeError, match="inside"):
        with calls_as_they_run():
            assert os.environ["MPQR_GRAPHS"] == "0"
            raise RuntimeError("inside")
    assert os.environ.get("MPQR_GRAPHS") == before


def _spine_in_blocks_of(monkeypatch, block):
    """The recursion's module with the fast plan forced and its spine in blocks of
    ``block`` columns at any width."""
    hr = importlib.import_module("mpqr.qr.householder_recursive")
    monkeypatch.setenv("MPQR_MEMORY_PLAN", "fast")
    monkeypatch.setattr(hr, "SPINE_BLOCKS", 10**6)
    monkeypatch.setattr(hr, "SPINE_BLOCK", block)
    return hr


@pytest.mark.parametrize("precision", ["fp16", "fp32-emulated"])
def test_gpu_spine_reserve_bounds_the_pool(monkeypatch, precision):
    # the fast plan's spine takes its estimate as one block of the pool first: one call's
    # growth of the pool (from an empty pool) is then the factors and that block, and no
    # more than without it
    cp = _cupy()
    from mpqr.bench.memory import measure_call

    hr = _spine_in_blocks_of(monkeypatch, 512)
    n = 4096
    a = cp.random.default_rng(0).standard_normal((n, n), dtype=cp.float32)
    grew = {}
    factor = hr.SPINE_RESERVE[precision]
    for on in (False, True):
        monkeypatch.setattr(hr, "SPINE_RESERVE", {precision: factor} if on else {})
        got = measure_call(cp, lambda x: mpqr.qr(x, precision=precision,
                                                 method="householder-recursive"), a)
        grew[on] = got["pool_multiple"] * a.nbytes
    est = factor * hr.spine_scratch(n, n, 512, fp16=precision == "fp16",
                                    stretch=hr.spine_stretch(n, n, precision))
    assert grew[True] <= grew[False] + (1 << 20), grew
    assert grew[True] <= 2 * a.nbytes + est + 0.05 * a.nbytes, (grew, est / a.nbytes)


@pytest.mark.parametrize("precision", ["fp16", "fp32-emulated"])
def test_gpu_repeated_calls_keep_the_pool_and_the_bits(monkeypatch, precision):
    # the fast plan's spine in blocks, with its reserved block and (fp32-emulated) its
    # products in stretches: 300 calls in a row take no more of the pool than the first
    # few (the reserve is taken from cached memory, not again), and every call gives the
    # first call's bits
    cp = _cupy()
    hr = _spine_in_blocks_of(monkeypatch, 512)
    monkeypatch.setattr(hr, "STRETCH_MIN_ROWS", 1024)
    pool = cp.get_default_memory_pool()
    a = cp.random.default_rng(2).standard_normal((4096, 4096), dtype=cp.float32)
    with mpqr.explain() as trace:
        q0, r0 = mpqr.qr(a, precision=precision, method="householder-recursive")
    if precision == "fp32-emulated":  # the stretches ran
        assert max(g.shape[2] for g in trace.gemms if g.label == "rec-update-WhB") < 4096
    for _ in range(2):
        q, r = mpqr.qr(a, precision=precision, method="householder-recursive")
    cp.cuda.Device().synchronize()
    held = pool.total_bytes()
    for i in range(300):
        q, r = mpqr.qr(a, precision=precision, method="householder-recursive")
        if i % 60 == 0 or i == 299:
            assert bool(cp.array_equal(q, q0)) and bool(cp.array_equal(r, r0)), i
    cp.cuda.Device().synchronize()
    assert pool.total_bytes() <= held, (pool.total_bytes(), held)
    del q, r, q0, r0


def test_spine_estimate_where_the_spine_reserves(monkeypatch):
    # the fast plan's estimate is the spine's where it goes in blocks with a reserved
    # block (float32, fp16 / fp32-emulated, one matrix, at most SPINE_MAX_ASPECT rows a
    # column): the working copy, W, the block (at least a taller input's R), a leaf's
    # copies and the slack; elsewhere the halves' terms
    from mpqr.qr import householder_recursive as hr
    from mpqr.qr.memory_plan import _spine_bytes

    est = memory_plan.estimate_bytes
    n = 16384
    nb = hr.leaf_width(n, hr.MAX_CERTIFIED_LEAF_WIDTH, rows=n)
    block = hr.SPINE_RESERVE["fp16"] * hr.spine_scratch(n, n, hr.spine_block(n, n, nb),
                                                         fp16=True)
    want = math.ceil(2 * 4 * n * n + int(block) + 4 * n * nb * 4 + 0.1 * 4 * n * n)
    assert est("householder-recursive", "fp16", (n, n), 4, "fast") == want
    m2 = 2 * n  # taller: R (n x n) is larger than the fp16 block
    nb2 = hr.leaf_width(n, hr.MAX_CERTIFIED_LEAF_WIDTH, rows=m2)
    assert _spine_bytes("householder-recursive", "fp16", m2, n, 1, 4) == math.ceil(
        2 * 4 * m2 * n + max(int(hr.spine_scratch(m2, n, 2048, fp16=True)), 4 * n * n)
        + 4 * m2 * nb2 * 4 + 0.1 * 4 * m2 * n)
    for args in (("fp64-emulated", n, n, 1, 8), ("fp16", n, n, 2, 4), ("fp16", n, n, 1, 8),
                 ("fp16", 16 * n, n, 1, 4), ("fp16", 4096, 4096, 1, 4)):
        assert _spine_bytes("householder-recursive", *args) is None, args
    monkeypatch.setattr(hr, "SPINE_RESERVE", {})
    assert _spine_bytes("householder-recursive", "fp16", n, n, 1, 4) is None
    assert est("householder-recursive", "fp16", (n, n), 4, "fast") > want


@pytest.mark.parametrize("shape,precision", [
    ((8192, 8192), "fp16"), ((8192, 8192), "fp32-emulated"), ((16384, 8192), "fp16")])
def test_gpu_spine_pool_within_its_estimate(shape, precision):
    # where the fast plan's spine goes in blocks, the estimate is its own (the working
    # copy, W, the reserved block, a leaf's copies, the slack): at least what one call
    # takes from the pool
    cp = _cupy()
    from mpqr.bench.memory import measure_call
    from mpqr.qr.memory_plan import _spine_bytes, estimate_bytes

    a = cp.random.default_rng(2).standard_normal(shape, dtype=cp.float32)
    got = measure_call(cp, lambda x: mpqr.qr(x, precision=precision), a)
    est = estimate_bytes("householder-recursive", precision, shape, 4, "fast")
    assert est == _spine_bytes("householder-recursive", precision, *shape, 1, 4)
    assert got["pool_multiple"] * a.nbytes <= est, (got, est / a.nbytes)


def test_gpu_pool_high_water_within_plan():
    # the estimate the check uses is at least what one call takes from the pool: with room
    # on the device the fp16 engines' products are whole (the untiled estimate); under a
    # pool limit that only the tiled plan fits, the call tiles them and stays within it
    cp = _cupy()
    from mpqr.backends.cupy import graphs

    from mpqr.bench.memory import measure_call
    from mpqr.qr.memory_plan import estimate_bytes

    pool = cp.get_default_memory_pool()
    graphs.clear()
    for dt, prec in (("float32", "fp32-emulated"), ("float32", "fp16"),
                     ("float64", "fp64-emulated")):
        a = cp.random.default_rng(1).standard_normal((4096, 4096)).astype(dt)
        got = measure_call(cp, lambda x, pr=prec: mpqr.qr(x, precision=pr), a)
        # both calls ran as they are: no graph of this shape captured, none replayed
        assert not [k for k in graphs.kept() if k[1] == a.shape], graphs.kept()
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


@pytest.mark.parametrize("engine", ["tc-sgemm", "tc-fp16"])
@pytest.mark.parametrize("backend_name", ["numpy", "cupy"])
def test_long_products_tile_along_k_within_the_limit(engine, backend_name, monkeypatch):
    # a product whose inner dimension is its longest runs in stretches of k (each operand
    # split once, the partial products added into the output) where that moves fewer
    # bytes than output tiles: the same numbers within the engine's bound (float64
    # reference), gemm / gemm_sub / gemm_into through transposed views; with stretches
    # of k off, none (the output is narrower than the narrowest output tile)
    import mpqr.policy.policy as pol

    xp = np if backend_name == "numpy" else _cupy()
    m, k, n = 96, 4096, 80
    limit = 1 << 20  # the whole product's splits are 1.4 MB (CuPy, tc-fp16) to 10 MB
    shapes = _three_products_checked(xp, engine, (m, k, n), limit, 11, monkeypatch)
    # equal stretches of k (two or more), whole rows and columns of the output
    kb = shapes[0][2]
    assert kb < k and k % kb == 0 and len(shapes) == 3 * (k // kb), shapes
    assert set(shapes) == {(m, n, kb), (n, m, kb)}
    monkeypatch.setattr(pol, "K_TILES", False)
    shapes = _three_products_checked(xp, engine, (m, k, n), limit, 11, monkeypatch)
    assert shapes and all(s[2] == k for s in shapes)


@pytest.mark.parametrize("fused", [True, False])
def test_tiles_for_the_one_kernel_tc_sgemm_have_no_product_in_memory(fused, monkeypatch):
    # where the backend's one-kernel tc-sgemm takes a tile, the tile is sized without the
    # product and partials (the kernel keeps them in registers): tiles larger than the
    # limit would allow with them; without that kernel the product's bytes count
    from types import SimpleNamespace

    import mpqr.policy.policy as pol

    monkeypatch.setattr(pol, "FUSED_TILES", True)
    m = n = 2048
    k = 4096
    backend = SimpleNamespace(xp=np, fused_sgemm_kernel=lambda *args: "k" if fused else None)
    d = SimpleNamespace(engine="tc-sgemm", params={"slice_k": 256, "partials_bytes": 1 << 20})
    a, b = np.empty((m, k), np.float32), np.empty((k, n), np.float32)
    limit = 6 * 1024 * (m + n) + (1 << 20)
    tiles = pol._tiles(backend, d, {"workspace_limit": limit}, a, b)
    shapes = {(t[0].stop - t[0].start, t[1].stop - t[1].start, t[2].stop - t[2].start)
              for t in tiles}
    if fused:  # the splits fit; with the product counted they would not
        assert all(6 * kk * (r + c) <= limit for r, c, kk in shapes)
        assert all(6 * kk * (r + c) + 8 * r * c + (1 << 20) > limit for r, c, kk in shapes)
    else:
        assert all(r * c < m * n for r, c, _ in shapes)
        assert all(6 * kk * (r + c) + 8 * r * c + (1 << 20) <= limit for r, c, kk in shapes)


def test_gpu_k_stretches_add_through_the_one_kernel_tc_sgemm(monkeypatch):
    # on CuPy with Triton, stretches of k whose output the one-kernel tc-sgemm takes add
    # into it in place (c += P, c -= P): gemm / gemm_sub / gemm_into against float64
    cp = _cupy()
    if not get_backend(cp).fused_sgemm_kernel(2048, 2048, 1024, 256):
        pytest.skip("no one-kernel tc-sgemm (Triton) on this device")
    m = n = 2048
    k = 4096
    shapes = _three_products_checked(cp, "tc-sgemm", (m, k, n), 6 * 1024 * (m + n), 13,
                                     monkeypatch)
    assert shapes and all(kk < k for _, _, kk in shapes), shapes


def _three_products_checked(xp, engine, mkn, limit, seed, monkeypatch):
    """``gemm``, ``gemm_sub`` into a transposed view and ``gemm_into`` from transposed
    operands on ``engine`` under ``workspace_limit=limit``, each against float64 within
    the engine's bound on a partial product plus the additions of the partials; the
    shapes ``(rows, cols, k)`` of the pieces the policy ran."""
    import mpqr.policy.policy as pol

    m, k, n = mkn
    rng = np.random.default_rng(seed)
    a64, b64, c64 = (rng.standard_normal(s) for s in ((m, k), (k, n), (m, n)))
    a, b, c = (xp.asarray(x.astype(np.float32)) for x in (a64, b64, c64))
    calls = []
    monkeypatch.setattr(pol, "_into", _counting(pol._into, calls))
    with mpqr.gemm_options(engine=engine, workspace_limit=limit):
        p = mpqr.policy.gemm(a, b, precision="fp32-emulated")
        sub = xp.asarray(c.T, copy=True)
        mpqr.policy.gemm_sub(sub.T, a, b, precision="fp32-emulated")
        out = xp.empty((n, m), dtype=xp.float32)
        mpqr.policy.gemm_into(out, b.T, a.T, precision="fp32-emulated")
    p, sub, into = (np.asarray(x.get() if hasattr(x, "get") else x, dtype=np.float64)
                    for x in (p, sub.T, out.T))
    exact = a64.astype(np.float32).astype(np.float64) @ b64.astype(np.float32)
    c32 = c64.astype(np.float32).astype(np.float64)
    bits = 11 if engine == "tc-fp16" else 22
    tol = (4 * 2.0**-bits + (k + 16) * 2.0**-24) * (np.abs(a64) @ np.abs(b64))
    assert np.all(np.abs(p - exact) <= tol)
    assert np.all(np.abs(into - exact) <= tol)
    assert np.all(np.abs(sub - (c32 - exact)) <= tol + 16 * 2.0**-24 * np.abs(c32))
    return calls


def _counting(fn, calls):
    def into(backend, d, out_dtype, c, a, b, *, subtract):
        calls.append((a.shape[0], b.shape[1], a.shape[1]))
        return fn(backend, d, out_dtype, c, a, b, subtract=subtract)
    return into


def _errors(a, q, r):
    a64 = a.astype(np.float64)
    be = np.linalg.norm(q.astype(np.float64) @ r - a64) / np.linalg.norm(a64)
    orth = np.linalg.norm(q.T.astype(np.float64) @ q - np.eye(q.shape[1]))
    return be, orth


@pytest.mark.parametrize("dtype,precision,plan", [
    ("float32", "fp32-emulated", "tiled"), ("float32", "fp16", "tiled"),
    ("float64", "fp64-emulated", "tiled"), ("float64", "fp64", "tiled"),
    ("float64", "fp64-emulated", "lean"), ("float64", "fp64", "lean")])
def test_square_route_peak_within_the_documented_bound(dtype, precision, plan, monkeypatch):
    # the bytes counted on the NumPy backend (its fp16 GEMM's float32 widening counted by
    # the policy's tiles) stay within the plan's budget of the route (docs/memory.md), the
    # caps' floors lowered to this size; the plan off goes past the tiled budget where it
    # splits operands whole; the lean route within the lean budget, below the tiled one.
    # (The fp16 engines' lean bound is counted on a GPU: NumPy's emulation of their
    # splits takes 14 bytes an element where CuPy takes 6, and the narrowest tile leaves
    # it above the lean cap at this size.)
    import mpqr.policy.policy as pol

    monkeypatch.setattr(memory_plan, "SPLIT_FLOOR", 1 << 12)
    monkeypatch.setattr(memory_plan, "OZAKI_FLOOR", 1 << 12)
    monkeypatch.setattr(pol, "MIN_TILE", 32)
    monkeypatch.setenv("MPQR_MEMORY_PLAN", "1" if plan == "tiled" else plan)
    n = 256
    a = np.random.default_rng(7).standard_normal((n, n)).astype(dtype)

    def call():
        return mpqr.qr(a, precision=precision, method="householder-recursive")

    call()  # first-call caches out of the count
    peak, (q, r) = _peak_bytes(call, keep=True)
    bound = memory_plan.estimate_bytes("householder-recursive", precision, a.shape,
                                       a.itemsize, plan)
    # NumPy forms the product of an in-place update first (cuBLAS accumulates into it;
    # the fp16 engines' products are within their tiles): one more block of the top
    # level's update (m x n/2), or of the lean route's Q formation (a chunk, m x n/4, and
    # a contiguous copy of a block's vectors, m x 32)
    numpy_products = n * (n // 2 if plan == "tiled" else n // 4 + 32) * a.itemsize
    assert peak <= bound + numpy_products, (peak / a.nbytes, bound / a.nbytes)
    be, orth = _errors(a, q, r)
    u = {"fp16": 2.0**-11, "fp32-emulated": 2.0**-24}.get(precision, 2.0**-53)
    if precision == "fp16":  # the TC-QR table's bounds
        assert be <= 1e-3 and orth / n <= 2e-4, (be, orth)
    else:
        assert be <= 4 * n * u and orth <= 4 * n * u, (be, orth)
    del q, r
    if plan == "lean":
        tiled = memory_plan.estimate_bytes("householder-recursive", precision, a.shape,
                                           a.itemsize)
        assert peak < tiled, (peak / a.nbytes, tiled / a.nbytes)
    elif precision == "fp32-emulated":
        monkeypatch.setenv("MPQR_MEMORY_PLAN", "0")
        assert _peak_bytes(call) > bound + numpy_products


@pytest.mark.parametrize("dtype,precision", [("float32", "fp16"),
                                             ("float32", "fp32-emulated")])
def test_lean_route_accuracy(dtype, precision, monkeypatch):
    # the lean route (W a block column, Q formed backward over the working copy; at fp16
    # the rounded vectors over Y) against the precision's bounds and the fast route's
    rng = np.random.default_rng(10)
    m, n = 224, 160
    a = rng.standard_normal((m, n)).astype(dtype)
    err = {}
    for plan in ("fast", "lean"):
        monkeypatch.setenv("MPQR_MEMORY_PLAN", plan)
        with mpqr.explain() as trace:
            q, r = mpqr.qr(a, precision=precision, method="householder-recursive")
        assert any("lean plan" in str(e) for e in trace.events) == (plan == "lean")
        assert q.dtype == r.dtype == a.dtype and q.shape == (m, n) and r.shape == (n, n)
        assert np.all(np.diagonal(r) >= 0) and np.array_equal(r, np.triu(r))
        err[plan] = _errors(a, q, r)
    (be, orth), (be0, orth0) = err["lean"], err["fast"]
    if precision == "fp16":  # the TC-QR table's bounds
        assert be <= 1e-3 and orth / n <= 2e-4, (be, orth)
    else:
        assert be <= 4 * n * 2.0**-24 and orth <= 4 * n * 2.0**-24, (be, orth)
    assert be <= 2 * be0 and orth <= 2 * max(orth0, n * 2.0**-24), (err,)


@pytest.mark.parametrize("dtype,precision", [("float64", "fp64"), ("float32", "fp16"),
                                             ("float32", "fp32-emulated")])
def test_lean_q_merges_narrow_leaves(dtype, precision, monkeypatch):
    # Q's lean formation joins narrower leaves' T's into one block (LAPACK's larft join):
    # the same Q as blocks of one leaf each, within the precision's bound, fewer blocks
    from mpqr.qr import householder_recursive as hr

    rng = np.random.default_rng(12)
    m, n = 320, 256  # leaves of 32 columns, chunks of n / 4 = 64: pairs of leaves join
    a = rng.standard_normal((m, n)).astype(dtype)
    monkeypatch.setenv("MPQR_MEMORY_PLAN", "lean")
    got = {}
    for width in (32, 1024):  # one leaf a block; leaves joined up to a chunk
        monkeypatch.setattr(hr, "LEAN_Q_BLOCK", width)
        with mpqr.explain() as trace:
            q, r = mpqr.qr(a, precision=precision, method="householder-recursive")
        blocks = sum(g.label == "formq-lean-YE" for g in trace.gemms)
        joins = sum(g.label == "formq-lean-YhY" for g in trace.gemms)
        got[width] = (q.astype(np.float64), r.astype(np.float64), blocks, joins)
    q1, r1, blocks1, joins1 = got[32]
    q2, r2, blocks2, joins2 = got[1024]
    assert (blocks1, joins1) == (n // 32, 0) and (blocks2, joins2) == (n // 64, n // 64)
    u = {"fp16": 2.0**-11, "fp32-emulated": 2.0**-24}.get(precision, 2.0**-53)
    # the same reflectors (R to the bits: the factoring is the same); Q's products in
    # another grouping: within the precision's bound on Q's formation
    np.testing.assert_array_equal(r1, r2)
    bound = (8 if precision == "fp16" else 4) * n * u
    assert np.linalg.norm(q2 - q1) <= bound * np.sqrt(n), np.linalg.norm(q2 - q1)
    be, orth = _errors(a, q2.astype(a.dtype), r2.astype(a.dtype))
    if precision == "fp16":
        assert be <= 1e-3 and orth / n <= 2e-4, (be, orth)
    else:
        assert be <= 4 * n * u and orth <= 4 * n * u, (be, orth)


@pytest.mark.parametrize("shape,precision,target", [
    ((16384, 16384), "fp32-emulated", 2.5), ((16384, 16384), "fp16", 2.5),
    ((16384, 16384), "fp64-emulated", 3.0), ((65536, 8192), "fp32-emulated", 2.5),
    ((32768, 32768), "fp64-emulated", 3.0)])
def test_lean_plan_budget_meets_the_targets(shape, precision, target):
    # the lean route's documented budget (docs/memory.md) at the target shapes; its
    # bytes are counted against it above and on a GPU (bench/probes/memory_gpu.py)
    itemsize = 8 if precision == "fp64-emulated" else 4
    nbytes = shape[0] * shape[1] * itemsize
    lean = memory_plan.estimate_bytes("householder-recursive", precision, shape, itemsize,
                                      "lean")
    assert lean <= target * nbytes, lean / nbytes
    assert lean < memory_plan.estimate_bytes("householder-recursive", precision, shape,
                                             itemsize, "tiled")


def test_lean_route_tall_wide_and_mode_r(monkeypatch):
    # m > n (R copied out, Q formed over the working copy) and R alone, against LAPACK
    monkeypatch.setenv("MPQR_MEMORY_PLAN", "lean")
    a = np.random.default_rng(8).standard_normal((400, 150))
    q, r = mpqr.qr(a, method="householder-recursive")
    be, orth = _errors(a, q, r)
    assert q.shape == (400, 150) and r.shape == (150, 150)
    assert be <= 600 * 2.0**-53 and orth <= 600 * 2.0**-53, (be, orth)
    r_lapack = np.linalg.qr(a, mode="r")
    np.testing.assert_allclose(np.abs(r), np.abs(r_lapack), atol=1e-12 * np.abs(r).max())
    r_only = mpqr.qr(a, mode="r", method="householder-recursive")
    np.testing.assert_allclose(r_only, r, atol=1e-12 * np.abs(r).max())


def test_plan_choice_follows_the_free_memory(small_device):
    # the fastest plan whose estimate fits what is free; lean where only it fits
    a = np.random.default_rng(9).standard_normal((96, 96))
    est = {p: memory_plan.estimate_bytes("householder-recursive", "fp64", a.shape, 8, p)
           for p in memory_plan.PLANS}
    assert est["lean"] < est["tiled"] <= est["fast"]
    for free, want in ((est["fast"], "fast"), (est["lean"], "lean")):
        small_device["bytes"] = free
        with mpqr.explain() as trace:
            q, r = mpqr.qr(a, precision="fp64", method="householder-recursive")
        plans = [e.data.get("plan") for e in trace.events if e.kind == "memory"]
        assert want in plans, (free, plans)
        assert any("lean plan" in str(e) for e in trace.events) == (want == "lean")
        np.testing.assert_allclose(q @ r, a, atol=1e-12 * np.linalg.norm(a))


def test_gpu_lean_plan_reserve_bounds_the_pool_by_its_estimate(monkeypatch):
    # fp64-emulated takes the lean plan first at 8192^2; with its estimate reserved at its
    # start (the size threshold lowered to this input) one call grows CuPy's pool by at
    # most the estimate (the pool's per-call blocks aside) and the factors are accurate
    cp = _cupy()
    from mpqr.bench.memory import measure_call
    from mpqr.qr.memory_plan import estimate_bytes

    hr = importlib.import_module("mpqr.qr.householder_recursive")
    monkeypatch.delenv("MPQR_MEMORY_PLAN", raising=False)
    monkeypatch.setattr(hr, "LEAN_RESERVE_MIN_ELEMENTS", 0)
    cp.get_default_memory_pool().free_all_blocks()
    n = 8192
    a = cp.random.default_rng(3).standard_normal((n, n))

    def call(x):
        return mpqr.qr(x, precision="fp64-emulated", method="householder-recursive")

    with mpqr.explain() as trace:
        call(a)
    assert any("taken as one block of the pool" in str(e) for e in trace.events)
    got = measure_call(cp, call, a)
    lean = estimate_bytes("householder-recursive", "fp64-emulated", a.shape, 8, "lean")
    assert got["pool_multiple"] * a.nbytes <= lean + (4 << 20), (got, lean / a.nbytes)
    q, r = call(a)
    be = float(cp.linalg.norm(q @ r - a) / cp.linalg.norm(a))
    orth = float(cp.linalg.norm(q.T @ q - cp.eye(n)) / n)
    assert be <= 32 * n**0.5 * 2.0**-53 and orth <= n**0.5 * 2.0**-53, (be, orth)


def test_gpu_lean_plan_pool_within_its_estimate(monkeypatch):
    # forced lean: one call's pool growth (CuPy's allocator) within the lean estimate,
    # below the tiled estimate, and the factors as accurate as the precision's bounds; the
    # route forced too (method="auto" takes cuSOLVER at 4096^2)
    cp = _cupy()
    from mpqr.bench.memory import measure_call
    from mpqr.qr.memory_plan import estimate_bytes

    monkeypatch.setenv("MPQR_MEMORY_PLAN", "lean")
    cp.get_default_memory_pool().free_all_blocks()
    n = 4096
    for dt, prec, tol in (("float32", "fp32-emulated", 32 * n**0.5 * 2.0**-24),
                          ("float32", "fp16", 1e-3), ("float64", "fp64-emulated",
                                                       32 * n**0.5 * 2.0**-53)):
        a = cp.random.default_rng(2).standard_normal((n, n)).astype(dt)

        def call(x, pr=prec):
            return mpqr.qr(x, precision=pr, method="householder-recursive")

        got = measure_call(cp, call, a)
        lean = estimate_bytes("householder-recursive", prec, a.shape, a.itemsize, "lean")
        tiled = estimate_bytes("householder-recursive", prec, a.shape, a.itemsize)
        # plus the pool's fixed per-call blocks (kernel scratch, scalars), as below
        assert got["peak_live_multiple"] * a.nbytes <= lean < tiled, (prec, got,
                                                                      lean / a.nbytes)
        assert got["pool_multiple"] * a.nbytes <= lean + (4 << 20), (prec, got,
                                                                     lean / a.nbytes)
        q, r = call(a)
        a64, q64 = a.astype(cp.float64), q.astype(cp.float64)
        be = float(cp.linalg.norm(q64 @ r.astype(cp.float64) - a64) / cp.linalg.norm(a64))
        orth = float(cp.linalg.norm(q64.T @ q64 - cp.eye(n)) / n)
        assert be <= tol and orth <= (2e-4 if prec == "fp16" else tol), (prec, be, orth)
        del a, q, r, a64, q64
        cp.get_default_memory_pool().free_all_blocks()


def test_out_of_memory_on_a_faster_plan_runs_again_lean(small_device, monkeypatch):
    # an estimate that fell short (a MemoryError from inside the fast plan's call): the
    # call runs once more on the lean plan; not where the input may have been overwritten
    from mpqr.qr import driver

    a = np.random.default_rng(11).standard_normal((96, 96))
    small_device["bytes"] = 10 * memory_plan.estimate_bytes(
        "householder-recursive", "fp64", a.shape, 8, "fast")
    run, calls = driver.run, []

    def failing_once(*args, **kw):
        calls.append(kw.get("overwrite"))
        if len(calls) == 1:
            raise MemoryError("out of device memory")
        return run(*args, **kw)

    monkeypatch.setattr(driver, "run", failing_once)
    with mpqr.explain() as trace:
        q, r = mpqr.qr(a, precision="fp64", method="householder-recursive")
    assert len(calls) == 2
    assert any("factored again on the lean plan" in str(e) for e in trace.events)
    assert any("lean plan" in str(e) and e.kind == "memory" for e in trace.events)
    np.testing.assert_allclose(q @ r, a, atol=1e-12 * np.linalg.norm(a))
    calls.clear()
    # overwrite_a: the input may be gone, so no second attempt; the caller gets mpqr's
    # error (what was needed and is free), the device's own one as its cause
    with pytest.raises(mpqr.DeviceMemoryError, match="are free") as info:
        mpqr.qr(np.array(a), precision="fp64", method="householder-recursive",
                overwrite_a=True)
    assert "out of device memory" in str(info.value.__cause__)
    assert len(calls) == 1


def test_tc_sgemm_partials_within_their_share_of_the_workspace_limit(monkeypatch):
    # few outputs and a long k: tc-sgemm batches the k-slices' partial products; under a
    # workspace limit a group of them takes at most PARTIALS_SHARE of it (the tiles'
    # splits the rest), the product as accurate as without the limit
    from mpqr.backends._base import ArrayAPIBackend

    from mpqr.engines.tc_sgemm import PARTIALS_SHARE

    rng = np.random.default_rng(12)
    a = rng.standard_normal((32, 2048)).astype(np.float32)
    b = rng.standard_normal((2048, 32)).astype(np.float32)
    sizes = []
    add = ArrayAPIBackend.add_partials

    def counting(self, c, parts):
        sizes.append(parts.nbytes)
        return add(self, c, parts)

    monkeypatch.setattr(ArrayAPIBackend, "add_partials", counting)
    limit = 64 << 10

    def run(**opts):
        sizes.clear()
        with mpqr.gemm_options(engine="tc-sgemm", slice_k=64, **opts):
            c = mpqr.policy.gemm(a, b, precision="fp32-emulated")
        return c, list(sizes)

    whole, free_sizes = run()
    capped, capped_sizes = run(workspace_limit=limit)
    assert max(free_sizes) == 32 * 32 * 32 * 4  # all 32 slices in one group
    assert len(capped_sizes) > 1 and max(capped_sizes) <= PARTIALS_SHARE * limit
    exact = a.astype(np.float64) @ b
    tol = 4 * 2048 * 2.0**-24 * (np.abs(a).astype(np.float64) @ np.abs(b))
    assert np.all(np.abs(capped - exact) <= tol) and np.all(np.abs(whole - exact) <= tol)


def _route(trace):
    return [e.data.get("route") for e in trace.events if e.kind == "out-of-core"]


def test_host_input_goes_out_of_core_where_the_in_core_plan_would_not_fit(small_device):
    # a host input with device=: in core where the input and the leanest plan's estimate
    # fit the budget (80% of the free device memory), out of core by itself otherwise
    a = np.random.default_rng(13).standard_normal((157, 101))
    need = a.nbytes + memory_plan.least_bytes("householder-recursive", "fp64", a.shape, 8)
    small_device["bytes"] = int(need / 0.8) + 64
    with mpqr.explain() as trace:
        q, r = mpqr.qr(a, device="cpu", precision="fp64", method="householder-recursive")
    assert _route(trace) == ["in-core"]
    assert [e.data["working_set"] for e in trace.events
            if e.data.get("route") == "in-core"] == [need]
    small_device["bytes"] = int(need / 0.8) - 64
    with mpqr.explain() as trace:
        q2, r2 = mpqr.qr(a, device="cpu", precision="fp64", method="householder-recursive")
    assert _route(trace) == ["out-of-core"]
    for qq, rr in ((q, r), (q2, r2)):
        be, orth = _errors(a, qq, rr)
        assert be <= 101 * 2.0**-53 * 20 and orth <= 101 * 2.0**-53 * 20, (be, orth)
    np.testing.assert_allclose(r2, r, atol=1e-12 * np.abs(r).max())


def test_host_input_out_of_core_when_the_device_has_less_than_its_budget(small_device):
    # the budget said in core (memory_budget given), the device had less free: the
    # in-core plan is refused before any work and the call goes out of core from the
    # untouched host input instead of raising
    a = np.random.default_rng(14).standard_normal((1101, 12))
    a0 = a.copy()
    small_device["bytes"] = a.nbytes  # CholQR2 in core needs 2x the input beyond it
    with mpqr.explain() as trace:
        q, r = mpqr.qr(a, device="cpu", memory_budget="1GB")
    assert _route(trace) == ["in-core", "out-of-core", "out-of-core"]
    np.testing.assert_array_equal(a, a0)
    be, orth = _errors(a, q, r)
    assert be <= 1e-14 and orth <= 1e-14, (be, orth)
    # where out of core cannot take it (wide), the device error stands
    small_device["bytes"] = 8
    with pytest.raises(mpqr.DeviceMemoryError, match="are free"):
        mpqr.qr(np.array(a.T), device="cpu", memory_budget="1GB")


@pytest.mark.parametrize("shape,method,mode", [
    ((96, 96), "householder-recursive", "reduced"),
    ((4096, 16), "cholqr2", "reduced"),
    ((48, 160), "householder-recursive", "reduced"),
    ((160, 48), "householder-recursive", "complete"),
    ((96, 96), "geqrf", "reduced")])
def test_device_memory_error_on_every_route(shape, method, mode, small_device):
    # square, tall, wide, complete and the library's QR: refused before any work, the
    # message naming the bytes needed (the route's leanest estimate), the bytes free
    # and a budget for the out-of-core route
    a = np.random.default_rng(15).standard_normal(shape)
    small_device["bytes"] = a.nbytes // 2
    with pytest.raises(mpqr.DeviceMemoryError) as info:
        mpqr.qr(a, mode=mode, precision="fp64", method=method)
    err = info.value
    plan = "lean" if method == "householder-recursive" else "tiled"
    assert err.needed == memory_plan.estimate_bytes(method, "fp64", shape, 8, plan,
                                                    complete=mode == "complete")
    assert err.free == a.nbytes // 2 < err.needed
    msg = str(err)
    assert f"{' x '.join(map(str, shape))} float64" in msg and f"({method})" in msg
    assert f"needs about {err.needed:,} bytes" in msg and f"{err.free:,} are free" in msg
    assert f"memory_budget={err.free // 2:,}" in msg


def test_wide_and_complete_routes_within_their_documented_bound(monkeypatch):
    # the bytes of the wide route (the leading block's QR, R2 written into R) and of the
    # lean mode="complete" (Q m x m over a copy of the vectors) on the NumPy backend,
    # against the estimates the check uses; accurate against LAPACK's R
    monkeypatch.setenv("MPQR_MEMORY_PLAN", "lean")
    rng = np.random.default_rng(16)
    for shape, mode in (((96, 288), "reduced"), ((240, 72), "complete")):
        a = rng.standard_normal(shape)

        def call(a=a, mode=mode):
            return mpqr.qr(a, mode=mode, precision="fp64", method="householder-recursive")

        call()
        peak, (q, r) = _peak_bytes(call, keep=True)
        bound = memory_plan.estimate_bytes("householder-recursive", "fp64", shape, 8, "lean",
                                           complete=mode == "complete")
        m, n = shape
        # NumPy forms a product before writing or subtracting it where cuBLAS writes into
        # the output: R2 (m x (n - m)); one chunk of Q's formation (m x m/4) and a copy
        # of a block's vectors
        numpy_product = m * (n - m if m < n else m // 4 + 32) * 8
        assert peak <= bound + numpy_product, (shape, peak / a.nbytes, bound / a.nbytes)
        assert q.shape == ((m, m) if mode == "complete" else (m, min(shape)))
        be = np.linalg.norm(q @ r - a) / np.linalg.norm(a)
        orth = np.linalg.norm(q.T @ q - np.eye(q.shape[1]))
        assert be <= 1e-14 and orth <= 1e-13, (be, orth)
        np.testing.assert_allclose(np.abs(r), np.abs(np.linalg.qr(a, mode=mode)[1]),
                                   atol=1e-12 * np.abs(r).max())


def test_gpu_host_input_out_of_core_under_a_pool_limit():
    # a host input with device="cuda" whose in-core plan does not fit the default budget
    # (80% of what the pool limit leaves) goes out of core by itself; with room, in core
    cp = _cupy()
    pool = cp.get_default_memory_pool()
    a = np.random.default_rng(17).standard_normal((2048, 2048)).astype(np.float32)
    for room, want in ((40 << 20, "out-of-core"), (1 << 30, "in-core")):
        pool.free_all_blocks()
        pool.set_limit(size=pool.total_bytes() + room)
        try:
            with mpqr.explain() as trace:
                q, r = mpqr.qr(a, device="cuda", precision="fp32-emulated")
        finally:
            pool.set_limit(size=0)
            pool.free_all_blocks()
        assert _route(trace)[-1] == want, _route(trace)
        be, orth = _errors(a, q, r)
        # in core Householder: orthogonal to n u; out of core the Gram-based route's Q
        # loses orthogonality with cond(a) (docs/out-of-core.md): n u cond(a)
        u, n = 2.0**-24, a.shape[1]
        reach = n * u * (1.0 if want == "in-core" else float(np.linalg.cond(a)))
        assert be <= n * u and orth <= reach, (want, be, orth, reach)


@pytest.mark.parametrize("shape,mode", [
    ((1024, 4096), "reduced"),
    ((8192, 2048), "complete"),
    ((4096, 1024), "complete"),
])
def test_gpu_wide_and_lean_complete_within_their_estimates(monkeypatch, shape, mode):
    # CuPy's pool (an allocator hook) within the estimates of the wide route and of the
    # lean mode="complete", the route forced (method="auto" takes cuSOLVER at these
    # shapes); the pool's cached blocks of earlier tests handed back first
    cp = _cupy()
    from mpqr.bench.memory import measure_call

    monkeypatch.setenv("MPQR_MEMORY_PLAN", "lean")
    cp.get_default_memory_pool().free_all_blocks()
    a = cp.random.default_rng(3).standard_normal(shape).astype(cp.float32)
    got = measure_call(cp, lambda x, md=mode: mpqr.qr(
        x, mode=md, precision="fp32-emulated", method="householder-recursive"), a)
    est = memory_plan.estimate_bytes("householder-recursive", "fp32-emulated", shape, 4,
                                     "lean", complete=mode == "complete")
    # plus the pool's fixed per-call blocks (kernel scratch, scalars: ~2.5 MiB at
    # 1024 x 4096 float32 on an H200), which the per-byte model leaves out
    assert got["peak_live_multiple"] * a.nbytes <= est, (shape, got, est / a.nbytes)
    assert got["pool_multiple"] * a.nbytes <= est + (4 << 20), (shape, got,
                                                                est / a.nbytes)
    del a
    cp.get_default_memory_pool().free_all_blocks()


def test_out_of_memory_inside_a_call_is_a_device_memory_error(small_device, monkeypatch):
    """A device's own out-of-memory error where the plan's estimate fit (memory taken
    meanwhile, or an estimate short) reaches the caller as DeviceMemoryError, never raw."""
    from mpqr.qr import driver

    a = np.random.default_rng(2).standard_normal((64, 48))
    small_device["bytes"] = 100 * a.nbytes

    def run(*args, **kw):
        small_device["bytes"] = a.nbytes // 4  # what is left when the library gives up
        raise MemoryError("out of memory allocating 512 bytes")

    monkeypatch.setattr(driver, "run", run)
    with pytest.raises(mpqr.DeviceMemoryError, match="are free") as info:
        mpqr.qr(a, method="geqrf", overwrite_a=False, memory_budget=None)
    err = info.value
    assert err.free == a.nbytes // 4 and err.needed > err.free
    assert isinstance(err.__cause__, MemoryError) and "512 bytes" in str(err.__cause__)
    assert "memory_budget=" in str(err)


def _pool_calls(monkeypatch):
    """The NumPy backend as one with a memory pool: its hand-backs and reserves recorded
    (``("release", need)``, ``("reserve", nbytes, need)``), short of memory where no
    estimate is given (the plan forced)."""
    backend = get_backend(np)
    calls = []
    monkeypatch.setattr(type(backend), "release_cached_memory",
                        lambda self, at_least=0, need=None:
                        calls.append(("release", need)) or need is None)
    monkeypatch.setattr(type(backend), "reserve_workspace",
                        lambda self, nbytes, need=None: calls.append(("reserve", nbytes,
                                                                      need)))
    return calls


@pytest.mark.parametrize("setting", ["auto", "lean"])
def test_lean_plan_hands_cached_memory_back_with_the_calls_estimate(small_device,
                                                                   monkeypatch, setting):
    # the lean plan tells the backend the call's estimate with every hand-back of cached
    # memory (the backend keeps the blocks where the device has ample room beside it);
    # forced by MPQR_MEMORY_PLAN=lean: None, always handed back
    calls = _pool_calls(monkeypatch)
    monkeypatch.setenv("MPQR_MEMORY_PLAN", "1" if setting == "auto" else "lean")
    a = np.random.default_rng(4).standard_normal((160, 128)).astype(np.float32)
    lean = memory_plan.estimate_bytes("householder-recursive", "fp32-emulated", a.shape, 4,
                                      "lean")
    small_device["bytes"] = lean  # only the lean plan fits
    with mpqr.explain() as trace:
        q, r = mpqr.qr(a, precision="fp32-emulated", method="householder-recursive")
    want = lean if setting == "auto" else None
    # the trace says what the backend did with its cached blocks
    (ev,) = [e for e in trace.events if "lean plan (W" in str(e)]
    assert ev.data["handed_back"] is (setting == "lean")
    assert ("cached blocks kept" in str(ev)) is (setting == "auto")
    kinds = {c[0] for c in calls}
    assert kinds == {"release", "reserve"}, calls
    assert all(c[-1] == want for c in calls), (want, calls)
    be = np.linalg.norm(q.astype(np.float64) @ r - a) / np.linalg.norm(a)
    assert be <= 32 * 128**0.5 * 2.0**-24, be


@pytest.mark.parametrize(("shape", "setting", "reserves"), [
    ((160, 128), "auto", True), ((384, 128), "auto", False), ((160, 128), "lean", False)])
def test_lean_plan_reserves_its_estimate_at_its_start(small_device, monkeypatch, shape,
                                                     setting, reserves):
    # with memory to spare (the cached blocks kept), the lean plan of an input of at most
    # two rows a column takes its estimate (beyond the working copy) as one block of the
    # pool before its first temporary; not for taller inputs, not where the device is short
    # (the blocks are handed back between the phases instead)
    hr = importlib.import_module("mpqr.qr.householder_recursive")
    monkeypatch.setattr(hr, "LEAN_RESERVE_MIN_ELEMENTS", 0)
    calls = _pool_calls(monkeypatch)
    monkeypatch.setenv("MPQR_MEMORY_PLAN", "1" if setting == "auto" else "lean")
    a = np.random.default_rng(5).standard_normal(shape).astype(np.float32)
    lean = memory_plan.estimate_bytes("householder-recursive", "fp32-emulated", a.shape, 4,
                                      "lean")
    small_device["bytes"] = lean  # only the lean plan fits
    with mpqr.explain() as trace:
        q, r = mpqr.qr(a, precision="fp32-emulated", method="householder-recursive")
    assert calls[0][0] == "release"
    first = calls[1] if len(calls) > 1 else None
    if reserves:
        assert first == ("reserve", lean - a.nbytes, None), calls
    else:
        assert first is None or first[0] != "reserve" or first[2] is not None, calls
    (ev,) = [e for e in trace.events if "lean plan (W" in str(e)]
    assert ("taken as one block of the pool" in str(ev)) is reserves
    be = np.linalg.norm(q.astype(np.float64) @ r - a) / np.linalg.norm(a)
    assert be <= 32 * shape[1]**0.5 * 2.0**-24, be
    assert hr.lean_reserves(2 * shape[1], shape[1], lean)
    assert not hr.lean_reserves(2 * shape[1] + 1, shape[1], lean)
    assert not hr.lean_reserves(*shape, None)


def test_cupy_hands_cached_memory_back_only_where_short():
    # the CuPy backend's rule, against a pool and a driver that record what they are
    # asked (no device here): ample room beside the call's estimate -> the cached blocks
    # stay (no cudaFree, which waits for the device); short, a pool limit in the way, or
    # no estimate -> handed back
    from types import SimpleNamespace

    from mpqr.backends.cupy import backend as cb

    class Pool:
        def __init__(self, limit=0, total=0):
            self.limit, self.total, self.calls = limit, total, []

        def get_limit(self):
            return self.limit

        def total_bytes(self):
            return self.total

        def free_bytes(self):
            return 0

        def free_all_blocks(self):
            self.calls.append("release")

    def run(pool, driver_free, need):
        cp = SimpleNamespace(get_default_memory_pool=lambda: pool, cuda=SimpleNamespace(
            runtime=SimpleNamespace(memGetInfo=lambda: (driver_free, 1 << 40))))
        be = SimpleNamespace(_cp=cp)
        before = len(pool.calls)
        short = cb._cupy_release_cached_memory(be, need=need)
        assert short is bool(pool.calls[before:])  # what it says it did
        return pool.calls[before:]

    gib = 1 << 30
    assert run(Pool(), 100 * gib, 3 * gib) == []  # ample: kept
    assert run(Pool(), 5 * gib, 3 * gib) == ["release"]  # under twice the estimate
    assert run(Pool(), 100 * gib, None) == ["release"]  # no estimate: always
    # a pool limit counts: 8 GiB under it with 4 taken leaves 4, short of 2 x 3
    assert run(Pool(limit=8 * gib, total=4 * gib), 100 * gib, 3 * gib) == ["release"]
    assert run(Pool(limit=64 * gib, total=4 * gib), 100 * gib, 3 * gib) == []
    assert cb.AMPLE_FREE == 2


def test_reserved_workspace_is_one_block_taken_again_only_where_needed():
    # the CuPy backend's reservation for Q's lean formation, against a pool that records
    # what it is asked (no device here): whole and alone -> nothing; other cached blocks
    # beside it -> handed back and one block taken; no room -> no error
    from types import SimpleNamespace

    from mpqr.backends.cupy.backend import _cupy_reserve_workspace

    class OutOfMemory(MemoryError):
        pass

    class Pool:
        def __init__(self, free, kept, room):
            self.free, self.kept, self.room, self.calls = free, kept, room, []

        def free_bytes(self):
            return self.free

        def free_all_blocks(self):
            self.calls.append("release")
            self.free = self.kept  # free chunks inside blocks in use stay

        def malloc(self, n):
            if n > self.room:
                raise OutOfMemory(n)
            self.calls.append(("block", n))
            pool = self

            class Mem:
                def __del__(self):
                    pool.free += n

            return Mem()

    def reserve(pool, nbytes):
        cp = SimpleNamespace(get_default_memory_pool=lambda: pool,
                             cuda=SimpleNamespace(memory=SimpleNamespace(
                                 OutOfMemoryError=OutOfMemory)))
        _cupy_reserve_workspace(SimpleNamespace(_cp=cp), nbytes)

    pool = Pool(free=0, kept=0, room=1 << 30)
    reserve(pool, 1000)  # rounded to the pool's 512-byte unit
    assert pool.calls == ["release", ("block", 1024)] and pool.free == 1024
    reserve(pool, 1000)  # the block is free and little else is cached
    pool.free += 4096
    reserve(pool, 1000)
    assert pool.calls == ["release", ("block", 1024)]
    pool.free += 4 << 20  # a request that did not fit took a block beside it
    reserve(pool, 1000)
    assert pool.calls[2:] == ["release", ("block", 1024)] and pool.free == 1024
    pool = Pool(free=8 << 20, kept=2048, room=1 << 30)  # room inside a block in use
    reserve(pool, 1024)
    assert pool.calls == ["release"]
    pool = Pool(free=0, kept=0, room=0)  # no room: the temporaries take what they find
    reserve(pool, 1024)
    assert pool.calls == ["release"] and pool.free == 0


def test_spine_stretches_lower_the_peak(monkeypatch):
    """``SPINE_STRETCH``: the spine's products in stretches of rows hold a stretch's split
    operands and product instead of a chunk's (half the input each): the NumPy backend's
    peak beyond the input falls (5.0x -> 2.75x at 512^2, the NumPy engines' float64
    copies of a stretch's operands included)."""
    hr = _spine_in_blocks_of(monkeypatch, 64)
    monkeypatch.setattr(hr, "STRETCH_UNIT", 32)
    monkeypatch.setattr(hr, "STRETCH_MIN_ROWS", 32)
    n = 512
    a = np.random.default_rng(11).standard_normal((n, n)).astype(np.float32)

    def call():
        return mpqr.qr(a, precision="fp32-emulated", method="householder-recursive")

    peaks = {}
    for share in (None, 0.125):
        monkeypatch.setattr(hr, "SPINE_STRETCH", {"fp32-emulated": share} if share else {})
        call()  # first-use allocations
        peaks[share] = _peak_bytes(call)
    assert peaks[0.125] < 0.7 * peaks[None], {k: v / a.nbytes for k, v in peaks.items()}
    assert peaks[0.125] <= 3 * a.nbytes, peaks[0.125] / a.nbytes


@pytest.mark.parametrize(("precision", "dtype", "shape"), [
    ("fp32-emulated", "float32", (512, 512)), ("fp64", "float64", (768, 512))])
def test_spine_in_blocks_takes_no_more_memory_than_the_halves(monkeypatch, precision, dtype,
                                                              shape):
    """The fast plan's spine in blocks (``householder_recursive.SPINE_BLOCK``) holds no
    merge's temporaries and chunks its updates: the NumPy backend's peak beyond the input
    is at most the halves' (docs/memory.md: the fast estimate bounds both)."""
    hr = importlib.import_module("mpqr.qr.householder_recursive")
    monkeypatch.setenv("MPQR_MEMORY_PLAN", "fast")
    monkeypatch.setattr(hr, "SPINE_BLOCKS", 10**6)
    a = np.random.default_rng(11).standard_normal(shape).astype(dtype)
    peaks = {}
    for sb in (None, 64):
        monkeypatch.setattr(hr, "SPINE_BLOCK", sb)

        def call():
            return mpqr.qr(a, precision=precision, method="householder-recursive")

        with mpqr.explain() as trace:  # also the warm-up: first-use allocations
            call()
        assert ("formq-blocked-YhQ" in {g.label for g in trace.gemms}) == (sb is not None)
        peaks[sb] = _peak_bytes(call)
    assert peaks[64] <= peaks[None] * 1.01, {k: v / a.nbytes for k, v in peaks.items()}
