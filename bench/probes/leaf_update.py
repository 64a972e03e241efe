"""The certified leaf's rank-32 products in kernels of their own against cuBLAS.

``python3 bench/probes/leaf_update.py OUT.json [--cases N:precision,...] [--leaf [--trace]]``:

* ``--leaf``: the kernels alone at a first panel's shape against CuPy's matmul, then one
  leaf (``panel_blocked.certified_leaf``, lookahead and combined W as the QR takes them)
  of 16384 x 1024 and 4096 x 1024, float32 and float64, each configuration timed by CUDA
  events (medians of 7 on fresh copies), also with the panels on the caller's stream
  (``serial``); ``--trace``: CUPTI's kernels of one 16384-row call per configuration;
* for each case, the whole QR (``method="householder-recursive"``) with the products in
  cuBLAS (``off``), in the kernels where the defaults give them (``both``), in the kernels
  whatever their shape and dtype (``any``): three rounds of 4 calls per configuration, alternated,
  graphs dropped between them; medians, backward error and orthogonality in float64.
"""

from __future__ import annotations

import json
import sys

import cupy as cp
from flag_ab import case_matrix  # the probes beside this one
from graphs_gpu import _ms
from kernel_time import profiled
from mpqr.backends import get_backend
from mpqr.backends.cupy import graphs, leaf_update, panel_cholqr

import mpqr
from mpqr._array_api import array_namespace
from mpqr.bench._timing import environment, release_pool
from mpqr.qr import panel_blocked

#: the first panel's update in a 16384 x 1024 leaf
R0, Q0 = 16384, 992
#: (update, join, MIN_ROWS, MIN_COLUMNS) of each configuration; "both" the defaults
CONFIGS = {"off": ((), (), 0, 0), "both": (("float32",), ("float32",), None, None),
           "any": (("float32", "float64"), ("float32", "float64"), 0, 0)}
_DEFAULTS = leaf_update.MIN_ROWS, leaf_update.MIN_COLUMNS


def _set(name: str) -> None:
    up, join, rows, cols = CONFIGS[name]
    leaf_update.UPDATE_KERNEL, leaf_update.JOIN_KERNEL = up, join
    leaf_update.MIN_ROWS = _DEFAULTS[0] if rows is None else rows
    leaf_update.MIN_COLUMNS = _DEFAULTS[1] if cols is None else cols


