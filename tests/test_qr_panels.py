"""The Householder leaves and the shape of the recursion: ``backend.householder_panel``
(geqrf in compact WY form, T by the UT transform) against explicit products of
reflectors in extended precision, the TSQR/geqrf leaf switch, the leaf width, and
the automatic method choice."""

from __future__ import annotations

import importlib
import sys

import numpy as np
import pytest
from mpqr.backends import get_backend
from mpqr.backends._base import ArrayAPIBackend, compact_wy_t

import mpqr
from mpqr._array_api import array_namespace
from mpqr._array_api import device as array_api_device
from tests._qr_support import (
    backward_error,
    hp_matmul,
    orthogonality,
    two_leaf_case,
    unit_roundoff,
)
from tests._support import from_numpy, to_numpy

api = sys.modules["mpqr.qr.api"]
kernels = importlib.import_module("mpqr.qr._kernels")
recursive = importlib.import_module("mpqr.qr.householder_recursive")


def _u(dtype) -> float:
    return 2.0**-24 if np.dtype(dtype) in (np.float32, np.complex64) else 2.0**-53


def _rand(rng, shape, dtype):
    a = rng.standard_normal(shape)
    if np.issubdtype(dtype, np.complexfloating):
        a = a + 1j * rng.standard_normal(shape)
    return a.astype(dtype)


def _check_panel(a, y, t, r):
    """``a = (I - Y T Y^H)[:, :k] R`` with the structure the recursion relies on."""
    a, y, t, r = (to_numpy(v) for v in (a, y, t, r))
    m, k = a.shape[-2:]
    u = _u(a.dtype)
    eye_mk = np.eye(m, k)
    assert np.array_equal(np.triu(y), np.broadcast_to(np.triu(eye_mk), y.shape))  # unit, zeros
    assert np.array_equal(t, np.triu(t)) and np.array_equal(r, np.triu(r))
    yh = np.conj(np.swapaxes(y, -1, -2))
    h = np.eye(m) - hp_matmul(hp_matmul(y, t), yh)  # I - Y T Y^H, extended precision
    h = np.asarray(h, dtype=np.complex128 if np.iscomplexobj(h) else np.float64)
    assert orthogonality(h) <= 10 * m * u, orthogonality(h)
    assert backward_error(a, h[..., :, :k], r) <= 10 * np.sqrt(m * k) * u


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.complex128])
@pytest.mark.parametrize("shape", [(40, 8), (8, 8), (9, 8), (2, 3, 30, 6)])
def test_householder_panel_is_a_compact_wy_factorization(xp, shape, dtype):
    a = _rand(np.random.default_rng(sum(shape)), shape, dtype)
    backend = get_backend(array_namespace(from_numpy(xp, a)))
    if "complex" in np.dtype(dtype).name and not hasattr(xp, "complex128"):
        pytest.skip("namespace without complex dtypes")
    y, t, r = backend.householder_panel(from_numpy(xp, a))
    assert y.dtype == from_numpy(xp, a).dtype and t.shape == (*shape[:-2], shape[-1], shape[-1])
    _check_panel(a, y, t, r)


@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
def test_ut_transform_matches_the_product_of_reflectors(dtype):
    """T from ``T^-1 = striu(Y^H Y) + diag(1/tau)`` equals I - H_1 ... H_k in Y, T form."""
    rng = np.random.default_rng(3)
    m, k = 12, 5
    a = _rand(rng, (m, k), dtype)
    h, tau = np.linalg.qr(a, mode="raw")
    f = h.T
    y = np.tril(f, -1) + np.eye(m, k)
    prod = np.eye(m, dtype=dtype)
    for i in range(k):
        v = y[:, i:i + 1]
        prod = prod @ (np.eye(m) - tau[i] * v @ v.conj().T)
    backend = get_backend(array_namespace(a))
    t = compact_wy_t(backend, y, tau)
    np.testing.assert_allclose(np.eye(m) - y @ t @ y.conj().T, prod, rtol=0, atol=20 * m * 2.0**-53)


