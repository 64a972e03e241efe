"""Square QR with certified CholQR2 panels: the kernels, then the QR, against cuSOLVER.

``python3 bench/probes/square_panels.py OUT.json check,panel,leaf,qr [N ...]`` runs the
sections named: ``check`` the panel kernels against the portable steps
(``backends/panel_cholqr.py``) on the GPU; ``panel`` one panel (kernels, cuSOLVER
``geqrf``, the TSQR reconstruction); ``leaf`` one 512-column leaf; ``qr`` ``mpqr.qr``
with ``householder-recursive`` at fp16, fp32-emulated and fp64-emulated with each kind
of leaf (:data:`CONFIGS`, A/B in one process) and cuSOLVER, with backward error and
orthogonality at the first size; ``kernels=DIR`` the same QRs with the panel kernels of
the library and those of ``DIR/panel_cholqr.cu`` (another version), and ``partials``
with tc-sgemm's slice partials summed by the CuPy backend or the portable way, each pair
alternating, twice.
"""

from __future__ import annotations

import json
import sys

import cupy as cp
import numpy as np
from cupyx.profiler import benchmark
from mpqr.backends import get_backend
from mpqr.backends._base import ArrayAPIBackend
from square_cholqr import errors  # the sibling probe's measures (run from bench/probes)

import mpqr
from mpqr._array_api import array_namespace
from mpqr.bench._timing import release_pool, time_it

B = get_backend(array_namespace(cp.empty(1)))
CLS = type(B)


def panel_check(rows):
    rng = cp.random.default_rng(1)
    for dt in (cp.float32, cp.float64):
        for m, n in ((32, 32), (33, 7), (100, 32), (1000, 1), (4096, 32), (16384, 32),
                     (70000, 19), (262144, 32)):
            a = rng.standard_normal((m, n + 5), dtype=cp.float64).astype(dt)
            out = {}
            for which in ("kernel", "portable"):
                p = a.copy()
                w = cp.zeros((m, n + 5), dt)
                f = B.new_certificate(p)
                if which == "kernel":
                    B.certified_panel(p[:, 2:2 + n], w[:, 2:2 + n], f)
                else:
                    ArrayAPIBackend.certified_panel(B, p[:, 2:2 + n], w[:, 2:2 + n], f)
                out[which] = (p, w, int(f[0]))
            (pk, wk, fk), (pp, wp, fp) = out["kernel"], out["portable"]
            y = cp.tril(pk[:, 2:2 + n].astype(cp.float64), -1) + cp.eye(m, n)
            r = cp.triu(pk[:n, 2:2 + n].astype(cp.float64))
            w64 = wk[:, 2:2 + n].astype(cp.float64)
            h = cp.eye(m, n) - w64 @ y[:n].T
            a64 = a[:, 2:2 + n].astype(cp.float64)
            back = float(cp.linalg.norm(h @ r - a64) / cp.linalg.norm(a64))
            orth = None
            if m <= 20000:
                full = cp.eye(m) - w64 @ y.T
                orth = float(cp.linalg.norm(full.T @ full - cp.eye(m)) / np.sqrt(m))
                del full
            diff = float(cp.max(cp.abs(pk - pp)) / cp.max(cp.abs(pp)))
            wdiff = float(cp.max(cp.abs(wk - wp)) / max(float(cp.max(cp.abs(wp))), 1e-300))
            untouched = bool(cp.all(pk[:, :2] == a[:, :2])
                             and cp.all(pk[:, 2 + n:] == a[:, 2 + n:]))
            row = {"check": "panel", "m": m, "n": n, "dtype": str(dt.__name__), "fails": [fk, fp],
                   "backward": back, "orth": orth, "vs_portable": diff, "w_vs_portable": wdiff,
                   "others_untouched": untouched}
            rows.append(row)
            print(row, flush=True)
    # a singular panel fails its certificate
    a = rng.standard_normal((4096, 32), dtype=cp.float64)
    a[:, 5] = a[:, 3]
    f = B.new_certificate(a)
    B.certified_panel(a, None, f)
    rows.append({"check": "singular", "fails": int(f[0])})
    print(rows[-1], flush=True)


def panel_times(rows):
    rng = cp.random.default_rng(2)
    for dt in (cp.float32, cp.float64):
        for m in (4096, 16384, 65536):
            a = rng.standard_normal((m, 32), dtype=cp.float64).astype(dt)
            w = cp.empty_like(a)
            f = B.new_certificate(a)
            cand = {
                "certified": lambda a=a, w=w, f=f: B.certified_panel(a.copy(), w, f),
                "geqrf": lambda a=a: B.householder_panel(a),
                "tsqr-reconstruct": lambda a=a: B.reconstruct_panel(a),
                "copy": lambda a=a: a.copy(),
            }
            for name, fn in cand.items():
                r = benchmark(fn, n_repeat=50, n_warmup=5)
                row = {"check": "panel-time", "m": m, "dtype": dt.__name__, "what": name,
                       "gpu_us": float(np.median(r.gpu_times)) * 1e6,
                       "cpu_us": float(np.median(r.cpu_times)) * 1e6}
                rows.append(row)
                print(row, flush=True)


