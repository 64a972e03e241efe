"""``python -m mpqr bench small``: small calls and the route choice against the library.

CPU (NumPy): ``qr`` and ``lstsq`` of 100 x 10, 1000 x 20 and 200 x 200 float64 against
``scipy.linalg.qr(mode="economic")``, ``numpy.linalg.qr`` and ``scipy.linalg.lstsq``,
also through :func:`mpqr.compat.scipy.patch` (the patched ``scipy.linalg`` functions
against the originals). Every candidate of a case is timed round-robin in one process
(``--repeats`` rounds of a call count chosen to last ~``--round-ms``), the median of
the rounds reported, so load shared with other work hits all alike.

GPU (CuPy, ``--gpu``): ``qr`` 100 x 10, 1000 x 20, 4000 x 50 and 10000 x 50 against
``cupy.linalg.qr``, ``lstsq`` against the cuSOLVER QR route (``cupyx.lapack.gels``:
geqrf + ormqr + trsm, which returns no singular values) and ``cupy.linalg.lstsq`` (the
SVD route, SciPy's outputs), ``ratio`` mpqr's time over the library's and the ``route``
mpqr took (the small-input fast path or the general route's method); then the route sweep:
square, wide (``m/n`` = 1/4, 1/16) and tall shapes, float32/float64/complex64/
complex128, every precision the dtype's own arithmetic meets, ``mpqr.qr`` against
``cupy.linalg.qr`` (the library route that meets the request); each row lists its
``ratio`` (the library's time over mpqr's: 1 or more where mpqr is not slower; three
rounds, a row below 0.95 timed again with twice ``--repeats`` rounds and its first ratio
kept as ``ratio_first``) and the route ``mpqr.explain()`` recorded. ``--budget-s``
bounds the sweep's time (its 86 rows took ~190 s on an H200).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np

from mpqr.bench._timing import environment, write_json

__all__ = ["main"]


def _rounds(funcs: dict[str, Any], sync: Any, repeats: int, round_ms: float
            ) -> dict[str, float]:
    """Median seconds per call of each function, timed round-robin."""
    for f in funcs.values():  # warm-up and call count per round
        f()
    sync()
    counts = {}
    for name, f in funcs.items():
        t0 = time.perf_counter()
        f()
        sync()
        dt = max(time.perf_counter() - t0, 1e-7)
        counts[name] = max(1, int(round_ms * 1e-3 / dt))
    samples: dict[str, list[float]] = {k: [] for k in funcs}
    for _ in range(repeats):
        for name, f in funcs.items():
            n = counts[name]
            sync()
            t0 = time.perf_counter()
            for _ in range(n):
                f()
            sync()
            samples[name].append((time.perf_counter() - t0) / n)
    return {k: statistics.median(v) for k, v in samples.items()}


def _cpu(repeats: int, round_ms: float) -> list[dict[str, Any]]:
    import scipy.linalg as sla

    import mpqr
    from mpqr.compat import scipy as mcs

    rows = []
    rng = np.random.default_rng(0)
    orig_qr, orig_lstsq = sla.qr, sla.lstsq
    for m, n in ((100, 10), (1000, 20), (200, 200)):
        a = rng.standard_normal((m, n))
        b = rng.standard_normal(m)

        funcs = {
            "mpqr.qr": lambda a=a: mpqr.qr(a),
            "scipy.linalg.qr(economic)": lambda a=a: orig_qr(a, mode="economic"),
            "numpy.linalg.qr": lambda a=a: np.linalg.qr(a),
            "mpqr.lstsq": lambda a=a, b=b: mpqr.lstsq(a, b),
            "scipy.linalg.lstsq": lambda a=a, b=b: orig_lstsq(a, b),
        }
        t = _rounds(funcs, lambda: None, repeats, round_ms)
        with mcs.patch():  # the patched functions, timed inside one patch block
            pt = _rounds({"patched scipy.linalg.qr(economic)":
                          lambda a=a: sla.qr(a, mode="economic"),
                          "scipy.linalg.qr(economic)": lambda a=a: orig_qr(a, mode="economic"),
                          "patched scipy.linalg.lstsq": lambda a=a, b=b: sla.lstsq(a, b),
                          "scipy.linalg.lstsq": lambda a=a, b=b: orig_lstsq(a, b)},
                         lambda: None, repeats, round_ms)
        ref_qr, ref_ls = t["scipy.linalg.qr(economic)"], t["scipy.linalg.lstsq"]
        rows += [
            {"call": "qr", "shape": [m, n], "mpqr_us": t["mpqr.qr"] * 1e6,
             "library": "scipy.linalg.qr(mode='economic')", "library_us": ref_qr * 1e6,
             "numpy_us": t["numpy.linalg.qr"] * 1e6, "ratio": t["mpqr.qr"] / ref_qr},
            {"call": "lstsq", "shape": [m, n], "mpqr_us": t["mpqr.lstsq"] * 1e6,
             "library": "scipy.linalg.lstsq", "library_us": ref_ls * 1e6,
             "ratio": t["mpqr.lstsq"] / ref_ls},
            {"call": "patched scipy.linalg.qr", "shape": [m, n],
             "mpqr_us": pt["patched scipy.linalg.qr(economic)"] * 1e6,
             "library": "scipy.linalg.qr(mode='economic')",
             "library_us": pt["scipy.linalg.qr(economic)"] * 1e6,
             "ratio": pt["patched scipy.linalg.qr(economic)"] / pt["scipy.linalg.qr(economic)"]},
            {"call": "patched scipy.linalg.lstsq", "shape": [m, n],
             "mpqr_us": pt["patched scipy.linalg.lstsq"] * 1e6,
             "library": "scipy.linalg.lstsq", "library_us": pt["scipy.linalg.lstsq"] * 1e6,
             "ratio": pt["patched scipy.linalg.lstsq"] / pt["scipy.linalg.lstsq"]},
        ]
    return rows


#: the precisions each dtype's own arithmetic meets, swept on the GPU
_SWEEP_PRECISIONS = {"float32": ("auto", "fp16", "fp32-emulated", "fp32"),
                     "complex64": ("auto", "fp32-emulated", "fp32"),
                     "float64": ("auto", "fp64", "fp64-emulated"),
                     "complex128": ("auto", "fp64-emulated")}


def _route(trace: Any) -> str:
    ev = [e for e in trace.events if e.kind == "method"]
    return ev[0].data.get("method", "?") if ev else "?"


def _small_route(a: Any, b: Any = None) -> str:
    """The route ``mpqr.qr(a)`` (``b`` None) or ``mpqr.lstsq(a, b)`` takes: the fast path
    (which ``explain()`` does not show for least squares: it records the general route)
    or the general route's first method."""
    import mpqr
    from mpqr import _fast
    from mpqr.backends.cupy import small

    size = a.size + (0 if b is None else b.size)
    where = "the host's LAPACK" if size <= small.HOST_MAX else "cuSOLVER"
    if b is None:
        if _fast.qr(a, "reduced", None, "auto", False) is not _fast.MISS:
            return f"geqrf by {where} (small-input fast path)"
        with mpqr.explain() as tr:
            mpqr.qr(a)
        return _route(tr)
    if _fast.lstsq(a, b, None, False, None, precision=None, refine="auto", tol=None,
                   maxiter=None) is not _fast.MISS:
        return ("SciPy's driver on the host (small-input fast path)" if size <= small.HOST_MAX
                else "geqrf of [A | b] by cuSOLVER (small-input fast path)")
    with mpqr.explain() as tr:
        mpqr.lstsq(a, b)
    ev = [e for e in tr.events if e.kind == "method"] or list(tr.events)
    return ev[0].message[:80] if ev else "?"


