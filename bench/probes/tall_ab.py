"""A/B on one GPU at 65536 x 4096: cholqr's ``EARLY_HOST_MAX_N`` (512, or any width on
the host as before) and tc-sgemm's Triton kernel on/off, timed as ``bench qr`` times
(CUDA events, medians), alternated in one process beside ``cupy.linalg.qr``.

``python bench/probes/tall_ab.py`` writes ``$OUT/tall_ab.json``.
"""

import json
import os
import statistics

import cupy as cp
from mpqr.backends.cupy import triton_sgemm as ts

import mpqr
from mpqr.bench._timing import time_it
from mpqr.qr import cholqr

CONFS = {"default": (512, True), "host_any_n": (10**9, True), "no_kernel": (512, False)}


def row(dtype, precision):
    a = cp.random.default_rng(0).standard_normal((65536, 4096), dtype=cp.float64).astype(dtype)
    times = {k: [] for k in CONFS}
    times["cusolver"] = [time_it(cp, lambda: cp.linalg.qr(a), repeat=3)]
    for _ in range(3):
        for k, (host_n, on) in CONFS.items():
            cholqr.EARLY_HOST_MAX_N, ts.ENABLED = host_n, on
            times[k].append(time_it(cp, lambda: mpqr.qr(a, precision=precision), repeat=3))
    cholqr.EARLY_HOST_MAX_N, ts.ENABLED = 512, True
    return {k: round(statistics.median(v) * 1e3, 2) for k, v in times.items()}


def main():
    res = {}
    for dtype, precision in ((cp.float64, "auto"), (cp.float32, "fp32-emulated")):
        res[precision] = row(dtype, precision)
        print(precision, res[precision], flush=True)
        cp.get_default_memory_pool().free_all_blocks()
    with open(os.path.join(os.environ.get("OUT", "/tmp"), "tall_ab.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
