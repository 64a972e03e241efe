"""Bad input gets a clear error at every public entry point, and odd-but-valid input
(views, read-only, zero-size, tiny shapes) gets the same answer as its plain copy.

Every message is asserted with ``match=``: it names the argument, what was
expected and what was got.
"""

from __future__ import annotations

import re

import array_api_strict as xs
import numpy as np
import pytest

import mpqr
from tests._qr_support import backward_error, orthogonality
from tests._support import to_numpy

U64 = 2.0**-53

# --- shapes and dtypes -------------------------------------------------------------

NDIM_CASES = [
    (lambda v: mpqr.qr(v), "x", "2-D or a stack of matrices"),
    (lambda v: mpqr.svd(v), "x", "2-D or a stack of matrices"),
    (lambda v: mpqr.orth(v), "x", "2-D or a stack of matrices"),
    (lambda v: mpqr.matmul(v, np.ones((3, 2))), "a", r"2-D \(the GEMM engines are 2-D\)"),
    (lambda v: mpqr.matmul(np.ones((2, 3)), v), "b", r"2-D \(the GEMM engines are 2-D\)"),
]


@pytest.mark.parametrize("call,name,what", NDIM_CASES)
def test_wrong_ndim_names_argument_expectation_and_got(call, name, what):
    with pytest.raises(ValueError, match=rf"^`{name}` must be {what}, got ndim=1$"):
        call(np.ones(3))


@pytest.mark.parametrize("call,name", [(lambda v: mpqr.qr(v), "x"),
                                       (lambda v: mpqr.matmul(v, np.ones((1, 1))), "a")])
def test_numpy_scalar_is_not_an_array(call, name):
    # np.float64 is a Python float subclass: it must not read as "no array given"
    with pytest.raises(TypeError, match=rf"^`{name}` must be an array of an Array API library "
                                        r"\(NumPy, CuPy, \.\.\.\), got scalar numpy\.float64$"):
        call(np.float64(3.0))


def test_python_list_is_not_an_array():
    with pytest.raises(TypeError, match=r"^`x` must be an array of an Array API library "
                                        r"\(NumPy, CuPy, \.\.\.\), got builtins\.list$"):
        mpqr.qr([[1.0, 2.0], [3.0, 4.0]])


def test_matmul_mismatched_inner_dimensions():
    with pytest.raises(ValueError, match=re.escape(
            "inner dimensions must match: `a` has shape (3, 2) and `b` has shape (3, 3) "
            "(2 != 3)")):
        mpqr.matmul(np.ones((3, 2)), np.ones((3, 3)))


@pytest.mark.parametrize("dtype,got", [(np.bool_, "bool"), (np.object_, "object"),
                                       (np.str_, "<U1")])
@pytest.mark.parametrize("entry", ["qr", "svd", "orth", "matmul_a", "matmul_b"])
def test_unsupported_dtypes_raise_typeerror(entry, dtype, got):
    bad = np.ones((3, 3)).astype(dtype) if dtype is not np.str_ else np.full((3, 3), "a")
    good = np.ones((3, 3))
    name = {"matmul_b": "b", "matmul_a": "a"}.get(entry, "x")
    call = {"qr": lambda: mpqr.qr(bad), "svd": lambda: mpqr.svd(bad),
            "orth": lambda: mpqr.orth(bad), "matmul_a": lambda: mpqr.matmul(bad, good),
            "matmul_b": lambda: mpqr.matmul(good, bad)}[entry]
    with pytest.raises(TypeError, match=rf"^`{name}` must have a floating or integer dtype, "
                                        rf"got {re.escape(got)}$"):
        call()


def test_strict_bool_raises_typeerror():
    with pytest.raises(TypeError, match=r"^`x` must have a floating or integer dtype, got bool$"):
        mpqr.qr(xs.asarray(np.ones((3, 3), dtype=bool)))


@pytest.mark.parametrize("dtype,want", [(np.int32, np.float64), (np.int64, np.float64),
                                        (np.uint8, np.float64), (np.float16, np.float32)])
def test_int_and_float16_are_promoted_like_numpy_linalg(dtype, want):
    a = (np.arange(12) % 7 + np.eye(4, 3).ravel()).reshape(4, 3).astype(dtype)
    q, r = mpqr.qr(a, precision="fp64")
    assert q.dtype == want and r.dtype == want
    ref = a.astype(np.float64)
    assert backward_error(ref, q, r) <= 4 * 3 * (2.0**-24 if want == np.float32 else U64)
    assert mpqr.matmul(a, a.T).dtype == want


