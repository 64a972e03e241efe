"""Session-7 probe: where lstsq's 65536x2048 time goes, whether the eigenvalues for
``s`` overlap the rest on a side stream, and mpqr's per-call overhead on small QR.

python3 bench/probe_s7.py OUT.json [lsq,ovl,small]
"""
import cProfile
import io
import pstats
import threading
import time

import cupy as cp
import cupyx.scipy.linalg as cxl
from _probe import rec, section, sections, timeit, write
from mpqr.backends import get_backend

import mpqr
from mpqr._array_api import array_namespace
from mpqr.lstsq.gram import certified_cholesky, norm2_estimate
from mpqr.policy import gemm
from mpqr.qr.gram_blocked import gram

sections(["lsq", "ovl", "small", "scale", "gemv", "phases", "eig"])
be = get_backend(array_namespace(cp.zeros(1)))


def _problem(m, n, seed=0):
    rs = cp.random.default_rng(seed)
    return rs.standard_normal((m, n)), rs.standard_normal((m, 1))


def _trace_summary(f):
    with mpqr.explain() as tr:
        f()
    ev = [str(e)[:150] for e in tr.events]
    return ev, tr.engines()


def _wall(f, reps=20):
    """Host wall milliseconds per call (after a warm-up), the GPU drained at both ends."""
    f()
    cp.cuda.Device().synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        f()
    cp.cuda.Device().synchronize()
    return (time.perf_counter() - t0) / reps * 1e3


def _profile(f, reps, keys, lines):
    """Print cProfile's top ``lines`` of ``reps`` calls, sorted by each of ``keys``."""
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(reps):
        f()
    cp.cuda.Device().synchronize()
    pr.disable()
    for key in keys:
        buf = io.StringIO()
        pstats.Stats(pr, stream=buf).sort_stats(key).print_stats(lines)
        print(buf.getvalue()[-6000:])


def _eig_in_thread(g, ready, out):
    with cp.cuda.Device(g.device):
        st = cp.cuda.Stream(non_blocking=True)
        with st:
            st.wait_event(ready)
            out.append(cp.linalg.eigvalsh(g))
            st.synchronize()


@section("lsq")
def _lsq():
    m, n = 65536, 2048
    a, b = _problem(m, n)
    g = gram(be, a, "fp64", "probe")
    rec("lsq gram fp64 (blocked)", timeit(lambda: gram(be, a, "fp64", "probe")))
    rec("lsq gram fp64-emulated", timeit(lambda: gram(be, a, "fp64-emulated", "probe")))
    rec("lsq eigvalsh(G)", timeit(lambda: cp.linalg.eigvalsh(g)))
    try:
        import cupyx.cusolver as cxs
        lam = cp.linalg.eigvalsh(g)
        lj = cxs.syevj(g, with_eigen_vector=False)
        rec("lsq syevj(G) values", timeit(lambda: cxs.syevj(g, with_eigen_vector=False), rep=3),
            diff=float(cp.max(cp.abs(cp.sort(lj) - lam)) / lam[-1]))
    except Exception as exc:
        print("syevj:", exc)
    rec("lsq certified_cholesky(G)", timeit(lambda: certified_cholesky(be, g)))
    rec("lsq cupy cholesky(G)", timeit(lambda: cp.linalg.cholesky(g)))
    r = certified_cholesky(be, g)
    eye = cp.eye(n)
    rec("lsq R^-1 by solve_triangular(R, I)", timeit(lambda: cxl.solve_triangular(r, eye)))
    rinv = cxl.solve_triangular(r, eye)
    v = cp.random.default_rng(1).standard_normal((n, 1))
    rec("lsq trsv R^-1 v", timeit(lambda: cxl.solve_triangular(r, v)))
    rh = cp.ascontiguousarray(r.T)
    rec("lsq trsv R^-H v (lower copy)", timeit(lambda: cxl.solve_triangular(rh, v, lower=True)))
    rec("lsq gemv Rinv @ v", timeit(lambda: rinv @ v))
    rec("lsq gemv A @ p", timeit(lambda: a @ v))
    rec("lsq gemv A^T @ r", timeit(lambda: a.T @ b))
    rec("lsq column_norms(A^T r)", timeit(lambda: be.column_norms(a.T @ b)))
    rec("lsq norm2_estimate(R) (8 steps, syncs)",
        timeit(lambda: norm2_estimate(lambda x, y: gemm(x, y, precision="fp64", backend=be),
                                      be.xp, r)))
    for drv in (None, "gelsy"):
        t = timeit(lambda drv=drv: mpqr.lstsq(a, b, lapack_driver=drv), rep=5)
        ev, eng = _trace_summary(lambda drv=drv: mpqr.lstsq(a, b, lapack_driver=drv))
        rec(f"lsq mpqr.lstsq driver={drv}", t, events=" | ".join(ev), engines=str(eng))
        _profile(lambda drv=drv: mpqr.lstsq(a, b, lapack_driver=drv), 3, ("tottime",), 18)

    def route():
        q, rr = cp.linalg.qr(a)
        return cxl.solve_triangular(rr, q.T @ b)
    rec("lsq cuSOLVER QR route", timeit(route, rep=3))
    for drv in (None, "gelsy"):
        rec(f"lsq mpqr.lstsq driver={drv} (again)",
            timeit(lambda drv=drv: mpqr.lstsq(a, b, lapack_driver=drv), rep=5))