def test_zero_tau_needs_no_special_case():
    """Columns already upper triangular give tau = 0 (H_i = I): T stays finite and exact."""
    a = np.array([[2.0, 1.0, 3.0], [0.0, 1.0, 4.0], [0.0, 0.0, 5.0], [0.0, 0.0, 0.0]])
    y, t, r = get_backend(array_namespace(a)).householder_panel(a)
    assert np.all(np.isfinite(t))
    _check_panel(a, y, t, r)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_portable_and_lapack_panels_agree(dtype):
    """The Array-API path (explicit QR + signed LU) and geqrf give the same R up to signs."""
    a = _rand(np.random.default_rng(5), (50, 10), dtype)
    ns = array_namespace(a)
    *_, r1 = get_backend(ns).householder_panel(a)
    y2, t2, r2 = ArrayAPIBackend(ns).householder_panel(a)
    _check_panel(a, y2, t2, r2)
    tol = 50 * 10 * _u(dtype) * np.abs(r1).max()
    np.testing.assert_allclose(np.abs(r1), np.abs(r2), rtol=0, atol=tol)


@pytest.mark.parametrize("aspect, tsqr", [(64, True), (10**9, False)])
def test_leaf_kind_follows_the_aspect_threshold(monkeypatch, aspect, tsqr):
    """Panels with m >= TSQR_ASPECT * k go through TSQR, the others through geqrf;
    both give Householder-quality factors."""
    monkeypatch.setattr(kernels, "TSQR_ASPECT", aspect)
    monkeypatch.setattr(kernels, "TSQR_MIN_ROWS", 0)
    # two 32-wide panels (a single panel goes straight to the backend's panel QR)
    a = np.random.default_rng(7).standard_normal((4096, 64))
    with mpqr.explain() as trace:
        q, r = mpqr.qr(a, precision="fp64", method="householder-tiled")
    labels = {g.label for g in trace.gemms}
    assert ("tsqr-combine" in labels) is tsqr
    assert backward_error(a, q, r) <= 2 * np.sqrt(64) * 2.0**-53
    assert orthogonality(q) <= np.sqrt(64) * 2.0**-53 / 4


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.complex128])
@pytest.mark.parametrize("n", [1, 7, 9, 40, 64, 65, 130, 257])
def test_lu_signed_of_an_orthonormal_top_block(xp, n, dtype):
    """``L U = Q1 - diag(s)`` with unit-lower L, upper U, ``s_i = -phase(pivot_i)``
    and ``|u_ii| >= 1`` (Ballard et al.): on every backend, and each backend's
    recursive halves agree with the column loop to rounding."""
    if n > 130 and xp.__name__ == "array_api_strict":
        pytest.skip("the column-loop reference takes seconds a call on array_api_strict at "
                    "257 columns; 130 runs the same recursion there")
    rng = np.random.default_rng(n)
    q = np.linalg.qr(_rand(rng, (3 * n + 5, n), np.complex128 if "complex" in
                           np.dtype(dtype).name else np.float64))[0][:n].astype(dtype)
    qx = from_numpy(xp, q)
    if "complex" in np.dtype(dtype).name and not hasattr(xp, "complex128"):
        pytest.skip("namespace without complex dtypes")
    backend = get_backend(array_namespace(qx))
    l, u, s = (to_numpy(v) for v in backend.lu_signed(qx))
    tol = 8 * n * _u(dtype)
    assert np.array_equal(l, np.tril(l)) and np.array_equal(np.diag(l), np.ones(n))
    assert np.array_equal(u, np.triu(u))
    assert np.allclose(np.abs(s), 1.0, rtol=0, atol=4 * _u(dtype))
    assert np.all(np.abs(np.diag(u)) >= 1 - tol)
    resid = hp_matmul(l, u) - (q.astype(np.complex128 if np.iscomplexobj(q) else np.float64)
                               - np.diag(s))
    assert np.max(np.abs(resid)) <= tol
    bx = backend.xp  # writable copies (the read-only fixture's arrays are not)
    w0 = bx.asarray(qx, copy=True)  # the column loop over the whole block: the reference
    s0 = bx.empty((n,), dtype=w0.dtype, device=array_api_device(w0))
    ArrayAPIBackend._lu_signed_columns(backend, w0, s0, 0, n)
    w0, s0 = to_numpy(w0), to_numpy(s0)
    l0, u0 = np.tril(w0, -1) + np.eye(n), np.triu(w0)
    # the pivots differ by rounding, so the phases do too (|u_ii| >= 1 bounds that)
    assert np.max(np.abs(s - s0)) <= tol
    assert np.max(np.abs(l - l0)) <= tol and np.max(np.abs(u - u0)) <= tol
    q_before = q.copy()
    backend.lu_signed(from_numpy(xp, q))
    assert np.array_equal(q, q_before)


