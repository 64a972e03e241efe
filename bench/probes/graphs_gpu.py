"""Square QR replayed from CUDA graphs (``mpqr.backends.cupy.graphs``) against the same
calls run as they are (``MPQR_GRAPHS=0``), alternated in one process.

``python3 bench/probes/graphs_gpu.py OUT.json [N ...] [--precisions P,P] [--try P,P]``:
for each N^2 float32 (float64 for the fp64 precisions) and precision, on fresh Gaussian
inputs of several seeds: the first call (run as it is), the second (captured, then
launched) and the median of later calls with replays on and off, alternated, beside
``cupy.linalg.qr``; the replayed factors against the ones run as they are (bitwise), the
backward error and orthogonality (float64), the bytes the kept graphs hold. ``--try``
adds precisions to ``driver.REPLAYED`` first (a capture that fails says why); the size
cap ``driver.REPLAY_MAX_ELEMENTS`` is raised to the largest N^2.
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


def _ms(fn, reps=5):
    out = []
    for _ in range(reps):
        s, e = cp.cuda.Event(), cp.cuda.Event()
        s.record()
        fn()
        e.record()
        e.synchronize()
        out.append(cp.cuda.get_elapsed_time(s, e))
    out.sort()
    return out


def _errors(a, q, r):
    a64, q64, r64 = (x.astype(cp.float64) for x in (a, q, r))
    be = float(cp.linalg.norm(q64 @ r64 - a64) / cp.linalg.norm(a64))
    orth = float(cp.linalg.norm(q64.T @ q64 - cp.eye(q.shape[1])))
    return be, orth


def main(argv):
    out = argv[0]
    sizes, precs, extra = [], ["fp16"], []
    it = iter(argv[1:])
    for v in it:
        if v == "--precisions":
            precs = next(it).split(",")
        elif v == "--try":
            extra = next(it).split(",")
        else:
            sizes.append(int(v))
    sizes = sizes or [8192, 16384]
    if extra:
        driver.REPLAYED = driver.REPLAYED | frozenset(extra)
    # replays at every size measured here (the library's cap is what this probe sets)
    driver.REPLAY_MAX_ELEMENTS = max(driver.REPLAY_MAX_ELEMENTS, max(sizes) ** 2)
    rows = []
    for n in sizes:
        for prec in precs:
            dt = cp.float64 if prec.startswith("fp64") else cp.float32
            graphs.clear()
            graphs.FAILED.clear()
            rng = cp.random.default_rng(0)
            inputs = [rng.standard_normal((n, n), dtype=cp.float64).astype(dt) for _ in range(3)]
            call = lambda x, prec=prec: mpqr.qr(x, precision=prec,  # noqa: E731
                                                method="householder-recursive")
            row = {"n": n, "dtype": dt.__name__, "precision": prec}
            os.environ["MPQR_GRAPHS"] = "1"
            t = time.perf_counter()
            q0, r0 = call(inputs[0])
            cp.cuda.Device().synchronize()
            row["first_ms"] = (time.perf_counter() - t) * 1e3
            t = time.perf_counter()
            q1, r1 = call(inputs[1])
            cp.cuda.Device().synchronize()
            row["second_ms"] = (time.perf_counter() - t) * 1e3
            row["captured"] = bool(graphs._GRAPHS)
            row["failed"] = list(graphs.FAILED.values())
            row["held_multiple"] = graphs.held_bytes() / inputs[0].nbytes
            # every input through the replay and without it: the same bits
            same = True
            for a in inputs:
                os.environ["MPQR_GRAPHS"] = "1"
                qg, rg = call(a)
                os.environ["MPQR_GRAPHS"] = "0"
                qe, re_ = call(a)
                same &= bool(cp.array_equal(qg, qe) and cp.array_equal(rg, re_))
            row["bitwise_equal"] = same
            row["backward"], row["orth"] = _errors(inputs[2], qg, rg)
            del q0, r0, q1, r1, qg, rg, qe, re_
            a0 = inputs[0]
            times = {"replay": [], "eager": [], "cusolver": []}
            for _ in range(2):
                for name in times:
                    if name == "cusolver":
                        fn = lambda a0=a0: cp.linalg.qr(a0)  # noqa: E731
                    else:
                        os.environ["MPQR_GRAPHS"] = "1" if name == "replay" else "0"
                        fn = lambda a0=a0, call=call: call(a0)  # noqa: E731
                    fn()
                    times[name] += _ms(fn, 4)
            os.environ["MPQR_GRAPHS"] = "1"
            for name, v in times.items():
                v.sort()
                row[f"{name}_ms"] = v[len(v) // 2]
                row[f"{name}_all_ms"] = [round(x, 2) for x in v]
            row["replay_vs_cusolver"] = row["cusolver_ms"] / row["replay_ms"]
            row["eager_vs_cusolver"] = row["cusolver_ms"] / row["eager_ms"]
            rows.append(row)
            print(json.dumps(row), flush=True)
            del inputs
            graphs.clear()
            release_pool(cp)
    with open(out, "w") as fh:
        json.dump({"environment": environment(cp), "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
