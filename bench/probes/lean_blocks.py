"""The lean plan's Q blocks and W's block column, timed against each other in one process.

``python3 bench/probes/lean_blocks.py OUT.json [ROW ...]`` (rows ``MxN:dtype:precision``,
default 16384^2 float64 fp64-emulated, where the lean plan is the default): for each
configuration ``(LEAN_Q_BLOCK, LEAN_PARTS)`` of :data:`CONFIGS`, alternated, three calls a
configuration a round, four rounds, the pool as a user's loop leaves it; wall time to full
device sync, medians. Per configuration: the backward error (float64) and R's largest
difference from the default configuration's.
"""

from __future__ import annotations

import json
import statistics
import sys

import cupy as cp
from pool_churn import wall  # the probe beside this one

import mpqr
from mpqr.bench._timing import environment
from mpqr.qr import householder_recursive as hr
from mpqr.qr import memory_plan as mp

CONFIGS = [(1024, 4), (2048, 4), (512, 4), (1024, 3), (1024, 2)]
DEFAULT = ["16384x16384:float64:fp64-emulated"]


def configure(q_block: int, parts: int) -> None:
    hr.LEAN_Q_BLOCK = q_block
    hr.LEAN_PARTS = mp.LEAN_PARTS = parts
    if hasattr(mp, "LEAN_Q_BLOCK"):
        mp.LEAN_Q_BLOCK = q_block


def main(argv):
    out = argv[0]
    rows = argv[1:] or DEFAULT
    base = (hr.LEAN_Q_BLOCK, hr.LEAN_PARTS)
    res = {"env": environment(cp), "configs": CONFIGS, "rows": []}
    for spec in rows:
        shape, dt, prec = spec.split(":")
        m, n = (int(v) for v in shape.split("x"))
        a = cp.random.default_rng(0).standard_normal((m, n), dtype=cp.float64).astype(dt)
        a64 = a.astype(cp.float64)
        an = float(cp.linalg.norm(a64))

        def call(a=a, prec=prec):
            return mpqr.qr(a, precision=prec)

        row = {"row": spec, "times_ms": {}, "backward": {}, "r_diff": {}}
        ref = None
        for c in CONFIGS:
            configure(*c)
            q, r = call()
            be = float(cp.linalg.norm(q.astype(cp.float64) @ r.astype(cp.float64) - a64) / an)
            if ref is None:
                ref = r
            row["backward"][str(c)] = be
            row["r_diff"][str(c)] = float(abs(r - ref).max() / abs(ref).max())
            row["times_ms"][str(c)] = []
            del q, r
        for _ in range(4):
            for c in CONFIGS:
                configure(*c)
                for _ in range(3):
                    row["times_ms"][str(c)].append(wall(call))
        configure(*base)
        row["median_ms"] = {k: statistics.median(v) for k, v in row["times_ms"].items()}
        print(spec, {k: round(v, 1) for k, v in row["median_ms"].items()},
              {k: f"{v:.1e}" for k, v in row["backward"].items()}, flush=True)
        res["rows"].append(row)
        del a, a64, ref
        with open(out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
