"""Out-of-core bad input and faults: budgets too small, bad ``out=``, interruptions,
device out-of-memory mid-way, bad keywords."""

from __future__ import annotations

import re

import numpy as np
import pytest
from mpqr.backends.host import staging

import mpqr
from mpqr.ooc import BudgetTooSmall
from tests._ooc_support import DEVICES, Dataset, ooc_events
from tests._qr_support import backward_error
from tests.conftest import GPU

TALL = (1101, 12)
SQUARE = (157, 101)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [TALL, SQUARE])
def test_budget_too_small_names_the_smallest_that_works(device, shape):
    a = np.random.default_rng(0).standard_normal(shape)
    with pytest.raises(BudgetTooSmall, match="the smallest budget that works is") as exc:
        mpqr.qr(a, device=device, memory_budget=1000)
    needed = exc.value.needed
    assert str(needed) in str(exc.value) and needed > 1000
    q, r = mpqr.qr(a, device=device, memory_budget=needed)  # and that one does work
    assert backward_error(a, q, r) <= 20 * shape[1] * 2.0**-53


@pytest.mark.parametrize("bad", [
    ((np.empty((1101, 11)), None), r"`out\[0\] \(Q\)` must have shape \(1101, 12\), got \(1101, 11\)"),
    ((np.empty((1101, 12), np.float32), None), r"`out\[0\] \(Q\)` must have dtype float64, got float32"),
    ((None, np.empty((12, 13))), r"`out\[1\] \(R\)` must have shape \(12, 12\), got \(12, 13\)"),
])
def test_bad_out_before_any_work(bad):
    out, msg = bad
    src = Dataset(np.random.default_rng(1).standard_normal(TALL))
    with pytest.raises(ValueError, match=msg):
        mpqr.qr(src, out=out, memory_budget="40KB")
    assert src.reads == 0


def test_read_only_out_and_wrong_kind(tmp_path):
    src = Dataset(np.random.default_rng(2).standard_normal(TALL))
    np.save(tmp_path / "q.npy", np.zeros(TALL))
    ro = np.load(tmp_path / "q.npy", mmap_mode="r")
    with pytest.raises(ValueError, match=r"`out\[0\] \(Q\)` is read-only"):
        mpqr.qr(src, out=(ro, None), memory_budget="40KB")
    with pytest.raises(TypeError, match=r"`out` must be a pair \(Q, R\)"):
        mpqr.qr(src, out=np.empty(TALL), memory_budget="40KB")
    with pytest.raises(ValueError, match=r"`out` must have shape \(12, 12\)"):
        mpqr.qr(src, mode="r", out=np.empty(TALL), memory_budget="40KB")
    assert src.reads == 0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("exc", [KeyboardInterrupt, RuntimeError])
@pytest.mark.parametrize(("shape", "method"), [(TALL, "auto"), (TALL, "tsqr"),
                                               (SQUARE, "ooc-recursive"),
                                               (SQUARE, "ooc-blocked")])
def test_interrupted_run_leaves_input_and_releases_staging(device, exc, shape, method):
    a = np.random.default_rng(3).standard_normal(shape)
    keep = a.copy()
    src = Dataset(a, fail_at=7, exc=exc)
    with pytest.raises(exc, match="injected fault"):
        mpqr.qr(src, method=method, device=device,
                memory_budget="40KB" if shape == TALL else "300KB")
    np.testing.assert_array_equal(a, keep)
    assert not list(staging.OPEN)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype, fail_at, one_pass", [
    ("float64", 3, True), ("float64", 30, True), ("float32", 12, True),  # the one pass
    ("float64", 3, False), ("float64", 40, False)])  # the Gram / the refinement pass
def test_interrupted_lstsq_leaves_inputs_and_releases_staging(device, dtype, fail_at,
                                                              one_pass, monkeypatch):
    from mpqr.backends import get_backend

    if one_pass:  # the one-pass route on the NumPy backend too
        monkeypatch.setattr(type(get_backend(np)), "gram_dd_max_n", 128)
    elif device == "cuda":
        pytest.skip("the GPU takes the one pass for float64")
    rng = np.random.default_rng(8)
    a = rng.standard_normal(TALL).astype(dtype)
    b = rng.standard_normal(TALL[0]).astype(dtype)
    keep_a, keep_b = a.copy(), b.copy()
    src = Dataset(a, fail_at=fail_at)
    with pytest.raises(KeyboardInterrupt, match="injected fault"):
        mpqr.lstsq(src, b, device=device, memory_budget="40KB")
    assert src.failures == 1
    np.testing.assert_array_equal(a, keep_a)
    np.testing.assert_array_equal(b, keep_b)
    assert not list(staging.OPEN)


