"""Session-9 probe: where square QR's time goes at the tensor-core precisions
(fp16 ran slower than fp32-emulated at 16384^2: 1317 ms against ~830 ms).

Every engine call, leaf panel and fp16 reflector rounding is timed synchronised and
attributed to the policy's label; "other" is the rest of the wall time.

python3 bench/probe_s9.py OUT.json [sqph,sqph8k,panel,sqleaves]
"""
import dataclasses
import time

import cupy as cp
from _probe import rec, section, sections, timeit, write
from mpqr.backends import get_backend

import mpqr
from mpqr._array_api import array_namespace
from mpqr.engines import ENGINES
from mpqr.qr import _kernels as qk
from mpqr.qr import householder_recursive as hr

sections(["sqph"])
be = get_backend(array_namespace(cp.zeros(1)))


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


class _route:
    """Force the leaf panel's route: "tsqr" (TSQR + reconstruction) or "geqrf"."""

    def __init__(self, route):
        self.route = route

    def __enter__(self):
        self.saved = (qk.TSQR_ASPECT, qk.TSQR_MAX_WIDTH, getattr(qk, "TSQR_MIN_ROWS", None))
        if self.route == "tsqr":
            qk.TSQR_ASPECT, qk.TSQR_MAX_WIDTH = 1, 1 << 30
            if self.saved[2] is not None:
                qk.TSQR_MIN_ROWS = 0
        elif self.route == "geqrf":
            qk.TSQR_ASPECT = 1 << 40

    def __exit__(self, *exc):
        qk.TSQR_ASPECT, qk.TSQR_MAX_WIDTH = self.saved[:2]
        if self.saved[2] is not None:
            qk.TSQR_MIN_ROWS = self.saved[2]


@section("panel")
def _panel():
    """The leaf panel's two routes, m x k, same process."""
    rng = cp.random.default_rng(2)
    for dt in (cp.float32, cp.float64):
        for k in (32, 64, 128):
            for m in (4096, 16384, 65536, 262144, 1048576):
                a = rng.standard_normal((m, k), dtype=dt)
                out = {}
                prec = "fp64" if dt == cp.float64 else "fp32"
                for route in ("geqrf", "tsqr"):
                    try:
                        with _route(route):
                            out[route] = timeit(lambda a=a, prec=prec: qk.householder_panel(
                                be, a, precision=prec), rep=5)
                    except Exception as exc:
                        print(f"panel {m}x{k} {route}: {exc!r}"[:200])
                        out[route] = float("nan")
                rec(f"panel {m}x{k} {cp.dtype(dt).name}", out["geqrf"], tsqr_ms=out["tsqr"],
                    ratio=out["tsqr"] / out["geqrf"])


@section("sqleaves")
def _sqleaves():
    """Square QR: leaf count and leaf route."""
    saved = hr.MAX_LEAVES
    for n in (16384, 8192):
        a32 = cp.random.default_rng(1).standard_normal((n, n), dtype=cp.float32)
        a64 = cp.random.default_rng(1).standard_normal((n, n))
        rec(f"cusolver qr {n}^2 float32", timeit(lambda a32=a32: cp.linalg.qr(a32), rep=2))
        for prec, a in (("fp16", a32), ("fp32-emulated", a32), ("fp64-emulated", a64)):
            for leaves, route in ((128, "default"), (128, "geqrf"), (64, "default"),
                                  (32, "default")):
                hr.MAX_LEAVES = leaves
                try:
                    with _route(route):
                        t = timeit(lambda prec=prec, a=a: mpqr.qr(a, precision=prec), rep=2)
                finally:
                    hr.MAX_LEAVES = saved
                rec(f"qr {n}^2 {prec} leaves={leaves} route={route}", t)
        cp.get_default_memory_pool().free_all_blocks()


@section("sqwidth")
def _sqwidth():
    """Square QR: leaf count and widest leaf (synced phases for fp16 at 16384)."""
    saved = (hr.MAX_LEAVES, hr.MAX_LEAF_WIDTH)
    for n in (16384, 8192):
        a32 = cp.random.default_rng(1).standard_normal((n, n), dtype=cp.float32)
        a64 = cp.random.default_rng(1).standard_normal((n, n))
        rec(f"cusolver qr {n}^2 float32", timeit(lambda a32=a32: cp.linalg.qr(a32), rep=3))
        for prec, a in (("fp16", a32), ("fp32-emulated", a32), ("fp64-emulated", a64)):
            for leaves, width in ((32, 256), (16, 512), (32, 512), (16, 1024)):
                hr.MAX_LEAVES, hr.MAX_LEAF_WIDTH = leaves, width
                nb = hr.leaf_width(n)
                try:
                    with _route("geqrf"):
                        t = timeit(lambda prec=prec, a=a: mpqr.qr(a, precision=prec), rep=3)
                        if n == 16384 and prec == "fp16":
                            _phases(a, prec)
                finally:
                    hr.MAX_LEAVES, hr.MAX_LEAF_WIDTH = saved
                rec(f"qr {n}^2 {prec} leaves<={leaves} width<={width} nb={nb}", t)
        cp.get_default_memory_pool().free_all_blocks()


write()
