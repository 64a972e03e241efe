"""Which lines of mpqr launch the GPU time of one QR call, kernel by kernel.

``python3 bench/probes/kernel_callers.py OUT.json CASE [CASE ...] [--top K]`` (a case
``N:precision`` or ``MxN:precision`` as in ``flag_ab.py``) profiles one ``mpqr.qr`` call
(mode reduced, after a warm call) under PyTorch's profiler with Python stacks: CUPTI
records every kernel with the correlation id of the runtime or driver call that launched
it, and the Python tracer the functions active at that call. Each kernel's time is charged
to its kernel name and the innermost three mpqr frames around its launch; the ``K``
heaviest (kernel, frames) pairs are written per case with milliseconds and counts.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from bisect import bisect_right
from collections import defaultdict

os.environ["MPQR_GRAPHS"] = "0"  # every kernel launched from Python, none replayed

import cupy as cp
import torch
from flag_ab import case_matrix  # the probe beside this one
from torch.profiler import ProfilerActivity, profile

import mpqr
from mpqr.bench._timing import release_pool


def _ours(name: str) -> bool:
    return ("mpqr/" in name or "backends/" in name or "compat/" in name) \
        and "_timing" not in name and "<built-in" not in name


def callers(trace: dict, top: int) -> list[dict]:
    events = trace["traceEvents"]
    launches = {}
    py = []
    for e in events:
        cat = e.get("cat", "")
        if cat in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {}):
            launches[e["args"]["correlation"]] = e["ts"]
        elif cat == "python_function" and _ours(e.get("name", "")):
            py.append((e["ts"], e["ts"] + e.get("dur", 0), e["name"]))
    py.sort()
    starts = [p[0] for p in py]
    charged = defaultdict(lambda: [0.0, 0])
    for e in events:
        if e.get("cat") != "kernel":
            continue
        ts = launches.get(e.get("args", {}).get("correlation"))
        frames = ()
        if ts is not None:
            i = bisect_right(starts, ts)
            # the functions open at the launch, innermost (latest start) first
            open_ = [p for p in py[max(0, i - 4000):i] if p[1] >= ts]
            frames = tuple(p[2] for p in sorted(open_, key=lambda p: -p[0])[:3])
        key = (e["name"][:90], frames)
        charged[key][0] += e.get("dur", 0) / 1e3
        charged[key][1] += 1
    rows = sorted(charged.items(), key=lambda kv: -kv[1][0])[:top]
    return [{"kernel": k[0], "frames": list(k[1]), "ms": round(v[0], 3), "count": v[1]}
            for k, v in rows]


def main(argv):
    out = argv[0]
    top = int(argv[argv.index("--top") + 1]) if "--top" in argv else 40
    cases = [a for a in argv[1:] if ":" in a]
    torch.zeros(1, device="cuda")  # CUPTI and the primary context, before CuPy's work
    result = []
    for case in cases:
        _, prec, a = case_matrix(case)
        mpqr.qr(a, precision=prec, mode="reduced")
        cp.cuda.Device().synchronize()
        release_pool(cp)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                     with_stack=True) as prof:
            mpqr.qr(a, precision=prec, mode="reduced")
            cp.cuda.Device().synchronize()
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "trace.json")
            prof.export_chrome_trace(path)
            with open(path) as fh:
                rows = callers(json.load(fh), top)
        result.append({"case": case, "rows": rows})
        print(f"== {case}", flush=True)
        for r in rows:
            where = " < ".join(f.split("/")[-1][:60] for f in r["frames"])
            print(f"  {r['ms']:8.2f} ms {r['count']:5d}x  {r['kernel'][:50]:50s} {where}",
                  flush=True)
        del a
        release_pool(cp)
    with open(out, "w") as fh:
        json.dump({"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
                   "cases": result}, fh, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
