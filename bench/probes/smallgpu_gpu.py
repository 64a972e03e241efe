"""GPU checks of the CuPy small-input fast path and the route choice's library rows.

``python bench/probes/smallgpu_gpu.py``: correctness (PASS/FAIL) of ``mpqr.qr`` /
``mpqr.lstsq`` through the direct cuSOLVER calls (mpqr's conventions: diag(R) real
>= 0, inputs untouched, SciPy's lstsq tuple as the general route gives it, NaN/Inf and
rank-deficient inputs on the general route), timings against ``cupy.linalg.qr`` and
cuSOLVER's QR least squares (``cupyx.lapack.gels``: geqrf + ormqr + trsm), and the sweep
rows that were below 0.95x (ratio = library time / mpqr time, and the route). Writes
``$OUT/smallgpu.json`` (``OUT`` default /tmp). Under 90 s on an H100/H200.
"""

from __future__ import annotations

import json
import os
import statistics
import time
import traceback

import cupy as cp
import numpy as np
from cupyx import lapack

import mpqr
from mpqr import _fast

RESULTS: dict = {"checks": [], "timings": [], "sweep": []}
DTYPES = [np.float32, np.float64, np.complex64, np.complex128]


def sync():
    cp.cuda.Device().synchronize()


def check(name, ok, detail=""):
    RESULTS["checks"].append({"name": name, "pass": bool(ok), "detail": detail})
    print(f"{'PASS' if ok else 'FAIL'}  {name}  {detail}")


