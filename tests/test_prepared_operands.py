"""Operands prepared once (:mod:`mpqr.engines.prepared`), tc-sgemm's unscale and update
of C in one pass, and the recursion's W1 prepared for the update and the merge.

On the CPU (NumPy backend, the engines' own roundings): a prepared operand on its own axis
gives the product's bits; transposed (its shifts moved to the other operand) it stays
within the engine's bound; the fused update gives the separate passes' bits; the QR's
accuracy is unchanged. On the GPU: the strided conversion kernels against the elementwise
ones (bitwise) and the prepared products against the NumPy emulation.
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest
from mpqr.backends import get_backend

import mpqr
from mpqr.engines import tc_sgemm
from mpqr.engines.prepared import Prepared, operand, prepare, shared_hi
from mpqr.policy import gemm, gemm_into, gemm_options, gemm_sub, prepare_operand

hr = importlib.import_module("mpqr.qr.householder_recursive")
BE = get_backend(np)
EMU = "fp32-emulated"


def _ab(m=70, k=300, n=50, seed=0, graded=False):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k))
    if graded:  # columns of A (the inner axis) over 2^-40 .. 2^40
        a *= np.exp2(rng.integers(-40, 40, size=(1, k)))
    return a.astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)


def _bound(a, b, k):
    # tc-sgemm: ~2^-22 per operand split, float32 sums over k (slices rounded to nearest)
    return (2.0**-20 + k * 2.0**-24) * (np.abs(a.astype(np.float64)) @ np.abs(b))


@pytest.mark.parametrize("side", ["left", "right"])
def test_prepared_on_its_own_axis_gives_the_same_bits(side):
    a, b = _ab()
    plain = gemm(a, b, precision=EMU)
    if side == "left":
        got = gemm(prepare(BE, a, side="left", engine="tc-sgemm"), b, precision=EMU)
    else:
        got = gemm(a, prepare(BE, b, side="right", engine="tc-sgemm"), precision=EMU)
    assert np.array_equal(got, plain)
    both = gemm(prepare(BE, a, side="left", engine="tc-sgemm"),
                prepare(BE, b, side="right", engine="tc-sgemm"), precision=EMU)
    assert np.array_equal(both, plain)


@pytest.mark.parametrize("side", ["left", "right"])
def test_shared_hi_parts_give_the_same_bits_in_two_thirds_the_bytes(side):
    """Within ``shared_hi`` a tc-sgemm operand's ``hi`` is its correction buffer's ``hf``
    half (4 bytes an element, not 6): finite operands give the product's bits."""
    a, b = _ab()
    x = a if side == "left" else b
    with shared_hi():
        p = prepare(BE, x, side=side, engine="tc-sgemm")
    plain = prepare(BE, x, side=side, engine="tc-sgemm")
    assert np.shares_memory(p.hi, p.cat) and p.hi is p.hf
    assert not np.shares_memory(plain.hi, plain.cat)
    assert np.array_equal(p.hi, plain.hi) and np.array_equal(p.lo, plain.lo)
    # one buffer of 4 bytes an element (the plain parts: that and hi's 2 beside it)
    assert p.cat.nbytes == 4 * x.size and plain.cat.nbytes + plain.hi.nbytes == 6 * x.size
    args = (p, b) if side == "left" else (a, p)
    assert np.array_equal(gemm(*args, precision=EMU), gemm(a, b, precision=EMU))


