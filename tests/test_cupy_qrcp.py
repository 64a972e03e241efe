"""GPU tests of the sketch-QRCP kernels (``backends/cupy/qrcp.py``, CuPy only).

The kernels run LAPACK geqp3's choice rule — the column of largest remaining norm,
the first of equals — with each remaining norm recomputed from its entries instead of
downdated. A textbook QRCP in float64 on the host with exact norms makes the same
choices wherever the largest and second-largest remaining norms differ by more than
rounding, which random sketches with graded columns do; and pivoted QR on the GPU
through these pivots stays a QR to working precision.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import GPU

if not GPU:
    pytest.skip("no CUDA GPU visible", allow_module_level=True)
import cupy as cp
from mpqr.backends.cupy import qrcp as cupy_qrcp

import mpqr


def _textbook_pivots(y: np.ndarray, k: int) -> list[int]:
    """Householder QR with column pivoting on exact remaining norms (float64)."""
    w = np.array(y, dtype=np.float64)
    rows, cols = w.shape
    perm = list(range(cols))
    for i in range(min(k, rows, cols)):
        norms = np.sum(w[i:, i:] ** 2, axis=0)
        p = i + int(np.argmax(norms))  # argmax: the first of equals
        w[:, [i, p]] = w[:, [p, i]]
        perm[i], perm[p] = perm[p], perm[i]
        x = w[i:, i]
        v = x.copy()
        v[0] += np.copysign(np.linalg.norm(x), x[0])
        if np.dot(v, v) > 0:
            w[i:, i:] -= np.outer(v, 2 * (v @ w[i:, i:]) / np.dot(v, v))
    return perm[:min(k, rows, cols)]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape,k", [((136, 2000), 128), ((20, 7), 20), ((40, 300), 40),
                                     ((136, 129), 128)])
def test_kernel_pivots_are_the_textbook_choice(dtype, shape, k):
    rng = np.random.default_rng(shape[1])
    y = rng.standard_normal(shape) * np.geomspace(1, 1e-3, shape[1])[rng.permutation(shape[1])]
    y = y.astype(dtype)
    yd = cp.asarray(y)
    got = cupy_qrcp.qrcp_pivots(yd, k)
    assert got == _textbook_pivots(y, k)
    np.testing.assert_array_equal(yd.get(), y)  # the sketch is not modified
    assert len(set(got)) == len(got)


def test_kernel_order_is_the_swap_order_of_its_pivots():
    """The device order the pivoted QR moves columns by: the pivots first, each displaced
    column where its pivot came from (LAPACK's swaps), nothing read back to the host."""
    from mpqr.backends._base import swap_order

    rng = np.random.default_rng(5)
    y = rng.standard_normal((40, 300)) * np.geomspace(1, 1e-2, 300)[rng.permutation(300)]
    order = cupy_qrcp.qrcp_order(cp.asarray(y), 40)
    assert isinstance(order, cp.ndarray) and order.dtype == cp.int32
    piv = _textbook_pivots(y, 40)
    assert order.get().tolist() == swap_order(piv, 300)


def test_kernel_takes_zero_columns_in_place_order():
    """All remaining norms zero: the first of equals, after the swaps of earlier steps
    (as geqp3: column 0 went where column 4 was)."""
    y = np.zeros((10, 6))
    y[:, 4] = 1.0
    assert cupy_qrcp.qrcp_pivots(cp.asarray(y), 3) == _textbook_pivots(y, 3) == [4, 1, 2]


def test_pivoted_qr_through_the_kernel_is_rank_revealing():
    rng = np.random.default_rng(3)
    m, n = 3000, 700  # above the randomized route's size: several 128-column blocks
    u, _ = np.linalg.qr(rng.standard_normal((m, n)))
    v, _ = np.linalg.qr(rng.standard_normal((n, n)))
    s = np.geomspace(1, 1e-12, n)
    a = (u * s) @ v.T
    q, r, p = mpqr.qr(cp.asarray(a), pivoting=True)
    q, r, p = q.get(), r.get(), p.get()
    assert np.linalg.norm(a[:, p] - q @ r) / np.linalg.norm(a) <= 10 * n * 2.0**-53
    assert np.linalg.norm(q.T @ q - np.eye(n)) / n <= 10 * 2.0**-53 * np.sqrt(n)
    d = np.abs(np.diag(r))
    ks = np.arange(0, n, 50)
    assert np.all(d[ks] <= 10 * s[ks]) and np.all(d[ks] >= s[ks] / 10)
