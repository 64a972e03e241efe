"""Session-13 probe: leaf panels in 32-column sub-panels (TSQR kernels + one
reconstruction kernel each, ``mpqr.qr.panel_blocked``) against cuSOLVER's geqrf leaves.

python3 bench/probe_s13.py OUT.json [panel,parts,sq,sqph]
  panel  one leaf, m x k at fp32/fp64, the backend's geqrf panel against the blocked
         panel (same process, alternately), with the blocked panel's residual
         ||A - (I - Y T Y^T)[:, :k] R||_F / ||A||_F (float64 on the GPU)
  parts  one 32-column sub-panel: TSQR alone, the reconstruction kernel alone, the whole
         reconstruct_panel, and the two update products of a 512-wide leaf
  sq     whole QR, blocked leaves against geqrf leaves alternately in one process:
         16384^2 fp16 / fp32-emulated / fp64-emulated, 8192^2 fp16, 65536 x 4096 fp16,
         against cupy.linalg.qr
  sqph   16384^2 fp16 with blocked leaves: host time per phase (cProfile, top lines)
  tall   the leaves at 2^15 rows and more: TSQR with and without its recompute pass,
         single leaves, and whole QR of 65536 x 4096 (fp16, fp32-emulated,
         fp64-emulated) and 32768 x 8192 fp16 with the shipped row cut, a lower cut
         (2^14) and geqrf leaves only, alternately in one process
  upd    the sub-panel update's product W^T B (32 x w, inner dimension m) through the
         policy, whole against summed over row chunks of 16384, and B -= Y Z
  ab2    the blocked leaf with its update accumulated in place (gemm_sub, cuBLAS beta = 1)
         against the product-then-subtract form and geqrf, single leaves at 8192 ... 65536
         rows; whole QR 16384^2 fp16 with a 2^14 row cut and 65536 x 8192 fp16, blocked
         against geqrf leaves, alternately in one process
  cost   host against GPU time (cupyx.profiler.benchmark) of TSQR, the reconstruction
         kernel, reconstruct_panel and a blocked 16384 x 512 leaf, and a cProfile of
         that leaf: what bounds a sub-panel
"""
import contextlib

import cupy as cp
from _probe import rec, section, sections, timeit, write
from mpqr.backends import cupy_lu, cupy_tsqr, get_backend

import mpqr
from mpqr._array_api import array_namespace
from mpqr.qr.panel_blocked import blocked_householder_panel

sections(["panel", "parts", "sq"])
be = get_backend(array_namespace(cp.zeros(1)))
CLS = type(be)
BLOCK = CLS.panel_block


@contextlib.contextmanager
def _block(nb, min_rows=None):
    """Blocked leaves of ``nb`` columns (None: geqrf leaves) from ``min_rows`` rows, at
    float32 and float64 alike (the shipped setting blocks float64 leaves only)."""
    saved = CLS.panel_block, CLS.panel_block_min_rows, CLS.panel_block_dtypes
    CLS.panel_block = nb
    CLS.panel_block_dtypes = ("float32", "float64")
    if min_rows is not None:
        CLS.panel_block_min_rows = min_rows
    try:
        yield
    finally:
        CLS.panel_block, CLS.panel_block_min_rows, CLS.panel_block_dtypes = saved


def _residual(a, y, t, r):
    a64, y64, t64, r64 = (x.astype(cp.float64) for x in (a, y, t, r))
    k = a.shape[1]
    # (I - Y T Y^T)[:, :k] R = [R; 0] - Y (T (Y[:k]^T R))
    hr = -(y64 @ (t64 @ (y64[:k].T @ r64)))
    hr[:k] += r64
    return float(cp.linalg.norm(a64 - hr) / cp.linalg.norm(a64))


