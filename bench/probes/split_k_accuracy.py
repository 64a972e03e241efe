"""The rounding of a tall float64 Gram matrix ``A^T A`` split along the rows
(``backends/cupy/split_k.py``) against cuBLAS's single GEMM: each variant's error against
a double-double reference (``backends/cupy/gram_dd.py``), on Gaussian ``A`` (a CholQR
pass's first Gram matrix) and on ``A / sqrt(m)`` (near-orthonormal columns, the second
pass's), with the partial blocks summed in a row (``cupy.sum``) or pairwise; and each
variant's time (CUDA events, medians of 7).

``python bench/probes/split_k_accuracy.py`` writes ``$OUT/split_k_accuracy.json``.
"""

import functools
import json
import os
import statistics
import sys
from pathlib import Path

import cupy as cp
from mpqr.backends.cupy.gram_dd import gram_dd_update

from mpqr.bench._timing import environment, time_it, write_json

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gram_splitk import partials, plain


def split_row(a, p):
    return partials(a, p).sum(axis=0)


def split_pairwise(a, p):
    s = partials(a, p)
    while s.shape[0] > 1:
        h = s.shape[0] // 2
        odd = s[2 * h:]
        s2 = s[:h] + s[h:2 * h]
        if odd.shape[0]:
            s2[0] += odd[0]
        s = s2
    return s[0]


def reference(a):
    n = a.shape[1]
    acc = cp.zeros((2, n, n))
    acc = gram_dd_update(a[:, : n - 1], a[:, n - 1:], acc)
    return acc[0], acc[1]


def row(m, n, scaled):
    rs = cp.random.RandomState(5)
    a = rs.standard_normal((m, n))
    if scaled:
        a /= m ** 0.5
    hi, lo = reference(a)
    norm = float(cp.linalg.norm(hi))
    fns = {"plain": plain}
    for p in (256, 1024, 2048, 4096):
        fns[f"row{p}"] = functools.partial(split_row, p=p)
        fns[f"pair{p}"] = functools.partial(split_pairwise, p=p)
    out = {"m": m, "n": n, "scaled": scaled}
    for k, f in fns.items():
        g = f(a)
        d = (g - hi) - lo
        out[f"{k}_fro"] = float(cp.linalg.norm(d)) / norm
        out[f"{k}_diag_rms_ulps"] = float(cp.sqrt(cp.mean((cp.diagonal(d) / cp.abs(
            cp.diagonal(hi))) ** 2))) / 2.0**-53
        out[f"{k}_ms"] = statistics.median(time_it(cp, functools.partial(f, a), repeat=7)
                                           for _ in range(2)) * 1e3
    print(json.dumps(out), flush=True)
    return out


def main():
    rows = [row(m, n, s) for m, n in [(2**22, 64), (2**24, 64), (2**21, 128), (2**22, 32)]
            for s in (False, True)]
    write_json(os.path.join(os.environ.get("OUT", "."), "split_k_accuracy.json"),
               {"environment": environment(cp), "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
