"""GPU tests of the cuBLASLt int8 path of the Ozaki engine (CuPy only).

Integer products are exact, so the checks are exact: every plane against an int64
product on the host, the whole engine bit for bit against the gemmEx path. The
autotuning threshold is lowered so that small operands take the cuBLASLt path.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import GPU

if not GPU:
    pytest.skip("no CUDA GPU visible", allow_module_level=True)
import cupy as cp
from mpqr.backends import get_backend
from mpqr.backends.cupy import int8_lt as cupy_int8_lt

import mpqr

#: the Ozaki engine regardless of the cost model (as in tests/test_ozaki.py)
FORCE = {"engine": "ozaki-int8"}


@pytest.fixture
def lt_always(monkeypatch):
    monkeypatch.setattr(cupy_int8_lt, "AUTOTUNE_MIN_OPS", 0)
    monkeypatch.setattr(cupy_int8_lt, "ENABLED", True)


def _operands(planes, m, n, kp, seed):
    rng = np.random.default_rng(seed)
    ar = rng.integers(-128, 128, (planes, m, kp), dtype=np.int8)
    brt = rng.integers(-128, 128, (planes, n, kp), dtype=np.int8)
    return ar, brt


@pytest.mark.parametrize("k0,k1", [(0, 96), (32, 96)])
def test_lt_products_are_exact(lt_always, k0, k1):
    planes, m, n, kp = 3, 48, 80, 96
    ar, brt = _operands(planes, m, n, kp, k0)
    out = cp.full((planes, m, n), -7, dtype=cp.int32)
    assert cupy_int8_lt.int8_gemms(cp.asarray(ar), cp.asarray(brt), k0, k1, out)
    ref = np.einsum("lik,ljk->lij", ar[:, :, k0:k1].astype(np.int64),
                    brt[:, :, k0:k1].astype(np.int64))
    np.testing.assert_array_equal(out.get(), ref)
    info = cupy_int8_lt.plan_info(planes, m, n, k1 - k0, kp, kp)
    assert info["candidates"] >= 1 and len(info["times_ms"]) == info["candidates"]
    assert info["choice"] is not None
    # a second call takes the cached choice and gives the same bits
    out2 = cp.zeros_like(out)
    assert cupy_int8_lt.int8_gemms(cp.asarray(ar), cp.asarray(brt), k0, k1, out2)
    assert bool(cp.array_equal(out, out2))


def test_small_products_keep_the_gemmex_path():
    ar, brt = _operands(2, 32, 32, 32, 1)
    out = cp.full((2, 32, 32), -7, dtype=cp.int32)
    assert 2.0 * 2 * 32**3 < cupy_int8_lt.AUTOTUNE_MIN_OPS
    assert not cupy_int8_lt.int8_gemms(cp.asarray(ar), cp.asarray(brt), 0, 32, out)
    assert bool((out == -7).all())  # untouched


def test_backend_planes_agree_with_gemmex(lt_always, monkeypatch):
    be = get_backend(cp)
    ar, brt = (cp.asarray(v) for v in _operands(4, 64, 112, 128, 2))
    lt = be.ozaki_int8_gemms(ar, brt, 0, 128)
    monkeypatch.setattr(cupy_int8_lt, "ENABLED", False)
    ex = be.ozaki_int8_gemms(ar, brt, 0, 128)
    assert lt.dtype == ex.dtype == cp.int32
    assert bool(cp.array_equal(lt, ex))


def test_ozaki_matmul_is_bitwise_the_same_and_explains_the_choice(lt_always, monkeypatch):
    rng = np.random.default_rng(3)
    a = cp.asarray(rng.standard_normal((200, 300)))
    b = cp.asarray(rng.standard_normal((300, 150)))
    with mpqr.explain() as trace:
        c_lt = mpqr.matmul(a, b, precision="fp64-emulated", options=FORCE)
    ev = [e for e in trace.events if e.kind == "int8-gemm"]
    assert ev and "cuBLASLt candidate" in ev[0].message
    assert ev[0].data["choice"] is not None
    monkeypatch.setattr(cupy_int8_lt, "ENABLED", False)
    c_ex = mpqr.matmul(a, b, precision="fp64-emulated", options=FORCE)
    assert bool(cp.array_equal(c_lt, c_ex))


@pytest.mark.parametrize("via_lt", [True, False])
def test_row_blocks_of_planes_are_exact(lt_always, monkeypatch, via_lt):
    # the Gram calls multiply row blocks of one residue array (planes a uniform
    # stride apart, rows contiguous): both paths take the views as they are
    monkeypatch.setattr(cupy_int8_lt, "ENABLED", via_lt)
    be = get_backend(cp)
    ar, brt = _operands(3, 96, 96, 64, 5)
    dar, dbrt = cp.asarray(ar), cp.asarray(brt)
    got = be.ozaki_int8_gemms(dar[:, 16:48, :], dbrt[:, 48:96, :], 0, 64)
    ref = np.einsum("lik,ljk->lij", ar[:, 16:48].astype(np.int64),
                    brt[:, 48:96].astype(np.int64))
    np.testing.assert_array_equal(got.get(), ref)
    if via_lt:
        assert cupy_int8_lt.plan_info(3, 32, 48, 64, 64, 64, 96 * 64, 96 * 64) is not None
