"""tc-sgemm's hi*hi slices: the CuTe DSL kernel (``backends/cupy/dsl_slices.py``) against
cuBLAS's slices, alone and in the QR.

``python3 bench/probes/dsl_slices_ab.py OUT.json [--tiles 128x128,256x128] [--qr CASES]``:
1. products ``c += a @ b`` (fp16, float32 ``c``) at the recursion's long-k shapes, each
   tile of ``--tiles`` and cuBLAS's slices of 1024 on the same data: time (CUDA events,
   median of 5) and the largest difference from float64 relative to ``|c| + |a||b|``;
2. the QR (``flag_ab.py``'s cases, default 32768:fp32-emulated) with
   ``dsl_slices.ENABLED`` False / True alternated.
"""

from __future__ import annotations

import json
import subprocess
import sys

import cupy as cp
from graphs_gpu import _ms  # the probe beside this one
from mpqr.backends import get_backend
from mpqr.backends.cupy import dsl_slices

from mpqr.bench._timing import environment

SHAPES = [(4096, 4096, 32768), (8192, 8192, 32768), (16384, 16384, 16384),
          (32768, 8192, 8192), (1024, 1024, 32768)]


def _cublas(be, a, b, c, width):
    for s in range(0, a.shape[1], width):
        be.gemm_fp16(a[:, s:s + width], b[s:s + width], out=c, alpha=1.0, beta=1.0)


def products(tiles):
    be = get_backend(cp)
    rows = []
    for m, n, k in SHAPES:
        rng = cp.random.default_rng(0)
        a = rng.random((m, k), dtype=cp.float32).astype(cp.float16)
        b = rng.random((k, n), dtype=cp.float32).astype(cp.float16)
        c0 = rng.standard_normal((m, n), dtype=cp.float32)
        a64, b64 = a.astype(cp.float64), b.astype(cp.float64)
        exact = c0.astype(cp.float64) + a64 @ b64
        scale = cp.abs(c0).astype(cp.float64) + cp.abs(a64) @ cp.abs(b64)
        del a64, b64
        row = {"shape": [m, n, k]}
        c = c0.copy()
        _cublas(be, a, b, c, 1024)
        err = float(cp.max(cp.abs(c.astype(cp.float64) - exact) / scale))  # before timing
        row["cublas_1024"] = {
            "err": err, "ms": _ms(lambda a=a, b=b, c=c: _cublas(be, a, b, c, 1024), 5)[2]}
        for t in tiles:
            keep = dsl_slices.TILE
            dsl_slices.TILE = t
            c = c0.copy()
            ran = dsl_slices.add_hi_product(cp, a, b, c, 1024)
            got = {"ran": ran}
            if ran:
                got["err"] = float(cp.max(cp.abs(c.astype(cp.float64) - exact) / scale))
                got["ms"] = _ms(lambda a=a, b=b, c=c: dsl_slices.add_hi_product(
                    cp, a, b, c, 1024), 5)[2]
            row[f"dsl_{t[0]}x{t[1]}"] = got
            dsl_slices.TILE = keep
        rows.append(row)
        print(json.dumps(row), flush=True)
        del a, b, c, c0, exact, scale
        cp.get_default_memory_pool().free_all_blocks()
    return rows


def main(argv):
    tiles = [(128, 128), (256, 128)]
    if "--tiles" in argv:
        tiles = [tuple(int(x) for x in t.split("x"))
                 for t in argv[argv.index("--tiles") + 1].split(",")]
    cases = argv[argv.index("--qr") + 1] if "--qr" in argv else "32768:fp32-emulated"
    out = {"environment": environment(cp), "products": products(tiles)}
    qr_json = argv[0].replace(".json", "_qr.json")
    subprocess.run([sys.executable, "flag_ab.py", qr_json,
                    "mpqr.backends.cupy.dsl_slices.ENABLED=False,True", "--cases", cases,
                    "--rounds", "2"], check=False)
    out["qr_file"] = qr_json
    with open(argv[0], "w") as fh:
        json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
