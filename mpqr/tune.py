"""Measured engine rates for the cost model: :func:`tune` and its cache.

``mpqr.tune()`` times native float64/float32 GEMM, the fp16 and int8
tensor-core GEMMs, memory bandwidth and launch overhead on the current device
and stores them in ``$XDG_CACHE_HOME/mpqr/rates.json`` (``~/.cache/mpqr`` when
unset), keyed by device name and the mpqr/array-library versions. The CuPy
backend's ``rates()`` returns the cached entry when there is one, else its
shipped defaults; the policy's predicted times (shown by ``mpqr.explain()``)
come from these rates.
"""

from __future__ import annotations

import functools
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["cache_path", "load_cached_rates", "rates_key", "tune"]

_lock = threading.Lock()
_memo: dict[tuple[str, str, float], dict[str, float] | None] = {}


def cache_path() -> Path:
    """``$XDG_CACHE_HOME/mpqr/rates.json`` (``~/.cache/mpqr/rates.json`` if unset)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "mpqr" / "rates.json"


@functools.cache
def _versions() -> tuple[str, ...]:
    # package metadata parsing is slow: once per process
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for pkg in ("mpqr", "numpy", "cupy"):
        try:
            out.append(f"{pkg}={version(pkg)}")
        except PackageNotFoundError:
            continue
    return tuple(out)


#: bumped whenever this process writes new rates; backends memoize per generation
generation = 0


def rates_key(backend: Any) -> str:
    """Cache key: device name and the versions that can change the rates."""
    return "|".join([backend.device_name(), backend.name, *_versions()])


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def load_cached_rates(backend: Any) -> dict[str, float] | None:
    """The cached rates of this device and versions, or ``None`` (thread-safe)."""
    path = cache_path()
    key = rates_key(backend)
    try:
        mtime = path.stat().st_mtime_ns
    except OSError:
        return None
    memo_key = (str(path), key, mtime)
    with _lock:
        if memo_key in _memo:
            return _memo[memo_key]
        entry = _read(path).get(key)
        ok = isinstance(entry, dict) and all(
            isinstance(v, (int, float)) and v > 0 for v in entry.values())
        rates = {k: float(v) for k, v in entry.items()} if ok else None
        _memo[memo_key] = rates
        return rates


def _time(backend: Any, fn: Any, repeats: int) -> float:
    fn()  # warm-up (kernel compilation, cuBLAS heuristics)
    backend.synchronize()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        backend.synchronize()
        best = min(best, time.perf_counter() - t0)
    return max(best, 1e-9)


def tune(xp: Any = None, *, size: int = 4096, repeats: int = 3, save: bool = True) -> dict:
    """Measure the engine rates of the current device and cache them.

    Parameters
    ----------
    xp : array namespace, optional
        The library whose device is measured (default: CuPy when a GPU is
        visible, else NumPy).
    size : int, optional
        Square GEMM size used for the rates (>= 16; 4096 reaches peak on H100).
        The INT8 rate on tensor cores is measured at least at 8192 (8 planes), the
        sizes where the Ozaki engine can pay.
    repeats : int, optional
        Timed repetitions; the best is kept.
    save : bool, optional
        Write the result to the cache file (see :func:`cache_path`).

    Returns
    -------
    rates : dict
        ``native-fp64``, ``native-fp32`` (FLOP/s), ``tc-fp16`` and ``int8``
        (OP/s, when the backend has those engines), ``bandwidth`` (B/s) and
        ``launch_s`` (seconds per small kernel).

    Raises
    ------
    ValueError
        ``size`` below 16 or ``repeats`` not positive.

    Examples
    --------
    >>> import numpy as np
    >>> from mpqr.tune import tune
    >>> rates = tune(np, size=64, repeats=1, save=False)
    >>> rates["native-fp64"] > 0
    True
    """
    if isinstance(size, bool) or not isinstance(size, int) or size < 16:
        raise ValueError(f"`size` must be an int >= 16, got {size!r}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"`repeats` must be a positive int, got {repeats!r}")
    from mpqr._array_api import array_namespace, device
    from mpqr.backends import get_backend

    if xp is None:
        xp = _default_namespace()
    # the raw library module (``tune(cupy)``) or its compat namespace: use the latter
    xp = array_namespace(xp.zeros(1))
    backend = get_backend(xp)

    dev = device(xp.zeros(1))
    flops = 2.0 * size**3
    rates: dict[str, float] = {}
    # varied, non-zero data: zeros or constants can run faster than real inputs
    vals = xp.reshape(xp.sin(xp.arange(size * size, dtype=xp.float64, device=dev) * 0.7071),
                      (size, size))
    for key, dt in (("native-fp64", xp.float64), ("native-fp32", xp.float32)):
        a = xp.astype(vals, dt)
        rates[key] = flops / _time(backend, lambda a=a: backend.gemm(a, a), repeats)
    if "fp16" in backend.capabilities:
        a16 = backend.to_fp16(xp.astype(vals, xp.float32))
        rates["tc-fp16"] = flops / _time(backend, lambda: backend.gemm_fp16(a16, a16), repeats)
    if "int8" in backend.capabilities:
        if hasattr(backend, "ozaki_int8_gemms"):
            # the layout the Ozaki engine runs (both operands k-contiguous), batched over
            # planes as it runs them, at the sizes where emulation can pay: on tensor
            # cores smaller products under-report the rate (H200, one 4096^3 plane: 837
            # TOPS vs 1170 for 15 planes of 16384^3; H100, 8 planes of 4096^3: 957 TOPS,
            # which moved the predicted break-even from 16384 to 24576 although the
            # measured 16384^3 was 1.24x DGEMM)
            tc = "tensor-cores" in backend.capabilities
            planes, n8 = (8, max(size, 8192)) if tc else (1, size)
            a8 = xp.astype(xp.reshape(xp.sin(xp.arange(
                n8 * n8, dtype=xp.float32, device=dev) * 0.7071), (n8, n8)) * 127.0, xp.int8)
            a3 = xp.stack([a8] * planes)
            rates["int8"] = planes * 2.0 * n8**3 / _time(
                backend, lambda: backend.ozaki_int8_gemms(a3, a3, 0, n8), repeats)
            del a3
        else:
            a8 = xp.astype(vals * 127.0, xp.int8)
            rates["int8"] = flops / _time(backend, lambda: backend.gemm_int8(a8, a8), repeats)
    del vals
    # a copy far larger than any cache: 256 MiB read + 256 MiB written
    big = xp.ones((2**25,), dtype=xp.float64, device=dev)
    rates["bandwidth"] = 2.0 * 8 * 2**25 / _time(backend, lambda b=big: b * 2.0, repeats)
    del big
    tiny = xp.ones((4,), dtype=xp.float64, device=dev)
    n_launch = 50

    def launches() -> None:
        for _ in range(n_launch):
            tiny + 1.0
    rates["launch_s"] = _time(backend, launches, repeats) / n_launch
    if save:
        _store(rates_key(backend), rates)
    return rates


def _default_namespace() -> Any:
    from mpqr.backends.cupy.backend import gpu_namespace
    from mpqr.backends.numpy.backend import host_namespace

    return gpu_namespace() or host_namespace()


def _store(key: str, rates: dict[str, float]) -> None:
    path = cache_path()
    with _lock:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = _read(path)
        data[key] = rates
        tmp = path.with_suffix(f".tmp{os.getpid()}.{threading.get_ident()}")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, path)  # atomic: readers never see a half-written file
        _memo.clear()
        global generation
        generation += 1