@pytest.mark.parametrize("device", DEVICES)
def test_overwrite_a_allows_workspace_only_when_asked(device):
    a = np.random.default_rng(4).standard_normal(SQUARE)
    keep = a.copy()
    r = mpqr.qr(a, mode="r", device=device, memory_budget="300KB")
    np.testing.assert_array_equal(a, keep)
    r2 = mpqr.qr(a, mode="r", device=device, memory_budget="300KB", overwrite_a=True)
    np.testing.assert_allclose(r2, r, rtol=0, atol=1e-12 * np.abs(r).max())


@pytest.mark.parametrize("device", DEVICES)
def test_out_of_memory_retries_once_with_smaller_pieces(device):
    a = np.random.default_rng(5).standard_normal(TALL)
    src = Dataset(a, fail_at=4, exc=MemoryError)
    with mpqr.explain() as trace:
        q, r = mpqr.qr(src, device=device, memory_budget="40KB")
    retry = [e for e in trace.events if e.kind == "retry"]
    assert len(retry) == 1 and retry[0].data["budget"] == 20_000
    assert backward_error(a, q, r) <= 20 * 12 * 2.0**-53
    assert ooc_events(trace)[0].data["budget"] == 20_000
    src = Dataset(a, fail_at=4, exc=MemoryError, times=2)
    with pytest.raises(MemoryError, match=re.escape(
            "out of device memory twice out of core (memory_budget 40 KB, then 20 KB)")):
        mpqr.qr(src, device=device, memory_budget="40KB")
    assert not list(staging.OPEN)


def test_bad_keywords():
    a = np.random.default_rng(6).standard_normal(TALL)
    with pytest.raises(ValueError, match="`device` must be None, 'cpu', 'cuda'"):
        mpqr.qr(a, device="tpu")
    with pytest.raises(TypeError, match="`progress` must be None, True or False"):
        mpqr.qr(a, progress="yes")
    with pytest.raises(ValueError, match="`memory_budget` must be a number of bytes"):
        mpqr.qr(a, memory_budget="lots")
    with pytest.raises(NotImplementedError, match="mode='complete' is not supported out of"):
        mpqr.qr(a, mode="complete", memory_budget="40KB")
    with pytest.raises(ValueError, match="`mode` must be one of"):
        mpqr.qr(a, mode="full", memory_budget="40KB")


def test_progress_bar():
    a = np.random.default_rng(7).standard_normal(TALL)
    try:
        import tqdm  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match=r"progress=True needs tqdm"):
            mpqr.qr(a, memory_budget="40KB", progress=True)
        q, r = mpqr.qr(a, memory_budget="40KB", progress=None)  # silently off
    else:
        q, r = mpqr.qr(a, memory_budget="40KB", progress=True)
    assert backward_error(a, q, r) <= 20 * 12 * 2.0**-53


@pytest.mark.skipif(not GPU, reason="no CUDA GPU")
def test_pinned_slots_page_locked_reused_capped_and_released(monkeypatch):
    """The staging's pinned slots are page-locked host buffers of a process pool: a
    second call takes the first call's, an interrupted call gives its own back, the pool
    keeps at most PINNED_POOL_BYTES, and release_pinned() unregisters them."""
    import cupy as cp
    from mpqr.backends.cupy import staging as cs

    cs.release_pinned()
    a = np.random.default_rng(6).standard_normal(TALL)
    r1 = mpqr.qr(a, mode="r", device="cuda", memory_budget="40KB")
    kept = list(cs._LOCKED)
    assert kept, "the call's slots went back to the pool"
    for buf in kept:  # registered: the driver sees page-locked host memory
        attrs = cp.cuda.runtime.pointerGetAttributes(buf.ptr)
        assert attrs.type == cp.cuda.runtime.memoryTypeHost
    r2 = mpqr.qr(a, mode="r", device="cuda", memory_budget="40KB")
    np.testing.assert_array_equal(r2, r1)
    assert sorted(map(id, cs._LOCKED)) == sorted(map(id, kept)), "slots reused, none new"
    src = Dataset(a, fail_at=3)
    with pytest.raises(KeyboardInterrupt, match="injected fault"):
        mpqr.qr(src, mode="r", device="cuda", memory_budget="40KB")
    assert len(cs._LOCKED) == len(kept) and not list(staging.OPEN)
    one = max(b.nbytes for b in kept)
    monkeypatch.setattr(cs, "PINNED_POOL_BYTES", one)
    mpqr.qr(a, mode="r", device="cuda", memory_budget="40KB")
    assert sum(b.nbytes for b in cs._LOCKED) <= one
    assert cs.release_pinned() > 0 and not cs._LOCKED
    assert all(not b.registered for b in kept)
