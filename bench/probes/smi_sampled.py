"""QR calls timed while ``nvidia-smi`` samples the GPU every 50 ms beside them.

``python3 bench/probes/smi_sampled.py OUT.json CASES [CALLS]`` (``CASES`` comma-separated
``N:precision`` or ``MxN:precision`` as in ``flag_ab.py``; ``CALLS`` per case, default 30):
each call of ``mpqr.qr`` (mode reduced, after a warm call; CUDA events) with the samples
taken during it: SM clock (min, mean), power, temperature and the active clock event
reasons (``0x4``: software power cap). Whether a slow call goes with lower clocks, and
what a driver query every 50 ms does to the calls themselves.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import cupy as cp
from flag_ab import warm_call  # the probe beside this one

_QUERY = ("--query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,"
          "clocks_event_reasons.active,utilization.gpu")


def main(argv: list[str]) -> None:
    out, cases = argv[0], argv[1].split(",")
    count = int(argv[2]) if len(argv) > 2 else 30
    samples: list[tuple[float, str]] = []
    proc = subprocess.Popen(["nvidia-smi", _QUERY, "--format=csv,noheader,nounits", "-lms",
                             "50"], stdout=subprocess.PIPE, text=True)

    def read() -> None:
        for line in proc.stdout:
            samples.append((time.perf_counter(), line.strip()))

    threading.Thread(target=read, daemon=True).start()
    calls = {}
    try:
        for case in cases:
            a, call = warm_call(case)
            got = []
            for _ in range(count):
                s, e = cp.cuda.Event(), cp.cuda.Event()
                t0 = time.perf_counter()
                s.record()
                call()
                e.record()
                e.synchronize()
                got.append((t0, time.perf_counter(), cp.cuda.get_elapsed_time(s, e)))
            calls[case] = got
            del a
    finally:
        proc.terminate()
    rows = []
    for case, got in calls.items():
        for t0, t1, ms in got:
            fields = [line.split(",") for ts, line in samples if t0 <= ts <= t1]
            clk = [int(f[1]) for f in fields]
            rows.append({"case": case, "ms": round(ms, 1), "samples": len(fields),
                         "clk_min": min(clk, default=-1),
                         "clk_mean": round(sum(clk) / max(1, len(clk))),
                         "power_max": max((float(f[2]) for f in fields), default=-1.0),
                         "temp": max((int(f[3]) for f in fields), default=-1),
                         "reasons": sorted({f[4].strip() for f in fields})})
            print(json.dumps(rows[-1]), flush=True)
    with open(out, "w") as fh:
        json.dump({"rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
