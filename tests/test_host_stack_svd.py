"""Singular values of a stack on the host over threads: the members' values and the
stack's shape as NumPy's one call gives them."""

from __future__ import annotations

import numpy as np
import pytest
from mpqr.backends.host.stack_svd import MIN_MEMBERS_A_THREAD, threaded_svdvals


@pytest.mark.parametrize("shape", [(2, 3 * MIN_MEMBERS_A_THREAD, 12, 9),
                                   (5 * MIN_MEMBERS_A_THREAD, 7, 11), (3, 6, 6)])
def test_threaded_svdvals_equals_numpy(shape):
    x = np.random.default_rng(len(shape)).standard_normal(shape)
    x0 = x.copy()
    s = threaded_svdvals(x, threads=4)
    ref = np.linalg.svd(x, compute_uv=False)
    assert s.shape == ref.shape and s.dtype == ref.dtype
    assert np.array_equal(s, ref) and np.array_equal(x, x0)