@section("panel")
def _panel():
    rng = cp.random.default_rng(3)
    for dt in (cp.float32, cp.float64):
        prec = "fp32" if dt == cp.float32 else "fp64"
        for m, k in ((16384, 512), (8192, 512), (2048, 512), (65536, 256), (16384, 128),
                     (4096, 64)):
            a = rng.standard_normal((m, k), dtype=dt)
            t_geqrf = timeit(lambda a=a: be.householder_panel(a), rep=5)
            t_blk = timeit(lambda a=a, prec=prec: blocked_householder_panel(
                be, a, block=BLOCK, precision=prec), rep=5)
            t_geqrf2 = timeit(lambda a=a: be.householder_panel(a), rep=5)
            y, t, r = blocked_householder_panel(be, a, block=BLOCK, precision=prec)
            rec(f"panel {m}x{k} {prec}", t_blk, geqrf_ms=min(t_geqrf, t_geqrf2),
                speedup=min(t_geqrf, t_geqrf2) / t_blk, resid=_residual(a, y, t, r))


@section("parts")
def _parts():
    rng = cp.random.default_rng(4)
    for dt in (cp.float32, cp.float64):
        for m in (16384, 4096):
            p = rng.standard_normal((m, 32), dtype=dt)
            rec(f"tsqr {m}x32 {dt.__name__}", timeit(lambda p=p: cupy_tsqr.tsqr(p), rep=20))
            q, r = cupy_tsqr.tsqr(p)
            rec(f"reconstruct kernel {m}x32 {dt.__name__}",
                timeit(lambda q=q, r=r: cupy_lu.reconstruct(q, r), rep=20))
            rec(f"reconstruct_panel {m}x32 {dt.__name__}",
                timeit(lambda p=p: be.reconstruct_panel(p), rep=20))
            rec(f"geqrf panel {m}x32 {dt.__name__}",
                timeit(lambda p=p: be.householder_panel(p), rep=20))
            wide = rng.standard_normal((m, 512), dtype=dt)
            y, w, _tau, _r = be.reconstruct_panel(wide[:, :32])
            b = wide[:, 32:]
            rec(f"update W^T B, B -= Y Z {m}x480 {dt.__name__}",
                timeit(lambda w=w, y=y, b=b: b.__isub__(y @ (w.T @ b)), rep=20))


def _errors(a, q, r):
    a64, q64 = a.astype(cp.float64), q.astype(cp.float64)
    back = float(cp.linalg.norm(a64 - q64 @ r.astype(cp.float64)) / cp.linalg.norm(a64))
    orth = float(cp.linalg.norm(q64.T @ q64 - cp.eye(a.shape[1])) / a.shape[1])
    return back, orth


def _ab_qr(rng, cases, variants):
    """Whole recursive QR of each ``(m, n, precision)`` against cupy.linalg.qr, the
    ``(panel_block, panel_block_min_rows)`` variants alternately in two rounds, then the
    errors with blocked and with geqrf leaves."""
    base = {}
    for m, n, prec in cases:
        dt = cp.float64 if prec == "fp64-emulated" else cp.float32
        a = rng.standard_normal((m, n), dtype=dt)
        key = (m, n, dt)
        if key not in base:
            base[key] = timeit(lambda a=a: cp.linalg.qr(a), rep=2)
            rec(f"cusolver qr {m}x{n} {dt.__name__}", base[key])
        for rnd in range(2):
            for nb, mr in variants(m):
                with _block(nb, mr):
                    t = timeit(lambda a=a, prec=prec: mpqr.qr(
                        a, precision=prec, method="householder-recursive"), rep=2)
                rec(f"mpqr qr {m}x{n} {prec} block={nb} min_rows={mr} round {rnd}", t,
                    speedup=base[key] / t)
        for nb, mr in variants(m)[:2]:
            with _block(nb, mr), mpqr.explain() as tr:
                q, r = mpqr.qr(a, precision=prec, method="householder-recursive")
            back, orth = _errors(a, q, r)
            rec(f"errors {m}x{n} {prec} block={nb}", 0.0, backward=back, orth=orth,
                blocked_leaves=sum(e.kind == "panel" for e in tr.events))
            del q, r
        del a


