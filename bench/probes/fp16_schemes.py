"""Which products the fp16 Householder QR can afford to round: each scheme's accuracy and time.

``python3 bench/probes/fp16_schemes.py OUT.json [N ...]`` (``--cpu`` for NumPy). At every
``N`` (default 1024 16384 32768 on a GPU, 256 512 1024 on the CPU) factors ``N x N``
float32 matrices with ``householder-recursive`` at ``precision="fp16"`` under each scheme of
:data:`SCHEMES` (the engines of the products with the rounded vectors ``Ŷ`` and with ``W``;
``forced`` is every product on ``tc-fp16`` without the rounded vectors), A/B in one process,
and reports backward error ``||A - QR||_F / ||A||_F``, orthogonality ``||I - Q^T Q||_F / n``
(the quantities of Leng et al.'s Table IV, which at 4096^2 reports 4.3-6.4e-4 and 8.7-9.3e-5
for fp16) and the time beside cuSOLVER's float32 QR. At the first size all four of Table
IV's kinds, elsewhere the normal kind.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import sys

import numpy as np

import mpqr
from mpqr.bench._timing import default_xp, environment, is_cupy, release_pool, time_it
from mpqr.bench.accuracy import make_matrix

hr = importlib.import_module("mpqr.qr.householder_recursive")  # mpqr.qr is the function

SPLITB, SGEMM, PLAIN = ({"engine": e} for e in ("tc-fp16-splitb", "tc-sgemm", "tc-fp16"))
#: name -> (engine of Ŷ X / Ŷ^T X, engine of W^T B / W D); None: every product forced
SCHEMES = {"vectors-exact": (SPLITB, SGEMM), "w-splitb": (SPLITB, SPLITB),
           "w-plain": (SPLITB, PLAIN), "y-plain": (PLAIN, SGEMM),
           "plain-rounded-y": (PLAIN, PLAIN), "forced": None}


def measure(xp, a, q, r):
    """(backward error, orthogonality) in float64 on the device."""
    a64, q64, r64 = (v.astype(xp.float64) for v in (a, q, r))
    be = float(xp.linalg.norm(a64 - q64 @ r64) / xp.linalg.norm(a64))
    del r64
    orth = float(xp.linalg.norm(q64.T @ q64 - xp.eye(q.shape[1])) / q.shape[1])
    return be, orth


@contextlib.contextmanager
def scheme(name):
    keep = hr.FP16_SCHEME
    spec = SCHEMES[name]
    try:
        if spec is None:
            with mpqr.gemm_options(engine="tc-fp16"):
                yield
        else:
            hr.FP16_SCHEMES["probe"] = spec
            hr.FP16_SCHEME = "probe"
            yield
    finally:
        hr.FP16_SCHEME = keep
        hr.FP16_SCHEMES.pop("probe", None)


def main(argv):
    cpu = "--cpu" in argv
    argv = [a for a in argv if a != "--cpu"]
    out, sizes = argv[0], [int(s) for s in argv[1:]]
    xp = np if cpu else default_xp()
    gpu = is_cupy(xp)
    sizes = sizes or ([1024, 16384, 32768] if gpu else [256, 512, 1024])
    rng = np.random.default_rng(7)
    rows = []
    for i, n in enumerate(sizes):
        kinds = ("uniform", "normal", "arithmetic", "geometric") if i == 0 else ("normal",)
        for kind in kinds:
            if gpu and n > 4096:
                a = xp.random.default_rng(n).standard_normal((n, n), dtype=xp.float32)
            else:
                a = xp.asarray(make_matrix(kind, n, n, 1e4, rng).astype(np.float32))
            timed = kind == "normal"
            base = None
            if timed:
                release_pool(xp)
                base = time_it(xp, lambda a=a: xp.linalg.qr(a), repeat=2 if n > 8192 else 3)
            for name in SCHEMES:
                release_pool(xp)
                run = lambda a=a: mpqr.qr(a, precision="fp16",  # noqa: E731
                                          method="householder-recursive")
                with scheme(name):
                    q, r = run()
                    be, orth = measure(xp, a, q, r)
                    del q, r
                    release_pool(xp)
                    t = time_it(xp, run, repeat=2 if n > 8192 else 3) if timed else None
                row = {"n": n, "kind": kind, "scheme": name, "backward": be,
                       "orthogonality": orth, "time_ms": t and t * 1e3,
                       "cusolver_ms": base and base * 1e3,
                       "speedup": (base / t) if t and base else None}
                rows.append(row)
                sp = f"{t * 1e3:9.1f} ms x{base / t:5.2f}" if t else ""
                print(f"{n:6d} {kind:<10} {name:<16} back {be:.2e} orth {orth:.2e} {sp}",
                      flush=True)
            del a
    with open(out, "w") as f:
        json.dump({"environment": environment(xp), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
