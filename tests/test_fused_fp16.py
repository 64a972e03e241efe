"""The ``tc-fp16`` engine's fused epilogue (the unscaling and ``C -= A B`` in the GEMM).

On the CPU: the policy's routing, through a NumPy backend given an emulated fused kernel
(the same roundings as the separate passes, so every result must be bitwise equal to
theirs). On the GPU: the Triton kernel against the separate passes, within the float32
accumulation's bound.
"""

from __future__ import annotations

import numpy as np
import pytest
from _support import triton_cupy as _triton_cupy
from mpqr.backends import get_backend

import mpqr
from mpqr._array_api import array_namespace
from mpqr.engines import ENGINES
from mpqr.policy import gemm, gemm_into, gemm_sub, gram

FP16 = {"engine": "tc-fp16"}


@pytest.fixture
def fused(monkeypatch):
    """The NumPy backend with an emulated fused kernel; yields the list of its calls."""
    be = get_backend(array_namespace(np.zeros(1)))
    calls = _Calls()
    state = calls.state

    def kernel(m, n, k, dtype):
        return "emulated" if np.dtype(dtype) == np.float32 and m * n >= 64 else None

    def run(a16, b16, sa, sb, c, *, accumulate, subtract):
        assert a16.dtype == b16.dtype == np.float16
        if state["decline"]:
            return False
        p = be.unscale(be.gemm_fp16(a16, b16), sa, sb, c.dtype)
        calls.append((a16.shape, b16.shape, accumulate, subtract))
        c[...] = (c - p if subtract else c + p) if accumulate else p
        return True

    monkeypatch.setattr(be, "fused_fp16_kernel", kernel, raising=True)
    monkeypatch.setattr(be, "fused_fp16_gemm", run, raising=True)
    return calls


class _Calls(list):
    """The emulated kernel's calls ``(a16 shape, b16 shape, accumulate, subtract)``;
    ``state["decline"]`` makes it decline every product."""

    def __init__(self):
        super().__init__()
        self.state = {"decline": False}