def rand(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        a = a + 1j * rng.standard_normal(shape)
    return a.astype(dtype)


def median_time(f, repeats=7, inner=None):
    f()
    sync()
    if inner is None:
        t0 = time.perf_counter()
        f()
        sync()
        inner = max(1, int(0.01 / max(time.perf_counter() - t0, 1e-6)))
    ts = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        for _ in range(inner):
            f()
        sync()
        ts.append((time.perf_counter() - t0) / inner)
    return statistics.median(ts)


def qr_checks():
    for dtype in DTYPES:
        u = np.finfo(dtype).eps / 2
        for m, n in ((100, 10), (1000, 20), (4000, 50), (1024, 1024)):
            tag = f"qr {m}x{n} {np.dtype(dtype).name}"
            try:
                ah = rand((m, n), dtype, m + n)
                a = cp.asarray(ah)
                a0 = a.copy()
                took = _fast.qr(a, "reduced", None, "auto", True) is not _fast.MISS
                q, r = mpqr.qr(a)
                rh = r.get().astype(np.complex128)
                qh = q.get().astype(np.complex128)
                d = np.diagonal(rh)
                tol = 30 * np.sqrt(m * n) * u
                back = np.linalg.norm(qh @ rh - ah) / np.linalg.norm(ah)
                orth = np.linalg.norm(qh.conj().T @ qh - np.eye(n)) / np.sqrt(n)
                _, rc = cp.linalg.qr(a)
                rch = rc.get().astype(np.complex128)
                ph = np.diagonal(rch)
                ph = np.where(ph != 0, ph / np.abs(ph), 1)
                same = np.linalg.norm(ph.conj()[:, None] * rch - rh) / np.linalg.norm(rh)
                r_only = mpqr.qr(a, mode="r")
                ok = (took and bool(cp.array_equal(a, a0)) and q.dtype == a.dtype
                      and r.dtype == a.dtype and q.shape == (m, n) and r.shape == (n, n)
                      and np.all(d.real >= 0) and np.all(d.imag == 0)
                      and np.all(np.tril(rh, -1) == 0) and back <= tol and orth <= tol
                      and same <= tol and bool(cp.allclose(r_only, r)))
                check(tag, ok, f"fast={took} backward={back:.1e} orth={orth:.1e} "
                      f"vs cupy R={same:.1e} tol={tol:.1e}")
            except Exception:
                traceback.print_exc()
                check(tag, False, "exception")
        try:
            a = cp.asarray(rand((100, 10), dtype, 5))
            a[3, 4] = np.nan
            miss = _fast.qr(a, "reduced", None, "auto", False) is _fast.MISS
            try:
                mpqr.qr(a, check_finite=True)
                raised = False
            except ValueError:
                raised = True
            nan_out = not bool(cp.isfinite(mpqr.qr(a)[1]).all())
            check(f"qr NaN {np.dtype(dtype).name} takes the general route",
                  miss and raised and nan_out, f"raised={raised} NaN out={nan_out}")
        except Exception:
            traceback.print_exc()
            check(f"qr NaN {np.dtype(dtype).name}", False, "exception")


def lstsq_checks():
    for dtype in DTYPES:
        u = np.finfo(dtype).eps / 2
        for (m, n), vec in (((100, 10), True), ((1000, 20), False), ((4000, 50), True)):
            tag = f"lstsq {m}x{n} {np.dtype(dtype).name} {'1-D' if vec else '2-D'} b"
            try:
                ah = rand((m, n), dtype, 1)
                bh = rand((m,) if vec else (m, 3), dtype, 2)
                a, b = cp.asarray(ah), cp.asarray(bh)
                a0, b0 = a.copy(), b.copy()
                fast = _fast.lstsq(a, b, None, True, None, precision=None, refine="auto",
                                   tol=None, maxiter=None)
                took = fast is not _fast.MISS
                via_api = mpqr.lstsq(a, b)
                with mpqr.explain():
                    gen = mpqr.lstsq(a, b)
                same_types = True
                for got, want in zip(via_api, gen):
                    if isinstance(want, int):
                        same_types &= type(got) is int and got == want
                    elif want is None:
                        same_types &= got is None
                    else:
                        same_types &= (type(got) is type(want) and got.shape == want.shape
                                       and got.dtype == want.dtype)
                x, res, rank, s = via_api
                a128, b128 = ah.astype(np.complex128), bh.astype(np.complex128)
                xr = np.linalg.lstsq(a128, b128, rcond=None)[0]
                kappa = np.linalg.cond(a128)
                tol = 100 * np.sqrt(m * n) * u * kappa
                err = np.linalg.norm(x.get() - xr) / np.linalg.norm(xr)
                sr = np.linalg.svd(a128, compute_uv=False)
                serr = np.max(np.abs(s.get() - sr) / sr[0])
                rr = b128 - a128 @ x.get()
                rerr = np.max(np.abs(res.get() - np.sum(np.abs(rr) ** 2, axis=0))
                              / np.sum(np.abs(b128) ** 2, axis=0))
                ok = (took and same_types and rank == n and err <= tol and serr <= tol
                      and rerr <= tol and bool(cp.array_equal(a, a0))
                      and bool(cp.array_equal(b, b0)))
                check(tag, ok, f"fast={took} types-as-general={same_types} rank={rank} "
                      f"x err={err:.1e} s err={serr:.1e} res err={rerr:.1e} tol={tol:.1e}")
            except Exception:
                traceback.print_exc()
                check(tag, False, "exception")
        tag = f"lstsq rank-deficient / NaN {np.dtype(dtype).name}"
        try:
            ah = rand((100, 10), dtype, 3)
            ah[:, 9] = ah[:, 0]
            a, b = cp.asarray(ah), cp.asarray(rand((100,), dtype, 4))
            miss = _fast.lstsq(a, b, None, True, None, precision=None, refine="auto",
                               tol=None, maxiter=None) is _fast.MISS
            rank = mpqr.lstsq(a, b)[2]
            bn = b.copy()
            bn[5] = np.nan
            miss_nan = _fast.lstsq(cp.asarray(rand((100, 10), dtype, 6)), bn, None, False,
                                   None, precision=None, refine="auto", tol=None,
                                   maxiter=None) is _fast.MISS
            xn = mpqr.lstsq(cp.asarray(rand((100, 10), dtype, 6)), bn,
                            check_finite=False)[0]
            ok = miss and rank == 9 and miss_nan and not bool(cp.isfinite(xn).any())
            check(tag, ok, f"rank={rank} general route={miss} NaN general={miss_nan}")
        except Exception:
            traceback.print_exc()
            check(tag, False, "exception")


def timings():
    rng = cp.random.default_rng(0)
    for m, n in ((100, 10), (1000, 20), (4000, 50)):
        try:
            a = rng.standard_normal((m, n))
            b = rng.standard_normal(m)
            t = {k: median_time(f) for k, f in (
                ("mpqr.qr", lambda a=a: mpqr.qr(a)),
                ("cupy.linalg.qr", lambda a=a: cp.linalg.qr(a)),
                ("mpqr.lstsq", lambda a=a, b=b: mpqr.lstsq(a, b)),
                ("gels", lambda a=a, b=b: lapack.gels(a, b)))}
            for call, mine, lib in (("qr", "mpqr.qr", "cupy.linalg.qr"),
                                    ("lstsq", "mpqr.lstsq", "gels")):
                row = {"call": call, "shape": [m, n], "mpqr_us": t[mine] * 1e6,
                       "library": lib, "library_us": t[lib] * 1e6,
                       "ratio": t[mine] / t[lib]}
                RESULTS["timings"].append(row)
                print(f"{call:5s} {m}x{n} float64: mpqr {row['mpqr_us']:8.1f} us, {lib} "
                      f"{row['library_us']:8.1f} us, ratio {row['ratio']:.2f} (target <= 1.5"
                      f" at 1000x20)")
        except Exception:
            traceback.print_exc()


def sweep():
    rng = cp.random.default_rng(1)
    rows = [((1024, 1024), "float64", ("auto", "fp64", "fp64-emulated")),
            ((4096, 4096), "float64", ("auto",)),
            ((4096, 16384), "float64", ("fp64-emulated", "auto")),
            ((1024, 1024), "complex128", ("auto", "fp64-emulated")),
            ((4096, 4096), "complex128", ("auto",))]
    for (m, n), dt, precs in rows:
        x = rng.standard_normal((m, n))
        if dt.startswith("complex"):
            x = (x + 1j * rng.standard_normal((m, n))).astype(dt)
        for p in precs:
            try:
                with mpqr.explain() as tr:
                    mpqr.qr(x, precision=p)
                ev = [e for e in tr.events if e.kind == "method"]
                route = ev[0].data.get("method", "?") if ev else "?"
                why = ev[0].message if ev else ""
                tm = median_time(lambda x=x, p=p: mpqr.qr(x, precision=p), 5, 1)
                tl = median_time(lambda x=x: cp.linalg.qr(x), 5, 1)
                row = {"shape": [m, n], "dtype": dt, "precision": p, "route": route,
                       "why": why, "mpqr_ms": tm * 1e3, "library": "cupy.linalg.qr",
                       "library_ms": tl * 1e3, "ratio": tl / tm}
                RESULTS["sweep"].append(row)
                flag = "ok" if tl / tm >= 0.95 else "LOW"
                print(f"sweep {m}x{n} {dt} {p}: {route}, mpqr {tm * 1e3:.2f} ms, cupy "
                      f"{tl * 1e3:.2f} ms, ratio {tl / tm:.2f} ({flag})")
            except Exception:
                traceback.print_exc()
        del x
        cp.get_default_memory_pool().free_all_blocks()


def main():
    start = time.perf_counter()
    for part in (qr_checks, lstsq_checks, timings, sweep):
        try:
            part()
        except Exception:
            traceback.print_exc()
        print(f"-- {part.__name__} done at {time.perf_counter() - start:.1f} s")
    fails = [c["name"] for c in RESULTS["checks"] if not c["pass"]]
    print(f"checks: {len(RESULTS['checks']) - len(fails)} PASS, {len(fails)} FAIL")
    RESULTS["device"] = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    out = os.path.join(os.environ.get("OUT", "/tmp"), "smallgpu.json")
    with open(out, "w") as f:
        json.dump(RESULTS, f, indent=1, default=str)
    print("wrote", out)


if __name__ == "__main__":
    main()