@section("sq")
def _sq():
    # every leaf blocked (row cut 0), as in run 1, against geqrf leaves
    cases = [(16384, 16384, "fp16"), (16384, 16384, "fp32-emulated"),
             (16384, 16384, "fp64-emulated"), (8192, 8192, "fp16"), (65536, 4096, "fp16")]
    _ab_qr(cp.random.default_rng(5), cases, lambda m: [(BLOCK, 0), (None, 0)])


@section("sqph")
def _sqph():
    import cProfile
    import io
    import pstats

    a = cp.random.default_rng(6).standard_normal((16384, 16384), dtype=cp.float32)
    mpqr.qr(a, precision="fp16", method="householder-recursive")
    cp.cuda.Device().synchronize()
    prof = cProfile.Profile()
    prof.enable()
    mpqr.qr(a, precision="fp16", method="householder-recursive")
    cp.cuda.Device().synchronize()
    prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25)
    print(s.getvalue())


@section("tall")
def _tall():
    rng = cp.random.default_rng(8)
    for dt in (cp.float32, cp.float64):
        for m in (16384, 65536):
            p = rng.standard_normal((m, 32), dtype=dt)
            for rc in (True, False, True, False):
                rec(f"tsqr {m}x32 {dt.__name__} recompute={rc}",
                    timeit(lambda p=p, rc=rc: cupy_tsqr.tsqr(p, recompute=rc), rep=20))
    with _block(BLOCK, 0):
        for dt in (cp.float32, cp.float64):
            prec = "fp32" if dt == cp.float32 else "fp64"
            for m, k in ((32768, 256), (32768, 512), (65536, 512), (131072, 256)):
                a = rng.standard_normal((m, k), dtype=dt)
                t_geqrf = timeit(lambda a=a: be.householder_panel(a), rep=3)
                t_blk = timeit(lambda a=a, prec=prec: blocked_householder_panel(
                    be, a, block=BLOCK, precision=prec), rep=3)
                y, t, r = blocked_householder_panel(be, a, block=BLOCK, precision=prec)
                rec(f"panel {m}x{k} {prec}", t_blk, geqrf_ms=t_geqrf, speedup=t_geqrf / t_blk,
                    resid=_residual(a, y, t, r))
                del a, y, t, r
    cases = [(65536, 4096, "fp16"), (65536, 4096, "fp32-emulated"),
             (65536, 4096, "fp64-emulated"), (32768, 8192, "fp16")]
    shipped = CLS.panel_block_min_rows
    _ab_qr(rng, cases, lambda m: [(BLOCK, shipped), (None, shipped)]
           + ([(BLOCK, 2**14)] if m < 65536 else []))


@section("upd")
def _upd():
    from mpqr.policy import gemm

    rng = cp.random.default_rng(9)
    for dt in (cp.float32, cp.float64):
        prec = "fp32" if dt == cp.float32 else "fp64"
        for m in (16384, 65536, 131072):
            for w in (224, 480):
                big = rng.standard_normal((m, w + 32), dtype=dt)
                wj = rng.standard_normal((m, 32), dtype=dt)
                b = big[:, 32:]
                wh = wj.T

                def whole(wh=wh, b=b, prec=prec):
                    return gemm(wh, b, precision=prec, label="x", backend=be)

                def chunked(wh=wh, b=b, prec=prec, m=m):
                    z = None
                    for r0 in range(0, m, 16384):
                        zi = gemm(wh[:, r0:r0 + 16384], b[r0:r0 + 16384], precision=prec,
                                  label="x", backend=be)
                        z = zi if z is None else z + zi
                    return z

                z = whole()
                t_sub = timeit(lambda b=b, wj=wj, z=z, prec=prec: b.__isub__(
                    gemm(wj, z, precision=prec, label="x", backend=be)), rep=10)
                rec(f"upd W^T B {m}x{w} {prec}", timeit(whole, rep=10),
                    chunked_ms=timeit(chunked, rep=10), sub_ms=t_sub)
                del big, wj, b, wh