def _operands(m=40, n=24, k=33, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = (rng.standard_normal((k, n)) * 1e3).astype(np.float32)
    c = rng.standard_normal((m, n)).astype(np.float32)
    return a, b, c


def _separate(a, b):
    be = get_backend(array_namespace(a))
    return ENGINES["tc-fp16"].run(be, a, b, out_dtype=np.float32)


def test_gemm_sub_runs_in_the_epilogue(fused):
    a, b, c = _operands()
    want = c - _separate(a, b)
    a0, b0 = a.copy(), b.copy()
    with mpqr.explain() as tr:
        gemm_sub(c, a, b, precision="fp16", options=FP16, label="t")
    np.testing.assert_array_equal(c, want)
    np.testing.assert_array_equal(a, a0)
    np.testing.assert_array_equal(b, b0)
    assert fused == [((40, 33), (33, 24), True, True)]
    assert tr.gemms[0].params == {"kernel": "emulated"}


def test_gemm_and_gemm_into_write_the_product(fused):
    a, b, c = _operands(seed=1)
    want = _separate(a, b)
    np.testing.assert_array_equal(gemm(a, b, precision="fp16", options=FP16), want)
    out = np.full_like(c, np.nan)
    gemm_into(out, a, b, precision="fp16", options=FP16)
    np.testing.assert_array_equal(out, want)
    assert [f[2] for f in fused] == [False, False]


def test_transposed_and_view_operands(fused):
    a, b, c = _operands(seed=2)
    big = np.zeros((50, 40), dtype=np.float32)
    big[5:45, 10:34] = c
    at = np.asfortranarray(a)
    want = c - _separate(a, b)
    gemm_sub(big[5:45, 10:34], at, b, precision="fp16", options=FP16)
    np.testing.assert_array_equal(big[5:45, 10:34], want)
    assert not big[:5].any() and not big[:, :10].any() and not big[:, 34:].any()


def test_stacks_grams_and_small_products_take_the_separate_passes(fused):
    rng = np.random.default_rng(3)
    a3 = rng.standard_normal((2, 20, 16)).astype(np.float32)
    b3 = rng.standard_normal((2, 16, 12)).astype(np.float32)
    with mpqr.explain() as tr:
        p = gemm(a3, b3, precision="fp16", options=FP16)
        g = gram(a3[0], precision="fp16", options=FP16)
        s = gemm(a3[0, :4, :], b3[0, :, :4], precision="fp16", options=FP16)
    assert fused == []
    assert all("kernel" not in d.params for d in tr.gemms)
    for i in range(2):
        np.testing.assert_array_equal(p[i], _separate(a3[i], b3[i]))
    assert g.shape == (16, 16) and s.shape == (4, 4)


def test_a_declined_product_is_still_right(fused, monkeypatch):
    fused.state["decline"] = True
    a, b, c = _operands(seed=4)
    want = c - _separate(a, b)
    be = get_backend(array_namespace(a))
    splits = []
    split = be.split_fp16
    monkeypatch.setattr(be, "split_fp16", lambda *args, **kw: (splits.append(1),
                                                               split(*args, **kw))[1])
    gemm_sub(c, a, b, precision="fp16", options=FP16)
    np.testing.assert_array_equal(c, want)
    assert len(splits) == 2  # each operand split once, also when the kernel declines
    np.testing.assert_array_equal(gemm(a, b, precision="fp16", options=FP16), _separate(a, b))


def test_float64_and_other_engines_never_fuse(fused):
    a, b, c = _operands(seed=5)
    with mpqr.explain() as tr:
        gemm_sub(c.astype(np.float64), a.astype(np.float64), b.astype(np.float64),
                 precision="fp16", options=FP16)
        gemm_sub(c, a, b, precision="fp32-emulated")
    assert fused == []
    assert all("kernel" not in d.params for d in tr.gemms)


@pytest.mark.parametrize("subtract", [None, True])
def test_one_unscaling_pass_without_a_kernel_gives_the_separate_bits(monkeypatch, subtract):
    """Without a fused kernel ``c -= A B`` is the GEMM and one pass unscaling into ``c``
    (``tc_fp16.FUSED_UNSCALE``): the bits of an unscaled product and an update (which
    unscales the product in its own storage, ``UNSCALE_IN_PLACE``, then updates ``c``)."""
    from mpqr.engines import tc_fp16

    a, b, c = _operands(seed=8)
    be = get_backend(array_namespace(a))
    passes = []
    into = be.unscale_into
    monkeypatch.setattr(be, "unscale_into", lambda dst, p, *args, **kw: (
        passes.append("in place" if dst is p else "into c"), into(dst, p, *args, **kw))[1])
    got = {}
    for one_pass in (False, True):
        monkeypatch.setattr(tc_fp16, "FUSED_UNSCALE", one_pass)
        got[one_pass] = c.copy()
        (gemm_sub if subtract else gemm_into)(got[one_pass], a, b, precision="fp16",
                                              options=FP16)
    assert passes == ["in place", "into c"]
    np.testing.assert_array_equal(got[True], got[False])
    want = c - _separate(a, b) if subtract else _separate(a, b)
    np.testing.assert_array_equal(got[True], want)


def _fp16_qr(a, mode="reduced"):
    return mpqr.qr(a, precision="fp16", method="householder-recursive", mode=mode)


@pytest.mark.parametrize("shape", [(300, 256), (256, 256)])
def test_fp16_qr_is_bitwise_the_same_with_the_epilogue(shape, fused):
    a = np.random.default_rng(6).standard_normal(shape).astype(np.float32)
    fused.state["decline"] = True  # every product through the separate passes
    q0, r0 = _fp16_qr(a)
    fused.state["decline"] = False
    q1, r1 = _fp16_qr(a)
    assert any(c[2] and c[3] for c in fused)  # the recursion's C -= A B took the epilogue
    np.testing.assert_array_equal(q1, q0)
    np.testing.assert_array_equal(r1, r0)


# --- the Triton kernel on the GPU -------------------------------------------------------


gpu = pytest.mark.skipif(_triton_cupy() is None, reason="needs a CUDA GPU with Triton")


def _check_gpu(cp, a, b, c0, sub=True):
    from mpqr.backends.cupy import triton_gemm as tg

    def run():
        c = c0.copy()
        (gemm_sub if sub else gemm_into)(c, a, b, precision="fp16", options=FP16)
        return c
    with mpqr.explain() as tr:
        on = run()
    tg.ENABLED = False
    try:
        off = run()
    finally:
        tg.ENABLED = True
    assert tr.gemms[0].params.get("kernel") == "triton-epilogue"
    k = a.shape[1]
    a64, b64 = a.astype(cp.float64), b.astype(cp.float64)
    bound = 2 * k * 2.0**-24 * (cp.abs(a64) @ cp.abs(b64)) + 2.0**-23 * cp.abs(c0) * sub
    fin = cp.isfinite(on) & cp.isfinite(off)
    assert bool(cp.all(cp.where(fin, cp.abs(on.astype(cp.float64) - off) <= bound, True)))
    assert bool(cp.all(cp.isnan(on) == cp.isnan(off)))
    assert bool(cp.all(cp.where(cp.isinf(off), on == off, ~cp.isinf(on))))


@gpu
def test_products_past_the_kernels_k_take_cublas_and_one_pass(monkeypatch):
    """Past ``triton_gemm.MAX_K`` the policy picks no kernel: cuBLAS's product and one
    unscaling pass into ``C``, within the float32 accumulation's bound of the kernel's."""
    cp = _triton_cupy()
    from mpqr.backends.cupy import triton_gemm as tg

    rng = cp.random.default_rng(9)
    m, n, k = 2000, 1500, 777
    a = rng.standard_normal((m, k), dtype=cp.float32)
    b = rng.standard_normal((k, n), dtype=cp.float32) * 2.0**-30  # shifts past fp16's range
    c0 = rng.standard_normal((m, n), dtype=cp.float32) * 2.0**-30
    got = {}
    for cap in (None, 512):
        monkeypatch.setattr(tg, "MAX_K", cap)
        c = c0.copy()
        with mpqr.explain() as tr:
            gemm_sub(c, a, b, precision="fp16", options=FP16)
        assert ("kernel" in tr.gemms[0].params) == (cap is None)
        got[cap] = c
    a64, b64 = a.astype(cp.float64), b.astype(cp.float64)
    bound = 2 * k * 2.0**-24 * (cp.abs(a64) @ cp.abs(b64)) + 2.0**-23 * cp.abs(c0)
    assert bool(cp.all(cp.abs(got[512].astype(cp.float64) - got[None]) <= bound))
    exact = c0.astype(cp.float64) - a64 @ b64
    assert bool(cp.all(cp.abs(got[512] - exact) <= 2.0**-9 * (cp.abs(a64) @ cp.abs(b64))
                       + bound))


@gpu
def test_triton_epilogue_matches_the_separate_passes():
    cp = _triton_cupy()
    rng = cp.random.default_rng(7)
    m, n, k = 2000, 1500, 777
    a = rng.standard_normal((m, k), dtype=cp.float32)
    b = rng.standard_normal((k, n), dtype=cp.float32)
    c = rng.standard_normal((m, n), dtype=cp.float32)
    _check_gpu(cp, a, b, c)
    _check_gpu(cp, a, b, c, sub=False)
    _check_gpu(cp, cp.asfortranarray(a), b, c)
    big = rng.standard_normal((m + 3, n + 9), dtype=cp.float32)
    _check_gpu(cp, a, b, big[3:, 9:])
    scaled = a * (cp.float32(2.0) ** rng.integers(-120, 100, (m, 1)).astype(cp.float32))
    _check_gpu(cp, scaled, b, c)
    bad = a.copy()
    bad[3, 5] = cp.inf
    bad[7, 9] = cp.nan
    _check_gpu(cp, bad, b, c)


@gpu
def test_triton_epilogue_fp16_qr_accuracy():
    cp = _triton_cupy()
    a = cp.random.default_rng(8).standard_normal((4096, 4096), dtype=cp.float32)
    with mpqr.explain() as tr:
        q, r = _fp16_qr(a)
    assert any(d.params.get("kernel") == "triton-epilogue" for d in tr.gemms)
    a64, q64 = a.astype(cp.float64), q.astype(cp.float64)
    back = float(cp.linalg.norm(a64 - q64 @ r.astype(cp.float64)) / cp.linalg.norm(a64))
    orth = float(cp.linalg.norm(q64.T @ q64 - cp.eye(4096)) / 4096)
    # the fp16 QR's documented accuracy (docs/precision.md): backward <= 1e-3, orth <= 2e-4
    assert back <= 1e-3 and orth <= 2e-4


def test_layouts_the_kernel_takes():
    from mpqr.backends.cupy.triton_gemm import _layout

    x = np.zeros((6, 10), dtype=np.float16)
    assert _layout(x) == ("r", 10)
    assert _layout(x.T) == ("c", 10)
    assert _layout(x[1:5, 2:7]) == ("r", 10)
    assert _layout(x[:, 2:7].T) == ("c", 10)
    assert _layout(x[::2, ::2]) is None  # a unit stride in neither dimension: declined
    assert _layout(x[:1, ::3]) == ("c", 3)  # one row: its stride never applies
    assert _layout(x[::2, :1]) == ("r", 20)


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    from mpqr.backends.cupy.triton_gemm import cache_dir

    monkeypatch.setenv("MPQR_CACHE_DIR", str(tmp_path))
    assert cache_dir() == tmp_path / "triton"
    monkeypatch.delenv("MPQR_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "mpqr" / "triton"


def test_compiled_variants_on_disk(tmp_path):
    from mpqr.backends.cupy.triton_gemm import _cached, _store

    path = tmp_path / "sub" / "k.cubin"
    assert _cached(path) is None
    info = {"name": "fp16_gemm", "shared": 65536, "num_warps": 8}
    assert _store(path, b"\x7fELF cubin", info)
    assert _cached(path) == (b"\x7fELF cubin", info)
    path.with_suffix(".json").write_text("{not json")
    assert _cached(path) is None  # unreadable: compiled again
    blocked = tmp_path / "file"
    blocked.write_text("a file where the cache directory would go")
    assert not _store(blocked / "k.cubin", b"x", info)  # not writable: kept in memory only


def test_a_failed_compile_turns_the_kernel_off(monkeypatch):
    from mpqr.backends.cupy import triton_gemm as tg

    monkeypatch.setattr(tg, "ENABLED", True)
    with pytest.warns(RuntimeWarning, match="fused epilogue is off for this process "
                      r"\(RuntimeError: no ptxas\); the engine's separate passes run"):
        tg._disable(RuntimeError("no ptxas"))
    assert tg.ENABLED is False
    assert tg.kernel_name(4096, 4096, 4096, np.float32) is None
