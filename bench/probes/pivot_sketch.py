"""QR with column pivoting on CuPy: the sketch's pivots by the kernel (a launch a step), by LAPACK
on the host or by the portable loop on the device, A/B in one process, against cuSOLVER's
unpivoted QR; and the kernel's pivots against LAPACK's on random sketches.

``python3 bench/probes/pivot_sketch.py OUT.json [MxN ...]`` (default 16384x16384 and
65536x4096, float64, precision auto): time, backward error ``||A[:, P] - QR|| / ||A||``
and whether the routes chose the same pivots.
"""

from __future__ import annotations

import json
import sys

import cupy as cp
import numpy as np
from mpqr.backends.cupy.backend import CupyBackend

import mpqr
from mpqr.bench._timing import environment, release_pool, time_it

ROUTES = ("kernel", "host")  # "loop": 11.4 s at 16384^2 (bench/NOTES.md)


def main(argv):
    out = argv[0]
    shapes = [tuple(int(v) for v in s.split("x")) for s in argv[1:]] or [(16384, 16384),
                                                                          (65536, 4096)]
    rows = []
    for m, n in shapes:
        a = cp.random.default_rng(m + n).standard_normal((m, n))
        base = time_it(cp, lambda a=a: cp.linalg.qr(a), repeat=3)
        piv = {}
        for route in ROUTES:
            CupyBackend.qrcp_route = route
            release_pool(cp)
            q, r, p = mpqr.qr(a, pivoting=True)
            back = float(cp.linalg.norm(a[:, p] - q @ r) / cp.linalg.norm(a))
            piv[route] = p.get()
            del q, r
            t = time_it(cp, lambda a=a: mpqr.qr(a, pivoting=True), repeat=2, max_seconds=20)
            row = {"shape": f"{m}x{n}", "sketch_qrcp": route,
                   "time_ms": t * 1e3, "cusolver_unpivoted_ms": base * 1e3,
                   "ratio_to_cusolver": t / base, "backward": back}
            rows.append(row)
            print(f"{m}x{n} {row['sketch_qrcp']:<7} {t * 1e3:9.1f} ms  cuSOLVER geqrf+orgqr "
                  f"{base * 1e3:7.1f} ms  ratio {t / base:5.2f}  backward {back:.1e}", flush=True)
        for other in ROUTES[1:]:
            print(f"{m}x{n} same pivots kernel/{other}: "
                  f"{bool((piv['kernel'] == piv[other]).all())}")
        del a
    CupyBackend.qrcp_route = "kernel"
    # the kernel's pivots against LAPACK geqp3 on random sketches (ties have measure zero)
    import scipy.linalg as sla
    from mpqr.backends.cupy import qrcp as cupy_qrcp
    rng = np.random.default_rng(0)
    agree = 0
    for _ in range(20):
        nr, nc = int(rng.integers(5, 140)), int(rng.integers(5, 3000))
        yh = rng.standard_normal((nr, nc)) * np.geomspace(1, 1e-3, nc)[rng.permutation(nc)]
        kk = min(nr, nc, 128)
        ref = sla.qr(yh, mode="r", pivoting=True)[1][:kk].tolist()
        got = cupy_qrcp.qrcp_pivots(cp.asarray(yh), kk)
        agree += got == ref
        if got != ref:
            first = next(i for i, (g, r) in enumerate(zip(got, ref)) if g != r)
            print(f"sketch {nr}x{nc}: first difference at step {first} of {kk}")
    print(f"kernel pivots equal LAPACK's on {agree} of 20 float64 sketches")
    rows.append({"kernel_equals_lapack": agree, "of": 20})
    with open(out, "w") as f:
        json.dump({"environment": environment(cp), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
