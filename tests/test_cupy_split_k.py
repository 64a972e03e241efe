"""GPU tests of the float64 products split along a long inner dimension
(``backends/cupy/split_k.py``): a tall matrix's Gram matrix through the backend's GEMM,
the precision policy's Gram call and into a block of a larger output.

Integer-valued operands make every partial sum exact, so the split product must equal
the exact product bitwise (the host's product of the same integers); on random operands
each entry must meet the dot-product bound ``|G - A^T A| <= gamma_k |A|^T |A|`` (Higham, eq. 3.12)
against a long-double host product. Each test checks that the split ran.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import GPU

if not GPU:
    pytest.skip("no CUDA GPU visible", allow_module_level=True)
import cupy as cp
from mpqr.backends import get_backend
from mpqr.backends.cupy import split_k

from mpqr.qr.gram_blocked import gram


@pytest.fixture
def calls(monkeypatch):
    seen = []
    real = split_k.gemm_split_k

    def spy(backend, a, b, out, p, alpha, types):
        seen.append((a.shape, b.shape, p))
        return real(backend, a, b, out, p, alpha, types)

    monkeypatch.setattr(split_k, "gemm_split_k", spy)
    return seen


def _integers(m, n, seed=0):
    # small integers: every partial sum is an integer below 2^53, so any order of the
    # float64 sums (the host's BLAS too) gives the exact product
    rng = np.random.default_rng(seed)
    return rng.integers(-8, 9, size=(m, n)).astype(np.float64)


@pytest.mark.parametrize("n", [32, 64])
def test_gram_of_integers_is_exact(calls, n):
    m = 2**21 + 777  # 1024 or 512 chunks and a tail
    a64 = _integers(m, n)
    exact = a64.T @ a64
    a = cp.asarray(a64, dtype=cp.float64)
    be = get_backend(cp)
    g = be.gemm(a.T, a)
    assert calls and calls[-1][2] == split_k.parts(n, n, m, cp.float64, cp)
    np.testing.assert_array_equal(g.get(), exact)
    # the policy's Gram call (the tall CholQR passes' product), exactly symmetric
    g2 = gram(be, a, None, "test")
    np.testing.assert_array_equal(g2.get(), exact)


def test_into_a_block_and_scaled(calls):
    m, n = 2**21, 48
    a64 = _integers(m, n, seed=1)
    a = cp.asarray(a64, dtype=cp.float64)
    be = get_backend(cp)
    big = cp.full((n + 5, n + 9), 7.0)
    be.gemm_into(big[2:2 + n, 3:3 + n], a.T, a)
    assert calls
    host = big.get()
    np.testing.assert_array_equal(host[2:2 + n, 3:3 + n], (a64.T @ a64))
    host[2:2 + n, 3:3 + n] = 7.0
    np.testing.assert_array_equal(host, 7.0)  # nothing written outside the block
    from cupy.cuda import cublas, runtime

    out = cp.empty((n, n))
    be._gemm_ex(a.T, a, out, 0.5, 0.0, runtime.CUDA_R_64F, runtime.CUDA_R_64F,
                cublas.CUBLAS_COMPUTE_64F, np.float64)
    np.testing.assert_array_equal(out.get(), (a64.T @ a64) / 2)


@pytest.mark.parametrize("shape", [(2**14 + 77, 40), (2**15, 32)])
def test_random_meets_the_dot_product_bound(calls, monkeypatch, shape):
    # smaller thresholds, so the long-double reference stays quick on the host
    monkeypatch.setattr(split_k, "MIN_K", 2**14)
    monkeypatch.setattr(split_k, "CHUNK", 256)
    monkeypatch.setattr(split_k, "MAX_WORKSPACE", 1.0)
    m, n = shape
    a64 = np.random.default_rng(2).standard_normal((m, n)) * np.logspace(0, 6, n)
    g = get_backend(cp).gemm(cp.asarray(a64).T, cp.asarray(a64)).get()
    assert calls and calls[-1][2] == min(split_k.MAX_PARTS, m // 256)
    al = a64.astype(np.longdouble)
    ref = al.T @ al
    u = 2.0**-53
    bound = m * u / (1 - m * u) * (np.abs(al).T @ np.abs(al))
    assert np.all(np.abs(g - ref) <= bound)


def test_not_split(calls):
    be = get_backend(cp)
    for m, n, dt in [(2**21, 64, cp.float32), (2**21, 128, cp.float64),
                     (2**21, 16, cp.float64), (2**20, 64, cp.float64)]:
        a = cp.ones((m, n), dtype=dt)
        g = be.gemm(a.T, a)
        assert float(g[0, 0]) == m
    assert calls == []
    # an accumulating product (beta = 1) is not split either
    a = cp.ones((2**21, 64))
    c = cp.zeros((64, 64))
    be.gemm_sub_into(c, a.T, a)
    assert calls == [] and float(c[3, 5]) == -(2**21)