def test_leaf_width_bounds_the_number_of_leaves():
    lw = recursive.leaf_width
    assert [lw(n) for n in (64, 512, 1024, 2048, 4096, 4097, 8192, 16384, 65536)] == \
        [32, 32, 64, 128, 256, 512, 512, 512, 512]
    assert lw(2**20) == recursive.MAX_LEAF_WIDTH


@pytest.mark.parametrize("method", ["householder-recursive", "householder-tiled"])
def test_wide_leaves_keep_householder_accuracy(monkeypatch, method):
    """Leaves 128 wide (as for n = 16384) on a CI-sized matrix: 2 leaves, same accuracy."""
    monkeypatch.setattr(recursive, "MAX_LEAVES", 2)
    a = np.random.default_rng(9).standard_normal((384, 256))
    for precision in ("fp64", "fp16"):
        with mpqr.explain() as trace:
            q, r = mpqr.qr(a, precision=precision, method=method)
        # each leaf's W = Y T ("panel-wy", "panel-wy-rounded" for fp16's rounded vectors),
        # or combined panel by panel in a certified leaf ("panel-combine-WG": the leaf's
        # rows, the earlier panels' columns, up to 128 - 32)
        panels = [g for g in trace.gemms if g.label.startswith("panel-wy")]
        if panels:
            assert {g.shape[1] for g in panels} == {128}
        else:
            panels = [g for g in trace.gemms if g.label == "panel-combine-WG"]
            assert max(g.shape[2] for g in panels) == 128 - 32
        assert {g.shape[0] for g in panels} == {384, 256}  # two leaves
        u = max(2.0**-53, {"fp64": 0, "fp16": 2.0**-11}[precision])
        assert backward_error(a, q, r) <= 2 * np.sqrt(256) * u
        assert orthogonality(q) <= np.sqrt(256) * u / 4


def test_mode_r_skips_the_merges_and_gives_the_same_r(xp):
    a = np.random.default_rng(11).standard_normal((200, 160))
    with mpqr.explain() as tr_r:
        r_only = mpqr.qr(from_numpy(xp, a), mode="r", precision="fp64",
                         method="householder-recursive")
    with mpqr.explain() as tr_q:
        _, r = mpqr.qr(from_numpy(xp, a), precision="fp64", method="householder-recursive")
    assert np.array_equal(to_numpy(r_only), to_numpy(r))
    merges_r = sum(g.label.startswith("rec-merge") for g in tr_r.gemms)
    merges_q = sum(g.label.startswith("rec-merge") for g in tr_q.gemms)
    assert merges_r < merges_q


class _TensorCoreNumpy(type(get_backend(array_namespace(np.zeros(1))))):
    """The NumPy reference with H200-like rates: the policy then prices engines like CuPy."""

    capabilities = frozenset({"fp16", "int8", "tensor-cores"})

    def rates(self):
        return {"native-fp64": 55e12, "native-fp32": 48e12, "tc-fp16": 600e12, "int8": 1000e12,
                "bandwidth": 3.5e12, "launch_s": 8e-6}


@pytest.mark.parametrize("precision, want", [
    ("fp16", "householder-recursive"), ("fp32-emulated", "householder-recursive"),
    ("fp32", "geqrf"), ("fp64", "geqrf"), ("auto", "geqrf")])
def test_choose_method_follows_the_update_gemms_engine(precision, want):
    ns = array_namespace(np.zeros(1))
    dtype = ns.float64 if precision in ("fp64", "auto") else ns.float32
    method, why = api.choose_method(_TensorCoreNumpy(ns), precision, dtype, 16384, 16384)
    assert method == want, why
    assert precision in why
    # without tensor cores (the NumPy reference itself) nothing is shape-sensitive: the
    # working precisions take the library's QR, the fp16 engines fixed-width panels
    assert api.choose_method(get_backend(ns), precision, dtype, 16384, 16384)[0] == \
        ("householder-tiled" if want == "householder-recursive" else "geqrf")