def test_shared_hi_keeps_non_finite_outputs_non_finite():
    """An Inf or NaN entry reaches the correction product too within ``shared_hi``: the
    outputs it touches are non-finite exactly where the engine's are (Inf may become NaN),
    the others keep their bits; the QR of such a matrix is non-finite either way."""
    a, b = _ab()
    a[3, 7], a[9, 11], b[20, 4] = np.inf, np.nan, -np.inf
    plain = gemm(a, b, precision=EMU)
    with shared_hi():
        got = gemm(prepare(BE, a, side="left", engine="tc-sgemm"),
                   prepare(BE, b, side="right", engine="tc-sgemm"), precision=EMU)
    bad = ~np.isfinite(plain)
    assert bad.any() and np.array_equal(~np.isfinite(got), bad)
    assert np.array_equal(got[~bad], plain[~bad])
    x = np.random.default_rng(3).standard_normal((200, 200)).astype(np.float32)
    ref = mpqr.qr(x, precision=EMU, method="householder-recursive")
    for flag in (False, True):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(hr, "SHARED_HI", flag)
            got_q, got_r = mpqr.qr(x, precision=EMU, method="householder-recursive")
            assert np.array_equal(got_q, ref[0]) and np.array_equal(got_r, ref[1])
            y = x.copy()
            y[50, 60] = np.inf
            q, r = mpqr.qr(y, precision=EMU, method="householder-recursive")
            assert not (np.isfinite(q).all() and np.isfinite(r).all())


def test_tc_fp16_prepared_gives_the_same_bits():
    a, b = _ab()
    plain = gemm(a, b, precision="fp16")
    got = gemm(prepare(BE, a, side="left", engine="tc-fp16"), b, precision="fp16")
    assert np.array_equal(got, plain)


@pytest.mark.parametrize("graded", [False, True])
def test_transposed_prepared_is_within_the_engines_bound(graded):
    # W^T prepared (W's columns scaled), then W on the left of W D: W's shifts go onto D
    w, d = _ab(m=90, k=200, n=40, seed=1, graded=graded)
    pw = prepare(BE, w.T, side="left", engine="tc-sgemm")
    assert pw.T.inner("left") and not pw.inner("left")
    got = gemm(pw.T, d, precision=EMU)
    ref = w.astype(np.float64) @ d.astype(np.float64)
    assert np.all(np.abs(got - ref) <= _bound(w, d, 200))
    # and on the other side of a product with its own axis: the same bits as W^T D'
    d2 = np.random.default_rng(2).standard_normal((90, 30)).astype(np.float32)
    assert np.array_equal(gemm(pw, d2, precision=EMU), gemm(w.T, d2, precision=EMU))


def test_inner_shifts_move_exactly_to_a_float32_partner():
    # the partner's lines scaled by 2^-s in float64: a partner entry that 2^-s would make
    # subnormal in float32 keeps its bits (the product is still within the bound)
    w, d = _ab(m=40, k=64, n=16, seed=3)
    w[:, 5] *= np.float32(2.0**-100)  # column 5's shift is ~+100: D's row 5 gets 2^-100
    d[5, :] = np.float32(3e-30)
    got = gemm(prepare(BE, w.T, side="left", engine="tc-sgemm").T, d, precision=EMU)
    ref = w.astype(np.float64) @ d.astype(np.float64)
    assert np.all(np.abs(got - ref) <= _bound(w, d, 64))


def test_another_engine_reads_the_array_and_explain_says_prepared():
    a, b = _ab()
    pa = prepare_operand(a, side="left", m=70, n=50, k=300, precision=EMU, backend=BE)
    assert isinstance(pa, Prepared)
    with mpqr.explain() as trace:
        c_emu = gemm(pa, b, precision=EMU, label="p-emu")
        c_nat = gemm(pa, b, precision="fp32", label="p-native")
    assert np.array_equal(c_nat, gemm(a, b, precision="fp32"))
    assert np.array_equal(c_emu, gemm(a, b, precision=EMU))
    lines = {g.label: str(g) for g in trace.gemms}
    assert "prepared=A" in lines["p-emu"] and "prepared" not in lines["p-native"]
    # an engine that splits no operand, or a memory cap on the engines' scratch: nothing
    # is prepared
    assert prepare_operand(a, side="left", m=70, n=50, k=300, precision="fp32") is a
    with gemm_options(workspace_limit=2**30):
        assert prepare_operand(a, side="left", m=70, n=50, k=300, precision=EMU) is a
    assert operand(pa) is a


