"""float16 operands of the fp16 engines, and the fp16 QR's vectors kept as float16.

An operand that is float16 already holds fp16 numbers: ``tc-fp16`` (and the A side of
``tc-fp16-splitb``) take it as it is, with no conversion pass, and must give the bits the
engine gives for the same numbers widened to float32 (scaling fp16 numbers by a power of
two and rounding them to fp16 again changes nothing). Engines that do not read fp16
operands get them widened by the policy. The fp16 Householder QR keeps its rounded
vectors in such an array (``mpqr.qr.householder_recursive``).
"""

from __future__ import annotations

import numpy as np
import pytest
from mpqr.backends import get_backend

import mpqr
from mpqr._array_api import array_namespace
from mpqr.engines import ENGINES
from mpqr.policy import gemm, gemm_sub
from tests._qr_support import backward_error
from tests._support import from_numpy, to_numpy


def _backend(xp):
    be = get_backend(array_namespace(xp.asarray(1.0)))
    if "fp16" not in be.capabilities:
        pytest.skip("backend without the fp16 engines")
    return be


def _fp16_numbers(rng, shape, scale=1.0):
    x = (rng.standard_normal(shape) * scale).astype(np.float16)
    x[0, 0] = np.float16(2.0**-24)  # the smallest subnormal: kept by every scaling too
    return x


@pytest.mark.skip_xp_backend("numpy_readonly", reason="C -= A B writes into C")
@pytest.mark.parametrize("engine", ["tc-fp16", "tc-fp16-splitb"])
def test_float16_operand_gives_the_bits_of_its_float32_copy(xp, engine):
    be = _backend(xp)
    rng = np.random.default_rng(0)
    a16 = _fp16_numbers(rng, (70, 45))
    b = rng.standard_normal((45, 30)).astype(np.float32) * 1e3
    a16x, bx = from_numpy(xp, a16), from_numpy(xp, b)
    a32x = from_numpy(xp, a16.astype(np.float32))
    got = gemm(a16x, bx, precision="fp16", options={"engine": engine}, backend=be)
    want = gemm(a32x, bx, precision="fp16", options={"engine": engine}, backend=be)
    assert got.dtype == want.dtype == xp.float32
    np.testing.assert_array_equal(to_numpy(got), to_numpy(want))
    if engine == "tc-fp16":  # a transposed float16 view on the right, and C -= A B
        c = from_numpy(xp, rng.standard_normal((30, 70)).astype(np.float32))
        c2 = xp.asarray(c, copy=True)
        bt = from_numpy(xp, b.T.copy())
        gemm_sub(c, bt, a16x.mT, precision="fp16", options={"engine": engine}, backend=be)
        gemm_sub(c2, bt, a32x.mT, precision="fp16", options={"engine": engine}, backend=be)
        # the layouts differ (a transposed view against a converted copy), so may the
        # library's summation order: within the float32 sums' bound of each other
        bound = 2 * 45 * 2.0**-24 * (np.abs(b.T).astype(np.float16).astype(np.float64)
                                     @ np.abs(a16.T.astype(np.float64))) + 2.0**-24 * 4
        assert (np.abs(to_numpy(c) - to_numpy(c2)) <= bound + np.abs(to_numpy(c2))
                * 2.0**-23).all()


def test_float16_operand_is_not_converted_again(monkeypatch):
    """No conversion pass for the float16 side: one ``split_fp16`` call, for B."""
    be = get_backend(array_namespace(np.zeros(1)))
    calls = []
    split = be.split_fp16
    monkeypatch.setattr(be, "split_fp16", lambda x, *a, **k: (calls.append(x.dtype),
                                                             split(x, *a, **k))[1])
    rng = np.random.default_rng(1)
    a16 = _fp16_numbers(rng, (20, 16))
    b = rng.standard_normal((16, 12)).astype(np.float32)
    gemm(a16, b, precision="fp16", backend=be)
    assert calls == [np.float32]


def test_engines_without_fp16_operands_get_them_widened():
    """``tc-sgemm`` and the native engines: the float16 operand is widened first (exact),
    so the product is the float32 one."""
    rng = np.random.default_rng(2)
    a16 = _fp16_numbers(rng, (24, 20))
    b = rng.standard_normal((20, 10)).astype(np.float32)
    for precision in ("fp32-emulated", "fp32"):
        got = gemm(a16, b, precision=precision)
        want = gemm(a16.astype(np.float32), b, precision=precision)
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, want)
    assert not ENGINES["tc-sgemm"].fp16_operands and ENGINES["tc-fp16"].fp16_operands


def test_nonfinite_float16_operand_stays_nonfinite(xp):
    be = _backend(xp)
    a16 = np.ones((8, 6), dtype=np.float16)
    a16[2, 3] = np.inf
    a16[5, 1] = np.nan
    b = np.ones((6, 4), dtype=np.float32)
    with np.errstate(invalid="ignore"):
        c = to_numpy(gemm(from_numpy(xp, a16), from_numpy(xp, b), precision="fp16",
                          backend=be))
    assert np.isinf(c[2]).all() and np.isnan(c[5]).all()
    assert np.isfinite(np.delete(c, [2, 5], axis=0)).all()