@pytest.mark.parametrize("precision, dtype, shape, batch, want", [
    ("fp64", "float64", (8192, 8192), 1, "householder-recursive"),
    ("fp32", "float32", (8192, 8192), 1, "householder-recursive"),
    ("auto", "float64", (6144, 6144), 1, "householder-recursive"),
    ("fp64-emulated", "float64", (8192, 8192), 1, "householder-recursive"),  # native there
    ("fp64", "float64", (12288, 6144), 1, "householder-recursive"),  # m = 2 n
    ("fp64", "float64", (4096, 4096), 1, "geqrf"),  # 2^24: at or below the range
    ("fp64", "float64", (16384, 16384), 1, "geqrf"),  # above it
    ("fp64", "float64", (16384, 4096), 1, "geqrf"),  # m > 2 n
    ("fp64", "float64", (6144, 8192), 1, "geqrf"),  # wide
    ("fp64", "complex128", (8192, 8192), 1, "geqrf"),  # complex: no certified panels
])
def test_native_near_square_takes_the_certified_recursion(monkeypatch, precision, dtype, shape,
                                                          batch, want):
    """At the input's own precision (every product native) a real near-square matrix
    within ``native_recursion_square`` takes the recursion, others the library's QR."""
    monkeypatch.setattr(_TensorCoreNumpy, "native_recursion_square", (2**25, 2**27),
                        raising=False)
    monkeypatch.setattr(_TensorCoreNumpy, "library_qr_square_max", 2**27, raising=False)
    monkeypatch.setattr(_TensorCoreNumpy, "library_qr_square_max_by_precision",
                        {"fp16": 2**25, "fp32-emulated": 3 * 2**24, "fp64-emulated": 2**25},
                        raising=False)
    ns = array_namespace(np.zeros(1))
    method, why = api.choose_method(_TensorCoreNumpy(ns), precision, getattr(ns, dtype),
                                    *shape, batch=batch)
    assert method == want, why
    if want == "householder-recursive":
        assert why.startswith(f"precision={precision!r} runs every product natively")
        assert f"near-square {shape[0]}x{shape[1]} of more than {2**25} and at most " \
            f"{2**27} elements" in why
    # the backend's default (0, 0): the library's QR
    monkeypatch.setattr(_TensorCoreNumpy, "native_recursion_square", (0, 0), raising=False)
    if precision != "fp64-emulated" and dtype != "complex128":
        assert api.choose_method(_TensorCoreNumpy(ns), precision, getattr(ns, dtype), *shape,
                                 batch=batch)[0] == "geqrf"


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_native_recursion_route_end_to_end(monkeypatch, dtype):
    """The rule's route runs: ``qr`` at the input's own precision takes the certified
    recursion where the backend's range says so, with the library QR's accuracy."""
    from mpqr.backends.numpy.backend import NumpyBackend

    monkeypatch.setattr(NumpyBackend, "native_recursion_square", (0, 2**20), raising=False)
    a = np.random.default_rng(5).standard_normal((400, 300)).astype(dtype)  # past small_max
    keep = a.copy()
    with mpqr.explain() as trace:
        q, r = mpqr.qr(a)
    assert [e.data["method"] for e in trace.events if e.kind == "method"] == \
        ["householder-recursive"]
    assert any(e.kind == "panel" for e in trace.events)  # certified panels
    np.testing.assert_array_equal(a, keep)
    u = float(np.finfo(dtype).eps) / 2
    assert q.dtype == dtype and r.dtype == dtype
    assert backward_error(a.astype(np.float64), q, r) <= np.sqrt(400 * 300) * u
    assert orthogonality(q) <= np.sqrt(400) * u
    assert np.all(np.diag(r) >= 0)
    # outside the range: the library's QR, as before
    monkeypatch.setattr(NumpyBackend, "native_recursion_square", (0, 0), raising=False)
    with mpqr.explain() as trace:
        mpqr.qr(a)
    assert [e.data["method"] for e in trace.events if e.kind == "method"] == ["geqrf"]


@pytest.mark.parametrize("precision, dtype, batch, want", [
    ("fp32", "float64", 1, "householder-tiled"),  # fp32 arithmetic on float64 data: ours
    ("fp64", "float32", 1, "householder-tiled"),
    ("fp64-emulated", "float32", 1, "householder-tiled"),
    ("fp64", "float64", 5, "geqrf"),  # stacks beyond one block: the library per matrix
    ("fp64", "float64", 1, "geqrf"), ("fp32", "float32", 1, "geqrf"),
    ("fp64-emulated", "float64", 1, "geqrf"), ("auto", "float32", 1, "geqrf")])