def test_a_tiled_product_reads_the_array():
    a, b = _ab(m=520, k=32, n=520)
    pa = prepare(BE, a, side="left", engine="tc-sgemm")
    with gemm_options(workspace_limit=520 * 32 * 20):
        got = gemm(pa, b, precision=EMU)
        plain = gemm(a, b, precision=EMU)
    assert np.array_equal(got, plain)


def test_prepare_names_a_bad_argument():
    with pytest.raises(ValueError, match="side='top'"):
        prepare(BE, np.ones((3, 3), np.float32), side="top", engine="tc-sgemm")
    with pytest.raises(ValueError, match="engine='native-fp32'"):
        prepare(BE, np.ones((3, 3), np.float32), side="left", engine="native-fp32")


@pytest.mark.parametrize("mode", ["sub", "into"])
def test_fused_unscale_gives_the_separate_passes_bits(monkeypatch, mode):
    a, b = _ab(seed=4)
    a[3, 7] = np.inf
    c0 = np.random.default_rng(5).standard_normal((70, 50)).astype(np.float32)
    outs = []
    for fused in (False, True):
        monkeypatch.setattr(tc_sgemm, "FUSED_UNSCALE", fused)
        c = c0.copy()
        view = c[:, :]  # a view of the caller's array, written in place
        (gemm_sub if mode == "sub" else gemm_into)(view, a, b, precision=EMU)
        outs.append(c)
    assert np.array_equal(outs[0], outs[1], equal_nan=True)


def _qr_errors(a, q, r):
    a64 = a.astype(np.float64)
    back = np.linalg.norm(a64 - q.astype(np.float64) @ r) / np.linalg.norm(a64)
    orth = np.linalg.norm(q.T.astype(np.float64) @ q - np.eye(q.shape[1]))
    return back, orth


def test_qr_with_w1_prepared_keeps_its_accuracy(monkeypatch):
    monkeypatch.setenv("MPQR_MEMORY_PLAN", "fast")  # products whole (no scratch cap)
    a = np.random.default_rng(6).standard_normal((160, 128)).astype(np.float32)
    errs = {}
    for on in (False, True):
        monkeypatch.setattr(hr, "PREPARED_OPERANDS", on)
        with mpqr.explain() as trace:
            q, r = mpqr.qr(a, precision=EMU, method="householder-recursive")
        errs[on] = _qr_errors(a, q, r)
        prepared = [g for g in trace.gemms if "prepared=A" in str(g)]
        labels = {g.label for g in prepared}
        assert labels == ({"rec-update-WhB", "rec-merge-WD", "rec-formq-trmm-gemm"} if on
                          else set())
    # the lean plan keeps no operand across the recursion: today's products
    with mpqr.explain() as trace, hr.lean_plan():
        mpqr.qr(a, precision=EMU, method="householder-recursive")
    assert not [g for g in trace.gemms if "prepared=" in str(g)]
    (b0, o0), (b1, o1) = errs[False], errs[True]
    u = 2.0**-24
    assert b1 <= 2 * b0 + 50 * u and o1 <= 2 * o0 + 50 * u
    assert b1 <= 200 * u * 128 and o1 <= 200 * u * 128


def _fp16_qr_both_ways(monkeypatch, a, xp=np):
    """The fp16 scheme's QR with W1's shifts undone in ``W1^T B``'s product and in a pass
    after it: ``(Q, R)`` each way and the labels that read a prepared left operand."""
    out = {}
    for on in (False, True):
        monkeypatch.setattr(hr, "WHB_SHIFTS_IN_PRODUCT", on)
        with mpqr.explain() as trace:
            q, r = mpqr.qr(a, precision="fp16", method="householder-recursive")
        out[on] = (q, r, {g.label for g in trace.gemms if "prepared=A" in str(g)})
    return out


def test_fp16_w1_shifts_in_the_product_give_the_pass_bits(monkeypatch):
    monkeypatch.setenv("MPQR_MEMORY_PLAN", "fast")
    a = np.random.default_rng(10).standard_normal((700, 600)).astype(np.float32)
    a[:, 5] *= 2.0**40  # columns far apart in scale: shifts that differ from row to row
    a[:, 9] *= 2.0**-40
    out = _fp16_qr_both_ways(monkeypatch, a)
    (q0, r0, lab0), (q1, r1, lab1) = out[False], out[True]
    assert "rec-update-WhB" in lab1 and "rec-update-WhB" not in lab0
    assert np.array_equal(q0, q1) and np.array_equal(r0, r1)


