"""The Gram product ``A^T A`` of a tall matrix (``k = m >> n``) on one GPU: cuBLAS's
single GEMM (the CuPy backend's split, ``backends/cupy/split_k.py``, turned off) against
the same product split along ``k`` into ``B`` chunks (one strided-batched GEMM, then a sum
of the ``B`` partial ``n x n`` blocks), and cuBLAS's ``syrk``; beside a copy of ``A`` (the
memory floor: one read of ``A`` is half a copy) and ``A X`` by GEMM. CUDA events, medians
of 7, variants alternated in one process; each variant's difference from the single GEMM
(``split_k_accuracy.py`` measures the rounding against a double-double product).

``python bench/probes/gram_splitk.py`` writes ``$OUT/gram_splitk.json``.
"""

import functools
import os
import statistics
import sys

import cupy as cp
import numpy as np
from cupy.cuda import cublas, runtime
from mpqr.backends import get_backend
from mpqr.backends.cupy import split_k

from mpqr.bench._timing import environment, time_it, write_json

BK = get_backend(cp)


def _types(dt):
    if dt == cp.float64:
        return runtime.CUDA_R_64F, cublas.CUBLAS_COMPUTE_64F, np.float64
    return runtime.CUDA_R_32F, cublas.CUBLAS_COMPUTE_32F, np.float32


def plain(a):
    # cuBLAS's single GEMM (the backend's own split turned off)
    on, split_k.MIN_K = split_k.MIN_K, 1 << 62
    try:
        return BK.gemm(a.T, a)
    finally:
        split_k.MIN_K = on


def partials(a, nb):
    """The ``nb`` partial Gram blocks of ``nb`` row chunks of ``a`` (the rows past whole
    chunks left out), by one strided-batched GEMM."""
    m, n = a.shape
    kc = m // nb
    a3 = a[: nb * kc].reshape(nb, kc, n)
    out = cp.empty((nb, n, n), dtype=a.dtype)
    t, c, s = _types(a.dtype)
    assert BK._gemm_strided_batched(a3.transpose(0, 2, 1), a3, out, 1.0, 0.0, t, t, c, s)
    return out


def split(a, nb):
    kc = a.shape[0] // nb
    g = partials(a, nb).sum(axis=0)
    if nb * kc < a.shape[0]:
        g += BK.gemm(a[nb * kc:].T, a[nb * kc:])
    return g


def _split_fn(a, nb):
    return split(a, nb)


def syrk(a):
    # cupy.cublas.syrk on A^T (n x m, F-order view of row-major A): upper of A^T A
    from cupy import cublas as cupy_blas

    g = cupy_blas.syrk("N", a.T, lower=False)
    return g + cp.triu(g, 1).T


def row(m, n, dt, picks):
    rs = cp.random.RandomState(7)
    a = rs.standard_normal((m, n), dtype=cp.float64).astype(dt)
    ref = cp.matmul(a.T.astype(cp.float64), a.astype(cp.float64))
    scale = float(cp.linalg.norm(ref))
    x = rs.standard_normal((n, n), dtype=cp.float64).astype(dt)
    out = {"m": m, "n": n, "dtype": str(np.dtype(dt)), "bytes": a.nbytes}
    fns = {"plain": plain, "syrk": syrk}
    fns.update({f"split{nb}": functools.partial(_split_fn, nb=nb) for nb in picks})
    for k, f in fns.items():
        try:
            g = f(a)
            out[f"{k}_err"] = float(cp.linalg.norm(g.astype(cp.float64) - ref)) / scale
        except Exception as e:
            out[f"{k}_error"] = repr(e)[:200]
    times = {k: [] for k in fns if f"{k}_err" in out}
    times["copy"], times["AX"] = [], []
    for _ in range(3):
        for k in list(times):
            if k == "copy":
                fn = a.copy
            elif k == "AX":
                fn = functools.partial(BK.gemm, a, x)
            else:
                fn = functools.partial(fns[k], a)
            times[k].append(time_it(cp, fn, repeat=7))
    for k, t in times.items():
        ms = statistics.median(t) * 1e3
        out[f"{k}_ms"] = ms
        out[f"{k}_read_TBs"] = a.nbytes / (ms * 1e-3) / 1e12
    return out


def main():
    picks = [8, 16, 32, 64, 128, 256, 512]
    shapes = [(2**22, 64, cp.float64), (2**22, 32, cp.float64), (2**24, 64, cp.float64),
              (2**20, 128, cp.float64), (2**20, 256, cp.float64), (2**22, 64, cp.float32),
              (65536, 4096, cp.float64), (2**18, 512, cp.float64)]
    rows = []
    for m, n, dt in shapes:
        r = row(m, n, dt, picks)
        rows.append(r)
        best = min((k for k in r if k.endswith("_ms") and k[:-3] not in ("copy", "AX")),
                   key=lambda k: r[k])
        print(f"{m}x{n} {r['dtype']}: plain {r['plain_ms']:.3f} best {best} {r[best]:.3f} "
              f"copy {r['copy_ms']:.3f} AX {r['AX_ms']:.3f}", flush=True)
        cp.get_default_memory_pool().free_all_blocks()
    write_json(os.path.join(os.environ.get("OUT", "."), "gram_splitk.json"),
               {"environment": environment(cp), "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
