"""Session-6 probe: can cuBLASLt's other int8 algorithms beat cublasGemmStridedBatchedEx?

python3 bench/probe_s6.py OUT.json [lt]

Section ``lt``: the Ozaki engine's int8 products ("TN", both operands k-major, int32
out) through cublasLtMatmul, timing every algorithm the heuristic offers, against
the backend's strided-batched gemmEx on the same operands.
"""
import ctypes

import cupy as cp
from _probe import rec, section, sections, timeit, write
from mpqr.backends import get_backend

sections(["lt", "ozlt", "sq", "panel", "small", "blasab"])
be = get_backend(cp)

_CUDA_R_8I, _CUDA_R_32I, _COMPUTE_32I = 3, 10, 72
_OP_N, _OP_T = 0, 1


def _lib():
    for name in ("libcublasLt.so.13", "libcublasLt.so"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            pass
    for line in open("/proc/self/maps"):
        if "libcublasLt" in line:
            return ctypes.CDLL(line.split()[-1])
    raise OSError("libcublasLt not found")


class _Heur(ctypes.Structure):
    _fields_ = [("algo", ctypes.c_uint64 * 8), ("ws", ctypes.c_size_t), ("state", ctypes.c_int),
                ("waves", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


def _ok(st, what):
    if st != 0:
        raise RuntimeError(f"{what}: cublas status {st}")


class LtInt8:
    """C(m x n, int32, row-major) = A(m x k) @ B(k x n) from ar (N, m, k) and brt (N, n, k)."""

    def __init__(self, planes, m, n, k, ws_bytes=64 << 20):
        L = self.L = _lib()
        self.h = ctypes.c_void_p()
        _ok(L.cublasLtCreate(ctypes.byref(self.h)), "create")
        self.desc = ctypes.c_void_p()
        _ok(L.cublasLtMatmulDescCreate(ctypes.byref(self.desc), _COMPUTE_32I, _CUDA_R_32I), "desc")
        for attr, val in ((3, _OP_T), (4, _OP_N)):
            v = ctypes.c_int32(val)
            _ok(L.cublasLtMatmulDescSetAttribute(self.desc, attr, ctypes.byref(v), 4), "trans")
        # column-major view: C^T (n x m) = (brt as k x n)^T (k x m)
        self.la = self._layout(_CUDA_R_8I, k, n, k, planes, n * k)
        self.lb = self._layout(_CUDA_R_8I, k, m, k, planes, m * k)
        self.lc = self._layout(_CUDA_R_32I, n, m, n, planes, m * n)
        self.pref = ctypes.c_void_p()
        _ok(L.cublasLtMatmulPreferenceCreate(ctypes.byref(self.pref)), "pref")
        w = ctypes.c_uint64(ws_bytes)
        _ok(L.cublasLtMatmulPreferenceSetAttribute(self.pref, 1, ctypes.byref(w), 8), "pref ws")
        self.ws = cp.empty(ws_bytes, dtype=cp.uint8)
        self.ws_bytes = ws_bytes
        res = (_Heur * 32)()
        cnt = ctypes.c_int(0)
        _ok(L.cublasLtMatmulAlgoGetHeuristic(self.h, self.desc, self.la, self.lb, self.lc,
                                             self.lc, self.pref, 32, res, ctypes.byref(cnt)),
            "heuristic")
        self.algos = [res[i] for i in range(cnt.value) if res[i].state == 0]

    def _layout(self, dtype, rows, cols, ld, batch, stride):
        lay = ctypes.c_void_p()
        _ok(self.L.cublasLtMatrixLayoutCreate(ctypes.byref(lay), dtype, ctypes.c_uint64(rows),
                                              ctypes.c_uint64(cols), ctypes.c_int64(ld)), "layout")
        b = ctypes.c_int32(batch)
        s = ctypes.c_int64(stride)
        _ok(self.L.cublasLtMatrixLayoutSetAttribute(lay, 5, ctypes.byref(b), 4), "batch")
        _ok(self.L.cublasLtMatrixLayoutSetAttribute(lay, 6, ctypes.byref(s), 8), "stride")
        return lay

    def run(self, i, ar, brt, out):
        one, zero = ctypes.c_int32(1), ctypes.c_int32(0)
        h = self.algos[i]
        _ok(self.L.cublasLtMatmul(
            self.h, self.desc, ctypes.byref(one), ctypes.c_void_p(brt.data.ptr), self.la,
            ctypes.c_void_p(ar.data.ptr), self.lb, ctypes.byref(zero),
            ctypes.c_void_p(out.data.ptr), self.lc, ctypes.c_void_p(out.data.ptr), self.lc,
            ctypes.byref(h.algo), ctypes.c_void_p(self.ws.data.ptr), ctypes.c_size_t(self.ws_bytes),
            ctypes.c_void_p(cp.cuda.get_current_stream().ptr)), "matmul")


def _lt_case(n, planes):
    ar = cp.random.randint(-128, 128, (planes, n, n), dtype=cp.int8)
    br = cp.random.randint(-128, 128, (planes, n, n), dtype=cp.int8)
    ops = 2.0 * planes * n**3
    ref = be.ozaki_int8_gemms(ar, br, 0, n)
    t = timeit(lambda: be.ozaki_int8_gemms(ar, br, 0, n), rep=3)
    rec(f"gemmEx strided-batched {planes}x{n}^3", t, tops=ops / t / 1e9)
    lt = LtInt8(planes, n, n, n)
    out = cp.empty_like(ref)
    print(f"  heuristic offered {len(lt.algos)} algorithms", flush=True)
    for i, h in enumerate(lt.algos[:16]):
        try:
            lt.run(i, ar, br, out)
            same = bool(cp.array_equal(out, ref))
            t = timeit(lambda i=i: lt.run(i, ar, br, out), rep=3)
            rec(f"lt {planes}x{n}^3 algo#{i}", t, tops=ops / t / 1e9, ws=int(h.ws),
                waves=float(h.waves), ids=",".join(str(int(x)) for x in h.algo[:3]),
                exact=same)
        except Exception as exc:
            print(f"lt algo {i}: {type(exc).__name__} {exc}"[:200], flush=True)


@section("lt")
def _lt():
    for n, planes in ((16384, 15), (8192, 15), (16384, 1)):
        _lt_case(n, planes)
        cp.get_default_memory_pool().free_all_blocks()


def _oz_case(n):
    from mpqr.backends import cupy_int8_lt

    import mpqr

    rng = cp.random.default_rng(0)
    a = rng.standard_normal((n, n))
    b = rng.standard_normal((n, n))
    ops = 2.0 * n**3
    td = timeit(lambda: a @ b, rep=3)
    rec(f"dgemm {n}^3", td, tflops=ops / td / 1e9)
    force = {"engine": "ozaki-int8"}
    outs = {}
    for enabled in (False, True):
        cupy_int8_lt.ENABLED = enabled
        outs[enabled] = mpqr.matmul(a, b, precision="fp64-emulated", options=force)
        t = timeit(lambda: mpqr.matmul(a, b, precision="fp64-emulated", options=force), rep=3)
        rec(f"ozaki {n}^3 {'cublasLt' if enabled else 'gemmEx'}", t, vs_dgemm=td / t)
    rec(f"ozaki {n}^3 bitwise equal", 0.0, equal=bool(cp.array_equal(outs[False], outs[True])))
    t = timeit(lambda: mpqr.matmul(a, b, precision="fp64-emulated"), rep=3)
    rec(f"fp64-emulated {n}^3 (cost model, untuned rates)", t, vs_dgemm=td / t)


@section("ozlt")
def _ozlt():
    for n in (16384, 8192):
        _oz_case(n)
        cp.get_default_memory_pool().free_all_blocks()


@section("sq")
def _sq():
    import time

    import mpqr

    mpqr.tune(cp, save=True)
    n = 16384
    a = cp.random.default_rng(1).standard_normal((n, n))
    t = timeit(lambda: cp.linalg.qr(a), rep=2)
    rec(f"cusolver qr {n}^2", t)
    for prec in ("fp64-emulated", "fp64"):
        t = timeit(lambda prec=prec: mpqr.qr(a, precision=prec), rep=2)
        rec(f"mpqr qr {n}^2 {prec}", t)
        with mpqr.explain() as tr:
            mpqr.qr(a, precision=prec)
        by = {}
        for g in tr.gemms:
            key = (g.engine, g.label)
            c, f, ps = by.get(key, (0, 0.0, 0.0))
            m_, n_, k_ = g.shape
            by[key] = (c + 1, f + 2.0 * m_ * n_ * k_ * g.batch,
                       ps + g.predicted_s.get(g.engine, 0.0))
        for (eng, lab), (c, f, ps) in sorted(by.items(), key=lambda kv: -kv[1][1]):
            print(f"  {prec:14s} {eng:12s} {lab:22s} {c:5d} gemms {f / 1e12:8.3f} TFLOP "
                  f"predicted {ps * 1e3:8.1f} ms", flush=True)
    # the leaf panels alone, synchronised
    from mpqr.qr import householder_recursive as hr

    orig = hr.householder_panel
    acc = [0.0, 0]

    def timed(*x, **kw):
        cp.cuda.Device().synchronize()
        t0 = time.perf_counter()
        out = orig(*x, **kw)
        cp.cuda.Device().synchronize()
        acc[0] += time.perf_counter() - t0
        acc[1] += 1
        return out
    hr.householder_panel = timed
    try:
        t0 = time.perf_counter()
        mpqr.qr(a, precision="fp64-emulated")
        cp.cuda.Device().synchronize()
        total = (time.perf_counter() - t0) * 1e3
    finally:
        hr.householder_panel = orig
    rec(f"mpqr qr {n}^2 fp64-emulated panels (synced)", acc[0] * 1e3, panels=acc[1],
        total_synced_ms=total)


@section("panel")
def _panel():
    import mpqr
    from mpqr._array_api import array_namespace
    from mpqr.qr import _kernels as K
    from mpqr.qr.cholqr import cholqr2

    bx = get_backend(array_namespace(cp.zeros(1)))
    for m in (16384, 8192, 2048, 512):
        a = cp.random.default_rng(m).standard_normal((m, 128))
        t1 = timeit(lambda a=a: K.householder_panel(bx, a, precision="fp64"), rep=5)
        rec(f"panel geqrf {m}x128", t1)

        def alt(a=a):
            q, r = cholqr2(bx, a, precision="fp64", prec_name="fp64")
            return K.householder_from_q(bx, q, precision="fp64"), r
        t2 = timeit(alt, rep=5)
        with mpqr.explain() as tr:
            (w, y, sgn), r = alt()
        rec(f"panel cholqr2+from_q {m}x128", t2, speedup=t1 / t2, events=len(tr.events))
        tq = timeit(lambda a=a: cholqr2(bx, a, precision="fp64", prec_name="fp64"), rep=5)
        rec(f"panel cholqr2 alone {m}x128", tq)
        rr = cp.expand_dims(sgn, -1) * r
        h = cp.eye(m) - w @ y.T
        err = float(cp.linalg.norm(a - h[:, :128] @ rr) / cp.linalg.norm(a))
        orth = float(cp.linalg.norm(h.T @ h - cp.eye(m)) / m)
        rec(f"panel cholqr2+from_q {m}x128 errors", 0.0, backward=err, orth=orth)


@section("small")
def _small():
    import cProfile
    import io
    import pstats

    import mpqr

    for m, n in ((2048, 128), (2048, 64), (2048, 256), (16384, 128)):
        a = cp.random.default_rng(m + n).standard_normal((m, n))
        t = timeit(lambda a=a: mpqr.qr(a), rep=5)
        tc = timeit(lambda a=a: cp.linalg.qr(a), rep=5)
        with mpqr.explain() as tr:
            mpqr.qr(a)
        meth = [e.message[:80] for e in tr.events if e.kind in ("method", "qr-method")]
        rec(f"qr auto {m}x{n}", t, cusolver_ms=tc, speedup=tc / t, method=str(meth[:1]))
    a = cp.random.default_rng(0).standard_normal((2048, 128))
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(5):
        mpqr.qr(a)
    cp.cuda.Device().synchronize()
    pr.disable()
    buf = io.StringIO()
    pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(14)
    print("\n".join(ln[:150] for ln in buf.getvalue().splitlines() if ln.strip())[-3500:])


@section("blasab")
def _blasab():
    import contextlib

    from mpqr.backends.cupy_backend import CupyBackend

    import mpqr

    scoped = CupyBackend.host_blas_scope
    cases = [((16384, 16384), "fp16"), ((2**20, 256), "fp64"), ((2**20, 256), "fp32-emulated"),
             ((16384, 16384), "fp64-emulated"), ((2048, 128), "auto"), ((2048, 256), "auto")]
    for shape, prec in cases:
        a = cp.random.default_rng(7).standard_normal(shape)
        if prec in ("fp16", "fp32-emulated"):
            a = a.astype(cp.float32)
        res_ = {}
        for order in ("on", "off", "on", "off"):
            CupyBackend.host_blas_scope = scoped if order == "on" else (
                lambda self: contextlib.nullcontext())
            cp.get_default_memory_pool().free_all_blocks()
            t = timeit(lambda a=a, prec=prec: mpqr.qr(a, precision=prec), rep=3)
            res_.setdefault(order, []).append(t)
        CupyBackend.host_blas_scope = scoped
        rec(f"qr {shape[0]}x{shape[1]} {prec} blas1", min(res_["on"]), runs=str(res_["on"]))
        rec(f"qr {shape[0]}x{shape[1]} {prec} blas-default", min(res_["off"]),
            runs=str(res_["off"]))


write()
