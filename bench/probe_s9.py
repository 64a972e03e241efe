"""Session-9 probe: where square QR's time goes at the tensor-core precisions
(fp16 ran slower than fp32-emulated at 16384^2: 1317 ms against ~830 ms).

Every engine call, leaf panel and fp16 reflector rounding is timed synchronised and
attributed to the policy's label; "other" is the rest of the wall time.

python3 bench/probe_s9.py OUT.json [sqph,sqph8k]
"""
import dataclasses
import time

import cupy as cp
from _probe import rec, section, sections, timeit, write

import mpqr
from mpqr.engines import ENGINES
from mpqr.qr import householder_recursive as hr

sections(["sqph"])


def _sync():
    cp.cuda.Device().synchronize()


def _timed(fn, acc, key):
    def wrapped(*x, **kw):
        _sync()
        t0 = time.perf_counter()
        out = fn(*x, **kw)
        _sync()
        acc.append((key, time.perf_counter() - t0))
        return out
    return wrapped


def _phases(a, prec, mode="reduced"):
    runs, other = [], []
    saved_engines = dict(ENGINES)
    saved = (hr.householder_panel, hr.round_reflectors_fp16)
    for name, e in saved_engines.items():
        ENGINES[name] = dataclasses.replace(e, run=_timed(e.run, runs, name))
    hr.householder_panel = _timed(saved[0], other, "leaf-panel")
    hr.round_reflectors_fp16 = _timed(saved[1], other, "fp16-round")
    try:
        with mpqr.explain() as tr:
            _sync()
            t0 = time.perf_counter()
            mpqr.qr(a, precision=prec, mode=mode)
            _sync()
            total = (time.perf_counter() - t0) * 1e3
    finally:
        ENGINES.clear()
        ENGINES.update(saved_engines)
        hr.householder_panel, hr.round_reflectors_fp16 = saved
    gemms = list(tr.gemms)
    by = {}
    if len(gemms) == len(runs):
        for g, (eng, s) in zip(gemms, runs):
            m_, n_, k_ = g.shape
            key = (eng, g.label)
            c, f, t = by.get(key, (0, 0.0, 0.0))
            by[key] = (c + 1, f + 2.0 * m_ * n_ * k_ * g.batch, t + s)
    else:
        print(f"  (trace has {len(gemms)} gemms, {len(runs)} engine runs: by engine only)")
        for eng, s in runs:
            c, f, t = by.get((eng, "?"), (0, 0.0, 0.0))
            by[(eng, "?")] = (c + 1, 0.0, t + s)
    gsum = sum(v[2] for v in by.values()) * 1e3
    osum = {}
    for k, s in other:
        osum[k] = osum.get(k, 0.0) + s * 1e3
    # the products inside the leaf panel and the rounding are counted in gemm_ms too
    rec(f"phases {a.shape[0]}^2 {prec} {mode} total(synced)", total, gemm_ms=gsum,
        **{k.replace("-", "_"): v for k, v in osum.items()})
    for (eng, lab), (c, f, t) in sorted(by.items(), key=lambda kv: -kv[1][2]):
        print(f"    {eng:16s} {lab:22s} {c:5d} calls {f / 1e12:8.3f} TFLOP {t * 1e3:9.2f} ms "
              f"{(f / t / 1e12) if t else 0:7.1f} TFLOP/s", flush=True)


def _square(n):
    a = cp.random.default_rng(1).standard_normal((n, n), dtype=cp.float32)
    rec(f"cusolver qr {n}^2 float32", timeit(lambda: cp.linalg.qr(a), rep=2))
    for prec in ("fp16", "fp32-emulated"):
        rec(f"mpqr qr {n}^2 {prec}", timeit(lambda prec=prec: mpqr.qr(a, precision=prec), rep=2))
        _phases(a, prec)
    cp.get_default_memory_pool().free_all_blocks()


@section("sqph")
def _sqph():
    _square(16384)


@section("sqph8k")
def _sqph8k():
    _square(8192)


write()
