"""A/B of the collective Dask call's client- and worker-side settings, every combination
alternated call by call in one process.

``python bench/probes/dask_call_ab.py [ROUNDS] [NAME=V1,V2 ...]`` on a host with two
GPUs; each ``NAME`` a constant of ``mpqr.backends.dask.collective`` or of
``mpqr.backends.dask._launch`` (set on the client: the call sends the workers what they
need), values as Python literals; default ``collective.RIDE=True,False
_launch.STORE_LATE=True,False``. The bench's cluster and matrix (``mpqr.bench.dask``:
``2^26 x 64`` float64, ``2^22``-row blocks spread evenly), each call on a fresh copy
(the bench's ``_fresh``), ``qr`` with ``Q`` persisted and ``mode="r"``; medians, each
call's timeline from the trace, and the client's time after ``collective.cholqr2``
returned (``after_cholqr2_ms``: ``R`` to the device, its dask array, the bench's check
that ``Q`` is persisted). Writes ``$OUT/dask_call_ab.json``.
"""

from __future__ import annotations

import ast
import itertools
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from mpqr.backends.dask import _launch, collective  # noqa: E402

import mpqr  # noqa: E402
from mpqr.bench import dask as bench  # noqa: E402

MODULES = {"collective": collective, "_launch": _launch}
STAMP: list[float] = []


def _stamped(real):
    def cholqr2(*args, **kw):
        out = real(*args, **kw)
        STAMP.append(time.perf_counter())
        return out
    return cholqr2


def call(client, x, mode):
    xi = bench._fresh(client, x)
    STAMP.clear()
    with mpqr.explain() as trace:
        t0 = time.perf_counter()
        if mode == "qr":
            q, _r = mpqr.qr(xi)
            bench._persisted(client, q)
        else:
            mpqr.qr(xi, mode="r")
        t1 = time.perf_counter()
    ev = [e.data for e in trace.events if e.kind == "dask-collective"]
    del xi
    return 1e3 * (t1 - t0), 1e3 * (t1 - STAMP[-1]) if STAMP else None, (ev[0] if ev else {})


def main(out_name: str = "dask_call_ab.json") -> None:
    from distributed import Client

    argv = sys.argv[1:]
    rounds = int(argv.pop(0)) if argv and argv[0].isdigit() else 7
    specs = argv or ["collective.RIDE=True,False", "_launch.STORE_LATE=True,False"]
    flags = []
    for spec in specs:
        name, _, vals = spec.partition("=")
        mod, _, attr = name.partition(".")
        flags.append((MODULES[mod], attr, [ast.literal_eval(v) for v in vals.split(",")]))
    combos = list(itertools.product(*[f[2] for f in flags]))
    first = tuple(getattr(m, a) for m, a, _ in flags)

    def setting(combo):
        for (m, a, _), v in zip(flags, combo):
            setattr(m, a, v)

    collective.cholqr2 = _stamped(collective.cholqr2)
    out = {"rounds": rounds, "flags": specs, "rows": {}}
    with bench._cluster(2, 2) as cluster, Client(cluster) as client:
        x = bench._placed(client, True, 2**26, 64, 2**22, "float64", "even")
        for mode in ("qr", "r"):
            for combo in combos:  # warm-up
                setting(combo)
                call(client, x, mode)
            got = {c: [] for c in combos}
            for _ in range(rounds):
                for combo in combos:
                    setting(combo)
                    got[combo].append(call(client, x, mode))
            for combo, calls in got.items():
                ms = [c[0] for c in calls]
                key = mode + ", " + ", ".join(f"{a}={v}" for (_, a, _), v in zip(flags, combo))
                tl = [c[2].get("timeline_ms") or {} for c in calls]
                out["rows"][key] = {
                    "median_ms": round(statistics.median(ms), 2),
                    "ms": [round(v, 2) for v in ms],
                    "after_cholqr2_ms": round(statistics.median(c[1] for c in calls), 3),
                    "timeline_median_ms": {k: round(statistics.median(t.get(k, 0) for t in tl),
                                                    2) for k in (tl[0] if tl else {})},
                    "collectives": calls[-1][2].get("collectives"),
                    "blocks_per_worker": calls[-1][2].get("blocks_per_worker"),
                    "timelines": tl}
                r = out["rows"][key]
                print(key, r["median_ms"], "ms; after cholqr2", r["after_cholqr2_ms"],
                      "ms;", r["timeline_median_ms"], flush=True)
    setting(first)
    path = os.path.join(os.environ.get("OUT", "/tmp"), out_name)
    with open(path, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
