"""Session-5 probe: where lstsq's time goes, and the candidates for its singular values.

python3 bench/probe_s5.py OUT.json [lstsq5]
"""
import threading
import time

import cupy as cp
import numpy as np
import scipy.linalg as sl
from _probe import rec, section, sections, timeit, write
from mpqr.backends import get_backend

import mpqr

sections(["cholqr5", "lstsq6"])


def host_ms(f, rep=3):
    f()
    ts = []
    for _ in range(rep):
        t = time.perf_counter()
        f()
        ts.append((time.perf_counter() - t) * 1e3)
    return float(np.median(ts))


def _phases(mod, names, f):
    """Run f once with mod's functions ``names`` wrapped in synchronised timers."""
    prof = {}
    saved = {nm: getattr(mod, nm) for nm in names}

    def wrapper(nm, orig):
        def g(*x, **kw):
            cp.cuda.Device().synchronize()
            t = time.perf_counter()
            out = orig(*x, **kw)
            cp.cuda.Device().synchronize()
            prof[nm] = prof.get(nm, 0) + (time.perf_counter() - t) * 1e3
            return out
        return g
    for nm, orig in saved.items():
        setattr(mod, nm, wrapper(nm, orig))
    try:
        cp.cuda.Device().synchronize()
        t = time.perf_counter()
        f()
        cp.cuda.Device().synchronize()
        tot = (time.perf_counter() - t) * 1e3
    finally:
        for nm, orig in saved.items():
            setattr(mod, nm, orig)
    return tot, {k: round(v, 2) for k, v in prof.items()}


def _lstsq5_one(m, n):
    tag = f"{m}x{n}"
    a = cp.random.standard_normal((m, n))
    b = cp.random.standard_normal(m)
    v = cp.random.standard_normal((n, 1))
    w = cp.random.standard_normal((m, 1))
    rec(f"{tag} gram A^T A", timeit(lambda: a.T @ a))
    g = a.T @ a
    rec(f"{tag} cholesky(G)", timeit(lambda: cp.linalg.cholesky(g)))
    r = cp.linalg.cholesky(g).T.copy()
    rec(f"{tag} A v", timeit(lambda: a @ v))
    rec(f"{tag} A^T w", timeit(lambda: a.T @ w))
    rec(f"{tag} trsv R", timeit(lambda: get_backend(cp).solve_triangular(r, v)))
    rec(f"{tag} host svdvals(R) incl copy", host_ms(
        lambda: np.linalg.svd(r.get(), compute_uv=False)))
    rec(f"{tag} host eigvalsh(G) incl copy", host_ms(
        lambda: np.linalg.eigvalsh(g.get())))
    rec(f"{tag} host scipy eigvalsh evd", host_ms(
        lambda: sl.eigvalsh(g.get(), driver="evd")))
    rec(f"{tag} gpu eigvalsh(G)", timeit(lambda: cp.linalg.eigvalsh(g), 3))
    if n <= 2048:
        rec(f"{tag} gpu svdvals(R)", timeit(lambda: cp.linalg.svd(r, compute_uv=False), 2))
    s_ref = np.linalg.svd(r.get(), compute_uv=False)
    s_eig = np.sqrt(np.maximum(np.linalg.eigvalsh(g.get())[::-1], 0))
    rec(f"{tag} |s_eig - s_svd|/s0", 0.0, err=float(np.max(np.abs(s_eig - s_ref)) / s_ref[0]))
    # does the host SVD overlap GPU work issued from the main thread?
    rh = r.get()

    def gpu_work():
        for _ in range(5):
            y = a @ v
            z = a.T @ w
        float(cp.linalg.norm(y) + cp.linalg.norm(z))

    t_gpu = host_ms(gpu_work)
    t_svd = host_ms(lambda: np.linalg.svd(rh, compute_uv=False))

    def both():
        th = threading.Thread(target=lambda: np.linalg.svd(rh, compute_uv=False))
        th.start()
        gpu_work()
        th.join()
    rec(f"{tag} overlap host svd + gpu", host_ms(both), gpu=t_gpu, svd=t_svd)
    rec(f"{tag} qr r auto", timeit(lambda: mpqr.qr(a, mode="r"), 3))
    for drv in ("gelsd", "gelsy"):
        rec(f"{tag} lstsq auto {drv}",
            timeit(lambda drv=drv: mpqr.lstsq(a, b, lapack_driver=drv), 3))
    with mpqr.explain() as tr:
        mpqr.lstsq(a, b)
    print([e.message[:120] for e in tr.events])


