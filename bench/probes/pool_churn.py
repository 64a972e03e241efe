"""The lean plan's hand-backs of CuPy's cached blocks, timed against keeping them.

``python3 bench/probes/pool_churn.py OUT.json [ROW ...]`` (rows ``MxN:dtype:precision:plan``,
default the square memory rows). Short of memory, the lean plan hands the pool's cached
blocks back before it starts (``backend.release_cached_memory``) and before each column
block of Q's formation (``backend.reserve_workspace``); each hand-back is a ``cudaFree``
(which waits for the device) and the blocks are taken again by ``cudaMalloc``. For each
row, calls with those hand-backs always (``release``) and never (``keep``) alternate
in one process, three calls a configuration a round, the pool left as a user's loop
leaves it (no ``free_all_blocks`` between calls); wall time of each call to full device
sync. Then, from an empty pool, one call of each configuration: the pool's growth and the
peak of live bytes (multiples of the input), and the factors compared bit for bit.
``cupy.linalg.qr`` beside each shape.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

import cupy as cp
from mpqr.backends.cupy import backend as cb

import mpqr
from mpqr.bench._timing import environment
from mpqr.bench.memory import _hook

POOL = cp.get_default_memory_pool()
ORIGINAL = (cb.CupyBackend.release_cached_memory, cb.CupyBackend.reserve_workspace)
DEFAULT = ["8192x8192:float64:fp64-emulated:lean", "16384x16384:float64:fp64-emulated:lean",
           "16384x16384:float32:fp32-emulated:lean", "16384x16384:float32:fp32-emulated:fast",
           "16384x16384:float32:fp16:lean", "16384x16384:float32:fp16:fast"]


def configure(name: str) -> None:
    release, reserve = ORIGINAL
    if name == "release":  # always, as a call that is short of memory
        cb.CupyBackend.release_cached_memory = \
            lambda self, at_least=0, need=None: release(self, at_least)
        cb.CupyBackend.reserve_workspace = lambda self, nbytes, need=None: reserve(self, nbytes)
    else:
        cb.CupyBackend.release_cached_memory = lambda self, at_least=0, need=None: None
        cb.CupyBackend.reserve_workspace = lambda self, nbytes, need=None: None


def wall(fn) -> float:
    cp.cuda.Device().synchronize()
    t0 = time.perf_counter()
    fn()
    cp.cuda.Device().synchronize()
    return (time.perf_counter() - t0) * 1e3


def one_from_empty(fn, a):
    cp.cuda.Device().synchronize()
    POOL.free_all_blocks()
    base = POOL.total_bytes()
    hook = _hook(cp)
    with hook:
        q, r = fn()
        cp.cuda.Device().synchronize()
    high = max(POOL.total_bytes(), hook.pool_peak)
    return q, r, (high - base) / a.nbytes, hook.peak / a.nbytes


def main(argv):
    out = argv[0]
    rows = argv[1:] or DEFAULT
    res = {"env": environment(cp), "rows": []}
    for spec in rows:
        shape, dt, prec, plan = spec.split(":")
        m, n = (int(v) for v in shape.split("x"))
        os.environ["MPQR_MEMORY_PLAN"] = plan
        a = cp.random.default_rng(0).standard_normal((m, n), dtype=cp.float64).astype(dt)
        an = float(cp.linalg.norm(a.astype(cp.float64)))

        def call(a=a, prec=prec):
            return mpqr.qr(a, precision=prec)

        row = {"row": spec, "times_ms": {"release": [], "keep": [], "cusolver": []}}
        configure("release")
        call()  # compiles
        for name in ("release", "keep"):
            configure(name)
            q, r, pool_x, live_x = one_from_empty(call, a)
            row[f"{name}_pool_x"], row[f"{name}_live_x"] = pool_x, live_x
            be = float(cp.linalg.norm(q.astype(cp.float64) @ r.astype(cp.float64)
                                      - a.astype(cp.float64)) / an)
            row[f"{name}_backward"] = be
            row[f"{name}_q"] = q
            row[f"{name}_r"] = r
            del q, r
        row["bitwise"] = bool(cp.array_equal(row.pop("release_q"), row.pop("keep_q"))
                              and cp.array_equal(row.pop("release_r"), row.pop("keep_r")))
        POOL.free_all_blocks()
        for _ in range(4):
            for name in ("release", "keep", "cusolver"):
                configure("release" if name == "cusolver" else name)
                fn = (lambda a=a: cp.linalg.qr(a)) if name == "cusolver" else call
                for _ in range(3):
                    row["times_ms"][name].append(wall(fn))
        cb.CupyBackend.release_cached_memory, cb.CupyBackend.reserve_workspace = ORIGINAL
        row["median_ms"] = {k: statistics.median(v) for k, v in row["times_ms"].items()}
        med = row["median_ms"]
        print(f"{spec:<44} release {med['release']:7.1f}  keep {med['keep']:7.1f}  "
              f"cusolver {med['cusolver']:7.1f} ms | pool {row['release_pool_x']:.2f}x / "
              f"{row['keep_pool_x']:.2f}x, live {row['release_live_x']:.2f}x / "
              f"{row['keep_live_x']:.2f}x | bitwise {row['bitwise']} | backward "
              f"{row['release_backward']:.2e}", flush=True)
        res["rows"].append(row)
        del a
        POOL.free_all_blocks()
        with open(out, "w") as f:
            json.dump(res, f, indent=1, default=str)
    os.environ.pop("MPQR_MEMORY_PLAN", None)


if __name__ == "__main__":
    main(sys.argv[1:])
