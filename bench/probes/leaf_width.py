"""Square QR: the certified leaves' width, A/B in one process.

``python3 bench/probes/leaf_width.py OUT.json [N ...]`` (default 16384 32768): ``mpqr.qr``
of an ``N x N`` matrix (float32 at fp16 and fp32-emulated, float64 at fp64-emulated)
with :data:`~mpqr.qr.householder_recursive.MAX_CERTIFIED_LEAF_WIDTH` at each of
:data:`WIDTHS`, alternating, twice; cuSOLVER beside it.
"""

from __future__ import annotations

import importlib
import json
import sys

import cupy as cp

import mpqr
from mpqr.bench._timing import environment, release_pool, time_it

hr = importlib.import_module("mpqr.qr.householder_recursive")  # mpqr.qr is the function
WIDTHS = (256, 512, 1024)
PRECISIONS = ("fp16", "fp32-emulated", "fp64-emulated")


def main(argv):
    out, sizes = argv[0], [int(s) for s in argv[1:]] or [16384, 32768]
    rows = []
    keep = hr.MAX_CERTIFIED_LEAF_WIDTH
    for n in sizes:
        for prec in PRECISIONS:
            if n > 16384 and prec == "fp64-emulated":
                continue
            dt = cp.float64 if prec == "fp64-emulated" else cp.float32
            a = cp.random.default_rng(n).standard_normal((n, n), dtype=dt)
            base = time_it(cp, lambda a=a: cp.linalg.qr(a), repeat=2)
            for width in WIDTHS * 2:
                hr.MAX_CERTIFIED_LEAF_WIDTH = width
                release_pool(cp)
                t = time_it(cp, lambda a=a, p=prec: mpqr.qr(a, precision=p), repeat=2,
                            max_seconds=10)
                rows.append({"n": n, "precision": prec, "leaf_cap": width, "time_ms": t * 1e3,
                             "cusolver_ms": base * 1e3, "speedup": base / t})
                print(f"{n:6d} {prec:<14} leaf {width:5d} {t * 1e3:9.1f} ms  x{base / t:5.2f}",
                      flush=True)
            del a
    hr.MAX_CERTIFIED_LEAF_WIDTH = keep
    with open(out, "w") as f:
        json.dump({"environment": environment(cp), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