def test_choose_method_takes_the_library_qr_only_in_the_inputs_precision(precision, dtype,
                                                                         batch, want):
    # 1000 x 100: above the small-input size, where the library's QR meets every request
    # the dtype meets (test_fast_path.py)
    ns = array_namespace(np.zeros(1))
    method, why = api.choose_method(get_backend(ns), precision, getattr(ns, dtype), 1000, 100,
                                    batch=batch)
    assert method == want, why


@pytest.mark.parametrize("precision, dtype, shape, batch, want", [
    ("fp16", "float32", (8192, 8192), 1, "geqrf"),
    ("fp32-emulated", "float32", (8192, 8192), 1, "geqrf"),
    ("fp16", "float64", (8192, 8192), 1, "geqrf"),  # float64 arithmetic covers fp16
    ("fp16", "float32", (16384, 16384), 1, "householder-recursive"),  # above the cut
    ("fp16", "float32", (8192, 8192), 3, "householder-recursive"),  # stacks: ours
    ("fp16", "float32", (65536, 2048), 1, "cholqr2"),  # tall-skinny: CholQR2 in fp32
    ("fp16", "float32", (65535, 4096), 1, "householder-recursive"),  # just under 16 n
    ("fp64-emulated", "float32", (8192, 8192), 1, "householder-recursive"),  # fp32 < fp64
    ("fp32", "float64", (8192, 8192), 1, "householder-tiled"),  # native: no recursion
])
def test_small_square_tensor_core_qr_takes_the_library_qr(monkeypatch, precision, dtype,
                                                          shape, batch, want):
    """Below ``library_qr_square_max`` elements the library's QR in the input's own
    precision replaces the recursion, when that precision covers the one asked for."""
    monkeypatch.setattr(_TensorCoreNumpy, "library_qr_square_max", 2**27, raising=False)
    monkeypatch.setattr(_TensorCoreNumpy, "rates", lambda self: {
        "native-fp64": 1e12, "native-fp32": 48e12, "tc-fp16": 600e12, "int8": 2000e12,
        "bandwidth": 3.5e12, "launch_s": 8e-6})  # slow FP64: fp64-emulated goes to Ozaki
    ns = array_namespace(np.zeros(1))
    method, why = api.choose_method(_TensorCoreNumpy(ns), precision, getattr(ns, dtype),
                                    *shape, batch=batch)
    assert method == want, why
    if want == "geqrf":
        assert f"{shape[0]}x{shape[1]} <= {2**27} elements" in why and precision in why


@pytest.mark.parametrize("precision, shape, want", [
    ("fp64-emulated", (16384, 16384), "geqrf"),  # 2^28: the precision's own, larger cut
    ("fp64-emulated", (8192, 32768), "geqrf"),  # wide: its 8192^2 block within the cut
    ("fp64-emulated", (16384, 16392), "geqrf"),  # wide by 8: its 16384^2 block as well
    ("fp64-emulated", (16400, 16400), "householder-recursive"),  # just above it
    ("fp16", (16384, 16384), "householder-recursive"),  # the other precisions keep 2^27
])
def test_library_qr_cut_per_precision(monkeypatch, precision, shape, want):
    """``library_qr_square_max_by_precision`` moves one precision's cut and no other's."""
    monkeypatch.setattr(_TensorCoreNumpy, "library_qr_square_max", 2**27, raising=False)
    monkeypatch.setattr(_TensorCoreNumpy, "library_qr_square_max_by_precision",
                        {"fp64-emulated": 2**28}, raising=False)
    monkeypatch.setattr(_TensorCoreNumpy, "rates", lambda self: {
        "native-fp64": 1e12, "native-fp32": 48e12, "tc-fp16": 600e12, "int8": 2000e12,
        "bandwidth": 3.5e12, "launch_s": 8e-6})  # slow FP64: fp64-emulated goes to Ozaki
    ns = array_namespace(np.zeros(1))
    method, why = api.choose_method(_TensorCoreNumpy(ns), precision, ns.float64, *shape)
    assert method == want, why
    if want == "geqrf" and shape[0] == shape[1]:
        assert why.startswith(f"{shape[0]}x{shape[1]} <= {2**28} elements at "
                              f"precision='{precision}'")
        assert "beats the fp64-emulated tensor-core recursion" in why
    elif want == "geqrf":  # a wide input whose m x m block the square rule gives the library
        assert why.startswith(f"wide {shape[0]}x{shape[1]} at precision='{precision}'")
        assert f"its {shape[0]}x{shape[0]} block is within the square cut of {2**28}" in why


