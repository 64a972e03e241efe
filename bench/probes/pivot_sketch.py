"""QR with column pivoting on CuPy: the sketch's pivots by LAPACK on the host or by the
vectorized loop on the device, A/B in one process, against cuSOLVER's unpivoted QR.

``python3 bench/probes/pivot_sketch.py OUT.json [MxN ...]`` (default 16384x16384 and
65536x4096, float64, precision auto): time, backward error ``||A[:, P] - QR|| / ||A||``
and whether both ways chose the same pivots.
"""

from __future__ import annotations

import json
import sys

import cupy as cp
from mpqr.backends.cupy_backend import CupyBackend

import mpqr
from mpqr.tools._timing import environment, release_pool, time_it


def main(argv):
    out = argv[0]
    shapes = [tuple(int(v) for v in s.split("x")) for s in argv[1:]] or [(16384, 16384),
                                                                          (65536, 4096)]
    rows = []
    for m, n in shapes:
        a = cp.random.default_rng(m + n).standard_normal((m, n))
        base = time_it(cp, lambda a=a: cp.linalg.qr(a), repeat=3)
        piv = {}
        for host in (True, False, True):
            CupyBackend.qrcp_on_host = host
            release_pool(cp)
            q, r, p = mpqr.qr(a, pivoting=True)
            back = float(cp.linalg.norm(a[:, p] - q @ r) / cp.linalg.norm(a))
            piv[host] = p.get()
            del q, r
            t = time_it(cp, lambda a=a: mpqr.qr(a, pivoting=True), repeat=2, max_seconds=20)
            row = {"shape": f"{m}x{n}", "sketch_qrcp": "host" if host else "device",
                   "time_ms": t * 1e3, "cusolver_unpivoted_ms": base * 1e3,
                   "ratio_to_cusolver": t / base, "backward": back}
            rows.append(row)
            print(f"{m}x{n} {row['sketch_qrcp']:<7} {t * 1e3:9.1f} ms  cuSOLVER geqrf+orgqr "
                  f"{base * 1e3:7.1f} ms  ratio {t / base:5.2f}  backward {back:.1e}", flush=True)
        print(f"{m}x{n} same pivots host/device: {bool((piv[True] == piv[False]).all())}")
        del a
    CupyBackend.qrcp_on_host = True
    with open(out, "w") as f:
        json.dump({"environment": environment(cp), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