def _cupy():
    try:
        import cupy as cp

        cp.cuda.runtime.getDeviceCount()
        return cp
    except Exception:
        return None


gpu = pytest.mark.skipif(_cupy() is None, reason="needs a CUDA GPU with CuPy")


@gpu
@pytest.mark.parametrize("layout", ["C", "view", "transposed", "F"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_split_kernels_match_the_elementwise_one(monkeypatch, layout, dtype):
    """The tile kernel and the row-run kernel give the elementwise kernel's bits, for the
    high part alone and for the three parts, with NaN/Inf, shifts past fp16's range and
    parts written into a concatenation's halves."""
    cp = _cupy()
    from mpqr.backends.cupy import engine_kernels as ek

    be = get_backend(cp)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((300, 260)) * np.exp2(rng.integers(-100, 100, size=(300, 1)))
    x[10, 10], x[20, 30] = np.inf, np.nan  # inside every layout's view
    big = cp.asarray(x.astype(dtype))
    v = {"C": big, "view": big[3:, 5:200], "transposed": big[3:250, 5:200].T,
         "F": cp.asfortranarray(big[3:250, 5:200])}[layout]
    from mpqr.backends.cupy import backend as cb

    outs = []
    for fast, rows, views in ((False, False, True), (True, False, True), (False, True, True),
                              (True, True, False), (True, True, True)):
        monkeypatch.setattr(ek, "FAST_SPLIT", fast)
        monkeypatch.setattr(ek, "FAST_SPLIT_ROWS", rows)
        monkeypatch.setattr(cb, "COLUMN_VIEW_PARTS", views)
        # a block of a transposed matrix gets parts in F order (the row-run kernel's
        # layout) only with COLUMN_VIEW_PARTS; a whole transposed matrix always
        f_parts = layout == "F" or (layout == "transposed" and views)
        assert be.empty_for(v, v.shape, cp.float16).flags.f_contiguous == f_parts
        got = []
        for axis in (-1, 0):
            s = be.pow2_shift(v, axis, 14)
            alone = be.empty_for(v, v.shape, cp.float16)
            be.split_fp16(v, s, alone)
            hi = be.empty_for(v, v.shape, cp.float16)
            cat = be.empty_for(v, (v.shape[0], 2 * v.shape[1]), cp.float16)
            be.split_fp16(v, s, hi, hf=cat[:, :v.shape[1]], lo=cat[:, v.shape[1]:])
            # the shared layout (``prepared.shared_hi``): hi where hf would be, and lo
            sh = be.empty_for(v, (v.shape[0], 2 * v.shape[1]), cp.float16)
            be.split_fp16(v, s, sh[:, :v.shape[1]], lo=sh[:, v.shape[1]:])
            got += [alone.view(cp.uint16), hi.view(cp.uint16), cat.view(cp.uint16),
                    sh.view(cp.uint16)]
            n = v.shape[1]
            assert bool(cp.all(got[-1][:, :n] == got[-4])), "shared hi: hi's bits, Inf kept"
            assert bool(cp.all(got[-1][:, n:] == got[-2][:, n:])), "shared hi: lo's bits"
        outs.append(got)
    for other in outs[1:]:
        assert all(bool(cp.all(p == q)) for p, q in zip(outs[0], other, strict=True))
    hi = outs[0][0].view(cp.float16)
    assert bool(cp.any(cp.isinf(hi))) and bool(cp.any(cp.isnan(hi)))  # carried through
    assert bool(cp.any(outs[0][2] != 0))
    name = "mpqr_splitrows_f32" if dtype == np.float32 else "mpqr_splitrows_f64"
    assert ek._fast_fn(name) is not None  # the kernels ran, not the fallback


@gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_ldexp_wide_kernel_gives_the_exact_product(dtype):
    """``backend.ldexp_wide`` (the widening and the scaling in one pass for float32) gives
    NumPy's exact ``ldexp(float64(x), e)`` bit for bit (NaN as a NaN): subnormal float32 entries,
    results past float32's range, NaN and Inf included; C arrays, views and transposed
    views, exponents along rows and along columns."""
    cp = _cupy()
    from mpqr.backends.cupy import engine_kernels as ek

    be = get_backend(cp)
    rng = np.random.default_rng(13)
    x = (rng.standard_normal((257, 130)) * np.exp2(rng.integers(-140, 120, size=(257, 130))))
    x[0, 0], x[1, 1], x[2, 2], x[3, 3] = np.inf, np.nan, -np.inf, 1e-45
    xh = x.astype(dtype)
    xd = cp.asarray(xh)
    if dtype == np.float32:
        assert np.any((xh != 0) & (np.abs(xh) < np.finfo(np.float32).tiny))  # subnormals
    for sl in ((slice(None), slice(None)), (slice(2, None), slice(3, 100)),
               (slice(2, 200), slice(3, 100), "T")):
        vh, v = xh[sl[:2]], xd[sl[:2]]
        if len(sl) == 3:
            vh, v = vh.T, v.T
        for shape in ((v.shape[0], 1), (1, v.shape[1])):
            eh = rng.integers(-300, 300, size=shape).astype(np.int32)
            want = np.ldexp(vh.astype(np.float64), eh)
            got = be.ldexp_wide(v, cp.asarray(eh))
            assert got.dtype == cp.float64 and got.shape == v.shape
            g = cp.asnumpy(got)
            np.testing.assert_array_equal(np.isnan(g), np.isnan(want))  # NaN: any payload
            fin = ~np.isnan(want)
            np.testing.assert_array_equal(g[fin].view(np.uint64), want[fin].view(np.uint64))
    taken = ek.ldexp_wide_2d(xd, cp.zeros((257, 1), dtype=cp.int32))
    assert (taken is None) == (dtype == np.float64)


def _scaled_case(cp, seed, specials, layout, axis, dtype):
    """``(backend, rng, v, shape)``: a 300 x 260 matrix of rows scaled over 2^+-60 with Inf,
    NaN and -Inf at ``specials``, as ``v`` in ``layout`` (C-contiguous, a strided view, a
    transposed view), and the shape of a row's (``axis`` 0), a column's (1) or one per
    entry (None) factors."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((300, 260)) * np.exp2(rng.integers(-60, 60, size=(300, 1)))
    for (i, j), val in zip(specials, (np.inf, np.nan, -np.inf), strict=True):
        x[i, j] = val
    big = cp.asarray(x.astype(dtype))
    v = {"C": big, "view": big[3:, 5:200], "transposed": big[3:250, 5:200].T}[layout]
    shape = {0: (v.shape[0], 1), 1: (1, v.shape[1]), None: v.shape}[axis]
    return get_backend(cp), rng, v, shape


@gpu
@pytest.mark.parametrize("layout", ["C", "view", "transposed"])
@pytest.mark.parametrize("axis", [0, 1, None])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_ldexp_kernel_gives_cupys_bits(monkeypatch, layout, axis, dtype):
    """``backend.ldexp`` by a row's or a column's exponents (or one each) in one pass gives
    CuPy's ``ldexp`` bit for bit, with overflow to Inf, results below the normal range, NaN
    and Inf, in place too; a layout the kernel does not take goes to CuPy's."""
    cp = _cupy()
    from mpqr.backends.cupy import engine_kernels as ek

    be, rng, v, shape = _scaled_case(cp, 11, ((0, 0), (1, 1), (2, 2)), layout, axis, dtype)
    lim = 200 if dtype == np.float32 else 1500  # past the overflow and subnormal ranges
    e = cp.asarray(rng.integers(-lim, lim, size=shape).astype(np.int32))
    outs = []
    for fast in (False, True):
        monkeypatch.setattr(ek, "FAST_LDEXP", fast)
        y = be.ldexp(v, e)
        z = v.copy()
        be.ldexp_in_place(z, e)
        outs.append((y, z))
    (y0, z0), (y1, z1) = outs
    want = cp.ldexp(v, e)
    for got in (y0, z0, y1, z1):
        assert got.shape == v.shape and got.dtype == v.dtype
        assert bool(cp.all(got.view(cp.uint32 if dtype == np.float32 else cp.uint64)
                           == want.view(cp.uint32 if dtype == np.float32 else cp.uint64)))
    assert bool(cp.any(cp.isinf(want) & cp.isfinite(v)))  # some overflowed
    tiny = np.finfo(dtype).tiny
    below = (cp.abs(v) > 0) & cp.isfinite(v) & (cp.abs(want) < tiny)  # past the normals
    assert bool(cp.any(below))
    if dtype == np.float64:  # some subnormal (CUDA's float32 ldexpf flushes them to zero,
        assert bool(cp.any(below & (want != 0)))  # CuPy's ldexp and the kernel alike)
    assert (ek.ldexp_2d(v, e) is None) == (layout == "transposed")


@gpu
@pytest.mark.parametrize("layout", ["C", "view", "transposed"])
@pytest.mark.parametrize("axis", [0, 1, None])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_scale_kernel_gives_cupys_bits(layout, axis, dtype):
    """``backend.mul_in_place`` by a row's or a column's factors (or one each) gives
    CuPy's ``x * f`` bit for bit, NaN/Inf, signs and overflow included; a layout the
    kernel does not take goes to CuPy's."""
    cp = _cupy()
    from mpqr.backends.cupy import engine_kernels as ek

    be, rng, v, shape = _scaled_case(cp, 12, ((10, 10), (20, 30), (40, 50)), layout, axis,
                                     dtype)
    huge = 2.0**100 if dtype == np.float32 else 2.0**1000  # past the range with x's scale
    f = rng.choice([-1.0, 1.0, 0.5, -3.0, huge], size=shape).astype(dtype)
    f = cp.asarray(f)
    want = v * f
    z = v.copy()
    be.mul_in_place(z, f)
    y = ek.scale_2d(v, f)
    bits = cp.uint32 if dtype == np.float32 else cp.uint64
    for got in (z, y) if y is not None else (z,):
        assert bool(cp.all(got.view(bits) == want.view(bits)))
    assert (y is None) == (layout == "transposed")
    assert bool(cp.any(cp.isinf(want) & cp.isfinite(v)))  # some overflowed


@gpu
@pytest.mark.parametrize("layout", ["C", "view"])
@pytest.mark.parametrize("subtract", [None, True, False])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_unscale_kernel_gives_the_elementwise_bits(monkeypatch, layout, subtract, dtype):
    """``backend.unscale_into`` in one pass gives the elementwise unscaling's bits, then the
    one rounded update: float32 results below the normal range rounded (not flushed),
    overflow, NaN/Inf, a row count no multiple of the kernel's run."""
    cp = _cupy()
    from mpqr.backends.cupy import engine_kernels as ek

    be = get_backend(cp)
    rng = np.random.default_rng(14)
    m, n = (297, 195) if layout == "view" else (300, 260)
    p = rng.standard_normal((m, n)).astype(np.float32)
    p[10, 10], p[20, 30] = np.inf, np.nan
    lim = 150 if dtype == np.float32 else 1100
    rs = rng.integers(-lim, lim, size=(m, 1)).astype(np.int32)
    cs = rng.integers(-10, 10, size=(1, n)).astype(np.int32)
    c0 = rng.standard_normal((m + 3, n + 5)).astype(dtype)
    outs = []
    for fast in (False, True):
        monkeypatch.setattr(ek, "FAST_UNSCALE_INTO", fast)
        big = cp.asarray(c0)
        c = big[3:, 5:] if layout == "view" else big[:m, :n]
        be.unscale_into(c, cp.asarray(p), cp.asarray(rs), cp.asarray(cs), subtract=subtract)
        outs.append(cp.asnumpy(big))
    bits = np.uint32 if dtype == np.float32 else np.uint64
    num = ~np.isnan(outs[0])
    assert np.array_equal(np.isnan(outs[1]), ~num) and bool(np.any(~num))
    assert np.array_equal(outs[0][num].view(bits), outs[1][num].view(bits))
    if subtract is None and dtype == np.float32:
        tiny = np.finfo(np.float32).tiny
        got = outs[1][3:, 5:] if layout == "view" else outs[1][:m, :n]
        assert bool(np.any((got != 0) & (np.abs(got) < tiny)))  # subnormals kept


@gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64])
@pytest.mark.parametrize("shape", [(300, 70), (1, 40), (50, 1)])
def test_assign_ct_gives_the_transposed_copy(dtype, shape):
    """``backend.assign_ct`` into a column block of a larger matrix (cuBLAS geam for real
    float32/float64, the portable copy otherwise): exactly ``src^H``, nothing else
    written."""
    cp = _cupy()
    be = get_backend(cp)
    rng = np.random.default_rng(15)
    m, k = shape
    w0 = rng.standard_normal((m, k + 30)).astype(dtype)
    src0 = rng.standard_normal((k, m)).astype(dtype)
    if np.iscomplexobj(src0):
        src0 = src0 + 1j * rng.standard_normal((k, m)).astype(dtype)
    src0[0, 0] = np.nan
    w = cp.asarray(w0)
    be.assign_ct(w[:, 10:10 + k], cp.asarray(src0))
    want = w0.copy()
    want[:, 10:10 + k] = src0.conj().T
    np.testing.assert_array_equal(cp.asnumpy(w), want)


