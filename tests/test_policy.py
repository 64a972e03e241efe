"""Precision settings, their resolution order, and the explain trace."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import mpqr
from mpqr.policy import GemmOptions, resolve_precision


@pytest.fixture(autouse=True)
def _clean_default(monkeypatch):
    monkeypatch.delenv("MPQR_PRECISION", raising=False)
    mpqr.set_precision(None)
    yield
    mpqr.set_precision(None)


def test_resolution_order(monkeypatch):
    assert resolve_precision(None) == ("auto", "builtin default")
    monkeypatch.setenv("MPQR_PRECISION", "fp32")
    assert resolve_precision(None) == ("fp32", "env")
    mpqr.set_precision("fp16")
    assert resolve_precision(None) == ("fp16", "set_precision")
    with mpqr.precision("fp64"):
        assert resolve_precision(None) == ("fp64", "context")
        assert resolve_precision("fp32-emulated") == ("fp32-emulated", "argument")
    assert mpqr.get_precision() == "fp16"


def test_typo_lists_valid_names(monkeypatch):
    with pytest.raises(ValueError, match=r"`precision` must be one of 'auto', 'fp16', .*got 'fp23'"):
        mpqr.matmul(np.ones((2, 2)), np.ones((2, 2)), precision="fp23")
    with pytest.raises(ValueError, match="must be one of .*got 'half'"):
        mpqr.precision("half")
    monkeypatch.setenv("MPQR_PRECISION", "bf16")
    with pytest.raises(ValueError, match="environment variable MPQR_PRECISION` must be one of"):
        mpqr.get_precision()
    with pytest.raises(TypeError, match="`precision` must be a string.*got int 16"):
        mpqr.set_precision(16)


def test_context_manager_as_decorator():
    @mpqr.precision("fp16")
    def inner():
        return mpqr.get_precision()

    assert inner() == "fp16"
    assert mpqr.get_precision() == "auto"


def test_threads_see_their_own_context():
    names = ["fp16", "fp32", "fp64", "fp32-emulated"] * 8
    barrier = threading.Barrier(8)

    def work(name):
        with mpqr.precision(name):
            barrier.wait(timeout=10)
            with mpqr.explain() as tr:
                mpqr.matmul(np.ones((3, 4), np.float32), np.ones((4, 2), np.float32))
            return name, mpqr.get_precision(), tr.gemms[0].precision

    with ThreadPoolExecutor(8) as pool:
        for name, seen, traced in pool.map(work, names):
            assert seen == traced == name


def test_explain_records_engine_reason_and_prediction():
    a = np.ones((5, 7), np.float32)
    b = np.ones((7, 3), np.float32)
    with mpqr.explain() as tr:
        mpqr.matmul(a, b, precision="fp32-emulated")
        with mpqr.precision("fp16"):
            mpqr.matmul(a, b)
        mpqr.matmul(a, b)
    engines = [g.engine for g in tr.gemms]
    assert engines == ["tc-sgemm", "tc-fp16", "native-fp32"]
    first = tr.gemms[0]
    assert first.shape == (5, 3, 7)
    assert first.precision_source == "argument"
    assert tr.gemms[1].precision_source == "context"
    assert "tc-sgemm" in first.predicted_s and first.predicted_s["tc-sgemm"] > 0
    text = str(tr)
    assert "precision=fp32-emulated [argument] -> tc-sgemm" in text
    # auto on the NumPy backend says why it stayed native
    assert "no emulated engine validated for auto" in tr.gemms[2].reason
    assert tr.engines() == {"tc-sgemm": 1, "tc-fp16": 1, "native-fp32": 1}


def test_auto_never_reduces_precision():
    rng = np.random.default_rng(0)
    for dt, engine in [(np.float32, "native-fp32"), (np.float64, "native-fp64"),
                       (np.complex64, "native-complex64")]:
        a = rng.standard_normal((4, 4)).astype(dt)
        with mpqr.explain() as tr:
            mpqr.matmul(a, a)
        assert tr.gemms[0].engine == engine


def test_gemm_options_forms_and_validation():
    assert mpqr.policy.as_gemm_options(None) == GemmOptions()
    assert mpqr.policy.as_gemm_options({"slice_k": 64}).slice_k == 64
    with pytest.raises(ValueError, match=r"`options` has unknown keys \['slicek'\]"):
        mpqr.matmul(np.ones((2, 2)), np.ones((2, 2)), options={"slicek": 3})
    with pytest.raises(ValueError, match="GemmOptions.slice_k must be a positive int or None, got 0"):
        GemmOptions(slice_k=0)
    with pytest.raises(TypeError, match="`options` must be None, a dict or a GemmOptions, got list"):
        mpqr.matmul(np.ones((2, 2)), np.ones((2, 2)), options=[1])
    with pytest.raises(ValueError, match=r"options.engine must be one of \[.*\]; got 'tc-magic'"):
        mpqr.matmul(np.ones((2, 2)), np.ones((2, 2)), options={"engine": "tc-magic"})


def test_gemm_options_context_and_forced_engine_in_trace():
    a = np.ones((4, 4))
    with mpqr.gemm_options(engine="tc-fp16"), mpqr.explain() as tr:
        mpqr.matmul(a, a, precision="fp64")
        mpqr.matmul(a, a, options={"slice_k": 2, "engine": "tc-sgemm"})
    assert [g.engine for g in tr.gemms] == ["tc-fp16", "tc-sgemm"]
    assert all(g.reason == "forced by options.engine" for g in tr.gemms)
    assert tr.gemms[1].params == {"slice_k": 2}


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_gemm_sub_updates_a_column_block_in_place(xp, dtype):
    """``c -= a @ b`` on a column block of a wider matrix: the block changes by the
    product (native-accuracy bound, against exact products), the columns beside it and
    the operands do not, and the trace records the product like :func:`gemm`."""
    from mpqr.backends import get_backend

    from mpqr._array_api import array_namespace
    from mpqr.policy import gemm_sub
    from tests._support import exact_matmul, from_numpy, to_numpy

    rng = np.random.default_rng(21)
    m, k, n = 70, 9, 30
    big = rng.standard_normal((m, n + 5)).astype(dtype)
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    ax, bx = from_numpy(xp, a), from_numpy(xp, b)
    backend = get_backend(array_namespace(ax))
    bigx = backend.xp.asarray(from_numpy(xp, big), copy=True)  # writable, not `big` itself
    with mpqr.explain() as trace:
        gemm_sub(bigx[:, 5:], ax, bx, precision="fp64" if dtype == np.float64 else "fp32",
                 label="upd", backend=backend)
    [g] = trace.gemms
    assert g.label == "upd" and g.shape == (m, n, k) and g.engine.startswith("native")
    got = to_numpy(bigx).astype(np.float64)
    want = big[:, 5:].astype(np.float64) - exact_matmul(a.astype(np.float64),
                                                        b.astype(np.float64))
    u = 2.0**-53 if dtype == np.float64 else 2.0**-24
    bound = (k + 2) * u * (np.abs(big[:, 5:]) + np.abs(a) @ np.abs(b))
    assert np.all(np.abs(got[:, 5:] - want) <= bound)
    assert np.array_equal(got[:, :5], big[:, :5].astype(np.float64))
    assert np.array_equal(to_numpy(ax), a) and np.array_equal(to_numpy(bx), b)
    # backends with an in-place product take this view directly (CuPy: cuBLAS, beta =
    # 1); NumPy only a block of a column-ordered matrix, whose product it forms in
    # column order (the pivoted QR's workspace)
    from mpqr.backends._base import ArrayAPIBackend

    in_place = type(backend).gemm_sub_into is not ArrayAPIBackend.gemm_sub_into
    scratch = backend.xp.asarray(from_numpy(xp, big), copy=True)
    took = backend.gemm_sub_into(scratch[:, 5:], ax, bx)
    assert took is (in_place and backend.name != "numpy")
    if took:
        assert np.array_equal(to_numpy(scratch), to_numpy(bigx))
    if backend.name == "numpy":
        scratch = np.array(big, order="F")
        assert backend.gemm_sub_into(scratch[:, 5:], ax, bx) is True
        got = scratch.astype(np.float64)
        assert np.all(np.abs(got[:, 5:] - want) <= bound)
        assert np.array_equal(got[:, :5], big[:, :5].astype(np.float64))


@pytest.mark.parametrize("precision", ["fp32", "fp32-emulated", "fp16"])
def test_gemm_add_accumulates_into_a_column_block(xp, precision):
    """``c += a @ b`` on a column block of a wider matrix at native and emulated
    precisions: the block grows by the product (the precision's bound, against exact
    products), the columns beside it and the operands do not change, and the trace
    records the product like :func:`gemm`."""
    from mpqr.backends import get_backend

    from mpqr._array_api import array_namespace
    from mpqr.policy import gemm_add
    from tests._support import exact_matmul, from_numpy, to_numpy

    if precision != "fp32" and getattr(xp, "__name__", "").startswith("array_api_strict"):
        pytest.skip("the standard-only backend has no emulated engines")
    rng = np.random.default_rng(22)
    m, k, n = 70, 300, 30
    big = rng.standard_normal((m, n + 5)).astype(np.float32)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    ax, bx = from_numpy(xp, a), from_numpy(xp, b)
    backend = get_backend(array_namespace(ax))
    bigx = backend.xp.asarray(from_numpy(xp, big), copy=True)
    engine = {"fp32": None, "fp32-emulated": "tc-sgemm", "fp16": "tc-fp16"}[precision]
    opts = None if engine is None else {"engine": engine}
    with mpqr.explain() as trace:
        gemm_add(bigx[:, 5:], ax, bx, precision=precision, label="acc", options=opts,
                 backend=backend)
    [g] = trace.gemms
    assert g.label == "acc" and g.shape == (m, n, k)
    assert g.engine == (engine or "native-fp32")
    got = to_numpy(bigx).astype(np.float64)
    want = big[:, 5:].astype(np.float64) + exact_matmul(a.astype(np.float64),
                                                        b.astype(np.float64))
    u = {"fp32": 2.0**-24, "fp32-emulated": 2.0**-24, "fp16": 2.0**-11}[precision]
    bound = (k + 2) * u * (np.abs(big[:, 5:]) + np.abs(a) @ np.abs(b))
    assert np.all(np.abs(got[:, 5:] - want) <= bound)
    # not a product that ignores c: the block holds c's part too
    assert np.abs(got[:, 5:] - (want - big[:, 5:])).max() > 0.5
    assert np.array_equal(got[:, :5], big[:, :5].astype(np.float64))
    assert np.array_equal(to_numpy(ax), a) and np.array_equal(to_numpy(bx), b)