def test_complex_is_factored_natively_and_at_emulated_precisions():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((6, 3)) + 1j * rng.standard_normal((6, 3))
    for method in ("householder-tiled", "gram-schmidt-recursive", "cholqr2", "svqr"):
        q, r = mpqr.qr(a, method=method, precision="fp64")
        assert q.dtype == np.complex128
        assert backward_error(a, q, r) <= 10 * 3 * U64
        assert orthogonality(q) <= 10 * 3 * U64
    # the emulated precisions take complex input too (as real products of the parts)
    q, r = mpqr.qr(a, precision="fp32-emulated")
    assert q.dtype == np.complex128
    assert backward_error(a, q, r) <= 10 * 3 * 2.0**-24


# --- parameter values --------------------------------------------------------------

def test_unknown_mode_method_precision():
    a = np.ones((3, 3))
    with pytest.raises(ValueError, match=r"^`mode` must be one of 'reduced', 'complete', 'r'; "
                                         r"got 'full' \(SciPy's 'economic' is mpqr's 'reduced' "
                                         r"and SciPy's 'full' is 'complete'; "
                                         r"mpqr.compat.scipy.qr takes SciPy's names\)$"):
        mpqr.qr(a, mode="full")
    with pytest.raises(ValueError, match=r"^`mode` must be one of 'reduced', 'complete', 'r'; "
                                         r"got 'economic' \(SciPy's 'economic' is mpqr's "
                                         r"'reduced' and SciPy's 'full' is 'complete'; "):
        mpqr.qr(a, mode="economic")
    # the out-of-core route answers SciPy's names alike
    with pytest.raises(ValueError, match=r"got 'economic' \(SciPy's 'economic' is mpqr's "):
        mpqr.qr(a, mode="economic", memory_budget="1MB")
    with pytest.raises(ValueError, match=r"^`mode` must be one of 'reduced', 'complete', 'r'; "
                                         r"got 'raw'$"):  # no hint where none applies
        mpqr.qr(a, mode="raw")
    with pytest.raises(ValueError, match=r"^`method` must be one of 'auto', 'cholqr', .*"
                                         r"'svqr'; got 'qr'$"):
        mpqr.qr(a, method="qr")
    with pytest.raises(TypeError, match=r"^`method` must be a string, one of 'auto', .*; "
                                        r"got list \['x'\]$"):
        mpqr.qr(a, method=["x"])
    for call in (lambda: mpqr.qr(a, precision="fp8"), lambda: mpqr.svd(a, precision="fp8"),
                 lambda: mpqr.orth(a, precision="fp8"),
                 lambda: mpqr.matmul(a, a, precision="fp8")):
        with pytest.raises(ValueError, match=r"^`precision` must be one of 'auto', 'fp16', "
                                             r"'fp32', 'fp32-emulated', 'fp64', "
                                             r"'fp64-emulated'; got 'fp8'$"):
            call()
    with pytest.raises(TypeError, match=r"^`precision` must be a string, .*; got int 3$"):
        mpqr.qr(a, precision=3)


def test_bad_options():
    a = np.ones((2, 2))
    with pytest.raises(ValueError, match=re.escape(
            "`options` has unknown keys ['foo']; valid keys are ['complex_product', 'engine', "
            "'ozaki_terms', 'slice_k', 'workspace_limit']")):
        mpqr.matmul(a, a, options={"foo": 1})
    with pytest.raises(ValueError, match=r"^GemmOptions\.workspace_limit must be a positive int "
                                         r"or None, got 0$"):
        mpqr.GemmOptions(workspace_limit=0)
    with pytest.raises(TypeError, match=r"^`options` must be None, a dict or a GemmOptions, "
                                        r"got str$"):
        mpqr.matmul(a, a, options="fast")


# --- namespaces and devices: nothing is moved silently -------------------------------

def test_mixed_namespaces_raise_typeerror():
    with pytest.raises(TypeError, match=re.escape(
            "arrays from different libraries cannot be mixed (`a` is numpy, `b` is "
            "array_api_strict); move them to one library and device first")):
        mpqr.matmul(np.ones((2, 2)), xs.asarray(np.ones((2, 2))))


def test_mixed_devices_raise_valueerror():
    a = xs.asarray(np.ones((3, 3)))
    b = xs.asarray(np.ones((3, 3)), device=xs.Device("device1"))
    with pytest.raises(ValueError, match=r"^arrays must be on one device, got `a` on .*"
                                         r"CPU_DEVICE.*, `b` on .*device1.*; nothing is moved "
                                         r"silently$"):
        mpqr.matmul(a, b)


def test_results_stay_on_the_callers_device():
    a = xs.asarray(np.random.default_rng(1).standard_normal((6, 3)),
                   device=xs.Device("device1"))
    q, r = mpqr.qr(a, precision="fp64")
    assert q.device == a.device and r.device == a.device
    assert mpqr.matmul(a, xs.matrix_transpose(a)).device == a.device


# --- odd-but-valid inputs ------------------------------------------------------------

def _views():
    rng = np.random.default_rng(2)
    base = rng.standard_normal((40, 24))
    yield "transposed", rng.standard_normal((12, 30)).T
    yield "fortran", np.asfortranarray(base[:, :12])
    yield "strided", base[::2, ::2]
    yield "negative-stride", base[::-1, 3:15]


