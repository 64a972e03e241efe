"""Where a Dask block task's time goes on a GPU worker: the steps of lstsq's first pass
and of a refinement pass on one ``2^22 x 64`` CuPy block, each timed alone.

``python3 bench/probes/dask_leaves.py [OUT.json]`` (GPU 0). Each row: median
milliseconds of ``repeat`` calls, synchronized; the bare CuPy products beside the
policy's calls of the same products.
"""

from __future__ import annotations

import json
import sys

import cupy as cp
from mpqr.backends.dask import _blocks

from mpqr.bench._timing import time_it
from mpqr.policy import gemm
from mpqr.qr._kernels import ct
from mpqr.qr.gram_blocked import gram


def main() -> None:
    m, n = 2**22, 64
    rng = cp.random.default_rng(0)
    a = rng.standard_normal((m, n))
    b = rng.standard_normal((m, 1))
    x = _blocks.to_host(rng.standard_normal((n, 2)))
    be = _blocks.block_backend(a)
    xp = be.xp
    xd = be.from_small(x, a)
    ax = a @ xd
    v = cp.concatenate([b - ax[:, :1], -ax[:, 1:]], axis=1)
    g = a.T @ a
    steps = {
        "bare a.T@a": lambda: a.T @ a,
        "policy gram": lambda: gram(be, a, "fp64", "lstsq:gram"),
        "bare a.T@b": lambda: a.T @ b,
        "policy gemm ct(a)@b": lambda: gemm(ct(xp, a), b, precision="fp64", label="p",
                                            backend=be),
        "sum |b|^2": lambda: xp.sum(xp.real(b * xp.conj(b)), axis=0),
        "max |b|": lambda: xp.max(xp.abs(b)),
        "finite via diag(G)": lambda: _blocks._finite(be, a, g, True),
        "all_finite(b)": lambda: be.all_finite(b),
        "to_host 64x64": lambda: _blocks.to_host(g),
        "lstsq_leaf": lambda: _blocks.lstsq_leaf(("fp64", "fp64", True), a, b),
        "from_small x": lambda: be.from_small(x, a),
        "bare a@x": lambda: a @ xd,
        "policy gemm a@x": lambda: gemm(a, xd, precision="fp64", label="p", backend=be),
        "concat v": lambda: xp.concat([b - ax[:, :1], -ax[:, 1:]], axis=1),
        "sum |v|^2": lambda: xp.sum(xp.real(v * xp.conj(v)), axis=0),
        "bare a.T@v": lambda: a.T @ v,
        "policy gemm ct(a)@v": lambda: gemm(ct(xp, a), v, precision="fp64", label="p",
                                            backend=be),
        "residual_leaf": lambda: _blocks.residual_leaf((x, 1, "fp64", 0, 0, True), a, b),
    }
    out = {}
    for k, fn in steps.items():
        out[k] = round(1e3 * time_it(cp, fn, repeat=9, warmup=2), 4)
        print(f"{k:<24}{out[k]:>10.3f} ms", flush=True)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump({"block": f"{m}x{n}", "device": cp.cuda.runtime.getDeviceProperties(0)
                       ["name"].decode(), "ms": out}, f, indent=1)


if __name__ == "__main__":
    main()
