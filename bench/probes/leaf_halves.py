"""The certified leaf by halves against panel after panel (``CERTIFIED_LEAF_RECURSIVE``).

``python3 bench/probes/leaf_halves.py OUT.json [MxK ...]``: one leaf
(``panel_blocked.certified_leaf`` with its W combined, as the recursive QR asks for it) of
each ``M x K`` float32 and float64 matrix, both ways alternated (CUDA events, medians of
7 on fresh copies; ``host_ms``: until the call returned, its launches issued), the
largest difference of the factors between the two ways, and the leaf's Householder QR
residual ``||A - (I - W Y^T)[:, :K] R||`` relative to ``||A||`` (float64 products).
``--trace``: CUPTI's kernels of one float32 call each way (GPU busy time, span, top
kernels; ``kernel_time.py``'s classes).
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import cupy as cp
from mpqr.backends import get_backend, panel_cholqr

from mpqr._array_api import array_namespace
from mpqr.bench._timing import environment
from mpqr.qr import panel_blocked


def leaf(a, by_halves: bool):
    panel_cholqr.CERTIFIED_LEAF_RECURSIVE = by_halves
    backend = get_backend(array_namespace(a))
    work = a.copy()
    w = cp.zeros_like(a)
    cert = backend.new_certificate(work)
    k = a.shape[1]
    start, end = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    t0 = time.perf_counter()
    tau = panel_blocked.certified_leaf(backend, work, w, 0, k, cert=cert,
                                       precision="fp32" if a.dtype == cp.float32 else "fp64",
                                       combine=True)
    host = 1e3 * (time.perf_counter() - t0)
    end.record()
    end.synchronize()
    leaf.host_ms = host
    return cp.cuda.get_elapsed_time(start, end), work, w, tau, int(cert[0])


def main(argv: list[str]) -> None:
    trace = "--trace" in argv
    argv = [v for v in argv if v != "--trace"]
    out, shapes = argv[0], argv[1:] or ["16384x1024", "65536x512", "32768x1024"]
    if trace:  # CUPTI and the primary context before CuPy's work (kernel_time.py)
        import torch

        torch.zeros(1, device="cuda")
    panel_cholqr.CERTIFIED_LEAF_SCHEDULE_MIN_ROWS = 0
    rows = []
    for shape in shapes:
        m, k = (int(v) for v in shape.split("x"))
        for dt in (cp.float32, cp.float64):
            a = cp.random.default_rng(3).standard_normal((m, k), dtype=cp.float64).astype(dt)
            times = {False: [], True: []}
            host = {False: [], True: []}
            for rep in range(8):
                for way in (False, True):
                    ms, *_ = leaf(a, way)
                    if rep:
                        times[way].append(ms)
                        host[way].append(leaf.host_ms)
            got = {way: leaf(a, way)[1:] for way in (False, True)}
            (wk0, w0, t0, f0), (wk1, w1, t1, f1) = got[False], got[True]
            y = cp.tril(wk1.astype(cp.float64), -1)[:, :k] + cp.eye(m, k)
            r = cp.triu(wk1[:k].astype(cp.float64))
            a64 = a.astype(cp.float64)
            # (I - W Y^T)[:, :k] R = R's rows padded - W (Y[:k]^T R)
            qr = cp.zeros((m, k))
            qr[:k] = r
            qr -= w1.astype(cp.float64) @ (y[:k].T @ r)
            row = {"shape": shape, "dtype": cp.dtype(dt).name,
                   "panel_after_panel_ms": statistics.median(times[False]),
                   "by_halves_ms": statistics.median(times[True]),
                   "all_ms": {str(w): [round(t, 3) for t in times[w]] for w in times},
                   "host_ms": {str(w): statistics.median(host[w]) for w in host},
                   "fails": [f0, f1],
                   "max_diff_work": float(cp.abs(wk1 - wk0).max() / cp.abs(wk0).max()),
                   "max_diff_w": float(cp.abs(w1 - w0).max() / cp.abs(w0).max()),
                   "max_diff_tau": float(cp.abs(t1 - t0).max()),
                   "residual": float(cp.linalg.norm(qr - a64) / cp.linalg.norm(a64))}
            print(row["shape"], row["dtype"], f"{row['panel_after_panel_ms']:.2f} -> "
                  f"{row['by_halves_ms']:.2f} ms (host {row['host_ms']})",
                  f"diff {row['max_diff_work']:.1e}",
                  f"res {row['residual']:.1e}", flush=True)
            if trace and dt == cp.float32:
                from kernel_time import profiled  # the probe beside this one (torch)

                row["trace"] = {str(w): profiled(lambda w=w, a=a: leaf(a, w))
                                for w in (False, True)}
                print({w: {k: round(v, 2) for k, v in t[0].items() if k != "kernel_ms_by_class"}
                       for w, t in row["trace"].items()}, flush=True)
            rows.append(row)
    with open(out, "w") as f:
        json.dump({"device": environment(cp)["device"], "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
