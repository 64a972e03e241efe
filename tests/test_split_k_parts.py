"""The rule that splits a long-inner-dimension float64 product along it
(``backends/cupy/split_k.py``; the split itself is tested on a GPU in
``test_cupy_split_k.py``). The rule is pure arithmetic, checked here on the CPU."""

from __future__ import annotations

import numpy as np
import pytest
from mpqr.backends.cupy import split_k


@pytest.mark.parametrize(("m", "n", "k", "want"), [
    (64, 64, 2**22, 1024),       # a 2^22 x 64 Gram matrix: 1024 chunks of 4096 rows
    (64, 64, 2**21, 512),        # the partials' cap (1/64 of the operand) binds
    (32, 32, 2**21, 1024),
    (64, 48, 2**24, 1024),
    (64, 64, 2**21 - 1, 0),      # too short
    (128, 128, 2**22, 0),        # outputs past 64 gained nothing
    (16, 64, 2**22, 0),          # nor thin ones
])
def test_parts(m, n, k, want):
    assert split_k.parts(m, n, k, np.dtype(np.float64), np) == want


def test_only_float64():
    for dt in (np.float32, np.float16, np.complex128, np.int8):
        assert split_k.parts(64, 64, 2**22, np.dtype(dt), np) == 0


@pytest.mark.parametrize("n", [32, 40, 48, 56, 64])
@pytest.mark.parametrize("k", [2**21, 2**21 + 12345, 2**22, 3 * 2**22 + 7, 2**25])
def test_partials_within_their_share_of_the_operand(n, k):
    p = split_k.parts(n, n, k, np.dtype(np.float64), np)
    assert 0 < p <= split_k.MAX_PARTS
    assert k // p >= split_k.CHUNK  # every chunk at least CHUNK rows
    # p partial n x n blocks against the operand's n x k
    assert p * n * n <= split_k.MAX_WORKSPACE * n * k
