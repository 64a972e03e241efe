"""Where the GPU time of one square QR goes, by kernel class, without blocking launches.

``python3 bench/probes/kernel_time.py OUT.json [N ...] [--precisions P,P]`` runs
``mpqr.qr`` (mode reduced) on an ``N x N`` Gaussian matrix at fp16, fp32-emulated and
fp64-emulated (or the precisions named), and cuSOLVER's QR, under PyTorch's profiler:
CUPTI records every kernel of the process, CuPy's and cuBLAS's included, with its start
and end on the GPU. For each call it writes the wall time without the profiler, the time
the GPU was busy (the union of the kernels' intervals), the kernel time per class (panel
kernels, tensor-core / int8 / float GEMMs, the engines' conversion kernels, copies, the
rest), the top kernels by time (in ``OUT_top_kernels.txt``), and the flops the policy's
products asked of each engine (from ``mpqr.explain``), so that each class's rate can be
set against its ceiling.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
import time
from collections import defaultdict

import cupy as cp
import torch
from torch.profiler import ProfilerActivity, profile

import mpqr
from mpqr.bench._timing import release_pool, time_it

#: kernel classes, first match wins (cuBLAS names its kernels by type: "i8"/"imma" int8,
#: "h"/"f16"/"hmma" half, "d" double; nvjet kernels carry the types in their names)
CLASSES = (
    ("panel", re.compile(r"panel_(pass|apply)")),
    ("tsqr/chol/lu kernels", re.compile(r"mpqr_(tsqr|chol|lu|right)|lu_signed|chol_steps")),
    ("engine conversions", re.compile(r"mpqr_(split|scale|unscale|max|strided_max|round|oz)"
                                      r"|ozaki|residue|crt")),
    ("cusolver", re.compile(r"(geqr|larf|orgqr|ormqr|trsm|potrf|syrk|getrf)", re.I)),
    ("gemm int8", re.compile(r"(i8|imma|int8|igemm)", re.I)),
    ("gemm fp16", re.compile(r"(f16|hmma|hgemm|_h[sh]{1,2}_|nvjet_h|fp16|half)", re.I)),
    ("gemm fp64", re.compile(r"(dgemm|_d[sd]?_|nvjet_d|f64|double|dmma)", re.I)),
    ("gemm fp32", re.compile(r"(sgemm|gemm|nvjet|xmma|cutlass|gemv|dot_kernel)", re.I)),
    ("copies", re.compile(r"(memcpy|memset|copy)", re.I)),
    ("cupy elementwise/reduce", re.compile(r"^cupy_")),
)


def classify(name: str) -> str:
    for cls, pat in CLASSES:
        if pat.search(name):
            return cls
    return "other"


def busy_us(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, -1.0
    for s, e in sorted(intervals):
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total


#: bytes per operand entry and per output entry that an fp16 engine's conversions move:
#: the scale's read, the split's read and its fp16 parts written; the unscale's read of
#: the float32 accumulator and its write
CONVERSION_BYTES = {"tc-fp16": (4 + 4 + 2, 8), "tc-fp16-splitb": (4 + 4 + 6, 8),
                    "tc-sgemm": (4 + 4 + 6, 8)}


def gemm_work(trace) -> tuple[dict[str, float], float]:
    """Operations the policy's products asked for, per engine (2 m n k per underlying
    GEMM: tc-fp16 1, tc-fp16-splitb 2, tc-sgemm 3, ozaki-int8 one per modulus (the
    decision's count: an upper bound where the moduli are chosen from the data); native
    engines 1), and the bytes the fp16 engines' conversions move at least."""
    per = defaultdict(float)
    moved = 0.0
    for d in trace.gemms:
        m, n, k = d.shape
        b = max(1, d.batch)
        ops = 2.0 * m * n * k * b
        mult = {"tc-fp16": 1, "tc-fp16-splitb": 2, "tc-sgemm": 3}.get(d.engine, 1)
        if d.engine.startswith("ozaki"):
            mult = int(d.params.get("terms") or d.params.get("moduli") or 1)
        per[d.engine] += ops * mult
        if d.engine in CONVERSION_BYTES:
            per_in, per_out = CONVERSION_BYTES[d.engine]
            moved += b * (per_in * (m * k + k * n) + per_out * m * n)
    return dict(per), moved


