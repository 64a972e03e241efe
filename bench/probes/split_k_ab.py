"""A/B on one GPU: tall float64 QR and least squares with the Gram products split along
the rows (``backends/cupy/split_k.py``) against one GEMM each (``split_k.MIN_K`` out of
reach), alternated in one process, timed as ``bench qr`` times (CUDA events, medians of
5 per round), beside ``cupy.linalg.qr``; every result checked (orthogonality, backward
error; lstsq's residual against cuSOLVER's).

``python bench/probes/split_k_ab.py`` writes ``$OUT/split_k_ab.json``.
"""

import json
import os
import statistics
import sys

import cupy as cp
from mpqr.backends.cupy import split_k
from mpqr.backends.cupy.gram_dd import gram_dd_update

import mpqr
from mpqr.bench._timing import environment, release_pool, time_it, write_json

ON = (split_k.MIN_K, split_k.CHUNK, split_k.MAX_PARTS)
#: variants: (MIN_K, CHUNK, MAX_PARTS); "one": cuBLAS's single GEMM
VARIANTS = {"one": (1 << 62, ON[1], ON[2]), "split": ON, "p256": (ON[0], 16384, 256)}
PICK = os.environ.get("SPLIT_AB_VARIANTS", ",".join(VARIANTS)).split(",")
ROUNDS = int(os.environ.get("SPLIT_AB_ROUNDS", "3"))


def _set(v):
    split_k.MIN_K, split_k.CHUNK, split_k.MAX_PARTS = v


def _errors(a, q, r):
    """``||Q^T Q - I||_F`` by cuBLAS's GEMM (as ``bench qr`` reads it, unnormalised) and
    by a double-double Gram matrix (the rounding of the check itself left out), and
    the backward error."""
    n = a.shape[1]
    orth = float(cp.linalg.norm(q.T @ q - cp.eye(n)))
    acc = gram_dd_update(q[:, : n - 1], q[:, n - 1:], cp.zeros((2, n, n)))
    orth_dd = float(cp.linalg.norm((acc[0] - cp.eye(n)) + acc[1]))
    back = float(cp.linalg.norm(q @ r - a) / cp.linalg.norm(a))
    return orth, orth_dd, back


def row(m, n, what):
    rs = cp.random.RandomState(11)
    a = rs.standard_normal((m, n))
    out = {"m": m, "n": n, "what": what}
    if what == "qr":
        fns = {"x": lambda: mpqr.qr(a)}
        out["cusolver_ms"] = time_it(cp, lambda: cp.linalg.qr(a), repeat=3) * 1e3
    elif what == "qr_r":
        fns = {"x": lambda: mpqr.qr(a, mode="r")}
        out["cusolver_ms"] = time_it(cp, lambda: cp.linalg.qr(a, mode="r"), repeat=3) * 1e3
    else:
        b = rs.standard_normal(m)
        fns = {"x": lambda: mpqr.lstsq(a, b)}
    times = {k: [] for k in PICK}
    for k in times:
        _set(VARIANTS[k])
        if what == "qr":
            q, r = mpqr.qr(a)
            out[f"{k}_orth"], out[f"{k}_orth_dd"], out[f"{k}_backward"] = _errors(a, q, r)
            del q, r
        elif what == "lstsq":
            x = mpqr.lstsq(a, b)[0]
            out[f"{k}_normal_residual"] = float(
                cp.linalg.norm(a.T @ (b - a @ x)) / (cp.linalg.norm(a) ** 2 * cp.linalg.norm(x)))
    release_pool(cp)
    for _ in range(ROUNDS):
        for k in times:
            _set(VARIANTS[k])
            times[k].append(time_it(cp, fns["x"], repeat=5))
    _set(ON)
    for k, t in times.items():
        out[f"{k}_ms"] = statistics.median(t) * 1e3
        out[f"{k}_all_ms"] = [v * 1e3 for v in t]
    if "cusolver_ms" in out:
        for k in times:
            out[f"{k}_speedup"] = out["cusolver_ms"] / out[f"{k}_ms"]
    print(json.dumps({k: v for k, v in out.items() if not k.endswith("_all_ms")}), flush=True)
    return out


def main():
    rows = [row(m, n, w) for m, n, w in [
        (2**22, 64, "qr"), (2**24, 64, "qr"), (2**21, 128, "qr"), (2**22, 64, "lstsq"),
        (2**22, 64, "qr_r")]]
    write_json(os.path.join(os.environ.get("OUT", "."), "split_k_ab.json"),
               {"environment": environment(cp), "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