@gpu
def test_finite_or_zero_on_fp16_bits():
    """NaN and infinite fp16 entries zeroed, every other bit pattern (subnormals, -0)
    kept: the portable ``where`` bit for bit."""
    cp = _cupy()
    from mpqr.backends.cupy import engine_kernels as ek

    be = get_backend(cp)
    bits = cp.arange(2**16, dtype=cp.uint32).astype(cp.uint16).reshape(256, 256)
    x = bits.view(cp.float16)
    got = be.finite_or_zero(x)
    want = cp.where(cp.isfinite(x), x, cp.zeros_like(x))
    assert ek.finite_or_zero_fp16(x) is not None  # the kernel ran
    assert bool(cp.all(got.view(cp.uint16) == want.view(cp.uint16)))
    assert int(cp.count_nonzero(got.view(cp.uint16) != bits)) == 2 * 1024  # NaN and Inf


@gpu
@pytest.mark.parametrize("shape", [(500, 300), (33, 31)])
@pytest.mark.parametrize("offset", [0, 1])
def test_add_partials_kernel_sums_in_the_portable_order(shape, offset):
    """The partial products summed on the GPU give the NumPy reference backend's bits
    (``c + p0``, then ``+ p1``, ...: each addition rounded to nearest), with four entries
    a thread (aligned) or one (an odd size, an offset view), NaN/Inf carried."""
    cp = _cupy()
    from mpqr.backends.cupy import engine_kernels as ek

    rng = np.random.default_rng(13)
    g = 7
    parts = (rng.standard_normal((g, *shape)) * np.exp2(rng.integers(-30, 30, (g, 1, 1))))
    parts = parts.astype(np.float32)
    parts[3, 1, 2] = np.inf
    c0 = rng.standard_normal((offset + shape[0], shape[1])).astype(np.float32)
    c0[2, 4] = np.nan
    want = c0[offset:].copy()
    get_backend(np).add_partials(want, parts)
    c_gpu = cp.asarray(c0)
    c = c_gpu[offset:]  # an offset view: still C-contiguous
    assert ek.add_partials(c, cp.asarray(parts))  # the kernel ran, not the fallback
    # the same bits (NaN where NaN: the GPU's NaN has a payload of its own)
    got = cp.asnumpy(c)
    num = ~np.isnan(want)
    assert np.array_equal(np.isnan(got), ~num) and bool(np.any(~num))
    assert np.array_equal(got[num].view(np.uint32), want[num].view(np.uint32))
    assert np.array_equal(cp.asnumpy(c_gpu[:offset]), c0[:offset])  # rows before untouched


