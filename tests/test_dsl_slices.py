"""tc-sgemm's hi*hi slices added in registers (backends/cupy/dsl_slices.py): GPU only, with
the CuTe DSL installed; against float64 and against the cuBLAS slices it replaces."""

import numpy as np
import pytest

cp = pytest.importorskip("cupy")


def _dsl():
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
    from mpqr.backends import get_backend

    be = get_backend(cp)
    for s in range(0, a16.shape[1], width):
        be.gemm_fp16(a16[:, s:s + width], b16[s:s + width], out=c, alpha=1.0, beta=1.0)
    return c


@pytest.mark.parametrize("a_order,b_order", [("C", "C"), ("F", "C"), ("C", "F")])
@pytest.mark.parametrize("kind", ["gaussian", "uniform"])
def test_gpu_slices_in_registers_against_float64_and_cublas(a_order, b_order, kind):
    dsl = _dsl()
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
    a = cp.ones((100, 128), dtype=cp.float16)  # m not a tile multiple
    b = cp.ones((128, 128), dtype=cp.float16)
    c = cp.zeros((100, 128), dtype=cp.float32)
    assert not dsl.add_hi_product(cp, a, b, c, 1024)
    assert not bool(c.any())
    c2 = cp.zeros((128, 128), dtype=cp.float32)[:, ::1].T  # F order
    assert not dsl.add_hi_product(cp, cp.ones((128, 128), dtype=cp.float16), b, c2, 1024)