def trace_events(call, with_stack: bool = False) -> list[dict]:
    """The chrome-trace events of one ``call`` under PyTorch's profiler (CUPTI kernels,
    CPU ops; with ``with_stack`` the Python tracer's frames too), after a device sync."""
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU],
                 with_stack=with_stack) as prof:
        call()
        cp.cuda.Device().synchronize()
    path = os.path.join(tempfile.mkdtemp(), "trace.json")
    prof.export_chrome_trace(path)
    with open(path) as fh:
        return json.load(fh)["traceEvents"]


def profiled(call) -> tuple[dict, list]:
    events = trace_events(call)
    kern = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
            and "dur" in e]
    by_class, by_name = defaultdict(float), defaultdict(lambda: [0.0, 0])
    for e in kern:
        by_class[classify(e["name"])] += e["dur"]
        by_name[e["name"]][0] += e["dur"]
        by_name[e["name"]][1] += 1
    span = (max(e["ts"] + e["dur"] for e in kern) - min(e["ts"] for e in kern)) if kern else 0
    top = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:25]
    summary = {"kernels": len(kern), "gpu_span_ms": span / 1e3,
               "gpu_busy_ms": busy_us([(e["ts"], e["ts"] + e["dur"]) for e in kern]) / 1e3,
               "kernel_ms_by_class": {k: v / 1e3 for k, v in sorted(by_class.items())}}
    return summary, [{"name": n[:160], "ms": v[0] / 1e3, "count": v[1]} for n, v in top]


def main() -> None:
    out = sys.argv[1]
    args = sys.argv[2:]
    only = None
    if "--precisions" in args:  # a subset of fp16, fp32-emulated, fp64-emulated
        i = args.index("--precisions")
        only = set(args[i + 1].split(","))
        args = args[:i] + args[i + 2:]
    sizes = [int(s) for s in args] or [16384]
    torch.zeros(1, device="cuda")  # CUPTI and the primary context, before CuPy's work
    rows = []
    groups = [(dt, ("cusolver", *(p for p in precs if only is None or p in only)))
              for dt, precs in ((cp.float32, ("fp16", "fp32-emulated")),
                                (cp.float64, ("fp64-emulated",)))]
    try:
        for n in sizes:
            for dtype, precs in [g for g in groups if len(g[1]) > 1]:
                a = cp.random.default_rng(0).standard_normal((n, n), dtype=cp.float64)
                a = a.astype(dtype)
                for prec in precs:
                    if prec == "cusolver":
                        def call(a=a):
                            return cp.linalg.qr(a)
                    else:
                        def call(a=a, prec=prec):
                            return mpqr.qr(a, precision=prec)
                    call()
                    release_pool(cp)
                    wall = time_it(cp, call, repeat=3, max_seconds=5)
                    release_pool(cp)
                    row = {"n": n, "dtype": dtype.__name__, "precision": prec,
                           "wall_ms": wall * 1e3}
                    if prec != "cusolver":
                        with mpqr.explain() as trace:
                            call()
                        row["gemm_ops_by_engine"], row["conversion_bytes"] = gemm_work(trace)
                        row["gemm_calls"] = len(trace.gemms)
                        calls = defaultdict(int)
                        for d in trace.gemms:
                            calls[d.engine] += 1
                        row["gemm_calls_by_engine"] = dict(calls)
                        row["method"] = next((str(e) for e in trace.events
                                              if e.kind == "method"), None)
                    release_pool(cp)
                    t0 = time.perf_counter()
                    row["profile"], row["top_kernels"] = profiled(call)
                    row["profiled_wall_ms"] = (time.perf_counter() - t0) * 1e3
                    rows.append(row)
                    print(json.dumps({k: v for k, v in row.items() if k != "top_kernels"}),
                          flush=True)
                    for t in row["top_kernels"][:12]:
                        print(f"   {t['ms']:9.2f} ms {t['count']:6d}x  {t['name'][:110]}",
                              flush=True)
                    release_pool(cp)
                del a
                release_pool(cp)
    finally:
        # the kernel lists go beside the JSON (the docs render the JSON as a table)
        with open(out.removesuffix(".json") + "_top_kernels.txt", "w") as fh:
            for row in rows:
                fh.write(f"== {row['n']}^2 {row['dtype']} {row['precision']}: "
                         f"wall {row['wall_ms']:.1f} ms\n")
                for t in row.pop("top_kernels"):
                    fh.write(f"  {t['ms']:8.2f} ms {t['count']:6d}x  {t['name']}\n")
        with open(out, "w") as fh:
            json.dump({"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
                       "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
