"""The fast plan's pool growth with the spine by halves and in blocks, one process.

``python3 bench/probes/spine_memory.py OUT.json [CASE ...] [--configs JSON]`` (cases
``N:precision`` or ``MxN:precision``, default 16384:fp32-emulated): for each
configuration of :mod:`mpqr.qr.householder_recursive`'s constants (``--configs``: a JSON
list of ``{NAME: value}``, each applied over the defaults; default
:data:`~mpqr.qr.householder_recursive.SPINE_BLOCK` ``None`` and the default), the memory
pool's growth and live peak beyond the input (``mpqr.bench.memory.measure_call``,
multiples of the input), the time of that call and the plan's estimate, with the fast
plan forced.
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
    configs = [{"SPINE_BLOCK": None}, {}]
    if "--configs" in argv:
        i = argv.index("--configs")
        configs = json.loads(argv[i + 1])
        argv = argv[:i] + argv[i + 2:]
    out, cases = argv[0], argv[1:] or ["16384:fp32-emulated"]
    os.environ["MPQR_MEMORY_PLAN"] = "fast"
    defaults = {k: getattr(hr, k) for c in configs for k in c}
    rows = []
    for case in cases:
        _, prec, a = case_matrix(case)
        est = memory_plan.estimate_bytes("householder-recursive", prec, a.shape,
                                         a.dtype.itemsize, "fast") / a.nbytes
        for cfg in configs:
            for k, v in {**defaults, **cfg}.items():
                setattr(hr, k, v)
            got = measure_call(cp, lambda x, p=prec: mpqr.qr(x, precision=p,
                                                            method="householder-recursive"), a)
            rows.append({"case": case, "config": cfg, "spine_block": hr.SPINE_BLOCK,
                         "estimate": est, **got})
            print(rows[-1], flush=True)
            cp.get_default_memory_pool().free_all_blocks()
        for k, v in defaults.items():
            setattr(hr, k, v)
        del a
    with open(out, "w") as f:
        json.dump({"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
                   "rows": rows}, f, indent=1, default=str)


if __name__ == "__main__":
    main(sys.argv[1:])
