"""GPU checks and timings of the small-input fast path's least squares beyond
``small_max``, its size cut, the QR's check download, and the wide fp16 route.

``python bench/probes/smallgpu_gpu.py``: writes ``$OUT/smallgpu.json`` (``OUT`` default
/tmp); under 90 s on an H200 (a time guard drops the grid's largest shapes).

* checks (PASS/FAIL): ``mpqr.qr`` 100 x 10 / 1000 x 20 per dtype against
  ``cupy.linalg.qr`` (R up to the phases), NaN takes the general route; ``mpqr.lstsq``
  through the one geqrf of ``[A | b]`` (now also above ``small_max``: 10000 x 50,
  30000 x 20, 60000 x 50) against ``numpy.linalg.lstsq`` in complex128 and the general
  route's tuple; n = 200 keeps the general route;
* lstsq grid (m 4000 .. 2^20, n 20 / 50 / 128, float64; float32 and complex128 rows):
  the fast path (forced past ``small_lstsq_max``) and the general route (the fast path
  switched off), ``cupyx.lapack.gels`` and ``cupy.linalg.lstsq`` (to 2^20 elements);
  medians of round-robin rounds; the Gram-SVD variant's checks (cond 1 and 1e6);
* lstsq steps at 4000 x 50 (device part, host part) and the host ``gesdd`` of an n x n
  R with the process's BLAS threads and with one;
* qr 1000 x 20 (float64/float32/complex128) against ``cupy.linalg.qr``: the early check
  (A's column maxima from the copy kernel) or R read afterwards, pinned or pageable;
* tiny inputs through the host's LAPACK (``small.HOST_MAX``): SciPy's results (PASS/FAIL,
  wide, rank-deficient, gelss/gelsy) and the host route against the device route;
* 4096 x 16384 float32 ``precision="fp16"``: route and time against ``cupy.linalg.qr``.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
import traceback

import cupy as cp
import numpy as np
from cupyx import lapack
from mpqr.backends import get_backend
from mpqr.backends.cupy import small

import mpqr
from mpqr import _fast

RESULTS: dict = {"checks": [], "grid": [], "steps": [], "gesdd": [], "qr": [], "fp16_wide": [],
                 "host_route": []}
DTYPES = [np.float32, np.float64, np.complex64, np.complex128]
T0 = time.perf_counter()
BUDGET_S = float(os.environ.get("SMALLGPU_BUDGET_S", "75"))
BE = get_backend(cp)


def elapsed():
    return time.perf_counter() - T0


def sync():
    cp.cuda.Device().synchronize()


def check(name, ok, detail=""):
    RESULTS["checks"].append({"name": name, "pass": bool(ok), "detail": detail})
    print(f"{'PASS' if ok else 'FAIL'}  {name}  {detail}", flush=True)


def rand(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        a = a + 1j * rng.standard_normal(shape)
    return a.astype(dtype)


def rounds(funcs, repeats=21, round_ms=5.0):
    """Median seconds per call of each function, round-robin, CUDA-synchronised."""
    for f in funcs.values():
        f()
        f()
    sync()
    counts = {}
    for k, f in funcs.items():
        t0 = time.perf_counter()
        f()
        sync()
        counts[k] = max(1, int(round_ms * 1e-3 / max(time.perf_counter() - t0, 1e-7)))
    samples = {k: [] for k in funcs}
    for _ in range(repeats):
        for k, f in funcs.items():
            sync()
            t0 = time.perf_counter()
            for _ in range(counts[k]):
                f()
            sync()
            samples[k].append((time.perf_counter() - t0) / counts[k])
    return {k: statistics.median(v) for k, v in samples.items()}


def fast_lstsq(a, b):
    return _fast.lstsq(a, b, None, True, None, precision=None, refine="auto", tol=None,
                       maxiter=None)


def _desc(v):
    if v is None or isinstance(v, (int, np.integer)):
        return f"{type(v).__name__}"
    return f"{type(v).__name__}{tuple(v.shape)} {v.dtype}"


def _lstsq_one(tag, ah, bh, expect_fast=True):
    dtype = ah.dtype
    m, n = ah.shape
    u = np.finfo(dtype).eps / 2
    a, b = cp.asarray(ah), cp.asarray(bh)
    a0, b0 = a.copy(), b.copy()
    fast = fast_lstsq(a, b)
    took = fast is not _fast.MISS
    via_api = mpqr.lstsq(a, b)
    with mpqr.explain():  # the general route
        gen = mpqr.lstsq(a, b)
    same_types, differ = True, []
    for got, want in zip(via_api, gen):
        if isinstance(want, (int, np.integer)):
            same = type(got) is type(want) and got == want
        elif want is None:
            same = got is None
        else:
            same = (type(got) is type(want) and got.shape == want.shape
                    and got.dtype == want.dtype)
        if not same:
            differ.append(f"{_desc(got)} vs general {_desc(want)}")
        same_types &= same
    x, res, rank, s = via_api
    a128, b128 = ah.astype(np.complex128), bh.astype(np.complex128)
    xr = np.linalg.lstsq(a128, b128, rcond=None)[0]
    kappa = np.linalg.cond(a128)
    tol = 100 * np.sqrt(m * n) * u * kappa
    err = np.linalg.norm(x.get() - xr) / np.linalg.norm(xr)
    sr = np.linalg.svd(a128, compute_uv=False)
    serr = np.max(np.abs(s.get() - sr) / sr[0])
    if m > n:
        rr = b128 - a128 @ x.get()
        rref = np.sum(np.abs(rr) ** 2, axis=0)
        rerr = np.max(np.abs(res.get() - rref) / np.maximum(np.sum(np.abs(b128) ** 2,
                                                                   axis=0), 1e-300))
    else:
        rerr = 0.0 if res.shape == (0,) else 1.0
    gx = gen[0].get()
    gap = np.linalg.norm(x.get() - gx) / np.linalg.norm(gx)
    ok = (took == expect_fast and same_types and rank == n and err <= tol
          and serr <= tol and rerr <= tol and gap <= tol
          and bool(cp.array_equal(a, a0)) and bool(cp.array_equal(b, b0)))
    check(tag, ok, f"fast={took} types-as-general={same_types} rank={rank} x err={err:.1e} "
          f"vs general {gap:.1e} s err={serr:.1e} res err={rerr:.1e} tol={tol:.1e}"
          + (f" differ: {differ}" if differ else ""))



def qr_checks():
    for early, dtypes in ((True, DTYPES), (False, [np.float64])):
        small.EARLY_CHECK = early
        try:
            _qr_checks(early, dtypes)
        finally:
            small.EARLY_CHECK = True


def _qr_checks(early, dtypes):
    for dtype in dtypes:
        u = np.finfo(dtype).eps / 2
        for m, n in ((100, 10), (1000, 20)):
            tag = f"qr {m}x{n} {np.dtype(dtype).name} early={early}"
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
                ok = (took and bool(cp.array_equal(a, a0)) and q.dtype == a.dtype
                      and np.all(d.real >= 0) and np.all(d.imag == 0)
                      and np.all(np.tril(rh, -1) == 0) and back <= tol and orth <= tol
                      and same <= tol)
                check(tag, ok, f"fast={took} backward={back:.1e} orth={orth:.1e} "
                      f"vs cupy R={same:.1e} tol={tol:.1e}")
            except Exception:
                traceback.print_exc()
                check(tag, False, "exception")
        for what, v in (("NaN", np.nan), ("-NaN", -np.nan), ("Inf", np.inf),
                        ("-Inf", -np.inf), ("huge", -2.0 ** 500)):
            tag = f"qr {what} {np.dtype(dtype).name} early={early} takes the general route"
            try:
                ah = rand((400, 10), dtype, 5)  # past HOST_MAX: the device's check
                ah[:, 4] = -0.0
                if np.dtype(dtype).char in "fF" and what == "huge":
                    v = -2.0 ** 60
                ah[3, 4] = v
                a = cp.asarray(ah)
                miss = _fast.qr(a, "reduced", None, "auto", False) is _fast.MISS
                out = mpqr.qr(a)[1]
                ok_out = (not bool(cp.isfinite(out).all())) if what != "huge" else \
                    bool(cp.isfinite(out).all())
                check(tag, miss and ok_out, f"miss={miss} out as the general route={ok_out}")
            except Exception:
                traceback.print_exc()
                check(tag, False, "exception")


def lstsq_checks():
    cases = [((1000, 20), 3, DTYPES), ((4000, 50), None, [np.float64, np.complex64]),
             ((10000, 50), None, [np.float32, np.complex128]),
             ((30000, 20), 2, [np.float64]), ((60000, 50), None, [np.float64]),
             ((4000, 128), None, [np.float64])]
    for (m, n), k, dts in cases:
        for dtype in dts:
            tag = f"lstsq {m}x{n} k={k} {np.dtype(dtype).name}"
            try:
                ah = rand((m, n), dtype, 3)
                bh = rand((m,) if k is None else (m, k), dtype, 4)
                _lstsq_one(tag, ah, bh, expect_fast=True)
            except Exception:
                traceback.print_exc()
                check(tag, False, "exception")
    # the singular values from A^H A's Cholesky factor, taken while cuSOLVER factors
    small.GRAM_SVD = True
    try:
        small.GRAM_SVD_MIN_N = 1
        for (m, n), dts in (((4000, 50), [np.float32, np.float64]),):
            for dtype in dts:
                tag = f"lstsq {m}x{n} {np.dtype(dtype).name} GRAM_SVD"
                try:
                    _lstsq_one(tag, rand((m, n), dtype, 3), rand((m,), dtype, 4))
                except Exception:
                    traceback.print_exc()
                    check(tag, False, "exception")
        for kappa in (1e6,):
            tag = f"lstsq 4000x50 float64 cond {kappa:.0e} GRAM_SVD"
            try:
                q1 = np.linalg.qr(rand((4000, 50), np.float64, 5))[0]
                q2 = np.linalg.qr(rand((50, 50), np.float64, 6))[0]
                ah = (q1 * np.logspace(0, -np.log10(kappa), 50)) @ q2
                _lstsq_one(tag, ah, rand((4000,), np.float64, 7))
            except Exception:
                traceback.print_exc()
                check(tag, False, "exception")
    finally:
        small.GRAM_SVD, small.GRAM_SVD_MIN_N = GRAM_DEFAULT
    tag = "lstsq 10000x200 float64 keeps the general route (n > small_lstsq_max_n)"
    try:
        a = cp.asarray(rand((10000, 200), np.float64, 3))
        b = cp.asarray(rand((10000,), np.float64, 4))
        miss = fast_lstsq(a, b) is _fast.MISS
        check(tag, miss, f"miss={miss}")
    except Exception:
        traceback.print_exc()
        check(tag, False, "exception")
    for dtype in (np.float64, np.complex128):
        tag = f"lstsq NaN in b 10000x50 {np.dtype(dtype).name} takes the general route"
        try:
            a = cp.asarray(rand((10000, 50), dtype, 3))
            b = cp.asarray(rand((10000,), dtype, 4))
            b[77] = np.nan
            miss = fast_lstsq(a, b) is _fast.MISS
            x = mpqr.lstsq(a, b, check_finite=False)[0]
            check(tag, miss and not bool(cp.isfinite(x).all()), f"miss={miss}")
        except Exception:
            traceback.print_exc()
            check(tag, False, "exception")


def large_checks():
    """Past EARLY_CHECK_MAX (the maxima's own pass before the library QR)."""
    for dtype in (np.float64, np.complex64):
        name = np.dtype(dtype).name
        tag = f"qr 1200x300 {name}: taken, NaN/-Inf/huge take the general route"
        try:
            ah = rand((1200, 300), dtype, 21)
            took = _fast.qr(cp.asarray(ah), "r", None, "auto", True) is not _fast.MISS
            q, r = mpqr.qr(cp.asarray(ah))
            back = float(cp.linalg.norm(q @ r - cp.asarray(ah)) / np.linalg.norm(ah))
            big = -(2.0 ** (60 if np.dtype(dtype).char in "fF" else 500))
            misses = []
            for v in (np.nan, -np.inf, big):
                bad = ah.copy()
                bad[777, 123] = v
                misses.append(_fast.qr(cp.asarray(bad), "reduced", None, "auto", False)
                              is _fast.MISS)
            tol = 30 * np.sqrt(1200 * 300) * np.finfo(dtype).eps
            check(tag, took and all(misses) and back <= tol,
                  f"taken={took} misses={misses} backward={back:.1e}")
        except Exception:
            traceback.print_exc()
            check(tag, False, "exception")


def host_checks():
    """Tiny inputs (small.HOST_MAX) take the host's LAPACK: SciPy's results exactly."""
    import scipy.linalg as sla

    for dtype in DTYPES:
        name = np.dtype(dtype).name
        for (m, n), k, driver in (((100, 10), None, None), ((21, 20), 4, "gelss"),
                                  ((10, 30), None, None), ((40, 8), None, "rankdef")):
            tag = f"host lstsq {m}x{n} k={k} {driver} {name}"
            try:
                ah = rand((m, n), dtype, 11)
                drv = driver
                if driver == "rankdef":
                    ah[:, 7] = ah[:, 1]
                    drv = None
                bh = rand((m,) if k is None else (m, k), dtype, 12)
                a, b = cp.asarray(ah), cp.asarray(bh)
                took = _fast.lstsq(a, b, None, True, drv, precision=None, refine="auto",
                                   tol=None, maxiter=None) is not _fast.MISS
                got = mpqr.lstsq(a, b, lapack_driver=drv)
                ref = sla.lstsq(ah, bh, lapack_driver=drv)
                ok = took and got[2] == ref[2]
                detail = []
                for g, r in zip(got, ref):
                    if r is None or isinstance(r, (int, np.integer)):
                        ok &= (g is None) == (r is None)
                        continue
                    gh = g.get()
                    same = gh.shape == np.shape(r) and gh.dtype == np.asarray(r).dtype \
                        and np.allclose(gh, r, rtol=50 * np.finfo(dtype).eps,
                                        atol=50 * np.finfo(dtype).eps * max(1.0, float(
                                            np.nanmax(np.abs(r))) if np.size(r) else 1.0),
                                        equal_nan=True)
                    detail.append(f"{gh.shape}{gh.dtype}:{same}")
                    ok &= bool(same)
                check(tag, ok, f"fast={took} rank={got[2]}/{ref[2]} " + " ".join(detail))
            except Exception:
                traceback.print_exc()
                check(tag, False, "exception")
        tag = f"host qr 100x10 r / NaN {name}"
        try:
            ah = rand((100, 10), dtype, 13)
            r = mpqr.qr(cp.asarray(ah), mode="r").get()
            rref = np.linalg.qr(ah, mode="r")
            ph = np.diagonal(rref)
            ph = np.where(ph != 0, ph / np.abs(ph), 1)
            err = np.linalg.norm(ph.conj()[:, None] * rref - r) / np.linalg.norm(r)
            ah[5, 5] = np.nan
            miss = _fast.qr(cp.asarray(ah), "reduced", None, "auto", False) is _fast.MISS
            check(tag, err <= 100 * np.finfo(dtype).eps and miss, f"R err={err:.1e} miss={miss}")
        except Exception:
            traceback.print_exc()
            check(tag, False, "exception")


def host_times():
    """The host route against the device route at small sizes (qr and lstsq)."""
    dev_max = small.HOST_MAX
    for m, n in ((100, 10), (300, 10), (1000, 10), (1000, 20)):
        a = cp.asarray(rand((m, n), np.float64, 1))
        b = cp.asarray(rand((m,), np.float64, 2))
        t = {}
        try:
            for name, lim in (("host", 2**40), ("device", 0)):
                small.HOST_MAX = lim
                tt = rounds({"qr": lambda a=a: mpqr.qr(a),
                             "lstsq": lambda a=a, b=b: mpqr.lstsq(a, b)}, repeats=9)
                t.update({f"{name} {k}": v * 1e6 for k, v in tt.items()})
        finally:
            small.HOST_MAX = dev_max
        tt = rounds({"cupy.linalg.qr": lambda a=a: cp.linalg.qr(a),
                     "gels": lambda a=a, b=b: lapack.gels(a, b)}, repeats=9)
        t.update({k: v * 1e6 for k, v in tt.items()})
        RESULTS["host_route"].append({"shape": [m, n], **t})
        print(f"host route {m}x{n} (us): " + ", ".join(f"{k} {v:.0f}" for k, v in t.items()),
              flush=True)


class _NoFast:
    """The general route: the fast path's lstsq switched off."""

    def __enter__(self):
        self.f = _fast.lstsq
        _fast.lstsq = lambda *a, **k: _fast.MISS
        return self

    def __exit__(self, *exc):
        _fast.lstsq = self.f


#: the module's defaults, restored after each variant
GRAM_DEFAULT = (small.GRAM_SVD, small.GRAM_SVD_MIN_N)


def _plain(a, b):
    small.GRAM_SVD = False
    try:
        return mpqr.lstsq(a, b)
    finally:
        small.GRAM_SVD, small.GRAM_SVD_MIN_N = GRAM_DEFAULT


def _general(a, b):
    with _NoFast():
        return mpqr.lstsq(a, b)


def grid():
    old = BE.small_lstsq_max
    BE.small_lstsq_max = 2**40  # the fast path for every shape of the grid
    shapes = [(m, 20, np.float64) for m in (10000, 100000, 1048576)]
    shapes += [(m, 50, np.float64) for m in (4000, 10000, 30000, 100000, 300000)]
    shapes += [(m, 128, np.float64) for m in (4000, 32768, 131072)]
    shapes += [(m, 50, dt) for m in (10000, 100000) for dt in (np.float32, np.complex128)]
    shapes.sort(key=lambda s: s[0] * s[1])
    try:
        for m, n, dt in shapes:
            if elapsed() > BUDGET_S - 8:
                print(f"grid: time guard at {m}x{n}", flush=True)
                RESULTS["grid"].append({"stopped": [m, n]})
                break
            try:
                a = cp.asarray(rand((m, n), dt, 1))
                b = cp.asarray(rand((m,), dt, 2))
                took = fast_lstsq(a, b) is not _fast.MISS
                funcs = {"fast": lambda a=a, b=b: _plain(a, b),
                         "general": lambda a=a, b=b: _general(a, b),
                         "gels": lambda a=a, b=b: lapack.gels(a, b)}
                if m * n <= 2**20:
                    funcs["cupy.linalg.lstsq"] = lambda a=a, b=b: cp.linalg.lstsq(
                        a, b, rcond=None)
                big = m * n >= 2**22
                t = rounds(funcs, repeats=5 if big else 7, round_ms=2.0 if big else 3.0)
                row = {"shape": [m, n], "dtype": np.dtype(dt).name, "fast_taken": took}
                row.update({k + "_us": v * 1e6 for k, v in t.items()})
                row["fast/general"] = t["fast"] / t["general"]
                row["fast/gels"] = t["fast"] / t["gels"]
                if "cupy.linalg.lstsq" in t:
                    row["fast/cupy_lstsq"] = t["fast"] / t["cupy.linalg.lstsq"]
                RESULTS["grid"].append(row)
                print(f"grid {m}x{n} {np.dtype(dt).name}: fast {t['fast']*1e6:.0f} us "
                      f"general {t['general']*1e6:.0f} gels {t['gels']*1e6:.0f} "
                      f"cupy.lstsq {t.get('cupy.linalg.lstsq', float('nan'))*1e6:.0f}  "
                      f"fast/general {row['fast/general']:.2f} fast/gels "
                      f"{row['fast/gels']:.2f} (taken={took})", flush=True)
                del a, b
                cp.get_default_memory_pool().free_all_blocks()
            except Exception:
                traceback.print_exc()
                RESULTS["grid"].append({"shape": [m, n], "error": traceback.format_exc()})
    finally:
        BE.small_lstsq_max = old


def steps():
    """Where an lstsq call's time goes: the device part (copy, geqrf, trsm, download,
    wait), the host part (aug_solve: checks, gesdd, residues) and the rest."""
    for m, n in ((4000, 50),):
        a = cp.asarray(rand((m, n), np.float64, 1))
        b = cp.asarray(rand((m,), np.float64, 2))
        b2 = b[:, None]
        w = n + 1
        xt = cp.empty((w, m))
        work = {}

        def device(a=a, b2=b2, xt=xt, m=m, n=n, w=w, work=work):
            small._AUG(a, b2, m, n, xt)
            xt2 = xt.copy()  # geqrf in place: a fresh buffer each call
            h = cp.cuda.device.get_cusolver_handle()
            from cupy_backends.cuda.libs import cusolver
            lw = cusolver.dgeqrf_bufferSize(h, m, w, xt2.data.ptr, m)
            ws = cp.empty(lw + w + 1)
            cusolver.dgeqrf(h, m, w, xt2.data.ptr, m, ws.data.ptr + lw * 8, ws.data.ptr,
                            lw, ws.data.ptr + (lw + w) * 8)
            host = xt2[:, :w].get()
            work["host"] = host
            return host

        device()
        hostbuf = work["host"]

        def host(hostbuf=hostbuf, m=m, n=n):
            return small.aug_solve(hostbuf.T, m, n, 1e-15, 2.0**-53, solved=False)

        t = rounds({"mpqr.lstsq": lambda a=a, b=b: mpqr.lstsq(a, b),
                    "gels": lambda a=a, b=b: lapack.gels(a, b),
                    "device part (copy, geqrf, get)": device,
                    "host part (aug_solve)": host,
                    "small.small_lstsq": lambda a=a, b2=b2: small.small_lstsq(
                        a, b2, 1e-15, 2.0**-53)}, repeats=11)
        row = {"shape": [m, n], **{k: v * 1e6 for k, v in t.items()}}
        RESULTS["steps"].append(row)
        print(f"steps {m}x{n} (us): " + ", ".join(f"{k} {v * 1e6:.0f}" for k, v in t.items()),
              flush=True)
    from mpqr.backends.host.blas import OneThread
    from scipy.linalg import lapack as hl
    for n in (64, 96, 128):
        r = np.asfortranarray(np.triu(rand((n, n), np.float64, 9)))

        def one(r=r):
            with OneThread():
                hl.dgesdd(r, compute_uv=0)
        t0 = {}
        for name, f in (("default threads", lambda r=r: hl.dgesdd(r, compute_uv=0)),
                        ("one thread", one)):
            f()
            ts = []
            for _ in range(15):
                s0 = time.perf_counter()
                f()
                ts.append(time.perf_counter() - s0)
            t0[name] = statistics.median(ts) * 1e6
        RESULTS["gesdd"].append({"n": n, **t0})
        print(f"host gesdd {n}x{n} (us): {t0}", flush=True)


def qr_times():
    variants = {"early check, pinned": (True, True), "R read, pinned": (False, True),
                "R read, pageable": (False, False)}
    for dt in (np.float64, np.float32, np.complex128):
        a = cp.asarray(rand((1000, 20), dt, 1))
        res = {}
        try:
            for name, (early, pinned) in variants.items():
                small.EARLY_CHECK, small.PINNED = early, pinned
                t = rounds({"mpqr.qr": lambda a=a: mpqr.qr(a),
                            "cupy.linalg.qr": lambda a=a: cp.linalg.qr(a)}, repeats=9)
                res[name] = {k: v * 1e6 for k, v in t.items()}
                res[name + " ratio"] = t["mpqr.qr"] / t["cupy.linalg.qr"]
        finally:
            small.EARLY_CHECK, small.PINNED = True, True
        b = cp.asarray(rand((1000,), dt, 2))
        for pinned in (True, False):
            small.PINNED = pinned
            try:
                tt = rounds({"mpqr.lstsq": lambda a=a, b=b: mpqr.lstsq(a, b),
                             "gels": lambda a=a, b=b: lapack.gels(a, b)}, repeats=9)
            finally:
                small.PINNED = True
            res["lstsq/gels " + ("pinned" if pinned else "pageable")] = \
                tt["mpqr.lstsq"] / tt["gels"]
        RESULTS["qr"].append({"shape": [1000, 20], "dtype": np.dtype(dt).name, **res})
        print(f"qr 1000x20 {np.dtype(dt).name}: " + ", ".join(
            f"{k} {v:.3f}" for k, v in res.items() if not isinstance(v, dict)), flush=True)
    # the early check's copy kernel with its atomics at the largest size it takes
    for shape in ((512, 512), (16384, 16), (10000, 50), (2048, 2048)):
        a = cp.asarray(rand(shape, np.float64, 3))
        try:
            t = {}
            for early in (True, False):
                small.EARLY_CHECK = early
                t["early" if early else "R read"] = rounds(
                    {"mpqr.qr": lambda a=a: mpqr.qr(a)}, repeats=9)["mpqr.qr"] * 1e6
        finally:
            small.EARLY_CHECK = True
        t["cupy.linalg.qr"] = rounds({"c": lambda a=a: cp.linalg.qr(a)}, repeats=9)["c"] * 1e6
        RESULTS["qr"].append({"shape": list(shape), "dtype": "float64", **t})
        print(f"qr {shape} float64 (us): {t}", flush=True)


def fp16_wide():
    x = cp.asarray(rand((4096, 16384), np.float32, 1))
    with mpqr.explain() as tr:
        mpqr.qr(x, precision="fp16")
    ev = [e for e in tr.events if e.kind == "method"]
    route = ev[0].data.get("method", "?") if ev else "?"
    t = rounds({"mpqr fp16": lambda: mpqr.qr(x, precision="fp16"),
                "cupy.linalg.qr": lambda: cp.linalg.qr(x)}, repeats=5, round_ms=0.0)
    ratio = t["cupy.linalg.qr"] / t["mpqr fp16"]
    RESULTS["fp16_wide"].append({"shape": [4096, 16384], "route": route,
                                 "why": ev[0].message if ev else "",
                                 "mpqr_ms": t["mpqr fp16"] * 1e3,
                                 "library_ms": t["cupy.linalg.qr"] * 1e3, "ratio": ratio})
    check("4096x16384 float32 fp16 takes the library QR and is >= 0.95x it",
          route == "geqrf" and ratio >= 0.95, f"route={route} ratio={ratio:.3f}")
    # accuracy of what it returned against float64 (backward error at float32's u)
    q, r = mpqr.qr(x, precision="fp16")
    back = float(cp.linalg.norm(q.astype(cp.float64) @ r.astype(cp.float64)
                                - x.astype(cp.float64)) / cp.linalg.norm(x.astype(cp.float64)))
    tol = 30 * math.sqrt(4096 * 16384) * 2.0**-24
    check("4096x16384 float32 fp16 backward error", back <= tol,
          f"backward={back:.1e} tol={tol:.1e}")


def _write():
    out = os.path.join(os.environ.get("OUT", "/tmp"), "smallgpu.json")
    with open(out, "w") as f:
        json.dump(RESULTS, f, indent=1, default=str)
    return out


def main():
    RESULTS["device"] = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    for part in (qr_checks, large_checks, lstsq_checks, host_checks, fp16_wide, qr_times,
                 host_times, grid, steps):
        try:
            part()
        except Exception:
            traceback.print_exc()
            check(part.__name__, False, "exception")
        print(f"-- {part.__name__} done at {elapsed():.1f} s", flush=True)
        _write()  # after every part: a run stopped by its time limit keeps what it has
    n_ok = sum(c["pass"] for c in RESULTS["checks"])
    print(f"checks: {n_ok} PASS, {len(RESULTS['checks']) - n_ok} FAIL")
    print("wrote", _write())


if __name__ == "__main__":
    main()
