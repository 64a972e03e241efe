"""``precision="fp32"`` QR of float64 data: the native FP32 engine as it is against the
plain cast of its operands (no scaling to unit magnitude), alternated in one process.

``python3 native_fp32_ab.py OUT.json`` (in bench/probes, as the other probes): 2^22 x 64,
2^20 x 256 and 8192^2 with ``method="auto"``, 4096^2 with ``"householder-recursive"``;
three rounds of four calls per form (CUDA events), the medians and the backward errors.
"""
import dataclasses
import json
import sys

import cupy as cp
from graphs_gpu import _ms  # the probe beside this one

import mpqr
from mpqr.bench._timing import environment
from mpqr.engines import ENGINES


def plain(backend, a, b, *, compute_dtype, out_dtype):
    xp = backend.xp
    a = a if a.dtype == compute_dtype else xp.astype(a, compute_dtype)
    b = b if b.dtype == compute_dtype else xp.astype(b, compute_dtype)
    c = backend.gemm(a, b)
    return c if c.dtype == out_dtype else xp.astype(c, out_dtype)


NEW = {k: ENGINES[k] for k in ("native-fp32", "native-complex64")}
OLD = {k: dataclasses.replace(v, run=plain) for k, v in NEW.items()}
rows = []
for m, n, meth in ((2**22, 64, "auto"), (2**20, 256, "auto"), (8192, 8192, "auto"),
                   (4096, 4096, "householder-recursive")):
    a = cp.random.default_rng(0).standard_normal((m, n), dtype=cp.float64)
    call = lambda a=a, meth=meth: mpqr.qr(a, precision="fp32", method=meth)  # noqa: E731
    times = {"cast": [], "as it is": []}
    for _ in range(3):
        for name, cfg in (("cast", OLD), ("as it is", NEW)):
            ENGINES.update(cfg)
            call()
            times[name] += _ms(call, 4)
    row = {"shape": [m, n], "method": meth}
    for name, cfg in (("cast", OLD), ("as it is", NEW)):
        ENGINES.update(cfg)
        q, r = call()
        t = sorted(times[name])
        row[name] = {"ms": t[len(t) // 2], "all": [round(x, 2) for x in t],
                     "backward": float(cp.linalg.norm(q @ r - a) / cp.linalg.norm(a))}
        del q, r
    ENGINES.update(NEW)
    rows.append(row)
    print(json.dumps(row), flush=True)
    del a
    cp.get_default_memory_pool().free_all_blocks()
with open(sys.argv[1], "w") as fh:
    json.dump({"environment": environment(cp), "rows": rows}, fh, indent=1)