@pytest.mark.skip_xp_backend("numpy_readonly", reason="writes into an output array")
def test_unit_lower_fp16_rounds_the_vectors_below_the_diagonal(xp):
    be = _backend(xp)
    rng = np.random.default_rng(3)
    for dtype in (np.float32, np.float64):
        src = rng.standard_normal((2, 9, 5)).astype(dtype)  # R above the diagonal: not read
        src[0, 4, 1] = 1 + 2.0**-11  # a tie: to even (1), as IEEE rounding does
        src[0, 6, 2] = 1 + 2.0**-11 + 2.0**-30 if dtype == np.float64 else src[0, 6, 2]
        src[1, 7, 3] = 3e-8  # below half the smallest subnormal's step: to 2^-24
        out = xp.empty((2, 9, 5), dtype=xp.float16)
        be.unit_lower_fp16(from_numpy(xp, src), out)
        want = (np.tril(src, -1) + np.eye(9, 5)).astype(np.float16)
        got = to_numpy(out)
        np.testing.assert_array_equal(got, want)
        assert got[0, 4, 1] == 1.0 and got[1, 7, 3] == np.float16(2.0**-24)
        if dtype == np.float64:  # rounded once from float64 (not through float32)
            assert got[0, 6, 2] == np.float16(1 + 2.0**-10)


def test_fp16_qr_reads_its_vectors_from_the_float16_array(xp):
    """The leaf's Gram matrix of the rounded vectors runs on ``tc-fp16`` (exact products)
    and ``W = Ŷ T̂`` on ``tc-fp16-splitb``; every product with the vectors takes the
    float16 array as it is; the factorization keeps the fp16 accuracy."""
    _backend(xp)
    rng = np.random.default_rng(4)
    a = rng.standard_normal((384, 256)).astype(np.float32)
    ax = from_numpy(xp, a)
    with mpqr.explain() as tr:
        q, r = mpqr.qr(ax, method="householder-recursive", precision="fp16")
    engines = {g.label: g.engine for g in tr.gemms}
    assert engines["panel-YhY"] == "tc-fp16"
    assert engines["panel-wy-rounded"] == "tc-fp16-splitb"
    u16 = 2.0**-11
    assert backward_error(a, q, r) <= 2 * u16
    qn = to_numpy(q).astype(np.float64)
    assert np.linalg.norm(np.eye(256) - qn.T @ qn) / 256 <= 4 * u16 / np.sqrt(256)
    np.testing.assert_array_equal(to_numpy(ax), a)  # the input is untouched


def test_rounded_reflectors_into_a_float16_array_and_their_w():
    """``round_reflectors_fp16(..., out=)``: the float16 array holds ``fp16(Y)`` (explicit
    unit lower, R above not read), ``I - Ŷ T̂ Ŷ^T`` is orthogonal to float32 working
    precision (``O(k u32)``), and ``rounded_wy``'s ``W = Ŷ T̂`` (on ``tc-fp16-splitb``) is within
    ``(2^-22 + k u32) |Ŷ||T̂|`` of the exact product."""
    import importlib

    recursive = importlib.import_module("mpqr.qr.householder_recursive")
    householder_panel = importlib.import_module("mpqr.qr._kernels").householder_panel
    be = get_backend(array_namespace(np.zeros(1)))
    m, k = 400, 64
    a = np.random.default_rng(6).standard_normal((m, k)).astype(np.float32)
    w, y, r = householder_panel(be, a, precision="fp32")
    work = np.triu(np.vstack([r, np.zeros((m - k, k), np.float32)])) + np.tril(y, -1)
    out = np.full((m, k), np.float16(7), dtype=np.float16)
    y16, t = recursive.round_reflectors_fp16(be, w, work, precision="fp32", out=out)
    assert y16 is out and out.dtype == np.float16
    np.testing.assert_array_equal(out, (np.tril(y, -1) + np.eye(m, k)).astype(np.float16))
    yh = out.astype(np.float64)
    h = np.eye(m) - yh @ t.astype(np.float64) @ yh.T
    # T̂ comes from float32 sums and a float32 triangular solve, each O(k u32) relative,
    # and H^T H - I = 2 Ŷ dT Ŷ^T + ... with ||Ŷ||_2 <= 2: measured 3.7 k u32 here, as with
    # the scaled rounding the float16 array replaced
    assert np.linalg.norm(h.T @ h - np.eye(m)) <= 8 * k * 2.0**-24
    wy = np.empty((m, k), dtype=np.float32)
    with mpqr.explain() as tr:
        recursive.rounded_wy(be, wy, out, t, precision="fp32")
    assert [g.engine for g in tr.gemms] == ["tc-fp16-splitb"]
    exact = yh @ t.astype(np.float64)
    bound = (2.0**-22 + k * 2.0**-24) * (np.abs(yh) @ np.abs(t.astype(np.float64)))
    assert (np.abs(wy - exact) <= bound + 1e-30).all()
