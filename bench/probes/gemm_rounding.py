"""The native GEMMs' rounding on the GPU (cuBLAS) against the host's (NumPy's BLAS).

``python3 bench/probes/gemm_rounding.py OUT.json``: for float64 and float32 products of
Gaussian operands at shapes like the square QR's (``m x k @ k x n``), the relative error
``||C - C_ref||_F / ||C_ref||_F`` of ``cupy.matmul`` and of ``numpy.matmul`` against a
reference rounded once from a more precise product (float32: the float64 product;
float64: a double-double product from float64 splits, exact products and compensated
sums), and the ratio of the two. The QR's error figures on the two backends part where
these do (``emulation_agreement.py``, ``emulation_sources.py``).
"""

from __future__ import annotations

import json
import sys

import cupy as cp
import numpy as np

SHAPES = [(1024, 1024, 1024), (2048, 1024, 2048), (2048, 2048, 2048), (3000, 1500, 3000),
          (2048, 64, 2048)]


def dd_product(a, b):
    """``a @ b`` in double-double on the GPU, one rank-1 term at a time: each product's
    rounding error by Dekker's split (no FMA), the sum's by TwoSum."""
    a, b = cp.asarray(a), cp.asarray(b)
    hi = cp.zeros((a.shape[0], b.shape[1]))
    lo = cp.zeros_like(hi)
    for k in range(a.shape[1]):
        x = a[:, k:k + 1] * b[k:k + 1, :]  # rounded product
        # exact error of the product: fma(x_a, x_b, -x) by Dekker's split
        sp = 134217729.0
        ah = a[:, k:k + 1] * sp
        ah = ah - (ah - a[:, k:k + 1])
        al = a[:, k:k + 1] - ah
        bh = b[k:k + 1, :] * sp
        bh = bh - (bh - b[k:k + 1, :])
        bl = b[k:k + 1, :] - bh
        e = ((ah * bh - x) + ah * bl + al * bh) + al * bl
        s = hi + x  # TwoSum
        bb = s - hi
        err = (hi - (s - bb)) + (x - bb)
        hi, lo = s, lo + err + e
    return cp.asnumpy(hi + lo)


def main(argv):
    out = argv[0]
    rows = []
    for m, n, k in SHAPES:
        rng = np.random.default_rng(m + n + k)
        for dt in (np.float64, np.float32):
            a = rng.standard_normal((m, k)).astype(dt)
            b = rng.standard_normal((k, n)).astype(dt)
            ref = (a.astype(np.float64) @ b.astype(np.float64) if dt == np.float32
                   else dd_product(a, b))
            gpu = cp.asnumpy(cp.asarray(a) @ cp.asarray(b)).astype(np.float64)
            host = (a @ b).astype(np.float64)
            nr = np.linalg.norm(ref)
            eg, eh = np.linalg.norm(gpu - ref) / nr, np.linalg.norm(host - ref) / nr
            rows.append({"m": m, "n": n, "k": k, "dtype": np.dtype(dt).name,
                         "cublas_rel_error": float(eg), "host_rel_error": float(eh),
                         "ratio": float(eg / eh)})
            print(rows[-1], flush=True)
    with open(out, "w") as f:
        json.dump({"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
                   "host_blas": str(np.show_config(mode="dicts").get("Build Dependencies", {})
                                    .get("blas", {}).get("name")), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
