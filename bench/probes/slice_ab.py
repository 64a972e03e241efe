"""tc-sgemm's k-slices: each product's error and time by slice length, then the QR by
the backend's default slices.

``python3 bench/probes/slice_ab.py OUT.json``

1. Products: ``mpqr.matmul(a, b, "fp32-emulated", options={"slice_k": L})`` at the shapes
   the square QR runs (``TN``: ``a`` a transposed view, as ``W^T B``), Gaussian and
   uniform [0, 1) operands (same-sign sums: where the tensor cores' truncation adds up),
   the largest error relative to ``|a| |b|`` (float64 products) beside native SGEMM's,
   and the time (CUDA events, median of 3).
2. The QR with the backend's ``tc_sgemm_slice_large`` (products of at least
   ``tc_sgemm_small_mn`` outputs) at each value is ``flag_ab.py``'s A/B of a class
   attribute: ``python3 bench/probes/flag_ab.py OUT.json
   mpqr.backends._base.ArrayAPIBackend.tc_sgemm_slice_large=1024,2048,4096 --cases
   32768:fp32-emulated,16384:fp32-emulated --rounds 2`` (the committed
   ``slice_ab_H200_2026-11-29.json`` ran both parts in this probe's first form, the
   same loop).
"""

from __future__ import annotations

import json
import sys

import cupy as cp
from graphs_gpu import _ms

import mpqr
from mpqr.bench._timing import environment, release_pool

SHAPES = [  # (m, n, k, transposed a)
    (1024, 1024, 32768, True), (2048, 2048, 32768, True), (4096, 4096, 32768, True),
    (8192, 8192, 32768, True), (16384, 16384, 16384, False), (32768, 8192, 8192, False),
]


def _operands(m, n, k, trans, kind):
    rng = cp.random.default_rng(1)
    draw = rng.standard_normal if kind == "gaussian" else rng.random
    a = draw((k, m), dtype=cp.float64).astype(cp.float32).T if trans \
        else draw((m, k), dtype=cp.float64).astype(cp.float32)
    b = draw((k, n), dtype=cp.float64).astype(cp.float32)
    return a, b


def _err(c, a, b):
    a64, b64 = a.astype(cp.float64), b.astype(cp.float64)
    ref = a64 @ b64
    scale = cp.abs(a64) @ cp.abs(b64)
    return float(cp.max(cp.abs(c.astype(cp.float64) - ref) / scale))


def products(slices):
    rows = []
    for m, n, k, trans in SHAPES:
        for kind in ("gaussian", "uniform"):
            a, b = _operands(m, n, k, trans, kind)
            row = {"shape": [m, n, k], "a_transposed": trans, "operands": kind,
                   "sgemm_err": _err(a @ b, a, b), "sgemm_ms": _ms(lambda a=a, b=b: a @ b, 3)[1]}
            for s in slices:
                if s > k:
                    continue

                def call(s=s, a=a, b=b):
                    return mpqr.matmul(a, b, "fp32-emulated", options={"slice_k": s})

                row[f"slice_{s}"] = {"err": _err(call(), a, b), "ms": _ms(call, 3)[1]}
            rows.append(row)
            print(json.dumps(row), flush=True)
            del a, b
            release_pool(cp)
    return rows


def main(argv):
    res = {"environment": environment(cp),
           "products": products([128, 256, 512, 1024, 2048, 4096])}
    with open(argv[0], "w") as fh:
        json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