@gpu
def test_prepared_products_on_the_gpu_match_the_numpy_emulation():
    cp = _cupy()
    w, d = _ab(m=500, k=384, n=200, seed=8, graded=True)
    got = cp.asnumpy(gemm(prepare(get_backend(cp), cp.asarray(w).T, side="left",
                                  engine="tc-sgemm").T, cp.asarray(d), precision=EMU))
    emu = gemm(prepare(BE, w.T, side="left", engine="tc-sgemm").T, d, precision=EMU)
    assert np.all(np.abs(got - emu) <= _bound(w, d, 384))
    c0 = np.random.default_rng(9).standard_normal((500, 200)).astype(np.float32)
    c_gpu = cp.asarray(c0)
    gemm_sub(c_gpu, cp.asarray(w), cp.asarray(d), precision=EMU)
    c_np = c0.copy()
    gemm_sub(c_np, w, d, precision=EMU)
    assert np.all(np.abs(cp.asnumpy(c_gpu) - c_np) <= _bound(w, d, 384))


@gpu
def test_fp16_w1_shifts_in_the_product_on_the_gpu(monkeypatch):
    cp = _cupy()
    monkeypatch.setenv("MPQR_MEMORY_PLAN", "fast")
    a = cp.asarray(np.random.default_rng(11).standard_normal((2500, 2048)).astype(np.float32))
    out = _fp16_qr_both_ways(monkeypatch, a)
    (q0, r0, _), (q1, r1, lab1) = out[False], out[True]
    assert "rec-update-WhB" in lab1
    # the same roundings: the product's one unscaling by 2^-(s1_i + sb_j) against two
    assert bool(cp.array_equal(q0, q1)) and bool(cp.array_equal(r0, r1))


