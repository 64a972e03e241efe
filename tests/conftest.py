"""Test fixtures in the array-api-extra style.

``xp`` runs a test over every backend: NumPy, a read-only NumPy (arrays the
test creates through ``xp`` cannot be written, so accidental writes into
inputs raise), array-api-strict (only the standard), and CuPy (skipped
without a GPU). ``@pytest.mark.skip_xp_backend("array_api_strict", reason=...)``
skips one backend with a reason.
"""

from __future__ import annotations

import importlib
import os
import types

import numpy as np
import pytest

BACKENDS = ["numpy", "numpy_readonly", "array_api_strict", "cupy"]


def _gpu_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


GPU = _gpu_available()


def _limit_blas_threads_per_xdist_worker() -> None:
    """Under pytest-xdist, the cores shared out between the worker processes: each
    worker's BLAS and OpenMP pools get ``cores // workers`` threads (at least one), so
    that the workers' threads do not outnumber the cores (oversubscribed OpenBLAS threads
    spin and can make a product tens of times slower)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if workers < 1:
        return
    import scipy.linalg  # noqa: F401  (SciPy's own OpenBLAS, loaded before the limit)
    from threadpoolctl import threadpool_limits

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        (os.cpu_count() or 1)
    threadpool_limits(max(1, cores // workers))


_limit_blas_threads_per_xdist_worker()


class _ReadOnlyNumpy(types.ModuleType):
    """NumPy whose array constructors return read-only arrays."""

    _wrap = frozenset({"asarray", "array", "zeros", "ones", "eye", "arange", "linspace", "full",
             "empty", "zeros_like", "ones_like", "full_like"})

    def __init__(self):
        super().__init__("numpy_readonly")

    def __getattr__(self, name):
        attr = getattr(np, name)
        if name in self._wrap:
            def wrapped(*args, **kwargs):
                out = np.array(attr(*args, **kwargs), copy=True)
                out.flags.writeable = False
                return out
            return wrapped
        return attr


@pytest.fixture(params=BACKENDS)
def xp(request):
    name = request.param
    for marker in request.node.iter_markers("skip_xp_backend"):
        if marker.args and marker.args[0] == name:
            pytest.skip(marker.kwargs.get("reason", f"not for {name}"))
    if name == "cupy":
        if not GPU:
            pytest.skip("no CUDA GPU visible")
        import cupy

        return cupy
    if name == "numpy_readonly":
        return _ReadOnlyNumpy()
    return importlib.import_module(name)


@pytest.fixture
def general_lstsq_route(monkeypatch):
    """Small least-squares problems on mpqr's general route instead of the small-input
    fast path (which runs under ``explain()`` too): for tests of the general route's
    steps at sizes the fast path would take."""
    from mpqr import _fast

    monkeypatch.setattr(_fast, "lstsq", lambda *args, **kwargs: _fast.MISS)


@pytest.fixture
def dask_threads():
    """Dask's threaded scheduler for the test (no distributed client); skipped where
    Dask (an optional extra) is not installed."""
    dask = pytest.importorskip("dask")

    with dask.config.set(scheduler="threads"):
        yield


def pytest_report_header(config):
    return f"mpqr test backends: {', '.join(BACKENDS)} (GPU visible: {GPU})"
