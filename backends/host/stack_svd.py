"""Singular values of a stack of small matrices on the host, the stack split over threads.

LAPACK's SVD of one small matrix runs on one core (its BLAS calls are too small to
thread); NumPy's batched call loops over the members on that one core. Here the stack
is cut into one slice per core, each slice one NumPy call on a worker thread (NumPy's
linalg loops release the GIL) with the host BLAS limited to one thread meanwhile.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from mpqr.backends.host.blas import one_thread

__all__ = ["MIN_MEMBERS_A_THREAD", "threaded_svdvals"]

#: members a thread gets at least (fewer: fewer threads)
MIN_MEMBERS_A_THREAD = 8

_pools: dict[int, ThreadPoolExecutor] = {}


def threaded_svdvals(x: Any, threads: int | None = None) -> np.ndarray:
    """``numpy.linalg.svd(x, compute_uv=False)`` of a NumPy stack ``(..., m, n)``, its
    members spread over ``threads`` threads (default: the cores)."""
    *batch, m, n = x.shape
    flat = x.reshape(-1, m, n)
    k = max(1, min(threads or os.cpu_count() or 1, len(flat) // MIN_MEMBERS_A_THREAD))
    if k == 1:
        return np.linalg.svd(x, compute_uv=False)
    pool = _pools.get(k)
    if pool is None:
        pool = _pools[k] = ThreadPoolExecutor(max_workers=k, thread_name_prefix="mpqr-svd")
    parts = np.array_split(flat, k)
    with one_thread():
        out = list(pool.map(lambda p: np.linalg.svd(p, compute_uv=False), parts))
    return np.concatenate(out).reshape(*batch, min(m, n))
