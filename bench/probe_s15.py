"""Session-15 probe: CholQR's n x n steps on the device (one launch, checks read once)
against the host route they replace.

python3 bench/probe_s15.py OUT.json [steps]
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


write()