def kernel_rows() -> list[dict]:
    """W^T B and B -= Y Z alone at a first panel's shape (16384 rows, 992 columns): the
    kernels (each BLOCKS_PER_SM) against the cuBLAS products of the leaf's loop."""
    rows = []
    for dt in (cp.float32, cp.float64):
        rng = cp.random.default_rng(2)
        b = rng.standard_normal((R0, Q0 + 32), dtype=cp.float64).astype(dt)
        w = rng.standard_normal((R0, 32), dtype=cp.float64).astype(dt)
        l = cp.tril(rng.standard_normal((32, 32), dtype=cp.float64).astype(dt))
        name = cp.dtype(dt).name
        kz, ks, ka = leaf_update._kernels(name)
        row = {"dtype": name, "regs": [int(k.attributes["num_regs"]) for k in (kz, ks, ka)],
               "local_bytes": [int(k.attributes["local_size_bytes"]) for k in (kz, ks, ka)]}
        prod = leaf_update.LeafProducts(dt, 1024)
        it = b.itemsize
        pb, ldb = b.data.ptr + 32 * it, b.shape[1]
        for bps in (1, 2, 4):
            leaf_update.BLOCKS_PER_SM = bps

            def z_only(prod=prod, pb=pb, ldb=ldb, w=w):
                prod.wtb(pb, ldb, w.data.ptr, 32, R0, 32, Q0)

            def both(prod=prod, pb=pb, ldb=ldb, w=w, l=l, b=b, it=it):
                pz = prod.wtb(pb, ldb, w.data.ptr, 32, R0, 32, Q0)
                prod.apply(pb, ldb, l.data.ptr, b.data.ptr + 32 * ldb * it, ldb, pz, R0, 32,
                           Q0)
            z_only()
            tz, tb = _ms(z_only, 9), _ms(both, 9)
            row[f"bps{bps}"] = {"wtb_ms": tz[4], "wtb_apply_ms": tb[4]}
        leaf_update.BLOCKS_PER_SM = 4

        def cublas(b=b, w=w, l=l):
            bb = b[:, 32:]
            z = w.T @ bb
            bb[:32] -= l @ z
            bb[32:] -= b[32:, :32] @ z
        cublas()
        row["cupy_matmul_ms"] = _ms(cublas, 9)[4]
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def leaf_rows(trace: bool = False) -> list[dict]:
    rows = []
    for m, dt in ((16384, cp.float32), (16384, cp.float64), (4096, cp.float32),
                  (4096, cp.float64)):
        a = cp.random.default_rng(1).standard_normal((m, 1024), dtype=cp.float64).astype(dt)
        backend = get_backend(array_namespace(a))
        row = {"leaf": f"{m}x1024", "dtype": cp.dtype(dt).name}
        for name in [*CONFIGS, "any:2", "off:4:serial", "any:4:serial"]:
            name, _, bps = name.partition(":")
            bps, _, serial = bps.partition(":")
            leaf_update.BLOCKS_PER_SM = int(bps or 4)
            panel_cholqr.LOOKAHEAD_STREAM = not serial
            _set(name)
            work, w = a.copy(), cp.zeros_like(a)
            cert = backend.new_certificate(work)

            def call(work=work, w=w, cert=cert, a=a, backend=backend):
                work[...] = a
                panel_blocked.certified_leaf(backend, work, w, 0, 1024, cert=cert,
                                             precision="fp32", combine=True)
            call()
            t = _ms(call, 7)
            key = name + (f":{bps}" if bps else "") + (":serial" if serial else "")
            row[key] = {"ms": t[len(t) // 2], "fails": int(cert[0])}
            if trace and m == 16384 and bps in ("", "4"):
                summary, top = profiled(call)
                summary["kernel_ms_sum"] = sum(summary.pop("kernel_ms_by_class").values())
                row[key]["trace"] = summary
                row[key]["top"] = top[:14]
        leaf_update.BLOCKS_PER_SM = 4
        panel_cholqr.LOOKAHEAD_STREAM = True
        _set("both")
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def qr_rows(cases: list[str]) -> list[dict]:
    rows = []
    for case in cases:
        n, prec, a = case_matrix(case)

        def call(a=a, prec=prec):
            return mpqr.qr(a, precision=prec, method="householder-recursive")

        times = {name: [] for name in CONFIGS}
        for _ in range(3):
            for name in CONFIGS:
                _set(name)
                graphs.clear()
                call()
                times[name] += _ms(call, 4)
        row = {"case": case}
        for name in CONFIGS:
            _set(name)
            graphs.clear()
            q, r = call()
            a64, q64, r64 = (x.astype(cp.float64) for x in (a, q, r))
            t = sorted(times[name])
            row[name] = {"ms": t[len(t) // 2], "all": [round(x, 2) for x in t],
                         "backward": float(cp.linalg.norm(q64 @ r64 - a64)
                                           / cp.linalg.norm(a64)),
                         "orth": float(cp.linalg.norm(q64.T @ q64 - cp.eye(n)) / n)}
            del q, r, a64, q64, r64
        _set("both")
        graphs.clear()
        rows.append(row)
        print(json.dumps(row), flush=True)
        del a
        release_pool(cp)
    return rows


def main(argv):
    out = {"environment": environment(cp)}
    if "--leaf" in argv:
        out["kernels"] = kernel_rows()
        out["leaf"] = leaf_rows("--trace" in argv)
    cases = argv[argv.index("--cases") + 1].split(",") if "--cases" in argv else []
    out["qr"] = qr_rows(cases)
    with open(argv[0], "w") as fh:
        json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