@section("scale")
def _scale():
    # does cuSOLVER's geqrf/orgqr survive columns whose squares over- or underflow?
    rs = cp.random.default_rng(7)
    base = rs.standard_normal((2048, 64))
    for name, e in (("2^1000", 1000), ("2^1020", 1020), ("2^-1000", -1000),
                    ("2^-1060 (subnormal)", -1060), ("mixed", None)):
        if e is None:
            ex = cp.asarray([1020 if j % 3 == 0 else (-1050 if j % 3 == 1 else 0)
                             for j in range(64)])
        else:
            ex = cp.full(64, e)
        a = cp.ldexp(base, ex[None, :])
        q, r = cp.linalg.qr(a)
        fin = bool(cp.all(cp.isfinite(q)) & cp.all(cp.isfinite(r)))
        # backward error column by column, relative to each column (exact unscaling)
        res = cp.ldexp(a - q @ r, -ex[None, :])
        be_col = float(cp.max(cp.linalg.norm(res, axis=0)
                              / cp.linalg.norm(base, axis=0)))
        orth = float(cp.linalg.norm(q.T @ q - cp.eye(64)))
        rec(f"scale cupy qr {name}", 0.0, finite=fin, backward=be_col, orth=orth)
        mq, mr = mpqr.qr(a)
        res = cp.ldexp(a - mq @ mr, -ex[None, :])
        rec(f"scale mpqr qr {name}", 0.0,
            backward=float(cp.max(cp.linalg.norm(res, axis=0) / cp.linalg.norm(base, axis=0))),
            orth=float(cp.linalg.norm(mq.T @ mq - cp.eye(64))))


@section("ovl")
def _ovl():
    m, n = 65536, 2048
    a, b = _problem(m, n, 2)
    g = gram(be, a, "fp64", "probe")
    rec("ovl eigvalsh alone", timeit(lambda: cp.linalg.eigvalsh(g)))
    rec("ovl gelsy alone", timeit(lambda: mpqr.lstsq(a, b, lapack_driver="gelsy")))
    rec("ovl default alone", timeit(lambda: mpqr.lstsq(a, b)))

    def both():
        ready = cp.cuda.Event()
        ready.record()
        out = []
        th = threading.Thread(target=_eig_in_thread, args=(g, ready, out))
        th.start()
        mpqr.lstsq(a, b, lapack_driver="gelsy")
        th.join()
        return out
    rec("ovl gelsy + eigvalsh in a side-stream thread", timeit(both))
    h0 = time.perf_counter()
    for _ in range(3):
        both()
    cp.cuda.Device().synchronize()
    rec("ovl same, host wall per call", (time.perf_counter() - h0) / 3 * 1e3)
    # the eigenvalues computed on the side stream equal those on the main stream
    out = both()
    ref = cp.linalg.eigvalsh(g)
    rec("ovl side-stream eigvalsh max diff", 0.0, diff=float(cp.max(cp.abs(out[0] - ref))))


