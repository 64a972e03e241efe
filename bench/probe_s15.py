"""Session-15 probe: CholQR's n x n steps on the device (one launch, checks read once)
against the host route they replace.

python3 bench/probe_s15.py OUT.json [steps,sqmeth,lane,split]
  split  CholQR's R^-1 applied by two GEMMs that skip its zeros (triangular_split_min_n =
         128, shipped) against one GEMM (None): whole mpqr.qr, fp64 at 2^20 x 256,
         2^21 x 128, 2^19 x 512 and 65536 x 4096, fp16 (CholQR2 in fp32) at 2^20 x 256,
         alternately in one process, three rounds; errors of each
  lane   16384^2 at fp16, fp32-emulated, fp64-emulated: householder-tiled with the
         look-ahead lane (shipped) against the same with SerialLane, and the recursion,
         with the panels' stream at high priority and at one priority, alternately in
         one process, two rounds; errors of the lane runs
  sqmeth  16384^2 at fp16, fp32-emulated and fp64-emulated: householder-recursive
         against householder-tiled (method forced; both at the same leaf width),
         alternately in one process, two rounds; errors; and the leaf time of each
         (backend.householder_panel synchronised and summed over one call)
  steps  whole mpqr.qr fp64 (mode reduced and r) at 2^22 x 64, 2^21 x 64, 2^24 x 32,
         2^20 x 64 and 2^20 x 256 (n = 256: no kernel, a control), with
         CupyBackend.chol_steps shipped and switched off, alternately in one process,
         three rounds; errors of each; the kernel alone at n = 32 and 64
"""
import cupy as cp
import numpy as np
from _probe import rec, section, sections, timeit, write
from mpqr.backends.cupy_backend import CupyBackend

import mpqr

sections(["steps"])


@section("steps")
def _steps():
    from cupyx.profiler import benchmark
    from mpqr.backends import cupy_chol_steps

    shipped = CupyBackend.chol_steps
    rng = cp.random.default_rng(15)
    for n in (32, 64):
        a = rng.standard_normal((4096, n))
        g = a.T @ a
        b = benchmark(lambda g=g: cupy_chol_steps.chol_steps(g), n_repeat=50, n_warmup=5)
        rec(f"steps kernel alone n={n}", timeit(lambda g=g: cupy_chol_steps.chol_steps(g), rep=20),
            gpu_ms=float(np.median(b.gpu_times)) * 1e3,
            cpu_ms=float(np.median(b.cpu_times)) * 1e3)
    try:
        for m, n in ((2**22, 64), (2**21, 64), (2**24, 32), (2**20, 64), (2**20, 256)):
            a = rng.standard_normal((m, n))
            for rnd in range(3):
                for name, f in (("device steps", shipped), ("host steps", lambda self, g: None)):
                    CupyBackend.chol_steps = f
                    t = timeit(lambda a=a: mpqr.qr(a, precision="fp64"), rep=7)
                    tr = timeit(lambda a=a: mpqr.qr(a, mode="r", precision="fp64"), rep=7)
                    rec(f"steps {m}x{n} round {rnd} {name}", t, mode_r=tr)
            for name, f in (("device steps", shipped), ("host steps", lambda self, g: None)):
                CupyBackend.chol_steps = f
                with mpqr.explain() as trace:
                    q, r = mpqr.qr(a, precision="fp64")
                bwd = float(cp.linalg.norm(a - q @ r) / cp.linalg.norm(a))
                orth = float(cp.linalg.norm(q.T @ q - cp.eye(n)))
                kinds = sorted({e.kind for e in trace.events})
                rec(f"steps {m}x{n} errors {name}", 0.0, backward=bwd, orth=orth,
                    events=",".join(kinds))
                del q, r
            del a
            cp.get_default_memory_pool().free_all_blocks()
    finally:
        CupyBackend.chol_steps = shipped


