"""tc-sgemm's hi*hi slices added in registers (backends/cupy/dsl_slices.py): GPU only, with
the CuTe DSL installed; against float64 and against the cuBLAS slices it replaces."""

import numpy as np
import pytest
from mpqr.backends import get_backend

from mpqr.engines import tc_sgemm


def test_split_product_hands_the_slices_to_the_backend(monkeypatch):
    # a backend with the kernel gets the hi*hi term after the corrections (c holds them)
    # and no slice of it runs as a GEMM; one without it runs the slices as before
    be = get_backend(np)
    rng = np.random.default_rng(0)
    m, n, k, width = 8, 6, 64, 16
    parts = [rng.standard_normal(s).astype(np.float16) for s in ((m, k), (m, k), (k, n), (k, n))]
    a_hf, a_lo, b_hf, b_lo = parts
    a_hi, b_hi = a_hf, b_hf
    plain = tc_sgemm.split_product(be, a_hi, None, b_hi, None, slice_k=width,
                                   parts=(a_hf, a_lo, b_hf, b_lo))
    seen, gemms = [], []
    real = type(be).gemm_fp16

    def counted(self, a, b, *args, **kw):
        gemms.append(a.shape)
        return real(self, a, b, *args, **kw)

    def kernel(self, a, b, c, slice_k):
        seen.append((a.shape, b.shape, slice_k))
        c += (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32)
        return True

    monkeypatch.setattr(type(be), "gemm_fp16", counted)
    monkeypatch.setattr(type(be), "add_hi_slices", kernel)
    got = tc_sgemm.split_product(be, a_hi, None, b_hi, None, slice_k=width,
                                 parts=(a_hf, a_lo, b_hf, b_lo))
    assert seen == [((m, k), (k, n), width)]
    assert len(gemms) == 2  # the two correction products only
    exact = a_hi.astype(np.float64) @ b_hi.astype(np.float64) + 2.0**-11 * (
        a_hf.astype(np.float64) @ b_lo.astype(np.float64)
        + a_lo.astype(np.float64) @ b_hf.astype(np.float64))
    scale = np.abs(a_hi.astype(np.float64)) @ np.abs(b_hi.astype(np.float64))
    for c in (plain, got):
        assert np.all(np.abs(c - exact) <= 8 * 2.0**-23 * scale)


def _dsl():
    cp = pytest.importorskip("cupy")
    from mpqr.backends.cupy import dsl_slices

    why = dsl_slices.available()
    if why is not None:
        pytest.skip(f"the CuTe DSL is not installed: {why}")
    try:
        cp.cuda.runtime.getDeviceCount()
    except Exception:
        pytest.skip("no CUDA device")
    return dsl_slices


def _cublas_slices(a16, b16, c, width):
    import cupy as cp

    be = get_backend(cp)
    for s in range(0, a16.shape[1], width):
        be.gemm_fp16(a16[:, s:s + width], b16[s:s + width], out=c, alpha=1.0, beta=1.0)
    return c


def test_tile_and_gate_by_output_shape(monkeypatch):
    from mpqr.backends.cupy import dsl_slices as dsl

    assert dsl.tile_for(8192, 8192) == (256, 128) and dsl.tile_for(4096, 16384) == (256, 128)
    assert dsl.tile_for(4096, 4096) == (128, 128) and dsl.tile_for(8192 + 128, 8192) == (128, 128)
    monkeypatch.setattr(dsl, "TILE", (128, 128))
    assert dsl.tile_for(16384, 16384) == (128, 128)
    # tall outputs stay with cuBLAS's slices
    assert not dsl.takes(32768, 16384) and not dsl.takes(65536, 2048)
    assert dsl.takes(32768, 32768) and dsl.takes(24576, 8192) and dsl.takes(512, 512)


@pytest.mark.parametrize("tile", [(128, 128), (256, 128)])
@pytest.mark.parametrize("a_order,b_order", [("C", "C"), ("F", "C"), ("C", "F"), ("F", "F")])
@pytest.mark.parametrize("kind", ["gaussian", "uniform"])
def test_gpu_slices_in_registers_against_float64_and_cublas(a_order, b_order, kind, tile,
                                                            monkeypatch):
    dsl = _dsl()
    import cupy as cp

    monkeypatch.setattr(dsl, "TILE", tile)

    m, n, k, width = 256, 384, 4096 + 64, 1024  # a last, shorter slice
    rng = np.random.default_rng(3)
    draw = rng.standard_normal if kind == "gaussian" else rng.random
    a = cp.asarray(np.asarray(draw((m, k)), dtype=np.float16), order=a_order)
    b = cp.asarray(np.asarray(draw((k, n)), dtype=np.float16), order=b_order)
    c0 = cp.asarray(rng.standard_normal((m, n)), dtype=cp.float32)
    c = c0.copy()
    assert dsl.add_hi_product(cp, a, b, c, width)
    a64, b64 = a.astype(cp.float64), b.astype(cp.float64)
    exact = c0.astype(cp.float64) + a64 @ b64
    scale = cp.abs(c0).astype(cp.float64) + cp.abs(a64) @ cp.abs(b64)
    # the tensor cores truncate within a slice (k-steps of 16), the slices and C are added
    # with round-to-nearest: about (width / 16 + slices + 1) float32 roundings of the scale
    steps = width // 16 + -(-k // width) + 1
    bound = steps * 2.0**-23 * scale
    assert bool(cp.all(cp.abs(c.astype(cp.float64) - exact) <= bound))
    # the cuBLAS path's slices (each added to C in turn): the same terms
    ref = _cublas_slices(a, b, c0.copy(), width)
    assert bool(cp.all(cp.abs(c - ref) <= (-(-k // width) + 1) * 2.0**-23 * scale))
    # nothing else written
    assert a.dtype == cp.float16 and c.shape == (m, n)


def test_gpu_declines_what_it_does_not_take():
    dsl = _dsl()
    import cupy as cp

    a = cp.ones((100, 128), dtype=cp.float16)  # m not a tile multiple
    b = cp.ones((128, 128), dtype=cp.float16)
    c = cp.zeros((100, 128), dtype=cp.float32)
    assert not dsl.add_hi_product(cp, a, b, c, 1024)
    assert not bool(c.any())
    c2 = cp.zeros((128, 128), dtype=cp.float32)[:, ::1].T  # F order
    assert not dsl.add_hi_product(cp, cp.ones((128, 128), dtype=cp.float16), b, c2, 1024)


def test_gpu_called_through_tvm_ffi_or_pointers_alike(monkeypatch):
    # the two calling conventions run the same compiled kernel: the same bits
    dsl = _dsl()
    import cupy as cp

    if not dsl._tvm_ffi():
        pytest.skip("apache-tvm-ffi is not installed")
    rng = np.random.default_rng(8)
    a = cp.asarray(rng.standard_normal((256, 2048)), dtype=cp.float16)
    b = cp.asarray(rng.standard_normal((2048, 256)), dtype=cp.float16)
    c0 = cp.asarray(rng.standard_normal((256, 256)), dtype=cp.float32)
    outs = []
    for ffi in (True, False):
        monkeypatch.setattr(dsl, "USE_TVM_FFI", ffi)
        c = c0.copy()
        assert dsl.add_hi_product(cp, a, b, c, 1024)
        outs.append(c)
    cp.testing.assert_array_equal(outs[0], outs[1])
    assert not bool(cp.array_equal(outs[0], c0))