def leaf_times(rows):
    """One leaf through the recursion's own code: a 512-column matrix is one leaf."""
    from mpqr.qr import householder_recursive as hr

    rng = cp.random.default_rng(3)
    width = hr.leaf_width
    hr.leaf_width = lambda n, cap=None: 512
    for dt, prec in ((cp.float32, "fp32"), (cp.float64, "fp64")):
        for m in (4096, 16384):
            a = rng.standard_normal((m, 512), dtype=cp.float64).astype(dt)
            for name in ("geqrf", "certified"):
                CLS.certified_panels = name == "certified"
                r = benchmark(_qr_call(a, prec), n_repeat=10, n_warmup=2)
                row = {"check": "leaf-time", "m": m, "k": 512, "dtype": dt.__name__,
                       "what": name, "gpu_ms": float(np.median(r.gpu_times)) * 1e3,
                       "cpu_ms": float(np.median(r.cpu_times)) * 1e3}
                rows.append(row)
                print(row, flush=True)
    CLS.certified_panels = True
    hr.leaf_width = width


def _qr_call(a, prec):
    def call():
        return mpqr.qr(a, precision=prec, method="householder-recursive")
    return call


#: (name, certified panels, leaf width)
CONFIGS = (("geqrf", False, 512), ("geqrf-1024", False, 1024),
           ("certified-1024", True, 1024), ("certified-2048", True, 2048))


def qr_ab(rows, sizes):
    from mpqr.qr import householder_recursive as hr

    width = hr.leaf_width
    for i, n in enumerate(sizes):
        for dtype, precs in ((cp.float32, ("fp16", "fp32-emulated")),
                             (cp.float64, ("fp64-emulated",))):
            a = cp.random.default_rng(0).standard_normal((n, n), dtype=cp.float64).astype(dtype)
            t_ref = time_it(cp, lambda a=a: cp.linalg.qr(a), repeat=3, max_seconds=3)
            rows.append({"check": "qr", "n": n, "dtype": dtype.__name__, "what": "cusolver",
                         "seconds": t_ref})
            print(rows[-1], flush=True)
            release_pool(cp)
            for prec in precs:
                for name, certified, nb in CONFIGS:
                    CLS.certified_panels = certified
                    hr.leaf_width = lambda n, cap=None, nb=nb: (min(nb, width(n)) if n < 4 * nb
                                                                else nb)
                    row = {"check": "qr", "n": n, "dtype": dtype.__name__, "precision": prec,
                           "leaves": name}
                    fn = _qr_call(a, prec)
                    if i == 0:
                        q, r = fn()
                        row["backward"], row["orthogonality"] = errors(a, q, r)
                        del q, r
                        release_pool(cp)
                    row["seconds"] = time_it(cp, fn, repeat=3 if n <= 16384 else 2,
                                             max_seconds=6)
                    row["vs_cusolver"] = t_ref / row["seconds"]
                    rows.append(row)
                    print(row, flush=True)
                    release_pool(cp)
            CLS.certified_panels = True
            hr.leaf_width = width
            del a
            release_pool(cp)


def ab(rows, sizes, check, variants):
    """The QRs of the ``qr`` section under each variant (``(name, switch on, switch off)``),
    alternating, twice; errors on the first pass."""
    for n in sizes:
        for dtype, precs in ((cp.float32, ("fp16", "fp32-emulated")),
                             (cp.float64, ("fp64-emulated",))):
            a = cp.random.default_rng(0).standard_normal((n, n), dtype=cp.float64).astype(dtype)
            for prec in precs:
                for rep in range(2):
                    for name, on, off in variants:
                        on()
                        try:
                            call = _qr_call(a, prec)
                            back = orth = None
                            if rep == 0:
                                q, r = call()
                                back, orth = errors(a, q, r)
                                del q, r
                                release_pool(cp)
                            sec = time_it(cp, call, repeat=3, max_seconds=6)
                        finally:
                            off()
                        rows.append({"check": check, "n": n, "precision": prec,
                                     "variant": name, "rep": rep, "seconds": sec,
                                     "backward": back, "orthogonality": orth})
                        print(rows[-1], flush=True)
                        release_pool(cp)
            del a
            release_pool(cp)


def kernel_variants(other):
    """The library's panel kernels against ``other/panel_cholqr.cu``."""
    from pathlib import Path

    from mpqr.backends.cupy import panel_cholqr as k

    mine = k._DIR

    def use(d):
        k._DIR = Path(d)
        k._module.cache_clear()

    return [("library", lambda: None, lambda: None),
            ("other", lambda: use(other), lambda: use(mine))]


def partial_variants():
    """tc-sgemm's slice partials added by the CuPy backend's GEMM with ones or by the
    portable ``c + sum(parts)``."""
    base = ArrayAPIBackend.add_partials
    mine = CLS.__dict__.get("add_partials")

    def portable():
        CLS.add_partials = base

    def restore():
        CLS.add_partials = mine

    return [("gemm-ones", lambda: None, lambda: None), ("cupy-sum", portable, restore)]


def main() -> None:
    out = sys.argv[1]
    sections = sys.argv[2].split(",")
    sizes = [int(s) for s in sys.argv[3:]] or [16384, 8192]
    rows = []
    try:
        if "check" in sections:
            panel_check(rows)
        if "panel" in sections:
            panel_times(rows)
        if "leaf" in sections:
            leaf_times(rows)
        if "qr" in sections:
            qr_ab(rows, sizes)
        if "partials" in sections:
            ab(rows, sizes, "partials", partial_variants())
        for sec in sections:
            if sec.startswith("kernels="):
                ab(rows, sizes, "kernels", kernel_variants(sec.split("=", 1)[1]))
    finally:
        with open(out, "w") as fh:
            json.dump({"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
                       "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
