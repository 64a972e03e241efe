"""A/B of how a collective call learns where a fresh array's blocks are: found by the
workers in the call (``collective.FIND = True``: one all-reduce of who holds what) or
asked of the scheduler before it (``False``: ``who_has``, one trip on the call's path).

``python bench/probes/dask_holders_ab.py [ROUNDS]`` on a host with two GPUs: the bench's
cluster and matrix (``mpqr.bench.dask``: ``2^26 x 64`` float64, ``2^22``-row blocks spread
evenly), each call on a fresh copy (the bench's ``_fresh``), ``qr`` with ``Q`` persisted
and ``mode="r"``, the two settings alternated call by call; medians and each call's
timeline from the trace. Writes ``$OUT/dask_holders_ab.json``.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from mpqr.backends.dask import collective  # noqa: E402

import mpqr  # noqa: E402
from mpqr.bench import dask as bench  # noqa: E402


def call(client, x, mode):
    xi = bench._fresh(client, x)
    with mpqr.explain() as trace:
        t0 = time.perf_counter()
        if mode == "qr":
            q, _r = mpqr.qr(xi)
            bench._persisted(client, q)
        else:
            mpqr.qr(xi, mode="r")
        dt = time.perf_counter() - t0
    ev = [e.data for e in trace.events if e.kind == "dask-collective"]
    del xi
    return 1e3 * dt, (ev[0] if ev else {})


def main() -> None:
    from distributed import Client

    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 9
    out = {"rounds": rounds, "rows": {}}
    with bench._cluster(2, 2) as cluster, Client(cluster) as client:
        x = bench._placed(client, True, 2**26, 64, 2**22, "float64", "even")
        for mode in ("qr", "r"):
            for flag in (True, False):  # warm-up
                collective.FIND = flag
                call(client, x, mode)
            got = {True: [], False: []}
            for _ in range(rounds):
                for flag in (True, False):
                    collective.FIND = flag
                    got[flag].append(call(client, x, mode))
            for flag, calls in got.items():
                ms = [c[0] for c in calls]
                key = f"{mode}, holders {'found by the workers' if flag else 'asked'}"
                out["rows"][key] = {
                    "median_ms": round(statistics.median(ms), 2), "ms": [round(v, 2) for v in ms],
                    "holders_from": sorted({c[1].get("holders_from") for c in calls}),
                    "blocks_per_worker": calls[-1][1].get("blocks_per_worker"),
                    "timelines": [c[1].get("timeline_ms") for c in calls]}
                print(key, out["rows"][key]["median_ms"], "ms;", out["rows"][key]["holders_from"],
                      out["rows"][key]["blocks_per_worker"], "timeline",
                      out["rows"][key]["timelines"][len(ms) // 2], flush=True)
    collective.FIND = True
    path = os.path.join(os.environ.get("OUT", "/tmp"), "dask_holders_ab.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
