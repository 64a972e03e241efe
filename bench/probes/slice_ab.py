"""tc-sgemm's k-slices: each product's error and time by slice length, then the QR by
the backend's default slices.

``python3 bench/probes/slice_ab.py OUT.json [--qr CASE,...] [--rounds 2]``

1. Products: ``mpqr.matmul(a, b, "fp32-emulated", options={"slice_k": L})`` at the shapes
   the square QR runs (``TN``: ``a`` a transposed view, as ``W^T B``), Gaussian and
   uniform [0, 1) operands (same-sign sums: where the tensor cores' truncation adds up),
   the largest error relative to ``|a| |b|`` (float64 products) beside native SGEMM's,
   and the time (CUDA events, median of 3).
2. The QR (``flag_ab.py``'s cases) with the backend's ``tc_sgemm_slice_large`` (products
   of at least ``tc_sgemm_small_mn`` outputs) at each value of ``--large`` (default
   1024,2048,4096), alternated in rounds of 4 calls: medians, backward error and
   orthogonality in float64.
"""

from __future__ import annotations

import json
import sys

import cupy as cp
from flag_ab import case_matrix  # the probe beside this one
from graphs_gpu import _ms
from mpqr.backends._base import ArrayAPIBackend
from mpqr.backends.cupy import graphs

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


def qr(cases, larges, rounds):
    keep = ArrayAPIBackend.tc_sgemm_slice_large
    rows = []
    for case in cases:
        n, prec, a = case_matrix(case)

        def call(a=a, prec=prec):
            return mpqr.qr(a, precision=prec, method="householder-recursive")

        times = {v: [] for v in larges}
        for _ in range(rounds):
            for v in larges:
                ArrayAPIBackend.tc_sgemm_slice_large = v
                graphs.clear()
                call()
                times[v] += _ms(call, 4)
        row = {"case": case}
        for v in larges:
            ArrayAPIBackend.tc_sgemm_slice_large = v
            graphs.clear()
            q, r = call()
            a64, q64, r64 = (x.astype(cp.float64) for x in (a, q, r))
            t = sorted(times[v])
            row[str(v)] = {"ms": t[len(t) // 2], "all": [round(x, 2) for x in t],
                           "backward": float(cp.linalg.norm(q64 @ r64 - a64)
                                             / cp.linalg.norm(a64)),
                           "orth": float(cp.linalg.norm(q64.T @ q64 - cp.eye(n)) / n)}
            del q, r, a64, q64, r64
        ArrayAPIBackend.tc_sgemm_slice_large = keep
        rows.append(row)
        print(json.dumps(row), flush=True)
        del a
        release_pool(cp)
    return rows


def main(argv):
    out = argv[0]
    cases = argv[argv.index("--qr") + 1].split(",") if "--qr" in argv else []
    rounds = int(argv[argv.index("--rounds") + 1]) if "--rounds" in argv else 2
    larges = [int(v) for v in argv[argv.index("--large") + 1].split(",")] \
        if "--large" in argv else [1024, 2048, 4096]
    res = {"environment": environment(cp)}
    if "--no-products" not in argv:
        res["products"] = products([128, 256, 512, 1024, 2048, 4096])
    res["qr"] = qr(cases, larges, rounds)
    with open(out, "w") as fh:
        json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
