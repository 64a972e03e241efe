"""Whether Python's garbage collector sets the slow calls of a QR apart from the fast ones.

``python3 bench/probes/gc_pauses.py OUT.json [--cases 16384:fp16,8192:fp32-emulated]
[--calls 16]``: for each case (``N:precision`` or ``MxN:precision`` as in ``flag_ab.py``)
``--calls`` calls of ``mpqr.qr`` (mode reduced, after a warm call; CUDA events to full
device sync) three ways, one after another in one process: the collector as it is, the
collector off during the calls (``gc.disable()``, one collection before), and the objects
alive after the warm call frozen out of the collections (``gc.freeze()``). Beside each
call's milliseconds: the collections that ran during it (generation, host milliseconds,
from ``gc.callbacks``). Slow calls that carry a generation-2 collection, and none with
the collector off, point at the host's collector pausing the launches.
"""

from __future__ import annotations

import gc
import json
import sys
import time

import cupy as cp
from flag_ab import warm_call  # the probe beside this one

from mpqr.bench._timing import environment

_EVENTS: list[tuple[int, float]] = []
_START: list[float] = []


def _callback(phase: str, info: dict) -> None:
    if phase == "start":
        _START.append(time.perf_counter())
    elif _START:
        _EVENTS.append((info["generation"], (time.perf_counter() - _START.pop()) * 1e3))


def _calls(call, count: int) -> list[dict]:
    rows = []
    for _ in range(count):
        _EVENTS.clear()
        s, e = cp.cuda.Event(), cp.cuda.Event()
        s.record()
        call()
        e.record()
        e.synchronize()
        rows.append({"ms": round(cp.cuda.get_elapsed_time(s, e), 2),
                     "collections": [[g, round(t, 2)] for g, t in _EVENTS]})
    return rows


def main(argv: list[str]) -> None:
    out = argv[0]
    cases = (argv[argv.index("--cases") + 1] if "--cases" in argv
             else "16384:fp16,8192:fp32-emulated").split(",")
    count = int(argv[argv.index("--calls") + 1]) if "--calls" in argv else 16
    gc.callbacks.append(_callback)
    result = {"environment": environment(cp), "objects": len(gc.get_objects()), "rows": []}
    for case in cases:
        _, call = warm_call(case)
        row = {"case": case, "objects": len(gc.get_objects())}
        row["as_is"] = _calls(call, count)
        gc.collect()
        gc.disable()
        row["off"] = _calls(call, count)
        gc.enable()
        gc.collect()
        gc.freeze()
        row["frozen"] = _calls(call, count)
        gc.unfreeze()
        for k in ("as_is", "off", "frozen"):
            ms = sorted(r["ms"] for r in row[k])
            row[k + "_median"] = ms[len(ms) // 2]
            row[k + "_gen2"] = sum(1 for r in row[k] for g, _ in r["collections"] if g == 2)
        print(json.dumps({k: v for k, v in row.items() if not isinstance(v, list)}),
              flush=True)
        result["rows"].append(row)
    with open(out, "w") as fh:
        json.dump(result, fh, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
