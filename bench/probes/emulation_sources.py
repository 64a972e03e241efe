"""Where the GPU's square QR and the NumPy emulation part: the same matrix factored with
one piece of the GPU route swapped at a time.

``python3 bench/probes/emulation_sources.py OUT.json [N ...]`` (default 2048): for each
``N`` and precision (``fp32-emulated`` on float32, ``fp64-emulated`` on float64, one
Gaussian matrix, ``householder-recursive``), the backward error and orthogonality
(float64, as ``emulation_agreement.py``'s) of

* ``gpu``: the GPU route as it is;
* ``gpu_portable_panels``: CuPy running the portable certified panels and leaves
  (``backends/panel_cholqr.py``, the loop the NumPy backend runs) instead of the CUDA
  kernels;
* ``gpu_geqrf_panels`` / ``numpy_geqrf_panels``: certified panels off on both (the
  backend's ``certified_panels`` flag: cuSOLVER's / LAPACK's ``geqrf`` panels);
* ``numpy``: the NumPy backend as it is.

A 1-ulp change of one input entry moves these figures by about 0.1 %
(``emulation_agreement.py``), so a larger gap between two variants is a difference of
arithmetic, not of rounding luck.
"""

from __future__ import annotations

import contextlib
import json
import sys

import cupy as cp
import numpy as np
from emulation_agreement import errors  # the probe beside this one
from mpqr.backends import get_backend
from mpqr.backends.cupy import panel_cholqr as cpc

import mpqr
from mpqr._array_api import array_namespace


@contextlib.contextmanager
def portable_panels():
    saved = cpc.supports, cpc.supports_leaf
    cpc.supports, cpc.supports_leaf = (lambda a: False), (lambda w, wa: False)
    try:
        yield
    finally:
        cpc.supports, cpc.supports_leaf = saved


@contextlib.contextmanager
def geqrf_panels(xp):
    """The backend of ``xp`` without certified panels (the driver's own switch is per
    call: it asks the backend whether it has them)."""
    be = get_backend(array_namespace(xp.zeros(1)))  # the instance mpqr.qr uses
    be.certified_panels = False
    try:
        yield
    finally:
        del be.certified_panels


def run(a, prec, gpu, ctx):
    x = cp.asarray(a) if gpu else a
    with ctx:
        q, r = mpqr.qr(x, precision=prec, method="householder-recursive")
    if gpu:
        q, r = cp.asnumpy(q), cp.asnumpy(r)
    return errors(a, q, r)


def main(argv):
    out = argv[0]
    sizes = [int(x) for x in argv[1:]] or [2048]
    rows = []
    for n in sizes:
        for prec, dt in (("fp32-emulated", np.float32), ("fp64-emulated", np.float64)):
            a = np.random.default_rng(n).standard_normal((n, n)).astype(dt)
            row = {"n": n, "precision": prec}
            for name, gpu, ctx in (
                    ("gpu", True, contextlib.nullcontext()),
                    ("gpu_portable_panels", True, portable_panels()),
                    ("gpu_geqrf_panels", True, geqrf_panels(cp)),
                    ("numpy", False, contextlib.nullcontext()),
                    ("numpy_geqrf_panels", False, geqrf_panels(np))):
                row[name] = run(a, prec, gpu, ctx)
            rows.append(row)
            print(row, flush=True)
    with open(out, "w") as f:
        json.dump({"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
                   "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
