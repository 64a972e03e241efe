"""mpqr.matmul: bad input, dtypes, empty shapes, inputs left untouched."""

from __future__ import annotations

import numpy as np
import pytest

import mpqr
from tests._support import assert_close, to_numpy

PRECISIONS = ["auto", "fp16", "fp32", "fp32-emulated", "fp64"]


def test_rejects_non_2d(xp):
    with pytest.raises(ValueError, match=r"`a` must be 2-D \(the GEMM engines are 2-D\), got ndim=1"):
        mpqr.matmul(xp.ones(3), xp.ones((3, 2)))
    with pytest.raises(ValueError, match=r"`b` must be 2-D \(the GEMM engines are 2-D\), got ndim=3"):
        mpqr.matmul(xp.ones((2, 3)), xp.ones((2, 3, 2)))


def test_rejects_mismatched_inner_dimensions(xp):
    with pytest.raises(ValueError, match=r"inner dimensions must match: `a` has shape \(2, 3\) "
                                         r"and `b` has shape \(4, 2\) \(3 != 4\)"):
        mpqr.matmul(xp.ones((2, 3)), xp.ones((4, 2)))


def test_rejects_bool(xp):
    with pytest.raises(TypeError, match="`a` must have a floating or integer dtype, got bool"):
        mpqr.matmul(xp.ones((2, 2), dtype=xp.bool), xp.ones((2, 2)))


def test_rejects_object_arrays():
    a = np.array([[1, 2], [3, 4]], dtype=object)
    with pytest.raises(TypeError, match="`a` must have a floating or integer dtype, got object"):
        mpqr.matmul(a, np.ones((2, 2)))


def test_rejects_mixed_libraries():
    xs = pytest.importorskip("array_api_strict")
    with pytest.raises(TypeError, match=r"arrays from different libraries cannot be mixed "
                                        r"\(`a` is numpy, `b` is array_api_strict\)"):
        mpqr.matmul(np.ones((2, 2)), xs.ones((2, 2)))
    with pytest.raises(TypeError, match="`b` must be an array of an Array API library"):
        mpqr.matmul(np.ones((2, 2)), [[1.0, 2.0], [3.0, 4.0]])


def test_integers_computed_as_float64(xp):
    a = xp.asarray([[1, 2], [3, 4]], dtype=xp.int64)
    c = mpqr.matmul(a, a)
    assert c.dtype == xp.float64
    assert_close(c, np.array([[7.0, 10.0], [15.0, 22.0]]), rtol=0, xp=xp)


@pytest.mark.skip_xp_backend("array_api_strict", reason="no float16 in array-api-strict")
def test_float16_computed_as_float32(xp):
    a = xp.asarray(np.array([[1.5, 2.0], [0.25, 4.0]], dtype=np.float16))
    c = mpqr.matmul(a, a, precision="fp32")
    assert c.dtype == xp.float32
    assert_close(c, np.array([[2.75, 11.0], [1.375, 16.5]]), rtol=0, xp=xp)


def test_mixed_float_dtypes_promote(xp):
    a = xp.ones((2, 3), dtype=xp.float32)
    b = xp.ones((3, 2), dtype=xp.float64)
    assert mpqr.matmul(a, b).dtype == xp.float64


def test_complex_native_and_emulated(xp):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((3, 4)) + 1j * rng.standard_normal((3, 4))
    b = rng.standard_normal((4, 2)) + 1j * rng.standard_normal((4, 2))
    c = mpqr.matmul(xp.asarray(a), xp.asarray(b))
    assert_close(c, a @ b, rtol=64 * 2.0**-53, xp=xp)
    # the emulated precisions run complex products as real products of the parts
    # (tests/test_engines_complex.py checks their accuracy against exact products)
    precs = ["fp64-emulated"] if xp.__name__ == "array_api_strict" else \
        ["fp16", "fp32-emulated", "fp64-emulated"]
    for p in precs:
        c = mpqr.matmul(xp.asarray(a), xp.asarray(b), precision=p)
        assert c.dtype == xp.complex128
        assert_close(c, a @ b, rtol=64 * 2.0**-11, xp=xp)


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize(("m", "k", "n"), [(0, 3, 2), (3, 0, 2), (3, 2, 0), (0, 0, 0)])
def test_empty_dimensions(xp, precision, m, k, n):
    if precision in ("fp16", "fp32-emulated") and xp.__name__ == "array_api_strict":
        pytest.skip("no fp16 engines on array-api-strict")
    c = mpqr.matmul(xp.ones((m, k)), xp.ones((k, n)), precision=precision)
    assert tuple(c.shape) == (m, n)
    assert c.dtype == xp.float64
    assert to_numpy(c).sum() == 0


@pytest.mark.parametrize("precision", PRECISIONS)
def test_inputs_never_modified_and_views_accepted(xp, precision):
    if precision in ("fp16", "fp32-emulated") and xp.__name__ == "array_api_strict":
        pytest.skip("no fp16 engines on array-api-strict")
    rng = np.random.default_rng(2)
    base = rng.standard_normal((9, 8))
    a = xp.asarray(base)
    before = to_numpy(a).copy()
    bt = xp.matrix_transpose(xp.asarray(base[:, :6]))  # transposed view (6, 9)
    c = mpqr.matmul(bt, a, precision=precision)
    np.testing.assert_array_equal(to_numpy(a), before)
    u = {"fp16": 2.0**-11, "fp32-emulated": 2.0**-22, "fp32": 2.0**-24}.get(precision, 2.0**-53)
    ref = base[:, :6].T @ base
    scale = np.abs(base[:, :6].T) @ np.abs(base)
    assert np.all(np.abs(to_numpy(c) - ref) <= 4 * 9 * u * scale)


def test_fortran_order_and_strided_views():
    rng = np.random.default_rng(4)
    a = np.asfortranarray(rng.standard_normal((7, 5)))
    b = rng.standard_normal((10, 6))[::2]  # non-contiguous rows
    for p in PRECISIONS:
        c = mpqr.matmul(a, b, precision=p)
        u = {"fp16": 2.0**-11, "fp32-emulated": 2.0**-22, "fp32": 2.0**-24}.get(p, 2.0**-53)
        assert np.all(np.abs(c - a @ b) <= 4 * 5 * u * (np.abs(a) @ np.abs(b)))
