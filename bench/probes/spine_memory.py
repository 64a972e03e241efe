"""The fast plan's pool growth with the spine by halves and in blocks, one process.

``python3 bench/probes/spine_memory.py OUT.json [CASE ...]`` (cases ``N:precision`` or
``MxN:precision``, default 16384:fp32-emulated): for each
:data:`mpqr.qr.householder_recursive.SPINE_BLOCK` of ``None`` and the default, the
memory pool's growth and live peak beyond the input (``mpqr.bench.memory.measure_call``,
multiples of the input) and the plan's estimate, with the fast plan forced.
"""

from __future__ import annotations

import importlib
import json
import os
import sys

import cupy as cp
from flag_ab import case_matrix  # the probe beside this one

import mpqr
from mpqr.bench.memory import measure_call
from mpqr.qr import memory_plan

hr = importlib.import_module("mpqr.qr.householder_recursive")


def main(argv):
    out, cases = argv[0], argv[1:] or ["16384:fp32-emulated"]
    os.environ["MPQR_MEMORY_PLAN"] = "fast"
    default = hr.SPINE_BLOCK
    rows = []
    for case in cases:
        _, prec, a = case_matrix(case)
        est = memory_plan.estimate_bytes("householder-recursive", prec, a.shape,
                                         a.dtype.itemsize, "fast") / a.nbytes
        for sb in (None, default):
            hr.SPINE_BLOCK = sb
            got = measure_call(cp, lambda x, p=prec: mpqr.qr(x, precision=p,
                                                            method="householder-recursive"), a)
            rows.append({"case": case, "spine_block": sb, "estimate": est, **got})
            print(rows[-1], flush=True)
            cp.get_default_memory_pool().free_all_blocks()
        hr.SPINE_BLOCK = default
        del a
    with open(out, "w") as f:
        json.dump({"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
                   "rows": rows}, f, indent=1, default=str)


if __name__ == "__main__":
    main(sys.argv[1:])
