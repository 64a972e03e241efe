"""tc-sgemm's product in one kernel (``backend.fused_sgemm``): the engine's hand-off of its
parts, on the NumPy backend with the kernel's sums emulated; the CUDA kernel on a GPU."""

from __future__ import annotations

import numpy as np
import pytest
from _support import triton_cupy as _triton_cupy
from mpqr.backends import get_backend

from mpqr._array_api import array_namespace
from mpqr.engines import tc_sgemm
from mpqr.engines.prepared import prepare
from mpqr.engines.scaling import LO_SHIFT


def _kernel_sums(a_hi, a_hf, a_lo, b_hi, b_hf, b_lo, slice_k):
    """The kernel's float32 sums: the corrections over k, scaled, then each k-slice of
    ``hi hi`` added with round-to-nearest."""
    f = np.float32
    acc = (a_hf.astype(f) @ b_lo.astype(f) + a_lo.astype(f) @ b_hf.astype(f)) \
        * f(2.0**-LO_SHIFT)
    for s in range(0, a_hi.shape[1], slice_k):
        acc = acc + a_hi[:, s:s + slice_k].astype(f) @ b_hi[s:s + slice_k].astype(f)
    return acc


@pytest.fixture
def kernel(monkeypatch):
    """The NumPy backend with the kernel emulated; yields the list of its calls."""
    be = get_backend(array_namespace(np.zeros(1)))
    calls = []

    def run(a_hi, a_hf, a_lo, b_hi, b_hf, b_lo, sa, sb, c, *, slice_k, accumulate, subtract):
        assert all(x.dtype == np.float16 and x.ndim == 2
                   for x in (a_hi, a_hf, a_lo, b_hi, b_hf, b_lo))
        p = be.unscale(_kernel_sums(a_hi, a_hf, a_lo, b_hi, b_hf, b_lo, slice_k), sa, sb,
                       c.dtype)
        calls.append((a_hi.shape, b_hi.shape, accumulate, subtract, slice_k))
        c[...] = (c - p if subtract else c + p) if accumulate else p
        return True

    monkeypatch.setattr(be, "fused_sgemm", run, raising=True)
    monkeypatch.setattr(be, "fused_sgemm_kernel", lambda m, n, k, s: "emulated", raising=True)
    return be, calls


def _bound(a, b, k):
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    return a64 @ b64, (2.0**-20 + k * 2.0**-24) * (np.abs(a64) @ np.abs(b64))


@pytest.mark.parametrize("subtract", [None, True, False])
def test_the_engine_hands_its_parts_to_the_kernel(kernel, subtract):
    be, calls = kernel
    rng = np.random.default_rng(1)
    m, n, k = 48, 40, 300
    a = (rng.standard_normal((m, k)) * np.exp2(rng.integers(-30, 30, (m, 1)))).astype(np.float32)
    b = (rng.standard_normal((k, n)) * np.exp2(rng.integers(-30, 30, (1, n)))).astype(np.float32)
    c0 = rng.standard_normal((m, n)).astype(np.float32)
    c = c0.copy()
    assert tc_sgemm.accumulate_tc_sgemm(be, a, b, c, subtract=subtract, out_dtype=np.float32,
                                        slice_k=64)
    assert calls == [((m, k), (k, n), subtract is not None, bool(subtract), 64)]
    p, bound = _bound(a, b, k)
    want = p if subtract is None else (c0 - p if subtract else c0 + p)
    tol = bound + (0 if subtract is None else 2.0**-24 * np.abs(want))
    assert np.all(np.abs(c - want) <= tol)
    # the same sums as the engine's own GEMMs (slices in the same order), to rounding
    off = c0.copy()
    tc_sgemm.FUSED_KERNEL = False
    try:
        tc_sgemm.accumulate_tc_sgemm(be, a, b, off, subtract=subtract, out_dtype=np.float32,
                                     slice_k=64)
    finally:
        tc_sgemm.FUSED_KERNEL = True
    assert len(calls) == 1
    assert np.all(np.abs(c.astype(np.float64) - off) <= 2 * tol)