@section("sqmeth")
def _sqmeth():
    import time

    from mpqr.backends.cupy_backend import CupyBackend as CB

    a32 = cp.random.default_rng(5).standard_normal((16384, 16384), dtype=cp.float32)
    a64 = cp.random.default_rng(5).standard_normal((16384, 16384))
    cases = (("fp16", a32), ("fp32-emulated", a32), ("fp64-emulated", a64))
    meths = ("householder-recursive", "householder-tiled")
    for rnd in range(2):
        for prec, a in cases:
            for meth in meths:
                t = timeit(lambda a=a, p=prec, mt=meth: mpqr.qr(a, precision=p, method=mt),
                           rep=3)
                rec(f"sqmeth 16384^2 {prec} {meth} round {rnd}", t)
    real = CB.householder_panel
    spent = []

    def timed(self, x):
        cp.cuda.Device().synchronize()
        t0 = time.perf_counter()
        out = real(self, x)
        cp.cuda.Device().synchronize()
        spent.append(time.perf_counter() - t0)
        return out

    CB.householder_panel = timed
    try:
        for prec, a in cases:
            for meth in meths:
                spent.clear()
                q, r = mpqr.qr(a, precision=prec, method=meth)
                bwd = float(cp.linalg.norm(a - q @ r) / cp.linalg.norm(a))
                orth = float(cp.linalg.norm(q.T @ q - cp.eye(16384, dtype=a.dtype)) / 16384)
                rec(f"sqmeth 16384^2 {prec} {meth} leaves", sum(spent) * 1e3,
                    leaves=len(spent), backward=bwd, orth=orth)
                del q, r
                cp.get_default_memory_pool().free_all_blocks()
    finally:
        CB.householder_panel = real


@section("lane")
def _lane():
    import contextlib

    from mpqr.backends import cupy_lane
    from mpqr.backends._base import SerialLane
    from mpqr.backends.cupy_backend import CupyBackend as CB

    shipped, prio = CB.update_lane, cupy_lane.CupyLane.main_stream
    a32 = cp.random.default_rng(5).standard_normal((16384, 16384), dtype=cp.float32)
    a64 = cp.random.default_rng(5).standard_normal((16384, 16384))
    cases = (("fp16", a32), ("fp64-emulated", a64), ("fp32-emulated", a32))
    same = contextlib.nullcontext
    runs = (("tiled lane, panels high priority", "householder-tiled", shipped, prio),
            ("tiled lane, one priority", "householder-tiled", shipped,
             lambda self: same()),
            ("tiled serial", "householder-tiled", lambda self, a: SerialLane(), prio),
            ("recursive", "householder-recursive", shipped, prio))
    try:
        for rnd in range(2):
            for prec, a in cases:
                for name, meth, lane, ms in runs:
                    CB.update_lane, cupy_lane.CupyLane.main_stream = lane, ms
                    t = timeit(lambda a=a, p=prec, mt=meth: mpqr.qr(a, precision=p, method=mt),
                               rep=3)
                    rec(f"lane 16384^2 {prec} {name} round {rnd}", t)
        CB.update_lane, cupy_lane.CupyLane.main_stream = shipped, prio
        for prec, a in cases:
            q, r = mpqr.qr(a, precision=prec, method="householder-tiled")
            bwd = float(cp.linalg.norm(a - q @ r) / cp.linalg.norm(a))
            orth = float(cp.linalg.norm(q.T @ q - cp.eye(16384, dtype=a.dtype)) / 16384)
            rec(f"lane 16384^2 {prec} errors", 0.0, backward=bwd, orth=orth)
            del q, r
    finally:
        CB.update_lane, cupy_lane.CupyLane.main_stream = shipped, prio

@section("split")
def _split():
    shipped = CupyBackend.triangular_split_min_n
    rng = cp.random.default_rng(17)
    try:
        for (m, n), prec, dt in (((2**20, 256), "fp64", cp.float64),
                                 ((2**21, 128), "fp64", cp.float64),
                                 ((2**19, 512), "fp64", cp.float64),
                                 ((65536, 4096), "fp64", cp.float64),
                                 ((2**20, 256), "fp16", cp.float32)):
            a = rng.standard_normal((m, n), dtype=dt)
            for rnd in range(3):
                for name, cut in (("split", shipped), ("one gemm", None)):
                    CupyBackend.triangular_split_min_n = cut
                    t = timeit(lambda a=a, p=prec: mpqr.qr(a, precision=p), rep=5)
                    rec(f"split {m}x{n} {prec} round {rnd} {name}", t)
            for name, cut in (("split", shipped), ("one gemm", None)):
                CupyBackend.triangular_split_min_n = cut
                q, r = mpqr.qr(a, precision=prec)
                bwd = float(cp.linalg.norm(a - q @ r) / cp.linalg.norm(a))
                orth = float(cp.linalg.norm(q.T @ q - cp.eye(n, dtype=dt)))
                rec(f"split {m}x{n} {prec} errors {name}", 0.0, backward=bwd, orth=orth)
                del q, r
            del a
            cp.get_default_memory_pool().free_all_blocks()
    finally:
        CupyBackend.triangular_split_min_n = shipped


write()
