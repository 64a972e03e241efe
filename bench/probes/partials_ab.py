"""A/B in one process at 65536 x 4096 (float64 ``auto``, float32 ``fp32-emulated``): the
CuPy backend's sum of tc-sgemm's partials into a strided block of a Gram matrix by one
reduction (the default) against the portable backend's addition per partial.

``python bench/probes/partials_ab.py`` prints medians (bench timing: CUDA events).
"""

import statistics

import cupy as cp
from mpqr.backends._base import ArrayAPIBackend
from mpqr.backends.cupy.backend import CupyBackend

import mpqr
from mpqr.bench._timing import time_it

ONE_REDUCTION = CupyBackend.add_partials


def per_partial(self, c, parts):
    if c.flags.c_contiguous:
        return ONE_REDUCTION(self, c, parts)
    return ArrayAPIBackend.add_partials(self, c, parts)


def row(dtype, precision):
    a = cp.random.default_rng(0).standard_normal((65536, 4096), dtype=cp.float64).astype(dtype)
    times = {"one reduction": [], "per partial": []}
    for _ in range(3):
        for name, fn in (("one reduction", ONE_REDUCTION), ("per partial", per_partial)):
            CupyBackend.add_partials = fn
            times[name].append(time_it(cp, lambda: mpqr.qr(a, precision=precision), repeat=3))
    CupyBackend.add_partials = ONE_REDUCTION
    return {k: round(statistics.median(v) * 1e3, 1) for k, v in times.items()}


if __name__ == "__main__":
    for dtype, precision in ((cp.float64, "auto"), (cp.float32, "fp32-emulated")):
        print(precision, row(dtype, precision), flush=True)
        cp.get_default_memory_pool().free_all_blocks()
