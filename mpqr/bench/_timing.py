"""Timing and environment helpers shared by the benchmarks."""

from __future__ import annotations

import datetime as _dt
import json
import pathlib
import platform
import statistics
import time
from typing import Any

import numpy as np


def default_xp():
    """CuPy when a CUDA GPU is visible, else NumPy."""
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() > 0:
            return cupy
    except Exception:
        pass
    return np


def is_cupy(xp) -> bool:
    return getattr(xp, "__name__", "") == "cupy"


def sync(xp) -> None:
    if is_cupy(xp):
        xp.cuda.get_current_stream().synchronize()


def release_pool(xp) -> None:
    """Return the CuPy memory pool's cached blocks to the device, so that each timed
    configuration starts from the same pool state (not from the previous one's blocks)."""
    if is_cupy(xp):
        xp.get_default_memory_pool().free_all_blocks()


def time_it(xp, fn, *, repeat: int = 5, warmup: int = 1, max_seconds: float = 20.0) -> float:
    """Median seconds per call; CUDA events on the GPU, perf_counter on the CPU."""
    return statistics.median(call_times(xp, fn, repeat=repeat, warmup=warmup,
                                        max_seconds=max_seconds))


def call_times(xp, fn, *, repeat: int = 5, warmup: int = 1,
               max_seconds: float = 20.0) -> list[float]:
    """Seconds of each of up to ``repeat`` calls of ``fn`` after ``warmup`` calls (CUDA
    events on the GPU, perf_counter on the CPU); no new call past ``max_seconds``."""
    for _ in range(warmup):
        fn()
    sync(xp)
    times = []
    t_start = time.perf_counter()
    for _ in range(repeat):
        if is_cupy(xp):
            start, stop = xp.cuda.Event(), xp.cuda.Event()
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            times.append(xp.cuda.get_elapsed_time(start, stop) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        if time.perf_counter() - t_start > max_seconds:
            break
    return times


def to_host(x) -> np.ndarray:
    return x.get() if hasattr(x, "get") else np.asarray(x)


def environment(xp) -> dict[str, Any]:
    import mpqr
    from mpqr._array_api import array_namespace
    from mpqr.backends import get_backend

    env = {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d"),
        "mpqr": mpqr.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "backend": getattr(xp, "__name__", str(xp)),
        "device": get_backend(array_namespace(xp.ones(1))).device_name(),
    }
    if is_cupy(xp):
        env["cupy"] = xp.__version__
        env["cuda_runtime"] = xp.cuda.runtime.runtimeGetVersion()
        try:
            from cupy.cuda import cublas

            env["cublas"] = cublas.getVersion(xp.cuda.device.get_cublas_handle())
        except Exception:
            pass
    return env


def write_json(path: str | None, payload: dict[str, Any]) -> None:
    if not path:
        return
    p = pathlib.Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(payload, indent=2, default=str))
    print(f"wrote {p}")


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    """``"MxN,BxMxN"`` -> ``[(M, N, 1), (M, N, B)]``: the benches' ``--shapes`` syntax."""
    shapes = []
    for s in text.split(","):
        v = [int(t) for t in s.split("x")]
        shapes.append((v[0], v[1], 1) if len(v) == 2 else (v[1], v[2], v[0]))
    return shapes


def shapes_or_default(text: str | None, xp, gpu: list, cpu: list) -> list:
    """The ``--shapes`` argument parsed, or the bench's default shapes for ``xp``."""
    if text:
        return parse_shapes(text)
    return gpu if is_cupy(xp) else cpu
