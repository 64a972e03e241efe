"""The square QR on the GPU against the NumPy backend's emulation of its engines.

``python3 bench/probes/emulation_agreement.py OUT.json [N ...]`` (default 1024 2048 3000):
for each ``N`` and precision (``fp16`` and ``fp32-emulated`` on float32, ``fp64-emulated``
on float64), ``mpqr.qr`` of one Gaussian matrix on CuPy and on NumPy (the same method,
``householder-recursive``), the backward error ``||A - QR||_F / ||A||_F`` and
orthogonality ``||I - Q^T Q||_F / n`` of each in float64, and the relative difference of
the two runs' errors.
"""

from __future__ import annotations

import json
import sys
import time

import cupy as cp
import numpy as np

import mpqr


def errors(a, q, r):
    a, q, r = (x.astype(np.float64) for x in (a, q, r))
    n = q.shape[1]
    return (float(np.linalg.norm(a - q @ r) / np.linalg.norm(a)),
            float(np.linalg.norm(q.T @ q - np.eye(n)) / n))


def main(argv):
    out = argv[0]
    sizes = [int(x) for x in argv[1:]] or [1024, 2048, 3000]
    rows = []
    for n in sizes:
        for prec, dt in (("fp16", np.float32), ("fp32-emulated", np.float32),
                         ("fp64-emulated", np.float64)):
            a = np.random.default_rng(n).standard_normal((n, n)).astype(dt)
            q, r = mpqr.qr(cp.asarray(a), precision=prec, method="householder-recursive")
            gpu = errors(a, cp.asnumpy(q), cp.asnumpy(r))
            t0 = time.perf_counter()
            q, r = mpqr.qr(a, precision=prec, method="householder-recursive")
            host_s = time.perf_counter() - t0
            host = errors(a, q, r)
            row = {"n": n, "precision": prec, "gpu_backward": gpu[0], "gpu_orth": gpu[1],
                   "numpy_backward": host[0], "numpy_orth": host[1],
                   "backward_rel_diff": abs(gpu[0] - host[0]) / host[0],
                   "orth_rel_diff": abs(gpu[1] - host[1]) / host[1], "numpy_s": host_s}
            rows.append(row)
            print(row, flush=True)
    with open(out, "w") as f:
        json.dump({"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
                   "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
