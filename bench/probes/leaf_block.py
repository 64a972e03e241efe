"""Square QR: the certified leaves' block of panels (the rank of the updates of a leaf's
columns right of a block), A/B in one process.

``python3 bench/probes/leaf_block.py OUT.json [N ...]`` (default 16384): ``mpqr.qr`` of an
``N x N`` matrix (float32 at fp16 and fp32-emulated, float64 at fp64-emulated) with the
CuPy leaf's ``LEAF_BLOCK`` at each of :data:`BLOCKS` (32: every panel updates the rest of
the leaf, as before the blocks), alternating, twice; cuSOLVER beside it. ``--alloc``: also
the allocations of one fp16 QR by source line (CuPy's ``LineProfileHook``), to find the
element-wise passes that allocate.
"""

from __future__ import annotations

import importlib
import io
import json
import sys

import cupy as cp

import mpqr
from mpqr.tools._timing import environment, release_pool, time_it

leaf = importlib.import_module("mpqr.backends.cupy_panel_cholqr")
BLOCKS = (32, 128, 256)
PRECISIONS = ("fp16", "fp32-emulated", "fp64-emulated")


def main(argv):
    alloc = "--alloc" in argv
    argv = [a for a in argv if a != "--alloc"]
    out, sizes = argv[0], [int(s) for s in argv[1:]] or [16384]
    rows = []
    keep = leaf.LEAF_BLOCK
    for n in sizes:
        for prec in PRECISIONS:
            dt = cp.float64 if prec == "fp64-emulated" else cp.float32
            a = cp.random.default_rng(n).standard_normal((n, n), dtype=dt)
            base = time_it(cp, lambda a=a: cp.linalg.qr(a), repeat=2)
            for blk in BLOCKS * 2:
                leaf.LEAF_BLOCK = blk
                release_pool(cp)
                t = time_it(cp, lambda a=a, p=prec: mpqr.qr(a, precision=p), repeat=3,
                            max_seconds=10)
                rows.append({"n": n, "precision": prec, "leaf_block": blk, "ms": t * 1e3,
                             "cusolver_ms": base * 1e3, "speedup": base / t})
                print(json.dumps(rows[-1]), flush=True)
            leaf.LEAF_BLOCK = keep
            del a
            release_pool(cp)
    report = ""
    if alloc:
        from cupy.cuda.memory_hooks import LineProfileHook

        a = cp.random.default_rng(1).standard_normal((sizes[0],) * 2, dtype=cp.float32)
        mpqr.qr(a, precision="fp16")
        hook = LineProfileHook(max_depth=6)
        with hook:
            mpqr.qr(a, precision="fp16")
        buf = io.StringIO()
        hook.print_report(file=buf)
        report = buf.getvalue()
        with open(out.replace(".json", "_alloc.txt"), "w") as f:
            f.write(report)
    with open(out, "w") as f:
        json.dump({"environment": environment(cp), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