@section("small")
def _small():
    for m, n in ((2048, 64), (2048, 128), (16384, 128), (512, 512)):
        a, _ = _problem(m, n, 3)
        h = {}
        for name, f in (("mpqr", lambda a=a: mpqr.qr(a)), ("cupy", lambda a=a: cp.linalg.qr(a))):
            h[name] = _wall(f)
        ev, _ = _trace_summary(lambda a=a: mpqr.qr(a))
        rec(f"small qr {m}x{n} host wall mpqr", h["mpqr"], cupy=h["cupy"], events=" | ".join(ev))
    a, _ = _problem(2048, 128, 4)
    _profile(lambda: mpqr.qr(a), 50, ("tottime", "cumtime"), 30)
    a = cp.random.default_rng(5).standard_normal((2048, 128))
    b = cp.random.default_rng(6).standard_normal((2048, 1))
    for name, f in (("mpqr.lstsq", lambda: mpqr.lstsq(a, b)),
                    ("mpqr.lstsq gelsy", lambda: mpqr.lstsq(a, b, lapack_driver="gelsy")),
                    ("cupy.linalg.lstsq", lambda: cp.linalg.lstsq(a, b, rcond=None))):
        rec(f"small {name} 2048x128 host wall", _wall(f))


@section("gemv")
def _gemv():
    rs = cp.random.default_rng(8)
    for m, n in ((2048, 2048), (65536, 2048), (1048576, 256)):
        a = rs.standard_normal((m, n))
        v, w = rs.standard_normal((n, 1)), rs.standard_normal((m, 1))
        at = be.xp.linalg.matrix_transpose(a)
        rec(f"gemv {m}x{n} policy A v", timeit(lambda a=a, v=v: gemm(a, v, precision="fp64",
                                                                      backend=be)))
        rec(f"gemv {m}x{n} cupy A v", timeit(lambda a=a, v=v: a @ v))
        rec(f"gemv {m}x{n} policy A^T w", timeit(lambda at=at, w=w: gemm(at, w, precision="fp64",
                                                                          backend=be)))
        rec(f"gemv {m}x{n} cupy A^T w", timeit(lambda a=a, w=w: a.T @ w))
        rec(f"gemv {m}x{n} backend.gemm A v", timeit(lambda a=a, v=v: be.gemm(a, v)))
        rec(f"gemv {m}x{n} backend.gemm A^T w", timeit(lambda at=at, w=w: be.gemm(at, w)))


@section("phases")
def _phases():
    import importlib
    from collections import defaultdict
    api = importlib.import_module("mpqr.lstsq.api")
    gm = importlib.import_module("mpqr.lstsq.gram")
    acc = defaultdict(float)

    def timed(mod, name):
        orig = getattr(mod, name)

        def w(*args, **kw):
            cp.cuda.Device().synchronize()
            t0 = time.perf_counter()
            out = orig(*args, **kw)
            cp.cuda.Device().synchronize()
            acc[f"{mod.__name__.split('.')[-1]}.{name}"] += time.perf_counter() - t0
            return out
        setattr(mod, name, w)
    for mod, name in ((gm, "gram"), (gm, "certified_cholesky"), (gm, "norm2_estimate"),
                      (gm, "cholesky_flagged"), (gm, "inverse_certificate"),
                      (api, "cgls"), (api, "gram_factor")):
        timed(mod, name)
    for m, n in ((65536, 2048), (1048576, 256)):
        a, b = _problem(m, n, 9)
        for drv in (None, "gelsy"):
            mpqr.lstsq(a, b, lapack_driver=drv)
            acc.clear()
            cp.cuda.Device().synchronize()
            t0 = time.perf_counter()
            for _ in range(5):
                mpqr.lstsq(a, b, lapack_driver=drv)
            cp.cuda.Device().synchronize()
            tot = (time.perf_counter() - t0) / 5 * 1e3
            rec(f"phases {m}x{n} driver={drv} total (synced phases)", tot,
                **{k: v / 5 * 1e3 for k, v in acc.items()})


@section("eig")
def _eig():
    """What the singular values of a 2048^2 R could cost: cuSOLVER's eigen/SVD routines."""
    rs = cp.random.default_rng(3)
    for n in (2048, 1024):
        r = cp.triu(rs.standard_normal((n, n)))
        g = r.T @ r
        for dt in (cp.float64, cp.float32):
            gd, rd = g.astype(dt), r.astype(dt)
            nm = cp.dtype(dt).name
            rec(f"eig {n} {nm} eigvalsh(G)", timeit(lambda gd=gd: cp.linalg.eigvalsh(gd), 3))
            rec(f"eig {n} {nm} eigh(G)", timeit(lambda gd=gd: cp.linalg.eigh(gd), 3))
            rec(f"eig {n} {nm} svd(R) values", timeit(
                lambda rd=rd: cp.linalg.svd(rd, compute_uv=False), 3))
        t0 = time.perf_counter()
        import numpy as np
        np.linalg.eigvalsh(g.get())
        rec(f"eig {n} host eigvalsh(G) incl copy", (time.perf_counter() - t0) * 1e3)


write()