@gpu
@pytest.mark.parametrize("shape", [(2048, 1536, 2048), (96, 4096, 80), (600, 2100, 500)])
@pytest.mark.parametrize("path", ["fused", "batched", "slices"])
def test_products_of_a_transposed_block_on_the_gpu(monkeypatch, shape, path):
    """tc-sgemm of a left operand that is a block of a transposed matrix (the recursion's
    ``W1^T``), its parts in F order (``COLUMN_VIEW_PARTS``) or in C order: each within the
    engine's bound of the float64 product, by the Triton kernel, the batched slices and
    the loop of slices."""
    cp = _cupy()
    from mpqr.backends.cupy import backend as cb

    from mpqr._array_api import array_namespace

    m, k, n = shape
    rng = np.random.default_rng(21)
    w = rng.standard_normal((k + 3, m + 7)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    a = cp.asarray(w)[3:, 5:5 + m].T  # m x k, unit stride along axis 0, not F-contiguous
    assert not a.flags.f_contiguous and a.strides[0] == 4
    be = get_backend(array_namespace(a))
    monkeypatch.setattr(tc_sgemm, "FUSED_KERNEL", path == "fused")
    exact = w[3:, 5:5 + m].T.astype(np.float64) @ b.astype(np.float64)
    bound = _bound(w[3:, 5:5 + m].T, b, k)
    got = {}
    for views in (False, True):
        monkeypatch.setattr(cb, "COLUMN_VIEW_PARTS", views)
        p = prepare(be, a, side="left", engine="tc-sgemm")
        assert p.hi.flags.f_contiguous == views and p.cat.flags.f_contiguous == views
        got[views] = cp.asnumpy(tc_sgemm.run_tc_sgemm(
            be, p, cp.asarray(b), out_dtype=cp.float32, slice_k=128,
            partials_bytes=0 if path == "slices" else tc_sgemm.BATCHED_PARTIALS_BYTES))
        assert np.all(np.abs(got[views] - exact) <= bound)
    assert np.all(np.abs(got[True] - got[False]) <= 2 * bound)