@section("lstsq5")
def _lstsq5():
    for m, n in [(2**20, 256), (2**22, 64), (65536, 2048)]:
        _lstsq5_one(m, n)
        cp.get_default_memory_pool().free_all_blocks()


@section("gram5")
def _gram5():
    from mpqr.qr.gram_blocked import gram
    bx = get_backend(cp)
    for m, n in [(2**20, 256), (65536, 2048), (2**20, 512), (65536, 4096)]:
        a = cp.random.standard_normal((m, n))
        for blk in (None, 64, 128, 256, 512):
            if blk is not None and n < 2 * blk:
                continue
            bx.gram_block = blk
            rec(f"{m}x{n} gram block {blk}", timeit(lambda a=a: gram(bx, a, "fp64", "g")))
            for mode in ("r", "reduced"):
                rec(f"{m}x{n} qr {mode} block {blk}",
                    timeit(lambda a=a, mode=mode: mpqr.qr(a, mode=mode), 3))
        bx.gram_block = type(bx).gram_block
        a = None
        cp.get_default_memory_pool().free_all_blocks()


def _lstsq6_one(m, n):
    import importlib
    api = importlib.import_module("mpqr.lstsq.api")
    a = cp.random.standard_normal((m, n))
    b = cp.random.standard_normal(m)
    for drv in ("gelsd", "gelsy"):
        rec(f"{m}x{n} lstsq auto {drv}",
            timeit(lambda drv=drv: mpqr.lstsq(a, b, lapack_driver=drv), 3))
        with mpqr.explain() as tr:
            mpqr.lstsq(a, b, lapack_driver=drv)
        print([e.message[:120] for e in tr.events])
        tot, prof = _phases(api._Solver, ["_gram_route", "_svdvals", "_factor"],
                            lambda drv=drv: mpqr.lstsq(a, b, lapack_driver=drv))
        rec(f"{m}x{n} lstsq {drv} phases", tot, **prof)


@section("lstsq6")
def _lstsq6():
    for m, n in [(2**20, 256), (2**22, 64), (65536, 2048)]:
        _lstsq6_one(m, n)
        cp.get_default_memory_pool().free_all_blocks()


@section("cholqr5")
def _cholqr5():
    import importlib
    mod = importlib.import_module("mpqr.qr.cholqr")
    names = ["_gram_small", "_chol_or_breakdown", "_apply_inverse", "_rr", "gram"]
    for m, n in [(2**20, 256), (2**22, 64), (2**24, 32)]:
        a = cp.random.standard_normal((m, n))
        for mode in ("reduced", "r"):
            rec(f"{m}x{n} qr {mode}", timeit(lambda a=a, mode=mode: mpqr.qr(a, mode=mode), 3))
            mpqr.qr(a, mode=mode)
            tot, prof = _phases(mod, names, lambda a=a, mode=mode: mpqr.qr(a, mode=mode))
            rec(f"{m}x{n} qr {mode} phases", tot, **prof)
        a = None
        cp.get_default_memory_pool().free_all_blocks()


@section("tri5")
def _tri5():
    bx = get_backend(cp)
    for m, n in [(2**20, 256), (65536, 2048), (2**20, 512), (65536, 4096)]:
        a = cp.random.standard_normal((m, n))
        for tri, blk in ((None, 256), (256, 256), (256, 128), (128, 256)):
            bx.triangular_apply_min_n, bx.gram_block = tri, blk
            for mode in ("reduced", "r"):
                rec(f"{m}x{n} qr {mode} tri {tri} gram {blk}",
                    timeit(lambda a=a, mode=mode: mpqr.qr(a, mode=mode), 5))
        bx.triangular_apply_min_n = type(bx).triangular_apply_min_n
        bx.gram_block = type(bx).gram_block
        a = None
        cp.get_default_memory_pool().free_all_blocks()


@section("pool5")
def _pool5():
    # the QR bench with and without releasing the memory pool before each configuration
    import importlib
    bq = importlib.import_module("mpqr.tools.bench_qr")
    for keep in (False, True):
        if keep:
            bq.release_pool = lambda xp: None
        out = bq.run([(2**20, 256, 1)], ["fp32", "fp64-emulated", "fp64"], ["reduced"],
                     xp=cp, repeat=5, max_seconds=3)
        for r in out["results"]:
            rec(f"pool {'kept' if keep else 'released'} {r['precision']}", r["time_ms"])


write()
