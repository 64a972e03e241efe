"""Helpers of the out-of-core tests: a device fixture and a host "dataset" that is no
NumPy array (as h5py/zarr datasets), counting its reads and failing on request."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import GPU

#: the out-of-core driver on the NumPy backend (the host) and on CuPy (device="cuda")
DEVICES = [pytest.param(None, id="numpy"),
           pytest.param("cuda", id="cupy", marks=pytest.mark.skipif(not GPU,
                                                                    reason="no CUDA GPU"))]


class Dataset:
    """``shape``, ``dtype`` and NumPy-style slicing over a NumPy array; ``fail_at``: the
    read (1-based) that raises ``exc``, ``times`` times in a row. ``rows_read`` counts
    the rows of every read, so ``rows_read / shape[0]`` is the number of passes."""

    def __init__(self, arr, fail_at=None, exc=KeyboardInterrupt, times=1):
        self.arr, self.fail_at, self.exc, self.times = arr, fail_at, exc, times
        self.shape, self.dtype, self.ndim = arr.shape, arr.dtype, arr.ndim
        self.reads = 0
        self.rows_read = 0
        self.failures = 0

    @property
    def passes(self):
        return self.rows_read / self.shape[0]

    def __getitem__(self, key):
        self.reads += 1
        rows = key[0] if isinstance(key, tuple) else key
        self.rows_read += len(range(*rows.indices(self.shape[0]))) \
            if isinstance(rows, slice) else self.shape[0]
        if self.fail_at is not None and self.reads >= self.fail_at and \
                self.failures < self.times:
            self.failures += 1
            self.reads = 0
            raise self.exc("injected fault")
        return self.arr[key]

    def __setitem__(self, key, value):
        raise AssertionError("the input must never be written")


def ooc_events(trace, route="out-of-core"):
    return [e for e in trace.events if e.kind == "out-of-core" and e.data.get("route") == route]


def rand(rng, shape, dtype):
    a = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        a = a + 1j * rng.standard_normal(shape)
    return a.astype(dtype)


@pytest.fixture
def one_pass_lstsq(monkeypatch):
    """The one-pass out-of-core lstsq on the NumPy backend too (its portable double-double
    Gram matrix is the GPU kernel's reference; the backend leaves it off for speed)."""
    from mpqr.backends import get_backend

    monkeypatch.setattr(type(get_backend(np)), "gram_dd_max_n", 128)
