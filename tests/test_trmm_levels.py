"""``L @ B`` for lower-triangular ``L`` by the split's levels (each level's blocks in one
stacked product) against the split one block at a time and the correctly rounded product.

Reference: ``tests._support.exact_matmul``. Bound: each entry is a dot product of at
most ``k`` terms, so ``|L B - fl(L B)| <= gamma_k |L| |B|``; the tests allow ``2 k u``.
The two forms run the same products and add them in the same order, so on the NumPy
backend they agree bit for bit.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
from mpqr.backends import get_backend

from mpqr.qr import _kernels
from tests._support import exact_matmul, to_numpy

aa = sys.modules["mpqr._array_api"]


def _backend(xp):
    return get_backend(aa.array_namespace(xp.asarray(1.0)))


@pytest.mark.parametrize(("k", "ncols", "cutoff"), [(512, 70, 64), (768, 33, 64),
                                                    (256, 9, 128), (96, 40, 64),
                                                    (100, 8, 64)])
@pytest.mark.parametrize("unit", [False, True])
def test_levels_match_the_split_and_the_exact_product(xp, monkeypatch, k, ncols, cutoff,
                                                      unit):
    rng = np.random.default_rng(k + ncols)
    lh = rng.standard_normal((k, k))
    bh = rng.standard_normal((k, ncols))
    # unit: the vectors below the diagonal, anything on and above it (R's place)
    ref_l = np.tril(lh, -1) + np.eye(k) if unit else np.tril(lh)
    exact = exact_matmul(ref_l, bh)
    be = _backend(xp)
    l = xp.asarray(lh if unit else np.tril(lh))
    b = xp.asarray(bh)
    got = {}
    for levels in (True, False):
        monkeypatch.setattr(_kernels, "TRMM_BATCHED", levels)
        got[levels] = to_numpy(_kernels.trmm_lower(l, b, precision="fp64", label="t",
                                                   backend=be, cutoff=cutoff,
                                                   unit_implicit=unit))
    u = np.finfo(np.float64).eps
    bound = 2 * k * u * (np.abs(ref_l) @ np.abs(bh))
    for v in got.values():
        assert v.shape == (k, ncols)
        assert np.all(np.abs(v - exact) <= bound)
    if xp.__name__.startswith("numpy"):
        np.testing.assert_array_equal(got[True], got[False])


def test_levels_run_one_product_a_level(monkeypatch):
    import mpqr

    be = get_backend(aa.array_namespace(np.asarray(1.0)))
    l = np.tril(np.random.default_rng(0).standard_normal((512, 512)))
    b = np.ones((512, 4))
    calls = {}
    for levels in (True, False):
        monkeypatch.setattr(_kernels, "TRMM_BATCHED", levels)
        with mpqr.explain() as trace:
            _kernels.trmm_lower(l, b, precision="fp64", label="t", backend=be, cutoff=64)
        calls[levels] = [(g.label, g.shape, g.batch) for g in trace.gemms]
    # 512 = 64 x 2^3: the 8 diagonal blocks, then 4, 2 and 1 blocks below them
    assert calls[True] == [("t", (64, 4, 64), 8), ("t-gemm", (64, 4, 64), 4),
                           ("t-gemm", (128, 4, 128), 2), ("t-gemm", (256, 4, 256), 1)]
    assert len(calls[False]) == 15
