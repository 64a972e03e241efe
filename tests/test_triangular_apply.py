"""``A @ X`` for upper-triangular ``X`` without its zeros (CholQR's inverse by GEMM), and
the policy's ``gemm_into`` that writes a product into a view.

Reference: the correctly rounded product (``tests._support.exact_matmul``). Bound: every
entry is a dot product of at most ``n`` terms, so ``|Q - A X| <= gamma_n |A| |X|``; the
tests allow ``2 n u`` for ``gamma_n`` (``u`` of the dtype).
"""

from __future__ import annotations

import functools
import sys

import numpy as np
import pytest
from mpqr.backends import get_backend

import mpqr
from mpqr.policy import gemm_into
from tests._support import assert_close, exact_matmul, to_numpy

cholqr_mod = sys.modules["mpqr.qr.cholqr"]
aa = sys.modules["mpqr._array_api"]


def _backend(xp):
    return get_backend(aa.array_namespace(xp.asarray(1.0)))


@functools.cache
def _split_case(n: int, m: int = 64) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(a, x, a @ x correctly rounded)``: the exact product once for every backend (the
    split is over the columns, so a few rows show it)."""
    rng = np.random.default_rng(n)
    a = rng.standard_normal((m, n))
    x = np.triu(rng.standard_normal((n, n))) + n * np.eye(n)
    return a, x, exact_matmul(a, x)


@pytest.mark.parametrize("n", [256, 300])
def test_split_product_is_the_product_without_the_zeros(xp, n):
    a, x, ref = _split_case(n)
    m = a.shape[0]
    be = _backend(xp)
    assert be.triangular_split_min_n is not None and n >= be.triangular_split_min_n
    with mpqr.explain() as trace:
        q = cholqr_mod._times_upper(be, xp.asarray(a), xp.asarray(x), "t", "fp64")
    h = (n // 2 + 7) // 8 * 8
    assert [g.shape for g in trace.gemms] == [(m, n - h, n), (m, h, h)]
    bound = 2 * n * 2.0**-53 * (np.abs(a) @ np.abs(x))
    assert np.all(np.abs(to_numpy(q) - ref) <= bound)
    assert aa.namespace_name(aa.array_namespace(q)) == \
        aa.namespace_name(aa.array_namespace(xp.asarray(0.0)))


def test_below_the_cut_one_gemm(xp):
    be = _backend(xp)
    n = be.triangular_split_min_n - 1
    a = xp.asarray(np.ones((50, n)))
    x = xp.asarray(np.triu(np.ones((n, n))))
    with mpqr.explain() as trace:
        q = cholqr_mod._times_upper(be, a, x, "t", "fp64")
    assert len(trace.gemms) == 1
    assert_close(q, np.ones((50, n)) @ np.triu(np.ones((n, n))), rtol=0, xp=xp)


@pytest.mark.skip_xp_backend("numpy_readonly", reason="writes into an array it creates")
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_gemm_into_writes_only_its_view(xp, dtype):
    rng = np.random.default_rng(4)
    a = rng.standard_normal((40, 12)).astype(dtype)
    b = rng.standard_normal((12, 7)).astype(dtype)
    out = xp.asarray(np.full((40, 20), 5.0, dtype=dtype))
    with mpqr.explain() as trace:
        gemm_into(out[:, 6:13], xp.asarray(a), xp.asarray(b), precision="fp64"
                  if dtype == "float64" else "fp32", label="into")
    (g,) = trace.gemms
    assert g.label == "into" and g.shape == (40, 7, 12)
    got = to_numpy(out)
    u = 2.0**-24 if dtype == "float32" else 2.0**-53
    bound = 2 * 12 * u * (np.abs(a) @ np.abs(b))
    assert np.all(np.abs(got[:, 6:13] - exact_matmul(a, b)) <= bound)
    assert np.all(got[:, :6] == 5.0) and np.all(got[:, 13:] == 5.0)
