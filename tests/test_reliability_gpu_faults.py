"""GPU faults become clear errors, and a failed call gives its memory back.

The translation lives in one place (:func:`mpqr._gpu_errors.device_errors`,
with the backend's ``translate_error`` hook); the CPU tests check that
mechanism with a stand-in backend, the CuPy tests provoke the real faults
(device out-of-memory under a capped memory pool, an NVRTC compile error).
GPU command: ``python3 -m pytest -q tests/test_reliability_gpu_faults.py``.
"""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
from mpqr.backends import get_backend

import mpqr
from mpqr._gpu_errors import device_errors
from tests.conftest import GPU

needs_gpu = pytest.mark.skipif(not GPU, reason="no CUDA GPU visible")


class _Workspace:
    """Stands in for a device buffer held by a failing call's frame."""


class _FakeOOM(Exception):
    pass


class _FakeBackend:
    def translate_error(self, exc, what):
        if isinstance(exc, _FakeOOM):
            return MemoryError(f"{what} ran out of device memory: its workspace needed "
                               "1,024 bytes more; lower the workspace with "
                               "mpqr.gemm_options(workspace_limit=...)")
        return None


def _fail_holding(ref_box):
    buf = _Workspace()
    ref_box.append(weakref.ref(buf))
    raise _FakeOOM("allocator said no")


def test_translation_names_call_need_and_remedy_and_frees_the_frames():
    refs = []
    gc.disable()  # the buffer must be freed by dropping the frames, not by a GC pass
    try:
        with pytest.raises(MemoryError, match=r"^mpqr\.qr ran out of device memory: its "
                                              r"workspace needed 1,024 bytes more; lower the "
                                              r"workspace with mpqr\.gemm_options\("
                                              r"workspace_limit=\.\.\.\)$") as info:
            with device_errors(_FakeBackend(), "mpqr.qr"):
                _fail_holding(refs)
        assert info.value.__cause__ is None and info.value.__suppress_context__
        assert refs[0]() is None, "the failed call's workspace is still referenced"
    finally:
        gc.enable()


def test_untranslated_errors_pass_through_unchanged():
    be = get_backend(mpqr._array_api.array_namespace(np.zeros(1)))
    assert be.translate_error(MemoryError("host"), "x") is None
    with pytest.raises(KeyError, match="'k'"):
        with device_errors(_FakeBackend(), "mpqr.qr"):
            raise KeyError("k")
    with pytest.raises(MemoryError, match="^host$"):
        with device_errors(be, "mpqr.qr"):
            raise MemoryError("host")


# --- real device faults (CuPy) ---------------------------------------------------------

@pytest.fixture
def capped_pool():
    import cupy as cp

    pool = cp.get_default_memory_pool()
    cp.cuda.get_current_stream().synchronize()
    # earlier tests' garbage first: arrays alive in a reference cycle pin their pool chunk,
    # whose free part then stays cached (80 MB seen on an H100) and serves allocations
    # that a cap on the pool should refuse
    gc.collect()
    pool.free_all_blocks()
    old = pool.get_limit()
    yield cp, pool
    pool.set_limit(size=old)
    pool.free_all_blocks()


_CALLS = [
    (lambda a: mpqr.qr(a, precision="fp64"), "mpqr.qr"),
    (lambda a: mpqr.qr(a, precision="fp32-emulated", method="householder-recursive"), "mpqr.qr"),
    (lambda a: mpqr.matmul(a, a.T, precision="fp32-emulated"), "mpqr.matmul"),
    (lambda a: mpqr.svd(a), "mpqr.qr"),  # svd's QR fails first
]


