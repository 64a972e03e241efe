"""Workspace of the reduced QR beyond Q and R, measured with ``tracemalloc`` on the
NumPy backend (the same core code as the GPU; docs/methods.md, "Memory"). The bounds
are the documented figures: the test fails if a change makes a method allocate more."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import mpqr

#: method -> (shape, precision, documented bound on the workspace beyond Q and R, as a
#: multiple of the input's bytes)
CASES = [
    ("cholqr2", (8192, 128), "fp64", 1.25),
    ("householder-recursive", (2048, 256), "fp64", 1.75),
    ("householder-recursive", (2048, 1024), "fp64", 1.75),  # 16 leaves of 64
    ("householder-recursive", (1024, 1024), "fp64", 1.25),  # R in the working copy
    ("householder-recursive", (8192, 128), "fp32-emulated", 4.0),
    ("householder-tiled", (2048, 256), "fp64", 5.1),
]


def _workspace(a, method, precision):
    mpqr.qr(a, method=method, precision=precision)  # warm-up: caches, lazy imports
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        q, r = mpqr.qr(a, method=method, precision=precision)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return (peak - q.nbytes - r.nbytes) / a.nbytes


@pytest.mark.parametrize("method, shape, precision, bound", CASES)
def test_reduced_qr_workspace_stays_within_the_documented_figure(method, shape, precision,
                                                                 bound):
    a = np.random.default_rng(0).standard_normal(shape)
    ws = _workspace(a, method, precision)
    # at least the working copy of the input (nothing is overwritten without overwrite_a),
    # except where R is left in it (a square input of the recursion: R is that copy)
    floor = 0.0 if method == "householder-recursive" and shape[0] == shape[1] else 1.0
    assert floor <= ws <= bound, ws


@pytest.mark.parametrize("method", ["householder-recursive", "gram-schmidt-recursive",
                                    "householder-tiled", "cholqr2"])
def test_working_arrays_are_freed_on_return_without_a_garbage_collection(method):
    """A recursive closure refers to itself; unless that cycle is cut, its working arrays
    stay allocated after the return until the cyclic collector runs (on a GPU: pool
    memory held for no one)."""
    import gc

    a = np.random.default_rng(1).standard_normal((2048, 256))
    mpqr.qr(a, method=method, precision="fp64")
    gc.collect()
    gc.disable()
    tracemalloc.start()
    try:
        q, r = mpqr.qr(a, method=method, precision="fp64")
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        gc.enable()
    assert held <= 1.05 * (q.nbytes + r.nbytes), held / a.nbytes