def test_choose_method_fp64_emulated_follows_the_cost_model(monkeypatch):
    """fp64-emulated is recursive exactly when the policy would run the update on Ozaki."""
    ns = array_namespace(np.zeros(1))
    tc = _TensorCoreNumpy(ns)
    engine = mpqr.policy.decide(tc, ns.float64, 8192, 8192, 16384, 1, "fp64-emulated", "t",
                                mpqr.policy.as_gemm_options(None)).engine
    method, _ = api.choose_method(tc, "fp64-emulated", ns.float64, 16384, 16384)
    assert method == ("geqrf" if engine == "native-fp64" else "householder-recursive")
    monkeypatch.setattr(_TensorCoreNumpy, "rates", lambda self: {
        "native-fp64": 1e12, "native-fp32": 48e12, "tc-fp16": 600e12, "int8": 2000e12,
        "bandwidth": 3.5e12, "launch_s": 8e-6})  # a GPU with slow FP64
    assert api.choose_method(tc, "fp64-emulated", ns.float64, 16384, 16384)[0] == \
        "householder-recursive"
    # a small tall-skinny matrix at fp16 takes the library's QR in float32 (covers fp16)
    assert api.choose_method(tc, "fp16", ns.float32, 4096, 32)[0] == "geqrf"
    assert api.choose_method(tc, "fp16", ns.float32, 300, 32)[0] == "householder-tiled"


@pytest.mark.parametrize("shape", [(4096, 32), (50, 256, 32), (40, 7)])
def test_single_panel_uses_the_backends_panel_qr_directly(xp, shape):
    """n <= one panel: the backend's panel QR gives Q and R; nothing is rebuilt
    from reflectors, so no policy GEMM runs at all."""
    a = np.random.default_rng(11).standard_normal(shape)
    with mpqr.explain() as trace:
        q, r = mpqr.qr(xp.asarray(a), method="householder-tiled", precision="fp64")
    assert trace.gemms == []
    qn, rn = to_numpy(q), to_numpy(r)
    n = shape[-1]
    assert np.all(np.diagonal(rn, axis1=-2, axis2=-1) >= 0)
    assert np.array_equal(np.triu(rn), rn)
    assert backward_error(a, qn, rn) <= 2 * np.sqrt(n) * 2.0**-53
    assert orthogonality(qn) <= np.sqrt(n) * 2.0**-53


