"""Where one tall QR call's time goes on the GPU: kernels, device idle gaps, and the
mpqr frame that launched each kernel or held the host during each gap.

``python3 bench/probes/tall_timeline.py OUT_DIR [MxN:cond[:method] ...]`` profiles one
call per case under PyTorch's profiler with its Python tracer (CUPTI records every
kernel of the process, CuPy's and cuBLAS's included; ``with_stack`` records the Python
frames). For each case it writes ``OUT_DIR/timeline_<case>.txt``: the wall time of the
call unprofiled (median of 7, CUDA events), the GPU busy time, device time per mpqr
frame (the innermost ``mpqr`` function active when the kernel was launched), the idle
gaps of over 20 us with the frames the host was in, and every kernel in order. A JSON
summary goes to ``OUT_DIR/timeline.json``. The matrices are those of
``bench/probes/ill_conditioned.py`` (``U diag(s) V^T``, geometric singular values).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import cupy as cp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ill_conditioned import matrix
from kernel_time import trace_events

import mpqr
from mpqr.bench._timing import release_pool, time_it

DEFAULT = ["1048576x256:1e12", "1048576x256:1", "1048576x256:1e12:sketch-cholqr",
           "4194304x64:1"]


def _frame(name: str) -> str | None:
    # python_function events are named "path(line): func"
    if "mpqr" not in name and "backends" not in name:
        return None
    path, _, func = name.partition(": ")
    short = path.split("/mpqr/")[-1] if "/mpqr/" in path else path.split("/")[-1]
    return f"{short} {func}"


def analyse(events: list[dict]) -> dict:
    kern = sorted((e for e in events if e.get("cat") in ("kernel", "gpu_memcpy",
                                                           "gpu_memset") and "dur" in e),
                  key=lambda e: e["ts"])
    py = [e for e in events if e.get("cat") == "python_function" and "dur" in e]
    frames = [(e["ts"], e["ts"] + e["dur"], f) for e in py if (f := _frame(e["name"]))]
    launches = {e["args"].get("correlation"): e for e in events
                if e.get("cat") == "cuda_runtime" and "args" in e}
    syncs = [e for e in events if e.get("cat") == "cuda_runtime" and "dur" in e
             and ("Synchronize" in e["name"] or "Memcpy" in e["name"])]

    def innermost(t: float) -> str:
        best = None
        for s, e, f in frames:
            if s <= t <= e and (best is None or e - s < best[1] - best[0]):
                best = (s, e, f)
        return best[2] if best else "?"

    def stack(t: float, depth: int = 4) -> str:
        hit = sorted(((s, e, f) for s, e, f in frames if s <= t <= e), key=lambda x: x[0])
        return " > ".join(f for _, _, f in hit[-depth:]) or "?"

    per_frame = defaultdict(float)
    rows = []
    for k in kern:
        ln = launches.get(k.get("args", {}).get("correlation"))
        where = innermost(ln["ts"]) if ln else "?"
        per_frame[where] += k["dur"]
        rows.append((k["ts"], k["dur"], k["name"][:70], where))
    t0 = kern[0]["ts"] if kern else 0
    gaps = []
    end = t0
    for ts, dur, _name, _where in rows:
        if ts - end > 20:
            mid = (end + ts) / 2
            gaps.append((end - t0, ts - end, stack(mid)))
        end = max(end, ts + dur)
    # the host's time before the first kernel: the frames that ran there, longest first
    first = min((ln["ts"] for ln in launches.values() if "ts" in ln), default=0)
    start = min((s for s, _, _ in frames), default=first)
    before = sorted(((min(e, first) - s, f) for s, e, f in frames if s < first),
                    key=lambda x: -x[0])[:12]
    busy = sum(d for _, d, _, _ in rows)
    span = (end - t0) if kern else 0
    sync_us = sum(e["dur"] for e in syncs)
    return {"kernels": len(kern), "span_ms": span / 1e3, "busy_ms": busy / 1e3,
            "idle_ms": sum(g[1] for g in gaps) / 1e3, "host_sync_ms": sync_us / 1e3,
            "per_frame_ms": {k: v / 1e3 for k, v in sorted(per_frame.items(),
                                                           key=lambda kv: -kv[1])},
            "gaps": [{"at_ms": a / 1e3, "ms": d / 1e3, "host": s} for a, d, s in gaps],
            "before_first_launch_ms": (first - start) / 1e3,
            "before_frames": [{"ms": d / 1e3, "frame": f} for d, f in before],
            "rows": [{"at_ms": (ts - t0) / 1e3, "ms": d / 1e3, "kernel": n, "frame": w}
                     for ts, d, n, w in rows]}


def case(spec: str, out: Path) -> dict:
    shape, cond, *meth = spec.split(":")
    m, n = (int(v) for v in shape.split("x"))
    cond = float(cond)
    method = meth[0] if meth else "auto"
    a = matrix(m, n, cond)
    b = cp.random.default_rng(1).standard_normal(m, dtype=cp.float64)

    def call():
        if method == "lstsq":
            return mpqr.lstsq(a, b)
        return mpqr.qr(a, method=method)

    t_ref = time_it(cp, lambda: cp.linalg.qr(a), repeat=3, max_seconds=5)
    release_pool(cp)
    for _ in range(3):
        call()
    cp.cuda.Device().synchronize()
    walls = [time_it(cp, call, repeat=7, max_seconds=8) for _ in range(1)]
    with mpqr.explain() as trace:
        call()
    cp.cuda.Device().synchronize()
    res = analyse(trace_events(call, with_stack=True))
    res.update(case=spec, wall_ms=statistics.median(walls) * 1e3, cusolver_ms=t_ref * 1e3,
               speedup=t_ref / statistics.median(walls),
               events=[f"{e.kind}: {e.message}"[:160] for e in trace.events])
    name = spec.replace(":", "_")
    with open(out / f"timeline_{name}.txt", "w") as fh:
        fh.write(f"{spec}: wall {res['wall_ms']:.2f} ms (cuSOLVER {res['cusolver_ms']:.1f}, "
                 f"{res['speedup']:.2f}x); profiled span {res['span_ms']:.2f}, busy "
                 f"{res['busy_ms']:.2f}, idle gaps {res['idle_ms']:.2f}, host syncs/copies "
                 f"{res['host_sync_ms']:.2f}, {res['kernels']} kernels\n\n")
        fh.write("events:\n" + "\n".join("  " + e for e in res["events"]) + "\n\n")
        fh.write(f"host before the first launch: {res['before_first_launch_ms']:.3f} ms\n")
        for b in res["before_frames"]:
            fh.write(f"  {b['ms']:8.3f}  {b['frame']}\n")
        fh.write("device ms by launching frame:\n")
        for k, v in res["per_frame_ms"].items():
            fh.write(f"  {v:8.3f}  {k}\n")
        fh.write("\nidle gaps > 20 us (at ms, ms, host frames):\n")
        for g in res["gaps"]:
            fh.write(f"  {g['at_ms']:8.3f} {g['ms']:7.3f}  {g['host']}\n")
        fh.write("\nkernels (at ms, ms, name, frame):\n")
        for r in res["rows"]:
            fh.write(f"  {r['at_ms']:8.3f} {r['ms']:7.3f}  {r['kernel']:70s} {r['frame']}\n")
    del res["rows"]
    print(f"{spec}: wall {res['wall_ms']:.2f} ms ({res['speedup']:.2f}x) busy "
          f"{res['busy_ms']:.2f} idle {res['idle_ms']:.2f}", flush=True)
    return res


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("OUT", "/tmp"))
    out.mkdir(parents=True, exist_ok=True)
    specs = sys.argv[2:] or DEFAULT
    results = []
    for spec in specs:
        try:
            results.append(case(spec, out))
        except Exception as exc:  # one case's failure does not stop the rest
            import traceback

            traceback.print_exc()
            results.append({"case": spec, "error": repr(exc)})
    with open(out / "timeline.json", "w") as fh:
        json.dump(results, fh, indent=1)


if __name__ == "__main__":
    main()