def _capped_call(cp, pool, call):
    """``call`` of a 4096 x 1024 float64 array under a pool capped at half its size above
    what is in use; the bytes in use before it."""
    a = cp.random.default_rng(0).standard_normal((4096, 1024))  # 32 MiB
    call(a[:512, :128])  # warm-up: kernels compiled, library handles and their buffers made
    cp.cuda.get_current_stream().synchronize()
    # earlier tests' garbage (reference cycles) would otherwise be collected during the
    # failing call and make the pool look smaller afterwards than before (seen on an H100)
    gc.collect()
    before = pool.used_bytes()
    pool.set_limit(size=before + a.nbytes // 2)  # less than any method's workspace
    return a, before


@needs_gpu
@pytest.mark.parametrize("call,what", _CALLS)
def test_device_oom_is_a_clear_memoryerror_and_the_pool_drains(capped_pool, call, what,
                                                               monkeypatch):
    # the memory plan off: the device's own error from inside the call, translated
    monkeypatch.setenv("MPQR_MEMORY_PLAN", "0")
    cp, pool = capped_pool
    a, before = _capped_call(cp, pool, call)
    with pytest.raises(MemoryError, match=rf"^{what} ran out of device memory: its workspace "
                                          r"needed [\d,]+ bytes more \([\d,]+ bytes in use, "
                                          r"pool limit [\d,]+ bytes\); lower the workspace "
                                          r"with mpqr\.gemm_options\(workspace_limit=\.\.\.\)"
                       ) as info:
        call(a)
    assert isinstance(info.value, (cp.cuda.memory.OutOfMemoryError, mpqr.DeviceMemoryError))
    cp.cuda.get_current_stream().synchronize()
    assert pool.used_bytes() == before, "the failed call left device memory allocated"
    pool.set_limit(size=0)
    _, r = mpqr.qr(a, precision="fp64")  # and the device is usable again
    assert bool(cp.isfinite(r).all())


@needs_gpu
@pytest.mark.parametrize("call,what", [c for c in _CALLS if c[1] == "mpqr.qr"])
def test_memory_plan_refuses_before_the_work_with_cupys_error(capped_pool, call, what):
    # the plan on (the default): refused up front, what was needed and is free, as an
    # mpqr.DeviceMemoryError that is CuPy's OutOfMemoryError too
    cp, pool = capped_pool
    a, before = _capped_call(cp, pool, call)
    with pytest.raises(cp.cuda.memory.OutOfMemoryError,
                       match=r"^mpqr\.qr of a 4096 x 1024 float64 array at precision=\S+ "
                             r"\([\w-]+\) needs about [\d,]+ bytes of device memory beyond "
                             r"the input and [\d,]+ are free; .*memory_budget=") as info:
        call(a)
    err = info.value
    assert isinstance(err, mpqr.DeviceMemoryError) and err.needed > err.free >= 0
    assert f"{err.needed:,} bytes" in str(err) and f"{err.free:,} are free" in str(err)
    cp.cuda.get_current_stream().synchronize()
    assert pool.used_bytes() == before, "the refused call left device memory allocated"


@needs_gpu
@pytest.mark.parametrize("plan", ["0", "1"])
def test_oom_error_is_also_cupys_outofmemoryerror(capped_pool, plan, monkeypatch):
    monkeypatch.setenv("MPQR_MEMORY_PLAN", plan)
    cp, pool = capped_pool
    # a chunk that a live array pins keeps its free part cached after free_all_blocks,
    # and the pool serves from it under any limit: the input outgrows that part
    n = 512
    m = max(2048, -(-pool.free_bytes() // (n * 8)) + 256)
    a = cp.ones((m, n))
    pool.set_limit(size=pool.used_bytes() + 1024)
    with pytest.raises(cp.cuda.memory.OutOfMemoryError,
                       match=r"^mpqr\.qr ran out" if plan == "0" else
                       rf"^mpqr\.qr of a {m} x {n} float64 array .* needs about") as info:
        mpqr.qr(a)
    assert isinstance(info.value, mpqr.DeviceMemoryError)


@needs_gpu
def test_nvrtc_failure_names_kernel_and_architecture(monkeypatch):
    import cupy as cp
    import mpqr.backends.cupy.engine_kernels as k

    for f in (k._split_kernels, k._max_abs_finite_kernel, k._unscale_kernel):
        f.cache_clear()
    monkeypatch.setattr(k, "_PREAMBLE", k._PREAMBLE + "\n#error mpqr_test_broken_source\n")
    try:
        cc = cp.cuda.Device().compute_capability
        with pytest.raises(RuntimeError, match=rf"^mpqr\.matmul: NVRTC could not compile the "
                                               rf"mpqr kernel \S+.* for sm_{cc} \(.*\); "
                                               r"compiler log: .*mpqr_test_broken_source"):
            mpqr.matmul(cp.ones((8, 8)), cp.ones((8, 8)), precision="fp16")
    finally:
        for f in (k._split_kernels, k._max_abs_finite_kernel, k._unscale_kernel):
            f.cache_clear()
