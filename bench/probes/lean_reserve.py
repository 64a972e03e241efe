"""The lean plan's estimate reserved at its start or not, fp64-emulated, alternated.

``python3 bench/probes/lean_reserve.py OUT.json`` (CuPy): for square and tall float64
inputs, rounds of one :func:`mpqr.bench.memory.measure_call` (the pool's growth and the
live peak from an empty pool) and 4 timed calls with
``mpqr.qr.householder_recursive.LEAN_RESERVE`` False and True, the size threshold
(``LEAN_RESERVE_MIN_ELEMENTS``) and the shape rule set aside; the lean estimate beside.
"""

from __future__ import annotations

import importlib
import json
import statistics as st
import sys

import cupy as cp
from graphs_gpu import _ms  # the probe beside this one

import mpqr
from mpqr.bench.memory import calls_as_they_run, measure_call

SHAPES = [(8192, 8192), (10240, 10240), (12288, 12288), (16384, 16384), (20480, 20480),
          (65536, 8192), (32768, 8192)]


def main(out_path: str) -> None:
    hr = importlib.import_module("mpqr.qr.householder_recursive")
    mp = importlib.import_module("mpqr.qr.memory_plan")
    hr.LEAN_RESERVE_MIN_ELEMENTS = 0
    rule = hr.lean_reserves
    hr.lean_reserves = lambda m, n, need: hr.LEAN_RESERVE and need is not None
    out = {}
    try:
        for shape in SHAPES:
            a = cp.random.default_rng(0).standard_normal(shape, dtype=cp.float64)

            def fn(x):
                return mpqr.qr(x, precision="fp64-emulated", method="householder-recursive")

            rows = {f: {"pool": [], "live": [], "ms": []} for f in (False, True)}
            for _ in range(2 if shape[0] * shape[1] > 2**28 else 3):
                for flag in (False, True):
                    hr.LEAN_RESERVE = flag
                    m = measure_call(cp, fn, a)
                    rows[flag]["pool"].append(round(m["pool_multiple"], 3))
                    rows[flag]["live"].append(round(m["peak_live_multiple"], 3))
                    with calls_as_they_run():
                        fn(a)
                        cp.cuda.Device().synchronize()
                        rows[flag]["ms"] += [round(x, 1) for x in _ms(lambda a=a: fn(a), 4)]
            key = "x".join(map(str, shape))
            est = mp.estimate_bytes("householder-recursive", "fp64-emulated", shape, 8, "lean")
            out[key] = {"lean_estimate": est / a.nbytes,
                        **{str(k): {**v, "median_ms": st.median(v["ms"])}
                           for k, v in rows.items()}}
            print(key, json.dumps(out[key]), flush=True)
            del a
            cp.get_default_memory_pool().free_all_blocks()
    finally:
        hr.lean_reserves = rule
        hr.LEAN_RESERVE = True
    with open(out_path, "w") as fh:
        json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
