"""The certified recursion with native GEMMs against cuSOLVER, at the input's own precision.

``python3 bench/probes/native_recursion.py OUT.json [MxN ...]`` (default 4096, 6144,
8192, 12288, 16384 squares): for float64 at ``fp64`` and float32 at ``fp32``, three
rounds of 3 calls each of ``cupy.linalg.qr``, ``mpqr.qr(method="geqrf")``,
``mpqr.qr(method="householder-recursive")`` and ``mpqr.qr`` as ``auto`` chooses
(alternated, CUDA events; the medians and minima), the engines of the recursion's
products, ``auto``'s method, and the backward error and orthogonality of the recursion and
of cuSOLVER in float64. The evidence for the CuPy backend's ``native_recursion_square``.
"""

from __future__ import annotations

import json
import sys

import cupy as cp
from graphs_gpu import _ms  # the probe beside this one
from mpqr.backends.cupy import graphs

import mpqr


def _errors(a, q, r):
    a64, q64, r64 = (x.astype(cp.float64) for x in (a, q, r))
    n = q64.shape[1]
    return (float(cp.linalg.norm(q64 @ r64 - a64) / cp.linalg.norm(a64)),
            float(cp.linalg.norm(q64.T @ q64 - cp.eye(n)) / n))


def main(argv):
    shapes = []
    for s in argv[1:] or ["4096", "6144", "8192", "12288", "16384"]:
        m, _, n = s.partition("x")
        shapes.append((int(m), int(n or m)))
    rows = []
    for m, n in shapes:
        for dt, prec in ((cp.float64, "fp64"), (cp.float32, "fp32")):
            a = cp.random.default_rng(n).standard_normal((m, n), dtype=cp.float64).astype(dt)
            row = {"m": m, "n": n, "dtype": cp.dtype(dt).name, "precision": prec}
            fns = {"cusolver": lambda a=a: cp.linalg.qr(a),
                   "geqrf": lambda a=a, p=prec: mpqr.qr(a, precision=p, method="geqrf"),
                   "recursive": lambda a=a, p=prec: mpqr.qr(a, precision=p,
                                                            method="householder-recursive"),
                   "auto": lambda a=a, p=prec: mpqr.qr(a, precision=p)}
            for f in fns.values():
                f()
            times = {k: [] for k in fns}
            for _ in range(3):
                for k, f in fns.items():
                    graphs.clear()
                    f()
                    times[k] += _ms(f, 3)
            for k, t in times.items():
                t.sort()
                row[k] = round(t[len(t) // 2], 2)
                row[k + "_min"] = round(t[0], 2)
            with mpqr.explain() as trace:
                q, r = mpqr.qr(a, precision=prec, method="householder-recursive")
            row["engines"] = sorted({g.engine for g in trace.gemms})
            row["backward"], row["orth"] = _errors(a, q, r)
            with mpqr.explain() as trace:
                mpqr.qr(a, precision=prec)
            row["auto_method"] = [e.data["method"] for e in trace.events
                                  if e.kind == "method"]
            q, r = cp.linalg.qr(a)
            row["backward_cusolver"], row["orth_cusolver"] = _errors(a, q, r)
            del q, r, a
            print(json.dumps(row), flush=True)
            rows.append(row)
    with open(argv[0], "w") as fh:
        json.dump({"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
                   "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
