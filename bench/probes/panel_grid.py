"""The one-launch certified panel's grid (``cupy.panel_cholqr.FUSED_BLOCKS``) in the whole
square QR: fewer blocks leave SMs to the trailing update the lookahead runs beside the
panel. Configurations alternated in one process (three rounds, medians of 4 calls), graphs
dropped between configurations (a kept graph has its grid baked in); backward error and
orthogonality in float64 per configuration.

``python3 bench/probes/panel_grid.py OUT.json [--grids G,G] [--cases N:precision,...]``
(grids: block counts, ``None`` the default; float64 input for ``fp64-emulated``)
"""

from __future__ import annotations

import json
import sys

import cupy as cp
from graphs_gpu import _ms  # the probe beside this one
from mpqr.backends.cupy import graphs
from mpqr.backends.cupy import panel_cholqr as pc

import mpqr
from mpqr.bench._timing import environment, release_pool

GRIDS = (None, 48, 24, 12)
CASES = ((16384, "fp32-emulated"), (16384, "fp16"), (8192, "fp16"), (12288, "fp32-emulated"))


def main(argv):
    grids, cases = GRIDS, CASES
    if "--grids" in argv:
        grids = tuple(None if g == "None" else int(g)
                      for g in argv[argv.index("--grids") + 1].split(","))
    if "--cases" in argv:
        cases = tuple((int(c.split(":")[0]), c.split(":")[1])
                      for c in argv[argv.index("--cases") + 1].split(","))
    rows = []
    for n, prec in cases:
        dt = cp.float64 if prec == "fp64-emulated" else cp.float32
        a = cp.random.default_rng(0).standard_normal((n, n), dtype=cp.float64).astype(dt)

        def call(a=a, prec=prec):
            return mpqr.qr(a, precision=prec, method="householder-recursive")

        row = {"n": n, "precision": prec}
        times = {g: [] for g in grids}
        for _ in range(3):
            for g in grids:
                pc.FUSED_BLOCKS = g
                graphs.clear()
                call()
                call()  # captured where the shape is replayed
                times[g] += _ms(call, 4)
        for g in grids:
            pc.FUSED_BLOCKS = g
            graphs.clear()
            q, r = call()
            a64, q64, r64 = (x.astype(cp.float64) for x in (a, q, r))
            v = sorted(times[g])
            row[str(g)] = {"ms": v[len(v) // 2], "all": [round(x, 2) for x in v],
                           "backward": float(cp.linalg.norm(q64 @ r64 - a64) / cp.linalg.norm(a64)),
                           "orth": float(cp.linalg.norm(q64.T @ q64 - cp.eye(n)))}
            del q, r, a64, q64, r64
        pc.FUSED_BLOCKS = None
        graphs.clear()
        rows.append(row)
        print(json.dumps(row), flush=True)
        del a
        release_pool(cp)
    with open(argv[0], "w") as fh:
        json.dump({"environment": environment(cp), "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
