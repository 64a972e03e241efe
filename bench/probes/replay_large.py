"""Repeated square QR calls above ``driver.REPLAY_MAX_ELEMENTS``: eager against replayed.

``python3 bench/probes/replay_large.py OUT.json [--cases 16384:fp32-emulated,...]
[--rounds 2] [--calls 5]``: for each case (``N`` or ``MxN``, float32 input, Gaussian,
seed 0), rounds alternate the eager calls (``MPQR_GRAPHS=0``) and the replayed ones (the
limit raised, graphs dropped, one eager call, one capture, then the timed replays). Per
call: the time to full device sync (CUDA events) and the host's time to return (the
launches issued, before the sync), so an eager call whose host time reaches its GPU time
shows where the GPU waits on the launches. Also the replayed graph's held pool, any
capture failure, and whether the two ways give the same bits.
"""

from __future__ import annotations

import json
import os
import sys
import time

import cupy as cp
from mpqr.backends.cupy import graphs

import mpqr
from mpqr.bench._timing import environment, release_pool
from mpqr.qr import driver


def _calls(fn, reps):
    dev, host = [], []
    for _ in range(reps):
        s, e = cp.cuda.Event(), cp.cuda.Event()
        s.record()
        t0 = time.perf_counter()
        fn()
        host.append((time.perf_counter() - t0) * 1e3)
        e.record()
        e.synchronize()
        dev.append(cp.cuda.get_elapsed_time(s, e))
    return dev, host


def main(argv):
    cases = ["16384:fp32-emulated"]
    if "--cases" in argv:
        cases = argv[argv.index("--cases") + 1].split(",")
    rounds = int(argv[argv.index("--rounds") + 1]) if "--rounds" in argv else 2
    reps = int(argv[argv.index("--calls") + 1]) if "--calls" in argv else 5
    keep_limit = driver.REPLAY_MAX_ELEMENTS
    rows = []
    for case in cases:
        shape, prec = case.split(":")
        m, _, n = shape.partition("x")
        m, n = int(m), int(n or m)
        a = cp.random.default_rng(0).standard_normal((m, n), dtype=cp.float64).astype(cp.float32)

        def call(a=a, prec=prec):
            return mpqr.qr(a, precision=prec)

        res = {"eager": {"ms": [], "host_ms": []}, "replayed": {"ms": [], "host_ms": []}}
        outs = {}
        for _ in range(rounds):
            os.environ["MPQR_GRAPHS"] = "0"
            graphs.clear()
            call()
            d, h = _calls(call, reps)
            res["eager"]["ms"] += d
            res["eager"]["host_ms"] += h
            os.environ["MPQR_GRAPHS"] = "1"
            driver.REPLAY_MAX_ELEMENTS = max(keep_limit, m * n)
            graphs.clear()
            call()
            call()  # the capture
            d, h = _calls(call, reps)
            res["replayed"]["ms"] += d
            res["replayed"]["host_ms"] += h
            res["replayed"]["kept"] = [repr(k[:3]) for k in graphs.kept()]
            res["replayed"]["held_gib"] = graphs.held_bytes() / 2**30
            res["replayed"]["failed"] = sorted(set(graphs.FAILED.values()))
            outs["replayed"] = call()
            driver.REPLAY_MAX_ELEMENTS = keep_limit
            graphs.clear()
            os.environ["MPQR_GRAPHS"] = "0"
            outs["eager"] = call()
            os.environ["MPQR_GRAPHS"] = "1"
        row = {"case": case}
        for k, v in res.items():
            t = sorted(v["ms"])
            hs = sorted(v["host_ms"])
            row[k] = {**v, "median_ms": t[len(t) // 2], "median_host_ms": hs[len(hs) // 2]}
            q, r = outs[k]
            a64, q64, r64 = (x.astype(cp.float64) for x in (a, q, r))
            row[k]["backward"] = float(cp.linalg.norm(q64 @ r64 - a64) / cp.linalg.norm(a64))
            del a64, q64, r64
        row["same_bits"] = bool(cp.array_equal(outs["eager"][0], outs["replayed"][0])
                                and cp.array_equal(outs["eager"][1], outs["replayed"][1]))
        outs.clear()
        rows.append(row)
        print(json.dumps({"case": case, "eager": row["eager"]["median_ms"],
                          "eager_host": row["eager"]["median_host_ms"],
                          "replayed": row["replayed"]["median_ms"],
                          "held_gib": row["replayed"].get("held_gib"),
                          "failed": row["replayed"].get("failed"),
                          "same_bits": row["same_bits"]}), flush=True)
        del a
        graphs.clear()
        release_pool(cp)
    with open(argv[0], "w") as fh:
        json.dump({"environment": environment(cp), "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
