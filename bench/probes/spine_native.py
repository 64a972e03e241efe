"""The recursion with native products, the spine by halves against in blocks, beside
cuSOLVER, one process.

``python3 bench/probes/spine_native.py OUT.json [N ...]`` (default 8192 11264 16384): for
each ``N`` and float32 / float64, ``mpqr.qr(A, precision=<the dtype's>,
method="householder-recursive")`` with :data:`mpqr.qr.householder_recursive.SPINE_BLOCK`
``None`` and its default, and ``cupy.linalg.qr(A)``, alternated in two rounds of three
calls (CUDA events, medians), with the backward error of each.
"""

from __future__ import annotations

import importlib
import json
import statistics
import sys

import cupy as cp

import mpqr

hr = importlib.import_module("mpqr.qr.householder_recursive")


def timed(fn, reps=3):
    out = []
    for _ in range(reps):
        s, e = cp.cuda.Event(), cp.cuda.Event()
        s.record()
        res = fn()
        e.record()
        e.synchronize()
        out.append(cp.cuda.get_elapsed_time(s, e))
    return out, res


def backward(a, q, r):
    a64 = a.astype(cp.float64)
    return float(cp.linalg.norm(a64 - q.astype(cp.float64) @ r.astype(cp.float64))
                 / cp.linalg.norm(a64))


def main(argv):
    out = argv[0]
    sizes = [int(x) for x in argv[1:]] or [8192, 11264, 16384]
    default = hr.SPINE_BLOCK
    rows = []
    for n in sizes:
        for dt, prec in ((cp.float32, "fp32"), (cp.float64, "fp64")):
            a = cp.random.default_rng(0).standard_normal((n, n), dtype=cp.float64).astype(dt)
            configs = {"halves": None, "blocks": default, "cusolver": "cusolver"}
            times = {k: [] for k in configs}
            err = {}
            for _ in range(2):
                for k, sb in configs.items():
                    if sb == "cusolver":
                        t, (q, r) = timed(lambda a=a: cp.linalg.qr(a))
                    else:
                        hr.SPINE_BLOCK = sb
                        t, (q, r) = timed(lambda a=a, p=prec: mpqr.qr(
                            a, precision=p, method="householder-recursive"))
                    times[k] += t
                    err[k] = backward(a, q, r)
                    del q, r
            hr.SPINE_BLOCK = default
            row = {"n": n, "dtype": str(a.dtype), "precision": prec,
                   **{f"{k}_ms": statistics.median(v) for k, v in times.items()},
                   **{f"{k}_backward": v for k, v in err.items()}}
            rows.append(row)
            print(row, flush=True)
            del a
            cp.get_default_memory_pool().free_all_blocks()
    with open(out, "w") as f:
        json.dump({"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
                   "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