def _gpu(repeats: int, budget_s: float, sizes: list[int]) -> list[dict[str, Any]]:
    import cupy as cp
    from cupyx import lapack

    import mpqr

    def sync() -> None:
        cp.cuda.get_current_stream().synchronize()

    rows = []
    rng = cp.random.default_rng(0)
    for m, n in ((100, 10), (1000, 20), (4000, 50), (10000, 50)):
        a = rng.standard_normal((m, n))
        b = rng.standard_normal(m)
        t = _rounds({"mpqr.qr": lambda a=a: mpqr.qr(a),
                     "cupy.linalg.qr": lambda a=a: cp.linalg.qr(a),
                     "mpqr.lstsq": lambda a=a, b=b: mpqr.lstsq(a, b),
                     "gels": lambda a=a, b=b: lapack.gels(a, b),
                     # the library call mpqr.lstsq replaces (x, residues, rank and s)
                     "cupy.linalg.lstsq": lambda a=a, b=b: cp.linalg.lstsq(a, b, rcond=None)},
                    sync, repeats, 20.0)
        rows.append({"call": "qr", "shape": [m, n], "mpqr_us": t["mpqr.qr"] * 1e6,
                     "library": "cupy.linalg.qr", "library_us": t["cupy.linalg.qr"] * 1e6,
                     "ratio": t["mpqr.qr"] / t["cupy.linalg.qr"], "route": _small_route(a)})
        rows.append({"call": "lstsq", "shape": [m, n], "route": _small_route(a, b),
                     "mpqr_us": t["mpqr.lstsq"] * 1e6,
                     "library": "cupyx.lapack.gels (geqrf + ormqr + trsm)",
                     "library_us": t["gels"] * 1e6, "ratio": t["mpqr.lstsq"] / t["gels"],
                     "cupy_lstsq_us": t["cupy.linalg.lstsq"] * 1e6,
                     "ratio_cupy_lstsq": t["mpqr.lstsq"] / t["cupy.linalg.lstsq"]})
    shapes = [(s, s) for s in sizes] + [(sizes[1], 4 * sizes[1]), (sizes[0], 16 * sizes[0]),
                                        (4 * sizes[1], sizes[1] // 4), (sizes[1], 16 * sizes[1])]
    start = time.perf_counter()
    shapes.sort(key=lambda s: s[0] * s[1])  # small first: a budget stop drops the largest
    for m, n in shapes:
        for dt, precs in _SWEEP_PRECISIONS.items():
            cplx = dt.startswith("complex")
            if cplx and m * n > 8192 * 8192:
                continue
            x = rng.standard_normal((m, n), dtype=np.float32 if dt in ("float32", "complex64")
                                    else np.float64)
            if cplx:
                x = x + 1j * x[::-1]
            x = x.astype(dt)
            for p in precs:
                if time.perf_counter() - start > budget_s:
                    rows.append({"call": "sweep", "stopped": f"budget {budget_s} s"})
                    return rows
                with mpqr.explain() as tr:
                    mpqr.qr(x, precision=p)
                funcs = {"mpqr": lambda x=x, p=p: mpqr.qr(x, precision=p),
                         "cupy": lambda x=x: cp.linalg.qr(x)}
                tt = _rounds(funcs, sync, 3, 0.0)
                row = {"call": "sweep qr", "shape": [m, n], "dtype": dt, "precision": p,
                       "route": _route(tr)}
                if tt["cupy"] < 0.95 * tt["mpqr"]:
                    # a low row is timed again with more rounds (first calls at a new
                    # size grow the memory pool; three rounds do not outvote that)
                    row["ratio_first"] = tt["cupy"] / tt["mpqr"]
                    tt = _rounds(funcs, sync, 2 * repeats, 0.0)
                row.update({"mpqr_ms": tt["mpqr"] * 1e3, "library": "cupy.linalg.qr",
                            "library_ms": tt["cupy"] * 1e3, "ratio": tt["cupy"] / tt["mpqr"]})
                rows.append(row)
            del x
            cp.get_default_memory_pool().free_all_blocks()
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mpqr bench small", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpu", action="store_true", help="the CuPy part (needs a CUDA GPU)")
    p.add_argument("--repeats", type=int, default=21, help="timed rounds per case")
    p.add_argument("--round-ms", type=float, default=20.0, help="length of one round")
    p.add_argument("--sizes", default="1024,4096,8192,16384", help="GPU sweep: square sizes")
    p.add_argument("--budget-s", type=float, default=200.0, help="GPU sweep: time bound")
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args(argv)
    if args.gpu:
        import cupy as cp

        env = environment(cp)
        rows = _gpu(max(5, args.repeats // 3), args.budget_s,
                    [int(s) for s in args.sizes.split(",")])
    else:
        env = environment(np)
        rows = _cpu(args.repeats, args.round_ms)
    for r in rows:
        print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()})
    write_json(args.json, {"environment": env, "rows": rows})
    return 0
