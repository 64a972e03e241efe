"""Gram matrices from upper-triangular blocks (mpqr/qr/gram_blocked.py).

The blocked product computes every entry as the same dot product as one GEMM, so
it is checked against a correctly rounded reference with the GEMM bound
``|G - A^T A| <= gamma_M (|A|^T |A|)`` elementwise; it must be exactly symmetric and
keep namespace, dtype and device. The block width is lowered so that small inputs
take several levels of the recursion (on every backend the GPU's width, 256, is
the default: tests/test_lstsq_gram.py and the CholQR tests run it at that width
only for N >= 512).
"""

from __future__ import annotations

import numpy as np
import pytest
from mpqr.backends import get_backend

import mpqr
from mpqr.qr.gram_blocked import gram
from tests._support import assert_close, exact_matmul, to_numpy


@pytest.fixture
def small_blocks(xp, monkeypatch):
    backend = get_backend(mpqr._array_api.array_namespace(xp.asarray(0.0)))
    monkeypatch.setattr(backend, "gram_block", 8)
    return backend


@pytest.mark.parametrize("n", [16, 37, 64])
def test_blocked_gram_is_the_gemm(xp, small_blocks, n):
    m = 300
    a = np.random.default_rng(n).standard_normal((m, n))
    with mpqr.explain() as trace:
        g = gram(small_blocks, xp.asarray(a), "fp64", "test-gram")
    # several products, each smaller than the full one
    sizes = [d.shape for d in trace.gemms]
    assert len(sizes) > 1 and all(s[0] * s[1] < n * n for s in sizes)
    gn = to_numpy(g)
    assert_close(g, gn, rtol=0, xp=xp)
    assert gn.dtype == np.float64 and gn.shape == (n, n)
    np.testing.assert_array_equal(gn, gn.T)
    exact = exact_matmul(a.T, a)
    bound = m * 2.0**-53 / (1 - m * 2.0**-53) * (np.abs(a).T @ np.abs(a))
    assert np.all(np.abs(gn - exact) <= bound)


def test_blocked_gram_complex_is_hermitian(xp, small_blocks):
    if xp.__name__.startswith("array_api_strict"):
        pytest.skip("complex GEMMs of array-api-strict are checked elsewhere")
    rng = np.random.default_rng(3)
    a = rng.standard_normal((200, 40)) + 1j * rng.standard_normal((200, 40))
    gn = to_numpy(gram(small_blocks, xp.asarray(a), "fp64", "test-gram"))
    np.testing.assert_array_equal(gn, gn.conj().T)
    ref = a.conj().T @ a
    u = 2.0**-53
    bound = 4 * 200 * u * (np.abs(a).T @ np.abs(a))
    assert np.all(np.abs(gn - ref) <= bound)


def test_cholqr2_with_blocked_gram(xp, small_blocks):
    a = np.random.default_rng(5).standard_normal((400, 24))
    q, r = mpqr.qr(xp.asarray(a), method="cholqr2")
    q, r = to_numpy(q), to_numpy(r)
    u = 2.0**-53
    assert np.linalg.norm(q.T @ q - np.eye(24)) <= 24 * 400 * u
    assert np.linalg.norm(q @ r - a) <= 24 * 400 * u * np.linalg.norm(a)
