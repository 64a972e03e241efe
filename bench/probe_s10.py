"""Session-10 probe: leaf panels by certified CholQR2 + Householder reconstruction
against cuSOLVER's geqrf, and what that does to square QR.

The route (mpqr/qr/panel_cholqr.py, ``cholqr_panel_min_width``) was measured slower
and removed again: sections leaf, sq and sqmin need commit 8fa448d; lu runs on main.

python3 bench/probe_s10.py OUT.json [leaf,lu,sq,sqmin]
  leaf   householder_panel of m x k panels, both routes, same process
  lu     the signed LU of the reconstruction: device kernel + cuBLAS vs the host
  sq     16384^2 / 8192^2 QR at fp16, fp32-emulated, fp64-emulated, route on and off
  sqmin  16384^2 fp16 with the route from 128, 256 or 512 columns
"""
import cupy as cp
import numpy as np
from _probe import rec, section, sections, timeit, write
from mpqr.backends import get_backend

import mpqr
from mpqr._array_api import array_namespace
from mpqr.qr import _kernels as qk

sections(["leaf", "lu", "sq"])
be = get_backend(array_namespace(cp.zeros(1)))
CLS = type(be)


class _width:
    def __init__(self, w):
        self.w = w

    def __enter__(self):
        self.saved = CLS.cholqr_panel_min_width
        CLS.cholqr_panel_min_width = self.w

    def __exit__(self, *exc):
        CLS.cholqr_panel_min_width = self.saved


@section("leaf")
def _leaf():
    rng = cp.random.default_rng(2)
    for dt, prec in ((cp.float32, "fp32"), (cp.float64, "fp64")):
        for m, k in ((16384, 512), (8192, 512), (4096, 512), (2048, 512), (65536, 256),
                     (16384, 256), (16384, 128)):
            a = rng.standard_normal((m, k), dtype=dt)
            with _width(None):
                t0 = timeit(lambda a=a, prec=prec: qk.householder_panel(be, a, precision=prec),
                            rep=5)
            with _width(128):
                t1 = timeit(lambda a=a, prec=prec: qk.householder_panel(be, a, precision=prec),
                            rep=5)
            rec(f"leaf {m}x{k} {cp.dtype(dt).name} geqrf", t0, cholqr_ms=t1, speedup=t0 / t1)


@section("lu")
def _lu():
    from mpqr.backends import cupy_lu

    hb = get_backend(array_namespace(np.zeros(1)))
    for n in (64, 128, 256, 512):
        q = cp.linalg.qr(cp.random.default_rng(n).standard_normal((4 * n, n)))[0][:n]
        q = cp.ascontiguousarray(q)
        td = timeit(lambda q=q: cupy_lu.lu_signed(q), rep=5)
        th = timeit(lambda q=q: [cp.asarray(v) for v in hb.lu_signed(q.get())], rep=3)
        rec(f"lu_signed {n} float64 device", td, host_ms=th)


def _sq(n, widths, precs=("fp16", "fp32-emulated", "fp64-emulated")):
    a32 = cp.random.default_rng(1).standard_normal((n, n), dtype=cp.float32)
    a64 = cp.random.default_rng(1).standard_normal((n, n))
    rec(f"cusolver qr {n}^2 float32", timeit(lambda: cp.linalg.qr(a32), rep=2))
    for prec in precs:
        a = a64 if prec == "fp64-emulated" else a32
        for w in widths:
            with _width(w):
                with mpqr.explain() as tr:
                    mpqr.qr(a, precision=prec, method="householder-recursive")
                fb = sum(e.kind == "panel-fallback" for e in tr.events)
                t = timeit(lambda a=a, prec=prec: mpqr.qr(a, precision=prec,
                                                          method="householder-recursive"),
                           rep=2)
            rec(f"qr {n}^2 {prec} cholqr-from={w}", t, fallbacks=fb)
    cp.get_default_memory_pool().free_all_blocks()


@section("sq")
def _sqs():
    _sq(16384, (None, 128))
    _sq(8192, (None, 128))


@section("sqmin")
def _sqmin():
    _sq(16384, (256, 512), precs=("fp16",))


write()