def test_small_tall_skinny_takes_the_library_qr():
    ns = array_namespace(np.zeros(1))
    be = get_backend(ns)
    cap = be.library_qr_tall_max
    assert api.choose_method(be, "fp64", ns.float64, cap // 64, 64)[0] == "geqrf"
    assert api.choose_method(be, "auto", ns.float32, cap // 64, 64)[0] == "geqrf"
    assert api.choose_method(be, "fp64", ns.float64, 2 * cap // 64, 64)[0] == "cholqr2"
    # not the input's own arithmetic (fp32 products on float64 data): CholQR2 as before
    assert api.choose_method(be, "fp32", ns.float64, cap // 64, 64)[0] == "cholqr2"
    # stacks beyond one block: the library per matrix (TSQR tile kernels on CuPy)
    assert api.choose_method(be, "fp64", ns.float64, 2048, 64, batch=4)[0] == "geqrf"


def test_small_tall_skinny_qr_through_the_library_is_accurate(xp):
    a = np.random.default_rng(5).standard_normal((2048, 64))
    with mpqr.explain() as trace:
        q, r = mpqr.qr(xp.asarray(a))
    assert [e.data["method"] for e in trace.events if e.kind == "method"] == ["geqrf"]
    u = 2.0**-53
    assert backward_error(a, q, r) <= 2 * np.sqrt(64) * u
    assert orthogonality(q) <= np.sqrt(64) * u / 4
    assert np.all(np.diag(to_numpy(r)) >= 0)


# --- blocked leaves: sub-panels by explicit QR + reconstruction (mpqr.qr.panel_blocked) ---
blocked = importlib.import_module("mpqr.qr.panel_blocked")


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.complex128])
@pytest.mark.parametrize("shape", [(300, 32), (40, 7), (32, 32), (260, 17)])
def test_reconstruct_panel_gives_reflectors_that_reproduce_the_panel(xp, shape, dtype):
    """``(Y, W, tau, R)``: ``I - W Y^H`` orthogonal, ``a = (I - W Y^H)[:, :k] R``,
    ``W = Y T`` with ``T`` upper triangular and ``diag(T) = tau``; on CuPy (real, k <= 32)
    the TSQR kernels and the reconstruction kernel."""
    if "complex" in np.dtype(dtype).name and not hasattr(xp, "complex128"):
        pytest.skip("namespace without complex dtypes")
    a = _rand(np.random.default_rng(shape[0]), shape, dtype)
    ax = from_numpy(xp, a)
    backend = get_backend(array_namespace(ax))
    y, w, tau, r = (to_numpy(v) for v in backend.reconstruct_panel(ax))
    assert np.array_equal(to_numpy(ax), a)
    m, k = shape
    u = _u(dtype)
    assert np.array_equal(np.triu(y), np.triu(np.eye(m, k)))
    assert np.array_equal(r, np.triu(r))
    h = np.eye(m) - hp_matmul(w, np.conj(y.T))
    h = np.asarray(h, dtype=np.complex128 if np.iscomplexobj(h) else np.float64)
    assert orthogonality(h) <= 10 * m * u, orthogonality(h)
    assert backward_error(a, h[:, :k], r) <= 10 * np.sqrt(m * k) * u
    t = np.linalg.solve(y[:k].astype(h.dtype), w[:k].astype(h.dtype))  # W1 = Y1 T
    scale = np.max(np.abs(t))
    assert np.max(np.abs(np.tril(t, -1))) <= 10 * k * u * scale
    np.testing.assert_allclose(tau, np.diag(t), rtol=0, atol=10 * k * u * scale)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape, block", [((300, 100), 32), ((100, 100), 32), ((64, 40), 16),
                                          ((257, 96), 32)])
def test_blocked_panel_is_a_compact_wy_factorization(xp, shape, block, dtype):
    """Sub-panels of ``block`` columns (the last one narrower where ``block`` does not
    divide ``k``) give the contract of ``householder_panel`` to Householder accuracy, and
    the same ``|R|`` as the backend's ``geqrf`` panel."""
    a = _rand(np.random.default_rng(shape[1]), shape, dtype)
    ax = from_numpy(xp, a)
    backend = get_backend(array_namespace(ax))
    y, t, r = blocked.blocked_householder_panel(
        backend, ax, block=block, precision="fp32" if dtype == np.float32 else "fp64")
    assert np.array_equal(to_numpy(ax), a)
    assert y.dtype == ax.dtype and t.shape == (shape[1], shape[1])
    _check_panel(a, y, t, r)
    *_, r0 = backend.householder_panel(ax)
    tol = 10 * np.sqrt(shape[0] * shape[1]) * _u(dtype) * np.abs(a).max() * np.sqrt(shape[0])
    np.testing.assert_allclose(np.abs(to_numpy(r)), np.abs(to_numpy(r0)), rtol=0, atol=tol)


def test_blocked_panel_spreads_nan():
    """A NaN in a sub-panel reaches R and the reflectors: never a finite-looking factor."""
    a = np.random.default_rng(2).standard_normal((90, 64))
    a[50, 40] = np.nan
    y, _t, r = blocked.blocked_householder_panel(get_backend(array_namespace(a)), a, block=16,
                                                precision="fp64")
    assert np.isnan(r[:, 40:]).any() and np.isnan(y[:, 32:48]).any()
    assert np.isfinite(r[:32, :32]).all()  # sub-panels before the NaN are untouched by it