@pytest.mark.parametrize("kind,view", list(_views()), ids=[k for k, _ in _views()])
@pytest.mark.parametrize("method", ["auto", "householder-recursive", "gram-schmidt-recursive",
                                    "cholqr2", "svqr"])
def test_views_give_the_answer_of_their_contiguous_copy(kind, view, method):
    plain = np.ascontiguousarray(view)
    q1, r1 = mpqr.qr(view, method=method, precision="fp64")
    _, r2 = mpqr.qr(plain, method=method, precision="fp64")
    n = view.shape[1]
    cond = np.linalg.cond(plain)
    # the same factorization up to rounding: layouts may take different BLAS paths
    np.testing.assert_allclose(r1, r2, atol=8 * n * cond * U64 * np.linalg.norm(plain), rtol=0)
    assert backward_error(plain, q1, r1) <= 8 * n * U64
    c1 = mpqr.matmul(view, view.T, precision="fp32-emulated")
    c2 = mpqr.matmul(plain, plain.T, precision="fp32-emulated")
    np.testing.assert_array_equal(c1, c2)  # the engine copies into fp16 either way


def test_read_only_inputs_are_accepted():
    a = np.random.default_rng(3).standard_normal((9, 4))
    a.flags.writeable = False
    q, r = mpqr.qr(a, precision="fp64", overwrite_a=True)  # overwrite is a permission only
    assert backward_error(a, q, r) <= 8 * 4 * U64
    mpqr.svd(a)
    mpqr.orth(a, precision="fp16")
    mpqr.matmul(a, a.T, precision="fp16")


@pytest.mark.parametrize("shape", [(0, 3), (3, 0), (0, 0), (2, 0, 3), (0, 4, 3)])
@pytest.mark.parametrize("mode", ["reduced", "complete", "r"])
def test_zero_size_dimensions(xp, shape, mode):
    a = xp.zeros(shape, dtype=xp.float64)
    out = mpqr.qr(a, mode=mode, precision="fp64")
    *batch, m, n = shape
    k = min(m, n)
    if mode == "r":
        assert tuple(out.shape) == (*batch, k, n)
        return
    q, r = out
    qcols, rrows = (m, m) if mode == "complete" else (k, k)
    assert tuple(q.shape) == (*batch, m, qcols) and tuple(r.shape) == (*batch, rrows, n)
    if mode == "complete" and 0 not in batch:
        np.testing.assert_array_equal(to_numpy(q), np.broadcast_to(np.eye(m), q.shape))


def test_zero_size_matmul(xp):
    c = mpqr.matmul(xp.zeros((3, 0)), xp.zeros((0, 2)))
    assert tuple(c.shape) == (3, 2)
    np.testing.assert_array_equal(to_numpy(c), np.zeros((3, 2)))


@pytest.mark.parametrize("shape", [(1, 1), (7, 1), (1, 7), (2, 1), (1, 2)])
@pytest.mark.parametrize("method", ["householder-tiled", "householder-recursive",
                                    "gram-schmidt-recursive", "cholqr", "cholqr2",
                                    "shifted-cholqr3", "svqr"])
def test_tiny_shapes(xp, shape, method):
    a = np.random.default_rng(sum(shape)).standard_normal(shape) - 2.0
    q, r = mpqr.qr(xp.asarray(a), method=method, precision="fp64")
    k = min(shape)
    assert tuple(q.shape) == (shape[0], k) and tuple(r.shape) == (k, shape[1])
    assert backward_error(a, q, r) <= 8 * U64
    assert orthogonality(q) <= 8 * U64
    assert np.all(np.diag(to_numpy(r)) >= 0)


# --- the guarantees page names real tests -------------------------------------------

def test_guarantees_page_names_real_tests():
    """Every ``tests/<file>.py::<test>`` in docs/guarantees.md (and the bare
    ``test_*`` names following one in the same cell) is a test function."""
    import fnmatch
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    text = (root / "docs" / "guarantees.md").read_text()
    checked = 0
    for line in text.splitlines():
        for cell in line.split("|"):
            current = None
            for tok in re.findall(r"`([^`]+)`", cell):
                m = re.fullmatch(r"(tests/[\w/]+\.py)(?:::([\w*]+))?", tok)
                if m:
                    current = root / m.group(1)
                    assert current.is_file(), tok
                    names = [m.group(2)] if m.group(2) else []
                elif current is not None and re.fullmatch(r"test_[\w*]+", tok):
                    names = [tok]
                else:
                    continue
                defs = re.findall(r"^def (test_\w+)", current.read_text(), flags=re.M)
                for name in names:
                    assert fnmatch.filter(defs, name), f"{current.name}::{name} does not exist"
                    checked += 1
    assert checked > 60