def test_a_plain_product_and_a_transposed_prepared_operand(kernel):
    be, calls = kernel
    rng = np.random.default_rng(2)
    m, n, k = 36, 20, 130
    w = (rng.standard_normal((k, m)) * np.exp2(rng.integers(-40, 40, (1, m)))).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    pw = prepare(be, w, side="right", engine="tc-sgemm").T  # shifts along k
    got = tc_sgemm.run_tc_sgemm(be, pw, b, out_dtype=np.float32, slice_k=32)
    p, bound = _bound(w.T, b, k)
    assert calls and calls[-1][:2] == ((m, k), (k, n))
    assert got.dtype == np.float32 and np.all(np.abs(got - p) <= bound)
    # a float64 result, and stacks, take the engine's GEMMs
    n_calls = len(calls)
    tc_sgemm.run_tc_sgemm(be, w.T, b, out_dtype=np.float64, slice_k=32)
    tc_sgemm.run_tc_sgemm(be, np.stack([w.T] * 2), b, out_dtype=np.float32, slice_k=32)
    assert len(calls) == n_calls


def test_nonfinite_entries_give_the_native_pattern(kernel):
    be, _ = kernel
    rng = np.random.default_rng(3)
    a = rng.standard_normal((20, 50)).astype(np.float32)
    b = rng.standard_normal((50, 30)).astype(np.float32)
    a[2, 7], b[9, 4] = np.inf, np.nan
    got = tc_sgemm.run_tc_sgemm(be, a, b, out_dtype=np.float32, slice_k=16)
    with np.errstate(invalid="ignore", over="ignore"):
        ref = a @ b
    assert np.array_equal(np.isnan(got), np.isnan(ref))
    assert np.array_equal(np.isinf(got), np.isinf(ref))


def test_the_portable_backend_has_no_kernel():
    be = get_backend(array_namespace(np.zeros(1)))
    x = np.zeros((2, 2), np.float16)
    s = np.zeros((2, 1), np.int32)
    assert be.fused_sgemm(x, x, x, x, x, x, s, s.T, np.zeros((2, 2), np.float32),
                          slice_k=2, accumulate=False, subtract=False) is False
    assert be.fused_sgemm_kernel(4096, 4096, 4096, 1024) is None


gpu = pytest.mark.skipif(_triton_cupy() is None, reason="needs a CUDA GPU with Triton")


@gpu
@pytest.mark.parametrize(("subtract", "slice_k"), [(None, 128), (True, 1024), (False, 128)])
def test_triton_sgemm_matches_the_engine_gemms(subtract, slice_k, monkeypatch):
    cp = _triton_cupy()
    from mpqr.backends.cupy import triton_sgemm as ts

    monkeypatch.setattr(ts, "MAX_SLICE", None)  # every slice length (default: short ones)

    rng = cp.random.default_rng(7)
    m, n, k = 2048, 1280, 3000
    a = rng.standard_normal((k, m), dtype=cp.float32).T
    b = rng.standard_normal((k, n), dtype=cp.float32)
    b[9, 4] = cp.nan
    c0 = rng.standard_normal((m, n), dtype=cp.float32)
    be = get_backend(array_namespace(c0))
    outs = []
    for on in (True, False):
        ts.ENABLED = on
        c = c0.copy()
        try:
            tc_sgemm.accumulate_tc_sgemm(be, a, b, c, subtract=subtract,
                                         out_dtype=cp.float32, slice_k=slice_k)
        finally:
            ts.ENABLED = True
        outs.append(c)
    on, off = outs
    a64, b64 = a.astype(cp.float64), cp.nan_to_num(b.astype(cp.float64))
    bound = 2 * (2.0**-20 + k * 2.0**-24) * (cp.abs(a64) @ cp.abs(b64)) \
        + 2.0**-23 * cp.abs(c0) * (subtract is not None)
    fin = cp.isfinite(off)
    assert bool(cp.all(cp.where(fin, cp.abs(on.astype(cp.float64) - off) <= bound, True)))
    assert bool(cp.all(cp.isnan(on) == cp.isnan(off)))
    assert ts.kernel_name(m, n, k, slice_k) == "triton-sgemm"


@pytest.mark.parametrize("same", [True, False])
def test_the_gram_blocks_go_to_the_kernel(kernel, same):
    from mpqr.engines.gram import gram_tc_sgemm

    be, calls = kernel
    rng = np.random.default_rng(4)
    k, n = 200, 96
    a = (rng.standard_normal((k, n)) * np.exp2(rng.integers(-20, 20, (1, n)))).astype(np.float32)
    b = a if same else rng.standard_normal((k, n)).astype(np.float32)
    got = gram_tc_sgemm(be, a, b, out_dtype=np.float32, sign=1, slice_k=64)
    assert calls and all(c[2:] == (False, False, 64) for c in calls)
    p, bound = _bound(a.T, b, k)
    upper = np.triu(np.ones((n, n), bool))
    assert np.all(np.abs(got - p)[upper] <= bound[upper])
    assert np.array_equal(got, got.T) or not same
