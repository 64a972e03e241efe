"""Square QR: two A/B switches in one process, alternating, twice.

``python3 bench/probes/square_ab.py OUT.json [triangle] [small[=N,N,...]]`` (both, and
``small`` at 8192, by default):

* ``triangle``: at 16384^2, fp32-emulated and fp64-emulated, the recursion's update with
  Y1's triangle as a TRMM split (:data:`~mpqr.qr.householder_recursive.TRIANGLE_AS_GEMM`
  = 8, today) against one GEMM over the zeros with R's triangle swapped out (= 1);
* ``small``: at each N^2, every precision, ``method="auto"`` (the library's QR route there)
  against ``method="householder-recursive"``.

cuSOLVER (``cupy.linalg.qr``) beside each.
"""

from __future__ import annotations

import importlib
import json
import sys

import cupy as cp

import mpqr
from mpqr.bench._timing import environment, release_pool, time_it

hr = importlib.import_module("mpqr.qr.householder_recursive")  # mpqr.qr is the function


def _row(rows, **kw):
    rows.append(kw)
    print(json.dumps(kw), flush=True)


def main(argv):
    out, probes = argv[0], argv[1:] or ["triangle", "small"]
    sizes = [8192]
    for p in probes:
        if p.startswith("small="):
            sizes = [int(v) for v in p.split("=", 1)[1].split(",")]
    rows = []
    keep = hr.TRIANGLE_AS_GEMM
    for prec in ("fp32-emulated", "fp64-emulated") if "triangle" in probes else ():
        dt = cp.float64 if prec == "fp64-emulated" else cp.float32
        a = cp.random.default_rng(7).standard_normal((16384, 16384), dtype=dt)
        base = time_it(cp, lambda a=a: cp.linalg.qr(a), repeat=2)
        for tag in ("trmm", "gemm") * 2:
            hr.TRIANGLE_AS_GEMM = keep if tag == "trmm" else 1
            release_pool(cp)
            t = time_it(cp, lambda a=a, p=prec: mpqr.qr(a, precision=p), repeat=3)
            _row(rows, probe="triangle", n=16384, precision=prec, variant=tag, ms=t * 1e3,
                 cusolver_ms=base * 1e3, speedup=base / t)
        hr.TRIANGLE_AS_GEMM = keep
        del a
        release_pool(cp)
    for n in sizes if any(p.startswith("small") for p in probes) else ():
        for prec in ("fp16", "fp32-emulated", "fp64-emulated"):
            dt = cp.float64 if prec == "fp64-emulated" else cp.float32
            a = cp.random.default_rng(8).standard_normal((n, n), dtype=dt)
            base = time_it(cp, lambda a=a: cp.linalg.qr(a), repeat=3)
            for method in ("auto", "geqrf", "householder-recursive") * 2:
                release_pool(cp)
                t = time_it(cp, lambda a=a, p=prec, m=method: mpqr.qr(a, precision=p,
                                                                       method=m), repeat=3)
                _row(rows, probe="small", n=n, precision=prec, method=method, ms=t * 1e3,
                     cusolver_ms=base * 1e3, speedup=base / t)
            del a
            release_pool(cp)
    with open(out, "w") as f:
        json.dump({"environment": environment(cp), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
