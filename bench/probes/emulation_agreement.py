"""The square QR on the GPU against the NumPy backend's emulation of its engines.

``python3 bench/probes/emulation_agreement.py OUT.json [N ...]`` (default 1024 2048 3000):
for each ``N`` and precision (``fp16`` and ``fp32-emulated`` on float32, ``fp64-emulated``
on float64), ``mpqr.qr`` of one Gaussian matrix on CuPy and on NumPy (the same method,
``householder-recursive``), the backward error ``||A - QR||_F / ||A||_F`` and
orthogonality ``||I - Q^T Q||_F / n`` of each in float64, and the relative difference of
the two runs' errors. Three NumPy runs:

* ``numpy``: the host's own engine choices (its cost model's rates: at ``fp64-emulated``
  native DGEMM wherever the Ozaki engine would not be faster on the host);
* ``numpy_alike``: the NumPy backend given the GPU backend's rates (and its fused-Ozaki
  flag), so that the policy picks per product the engines the GPU picks; the engines of
  each product label are compared with the GPU's (``engines_alike``);
* the resolution of the figures themselves: ``PERTURBED`` runs on the GPU (and one on
  NumPy alike) of the same matrix with one entry moved by one unit in the last place
  (a different entry a run): the rounding errors take another course, so the relative
  spread of these runs' errors is the finest agreement two correct implementations with
  different summation orders can be expected to show.
"""

from __future__ import annotations

import collections
import json
import sys
import time

import cupy as cp
import numpy as np
from mpqr.backends import get_backend

import mpqr
from mpqr._array_api import array_namespace

PERTURBED = 4


def errors(a, q, r):
    a, q, r = (x.astype(np.float64) for x in (a, q, r))
    n = q.shape[1]
    return (float(np.linalg.norm(a - q @ r) / np.linalg.norm(a)),
            float(np.linalg.norm(q.T @ q - np.eye(n)) / n))


def nudged(a, seed):
    """``a`` with one entry (chosen by ``seed``) moved by one unit in the last place."""
    b = a.copy()
    i, j = np.random.default_rng(seed).integers(0, a.shape[0], size=2)
    b[i, j] = np.nextafter(b[i, j], np.inf, dtype=b.dtype)
    return b


def run(a, prec, *, gpu):
    x = cp.asarray(a) if gpu else a
    with mpqr.explain() as trace:
        t0 = time.perf_counter()
        q, r = mpqr.qr(x, precision=prec, method="householder-recursive")
        if gpu:
            cp.cuda.Device().synchronize()
        secs = time.perf_counter() - t0
    engines = collections.Counter((g.label, g.engine) for g in trace.gemms)
    if gpu:
        q, r = cp.asnumpy(q), cp.asnumpy(r)
    return errors(a, q, r), engines, secs


def rel(x, y):
    return abs(x - y) / y


def main(argv):
    out = argv[0]
    sizes = [int(x) for x in argv[1:]] or [1024, 2048, 3000]
    # the instances mpqr.qr uses (its namespaces are array-api-compat's)
    host_b, gpu_b = (get_backend(array_namespace(x.zeros(1))) for x in (np, cp))
    own = (host_b.rates, host_b.ozaki_fused)
    rows = []
    for n in sizes:
        for prec, dt in (("fp16", np.float32), ("fp32-emulated", np.float32),
                         ("fp64-emulated", np.float64)):
            a = np.random.default_rng(n).standard_normal((n, n)).astype(dt)
            gpu, gpu_eng, _ = run(a, prec, gpu=True)
            host, _, host_s = run(a, prec, gpu=False)
            host_b.rates, host_b.ozaki_fused = gpu_b.rates, gpu_b.ozaki_fused
            try:
                alike, alike_eng, alike_s = run(a, prec, gpu=False)
                alike_p = run(nudged(a, 0), prec, gpu=False)[0]
            finally:
                host_b.rates, host_b.ozaki_fused = own
            pert = [run(nudged(a, s), prec, gpu=True)[0] for s in range(PERTURBED)]
            # the engines of each label, GPU against NumPy alike (a label's counts may
            # differ where one backend fuses products the other runs apart)
            by_label = collections.defaultdict(lambda: [set(), set()])
            for (lab, eng), _c in gpu_eng.items():
                by_label[lab][0].add(eng)
            for (lab, eng), _c in alike_eng.items():
                by_label[lab][1].add(eng)
            differ = {lab: [sorted(g), sorted(h)] for lab, (g, h) in by_label.items()
                      if g and h and g != h}
            row = {"n": n, "precision": prec,
                   "gpu_backward": gpu[0], "gpu_orth": gpu[1],
                   "numpy_backward": host[0], "numpy_orth": host[1],
                   "backward_rel_diff": rel(gpu[0], host[0]),
                   "orth_rel_diff": rel(gpu[1], host[1]), "numpy_s": host_s,
                   "numpy_alike_backward": alike[0], "numpy_alike_orth": alike[1],
                   "alike_backward_rel_diff": rel(gpu[0], alike[0]),
                   "alike_orth_rel_diff": rel(gpu[1], alike[1]), "numpy_alike_s": alike_s,
                   "engines_alike": not differ, "engines_differ": differ,
                   "gpu_engines": sorted({e for _, e in gpu_eng}),
                   "numpy_alike_engines": sorted({e for _, e in alike_eng}),
                   "gpu_perturbed": pert, "numpy_alike_perturbed": alike_p,
                   # the figures' own resolution: the perturbed runs against the run
                   "gpu_perturbed_backward_max_rel": max(rel(p[0], gpu[0]) for p in pert),
                   "gpu_perturbed_orth_max_rel": max(rel(p[1], gpu[1]) for p in pert),
                   "numpy_alike_perturbed_backward_rel": rel(alike_p[0], alike[0]),
                   "numpy_alike_perturbed_orth_rel": rel(alike_p[1], alike[1])}
            rows.append(row)
            print({k: (f"{v:.3g}" if isinstance(v, float) else v) for k, v in row.items()
                   if k not in ("gpu_perturbed",)}, flush=True)
    with open(out, "w") as f:
        json.dump({"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
                   "perturbed": PERTURBED, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