@contextlib.contextmanager
def _no_in_place():
    saved = CLS.gemm_sub_into
    CLS.gemm_sub_into = lambda self, c, a, b: False
    try:
        yield
    finally:
        CLS.gemm_sub_into = saved


@section("ab2")
def _ab2():
    rng = cp.random.default_rng(10)
    for dt in (cp.float32, cp.float64):
        prec = "fp32" if dt == cp.float32 else "fp64"
        for m, k in ((8192, 512), (16384, 512), (32768, 512), (65536, 512), (65536, 256)):
            a = rng.standard_normal((m, k), dtype=dt)
            for rnd in range(2):
                t_geqrf = timeit(lambda a=a: be.householder_panel(a), rep=3)
                t_new = timeit(lambda a=a, prec=prec: blocked_householder_panel(
                    be, a, block=BLOCK, precision=prec), rep=3)
                with _no_in_place():
                    t_old = timeit(lambda a=a, prec=prec: blocked_householder_panel(
                        be, a, block=BLOCK, precision=prec), rep=3)
                rec(f"ab2 panel {m}x{k} {prec} round {rnd}", t_new, subtract_ms=t_old,
                    geqrf_ms=t_geqrf, speedup=t_geqrf / t_new)
            y, t, r = blocked_householder_panel(be, a, block=BLOCK, precision=prec)
            rec(f"ab2 residual {m}x{k} {prec}", 0.0, resid=_residual(a, y, t, r))
            del a, y, t, r
    for m, n, cuts in ((16384, 16384, (2**14, None)), (65536, 8192, (2**15, None))):
        a = rng.standard_normal((m, n), dtype=cp.float32)
        base = timeit(lambda a=a: cp.linalg.qr(a), rep=2)
        rec(f"cusolver qr {m}x{n} float32", base)
        for rnd in range(2):
            for cut in cuts:
                with _block(BLOCK if cut else None, cut):
                    t = timeit(lambda a=a: mpqr.qr(a, precision="fp16",
                                                   method="householder-recursive"), rep=2)
                rec(f"ab2 qr {m}x{n} fp16 min_rows={cut} round {rnd}", t, speedup=base / t)
        with _block(BLOCK, cuts[0]):
            q, r = mpqr.qr(a, precision="fp16", method="householder-recursive")
        back, orth = _errors(a, q, r)
        rec(f"ab2 errors {m}x{n} fp16 min_rows={cuts[0]}", 0.0, backward=back, orth=orth)
        del a, q, r


@section("cost")
def _cost():
    import cProfile
    import io
    import pstats

    from cupyx.profiler import benchmark

    def bench(name, f):
        r = benchmark(f, n_repeat=20, n_warmup=3)
        rec(name, float(r.gpu_times.mean() * 1e3), cpu_ms=float(r.cpu_times.mean() * 1e3))

    rng = cp.random.default_rng(7)
    for m in (16384, 4096):
        p = rng.standard_normal((m, 32), dtype=cp.float32)
        q, r = cupy_tsqr.tsqr(p)
        bench(f"cost tsqr {m}x32", lambda p=p: cupy_tsqr.tsqr(p))
        bench(f"cost reconstruct kernel {m}x32", lambda q=q, r=r: cupy_lu.reconstruct(q, r))
        bench(f"cost reconstruct_panel {m}x32", lambda p=p: be.reconstruct_panel(p))
        bench(f"cost geqrf panel {m}x32", lambda p=p: be.householder_panel(p))
    a = rng.standard_normal((16384, 512), dtype=cp.float32)
    bench("cost blocked 16384x512", lambda: blocked_householder_panel(
        be, a, block=BLOCK, precision="fp32"))
    bench("cost geqrf 16384x512", lambda: be.householder_panel(a))
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(5):
        blocked_householder_panel(be, a, block=BLOCK, precision="fp32")
    cp.cuda.Device().synchronize()
    prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(22)
    print(s.getvalue())


write()