@pytest.mark.parametrize("precision", ["fp64", "fp32-emulated", "fp16", "fp64-emulated"])
def test_recursive_qr_with_blocked_leaves(xp, monkeypatch, precision):
    """The recursion with 128-wide leaves in 32-column sub-panels (the CuPy backend's
    setting) keeps the accuracy of its ``geqrf`` leaves; the trace names the leaves."""
    a, ax, backend = two_leaf_case(xp, monkeypatch, precision)
    results = {}
    # the geqrf route's sub-panels (certified panels have tests of their own)
    monkeypatch.setattr(type(backend), "certified_panels", False)
    monkeypatch.setattr(type(backend), "panel_block_min_rows", 0)
    monkeypatch.setattr(type(backend), "panel_block_dtypes", ("float32", "float64"))
    for nb in (32, None):
        monkeypatch.setattr(type(backend), "panel_block", nb)
        with mpqr.explain() as trace:
            q, r = mpqr.qr(ax, precision=precision, method="householder-recursive")
        leaves = [e.data for e in trace.events if e.kind == "panel"]
        assert leaves == ([{"rows": 384, "cols": 128, "block": 32},
                           {"rows": 256, "cols": 128, "block": 32}] if nb else [])
        results[nb] = (backward_error(a, q, r), orthogonality(q))
    u = unit_roundoff(precision, np.float64)
    back, orth = results[32]
    assert back <= 2 * np.sqrt(256) * u, results
    assert orth <= np.sqrt(256) * max(u, 2.0**-24) / 4, results
    # and no worse than the geqrf leaves beyond rounding-level noise
    assert back <= 4 * results[None][0] + np.sqrt(256) * 2.0**-53, results


def test_blocked_leaves_start_at_the_backends_row_cut_and_dtypes(monkeypatch):
    """Only leaves of at least ``panel_block_min_rows`` rows and of a dtype in
    ``panel_block_dtypes`` go in sub-panels."""
    monkeypatch.setattr(recursive, "MAX_LEAVES", 2)
    backend = get_backend(array_namespace(np.zeros(1)))
    monkeypatch.setattr(type(backend), "certified_panels", False)
    monkeypatch.setattr(type(backend), "panel_block", 32)
    monkeypatch.setattr(type(backend), "panel_block_min_rows", 300)
    monkeypatch.setattr(type(backend), "panel_block_dtypes", ("float64",))
    a = np.random.default_rng(17).standard_normal((384, 256))
    for dtype, rows in ((np.float64, [384]), (np.float32, [])):
        with mpqr.explain() as trace:
            q, r = mpqr.qr(a.astype(dtype), precision="fp64" if dtype == np.float64 else "fp32",
                           method="householder-recursive")
        assert [e.data["rows"] for e in trace.events if e.kind == "panel"] == rows
        u = 2.0**-53 if dtype == np.float64 else 2.0**-24
        assert backward_error(a.astype(dtype), q, r) <= 2 * np.sqrt(256) * u


@pytest.mark.parametrize("precision, dtype, n, want, says_why", [
    ("fp16", "float32", 4096, "geqrf", False),  # 2^24 <= the fp16 cut: the library
    ("fp16", "float32", 6144, "householder-recursive", True),  # above it, and says why
    ("fp16", "float32", 8192, "householder-recursive", True),
    ("fp64-emulated", "float32", 8192, "householder-recursive", False),  # fp32 < fp64
])
def test_recursion_above_the_cut_says_why(monkeypatch, precision, dtype, n, want, says_why):
    """Above a precision's measured cut the recursion is faster than the library's QR that
    would meet the request (H200, float32 fp16: 6144^2 42.7 against 56.4 ms, 8192^2 62.5
    against 96.1); ``explain()``'s reason says so where that QR would meet it."""
    monkeypatch.setattr(_TensorCoreNumpy, "library_qr_square_max", 2**27, raising=False)
    monkeypatch.setattr(_TensorCoreNumpy, "library_qr_square_max_by_precision",
                        {"fp16": 2**25, "fp64-emulated": 2**25}, raising=False)
    monkeypatch.setattr(_TensorCoreNumpy, "rates", lambda self: {
        "native-fp64": 1e12, "native-fp32": 48e12, "tc-fp16": 600e12, "int8": 2000e12,
        "bandwidth": 3.5e12, "launch_s": 8e-6})
    ns = array_namespace(np.zeros(1))
    method, why = api.choose_method(_TensorCoreNumpy(ns), precision, getattr(ns, dtype), n, n)
    assert method == want, why
    assert (f"above the backend's measured cut of {2**25} elements it is faster than the "
            "library's QR" in why) == says_why, why
