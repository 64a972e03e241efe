"""``python -m mpqr bench qr --cpu --lapack``: mpqr.qr on the NumPy backend against the
host's LAPACK QR as NumPy and SciPy call it.

For each shape (float64, mode reduced): ``numpy.linalg.qr``, ``scipy.linalg.qr(mode=
"economic")`` and ``mpqr.qr`` are timed interleaved in one process (one call of each per
round, so load from other processes falls on all three alike), median over ``repeat``
rounds after a warm-up round, each round starting with the next of the three; every
round's wall and CPU times are kept in the JSON. mpqr's row also
carries its backward error and orthogonality, and the ratio of its median to each
baseline's (below 1: mpqr is faster).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np

__all__ = ["LAPACK_SHAPES", "run_lapack"]

#: the default shapes: the square QR where the library route decides
LAPACK_SHAPES = [(4000, 4000, 1)]


def run_lapack(shapes, *, repeat: int = 3, threads: int | None = None) -> dict[str, Any]:
    """Rows of median seconds per implementation, timed interleaved; ``threads`` limits
    the BLAS threads of every call alike (threadpoolctl; on a shared machine one thread
    a call measures the work without the threads' wake-ups)."""
    import scipy.linalg  # loaded first: threadpoolctl limits the BLASes loaded only

    if threads is not None:
        from threadpoolctl import threadpool_limits

        with threadpool_limits(limits=threads, user_api="blas"):
            out = run_lapack(shapes, repeat=repeat)
        out["blas_threads"] = threads
        return out
    import scipy
    import scipy.linalg as sl

    import mpqr
    from mpqr.bench._timing import environment

    rows = []
    for m, n, batch in shapes:
        if batch != 1:
            raise ValueError(f"--lapack times single matrices; got a batch of {batch}")
        a = np.random.default_rng(0).standard_normal((m, n))
        calls = {"numpy.linalg.qr": lambda a=a: np.linalg.qr(a),
                 "scipy.linalg.qr economic": lambda a=a: sl.qr(a, mode="economic"),
                 "mpqr.qr": lambda a=a: mpqr.qr(a)}
        times: dict[str, list[float]] = {k: [] for k in calls}
        cpu: dict[str, list[float]] = {k: [] for k in calls}
        names = list(calls)
        for rnd in range(repeat + 1):  # round 0 warms up
            # each round starts with the next implementation: none always follows another
            for name in names[rnd % 3:] + names[:rnd % 3]:
                fn = calls[name]
                t0, c0 = time.perf_counter(), time.process_time()
                fn()
                if rnd:
                    times[name].append(time.perf_counter() - t0)
                    cpu[name].append(time.process_time() - c0)
        q, r = mpqr.qr(a)
        med = {k: statistics.median(v) for k, v in times.items()}
        for name in calls:
            row = {"shape": [m, n], "dtype": "float64", "mode": "reduced",
                   "implementation": name, "median_s": med[name],
                   "runs_s": [round(t, 4) for t in times[name]],
                   "cpu_s": [round(t, 4) for t in cpu[name]]}
            if name == "mpqr.qr":
                row["vs_numpy"] = med[name] / med["numpy.linalg.qr"]
                row["vs_scipy"] = med[name] / med["scipy.linalg.qr economic"]
                row["backward_error"] = float(np.linalg.norm(a - q @ r) / np.linalg.norm(a))
                row["orthogonality"] = float(np.linalg.norm(np.eye(n) - q.T @ q) / n)
            rows.append(row)
            print(f"{m}x{n} {name:26s} median {med[name]:.3f} s  runs "
                  f"{', '.join(f'{t:.3f}' for t in times[name])}")
    env = environment(np)
    env["scipy"] = scipy.__version__
    try:
        from threadpoolctl import threadpool_info

        env["blas"] = ", ".join(f"{i['internal_api']} {i['version']} ({i['num_threads']} "
                                f"threads, {i['prefix']})" for i in threadpool_info()
                                if i.get("user_api") == "blas")
    except Exception:
        pass
    import os

    env["cpu_count"] = os.cpu_count()
    return {"environment": env, "timing": "interleaved rounds, median", "repeat": repeat,
            "results": rows}
