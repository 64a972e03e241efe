"""The certified panel's n x n steps in one warp's registers, on the GPU:
``python bench/probes/square2_gpu.py`` (CuPy; < 90 s on an H200; JSON to ``$OUT/square2.json``).

Lever (module constant, A/B'd in one process): ``cupy.panel_cholqr.ONE_LAUNCH``,
``"block"`` (the default: the Cholesky and signed LU by the whole block, one barrier a step)
against ``"registers"`` (one warp, the 32 x 32 matrix in registers, lane j holds column j,
shuffles, no barrier a step; the same operations in the same order).

1. Panel checks (PASS/FAIL, registers bitwise against block; block against the three
   launches reported beside): float32 / float64,
   m = 32, 1000, 8192, 16384, 100000, n = 8, 17, 32, a view inside a wider matrix; a repeated
   column (the certificate fails as before); a NaN entry (the certificate fails).
2. Panel time (us, CUDA events over 200 launches) 16384 x 32 and 100000 x 32, both dtypes,
   block / registers / three launches; per stage (the launch's ``stop`` after each grid
   barrier: the time to that barrier).
3. The leaf 16384 x 1024 (ms), block / registers.
4. QR 4096^2 accuracy both ways; QR 16384^2 and 8192^2 at fp32-emulated, fp16,
   fp64-emulated, block / registers alternated, beside ``cupy.linalg.qr``.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import threading
import time
import traceback
from pathlib import Path

import cupy as cp
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

OUT = Path(os.environ.get("OUT", "/tmp"))
RESULT: dict = {"checks": {}, "panel_us": {}, "stages_us": {}, "leaf_ms": {}, "qr": []}
T0 = time.perf_counter()
BUDGET = 84.0
WAYS = ("block", "registers")


def status(name: str, ok: bool, detail: str = "") -> None:
    RESULT["checks"][name] = {"pass": bool(ok), "detail": detail}
    print(f"{'PASS' if ok else 'FAIL'}  {name}  {detail}", flush=True)


def guarded(fn):
    def run(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception:
            traceback.print_exc()
            tail = traceback.format_exc()[-800:]
            RESULT.setdefault("errors", []).append(f"{fn.__name__}: {tail}")
            return None
    return run


def _k():
    from mpqr.backends.cupy import panel_cholqr as k
    return k


def _panel(a0, c0, n, way):
    from mpqr.backends import get_backend

    from mpqr._array_api import array_namespace

    k = _k()
    old = k.ONE_LAUNCH
    k.ONE_LAUNCH = way
    try:
        work = a0.copy()
        w = cp.zeros_like(work)
        backend = get_backend(array_namespace(work))
        cert = backend.new_certificate(work)
        l, tau = backend.certified_panel(work[:, c0:c0 + n], w[:, c0:c0 + n], cert)
        cp.cuda.Device().synchronize()
    finally:
        k.ONE_LAUNCH = old
    return [cp.asnumpy(x) for x in (work, w, l, tau, cert)]


def _same(x, y) -> bool:
    return all(np.array_equal(a, b, equal_nan=True) for a, b in zip(x, y, strict=True))


@guarded
def panel_checks() -> None:
    rng = np.random.default_rng(3)
    for dt in (np.float32, np.float64):
        for m in (32, 1000, 8192, 16384, 100000):
            for n in (8, 17, 32):
                a0 = cp.asarray(rng.standard_normal((m, 40)).astype(dt))
                three = _panel(a0, 3, n, None)
                ref, got = (_panel(a0, 3, n, w) for w in WAYS)
                status(f"panel {np.dtype(dt).name} {m}x{n} (view in {m}x40) registers = block",
                       _same(got, ref), f"cert {got[4].tolist()}; block = three launches: "
                       f"{_same(ref, three)}")
        for label, bad in (("repeated column", "rep"), ("NaN entry", "nan")):
            a = rng.standard_normal((3000, 40)).astype(dt)
            if bad == "rep":
                a[:, 20] = a[:, 7]
            else:
                a[17, 9] = np.nan
            a0 = cp.asarray(a)
            ref, got = (_panel(a0, 3, 32, w) for w in WAYS)
            ok = _same(got, ref) and int(got[4][0]) >= 1
            status(f"panel {np.dtype(dt).name} {label}: registers = block, certificate fails",
                   ok, f"cert {got[4].tolist()} (block {ref[4].tolist()})")


def _events(fn, reps: int) -> float:
    fn()
    cp.cuda.Device().synchronize()
    s, e = cp.cuda.Event(), cp.cuda.Event()
    s.record()
    for _ in range(reps):
        fn()
    e.record()
    e.synchronize()
    return cp.cuda.get_elapsed_time(s, e) * 1000.0 / reps


def _panel_timing(k, dt, m: int) -> None:
    from mpqr.backends import get_backend

    from mpqr._array_api import array_namespace

    a0 = cp.random.default_rng(1).standard_normal((m, 32), dtype=dt)
    work = a0.copy()
    w = cp.zeros_like(work)
    backend = get_backend(array_namespace(work))
    cert = backend.new_certificate(work)

    def copy():
        work[...] = a0  # a fresh panel each time (the copy timed apart)

    def one():
        copy()
        backend.certified_panel(work, w, cert)

    copy_us = _events(copy, 200)
    label = f"{np.dtype(dt).name} {m}x32"
    row = {"copy_us": copy_us}
    for _ in range(3):  # alternated
        for way in (None, *WAYS):
            k.ONE_LAUNCH = way
            row.setdefault(str(way), []).append(_events(one, 200) - copy_us)
    k.ONE_LAUNCH = "block"
    row = {c: (float(np.median(v)) if isinstance(v, list) else v) for c, v in row.items()}
    RESULT["panel_us"][label] = row
    print(f"panel {label}: " + ", ".join(f"{c} {t:.1f} us" for c, t in row.items()),
          flush=True)
    if m != 16384:
        return
    # per stage: the one launch stopped after grid barrier s (the time to it)
    lda = cp.int64(work.strides[0] // work.itemsize)
    stages = {}
    ws = k._workspace()
    ltop = cp.empty(2 * 32 * 32, dtype=dt)
    tau = cp.empty(32, dtype=dt)
    for way in WAYS:
        kern = k._fused_kernel(cp.dtype(dt).name, way)
        for stop in (1, 2, 3, 4, 5, 6, 0):
            def st(kern=kern, stop=stop):
                copy()
                k._launch_fused(kern, work, lda, m, 32, ws, cert, w, lda, ltop, tau, stop=stop)
            stages[f"{way} stop {stop}"] = _events(st, 200) - copy_us
    RESULT["stages_us"][label] = stages
    for way in WAYS:
        print(f"stages {label} {way} (us to barrier 1..6, all): " + ", ".join(
            f"{stages[f'{way} stop {s}']:.1f}" for s in (1, 2, 3, 4, 5, 6, 0)), flush=True)


@guarded
def panel_timings() -> None:
    k = _k()
    for dt in (np.float32, np.float64):
        for m in (16384, 100000):
            _panel_timing(k, dt, m)


@guarded
def leaf_timings() -> None:
    from mpqr.backends import get_backend

    from mpqr._array_api import array_namespace

    k = _k()
    for dt in (np.float32, np.float64):
        a0 = cp.random.default_rng(2).standard_normal((16384, 1024), dtype=dt)
        work = a0.copy()
        w = cp.zeros_like(work)
        backend = get_backend(array_namespace(work))
        cert = backend.new_certificate(work)
        row = {}
        for _ in range(3):
            for way in WAYS:
                k.ONE_LAUNCH = way
                ts = []
                for _ in range(3):
                    work[...] = a0
                    cp.cuda.Device().synchronize()
                    s, e = cp.cuda.Event(), cp.cuda.Event()
                    s.record()
                    k.certified_leaf(backend, work, w, 0, 1024, cert)
                    e.record()
                    e.synchronize()
                    ts.append(cp.cuda.get_elapsed_time(s, e))
                row.setdefault(way, []).append(min(ts))
        k.ONE_LAUNCH = "block"
        row = {c: float(np.median(v)) for c, v in row.items()}
        RESULT["leaf_ms"][np.dtype(dt).name] = row
        print(f"leaf 16384x1024 {np.dtype(dt).name}: " + ", ".join(
            f"{c} {t:.2f} ms" for c, t in row.items()) + f"; cert {cert.get().tolist()}",
            flush=True)


def _errors(a, q, r) -> tuple[float, float]:
    a64, q64, r64 = (x.astype(cp.float64) for x in (a, q, r))
    back = float(cp.linalg.norm(a64 - q64 @ r64) / cp.linalg.norm(a64))
    n = q64.shape[1]
    orth = float(cp.linalg.norm(q64.T @ q64 - cp.eye(n)) / np.sqrt(n))
    return back, orth


@guarded
def qr_checks() -> None:
    import mpqr

    k = _k()
    rng = np.random.default_rng(11)
    for prec, dt in (("fp32-emulated", np.float32), ("fp64-emulated", np.float64),
                     ("fp16", np.float32)):
        a = cp.asarray(rng.standard_normal((4096, 4096)).astype(dt))
        errs = {}
        for way in WAYS:
            k.ONE_LAUNCH = way
            try:
                q, r = mpqr.qr(a, precision=prec, method="householder-recursive")
                errs[way] = _errors(a, q, r)
            finally:
                k.ONE_LAUNCH = "block"
        (b0, o0), (b, o) = errs["block"], errs["registers"]
        ok = b <= 2 * b0 + 1e-15 and o <= 2 * o0 + 1e-15
        status(f"qr 4096^2 {prec} registers", ok,
               f"backward {b:.2e} (block {b0:.2e}), orthogonality {o:.2e} (block {o0:.2e})")


@guarded
def qr_timings(shapes=(16384, 8192)) -> None:
    import mpqr

    k = _k()
    rng = cp.random.default_rng(13)
    for nn in shapes:
        for dt in (np.float32, np.float64):
            if time.perf_counter() - T0 > BUDGET - 8:
                print(f"skipped {nn}^2 {np.dtype(dt).name}: time budget", flush=True)
                continue
            a = rng.standard_normal((nn, nn), dtype=dt)
            cp.linalg.qr(a)
            cp.cuda.Device().synchronize()
            s, e = cp.cuda.Event(), cp.cuda.Event()
            s.record()
            cp.linalg.qr(a)
            e.record()
            e.synchronize()
            base = cp.cuda.get_elapsed_time(s, e)
            precs = ("fp32-emulated", "fp16") if dt == np.float32 else ("fp64-emulated",)
            for prec in precs:
                if time.perf_counter() - T0 > BUDGET - 5:
                    print(f"skipped {nn}^2 {prec}: time budget", flush=True)
                    continue
                row = {"shape": f"{nn}x{nn}", "precision": prec,
                       f"cusolver_{np.dtype(dt).name}_ms": base}
                call = functools.partial(mpqr.qr, a, precision=prec,
                                         method="householder-recursive")
                for way in WAYS:
                    k.ONE_LAUNCH = way
                    call()
                cp.cuda.Device().synchronize()
                times = {w: [] for w in WAYS}
                for _ in range(3 if nn > 8192 else 5):
                    for way in WAYS:
                        k.ONE_LAUNCH = way
                        s, e = cp.cuda.Event(), cp.cuda.Event()
                        s.record()
                        call()
                        e.record()
                        e.synchronize()
                        times[way].append(cp.cuda.get_elapsed_time(s, e))
                k.ONE_LAUNCH = "block"
                for way in WAYS:
                    t = float(np.median(times[way]))
                    row[f"{way}_ms"] = t
                    row[f"{way}_speedup"] = base / t
                RESULT["qr"].append(row)
                print(f"qr {nn}^2 {prec}: cuSOLVER {base:.1f} ms; " + ", ".join(
                    f"{w} {row[w + '_ms']:.1f} ({row[w + '_speedup']:.2f}x)" for w in WAYS),
                    flush=True)
            del a
            cp.get_default_memory_pool().free_all_blocks()


def _write() -> None:
    RESULT["seconds"] = time.perf_counter() - T0
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "square2.json").write_text(json.dumps(RESULT, indent=1, default=str))
    print(f"wrote {OUT / 'square2.json'}", flush=True)


def _watchdog() -> None:
    print("FAIL  watchdog: the probe did not finish in 88 s", flush=True)
    RESULT["checks"]["watchdog"] = {"pass": False, "detail": "did not finish in 88 s"}
    _write()
    os._exit(3)


def main() -> None:
    timer = threading.Timer(88.0, _watchdog)
    timer.daemon = True
    timer.start()
    dev = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    RESULT["device"] = dev["name"].decode() if isinstance(dev["name"], bytes) else dev["name"]
    RESULT["cupy"] = cp.__version__
    t = time.perf_counter()
    guarded(lambda: [_k()._fused_kernel(d, w) for d in ("float32", "float64") for w in WAYS])()
    RESULT["compile_s"] = time.perf_counter() - t
    print(f"compiled the one launch's kernels in {RESULT['compile_s']:.1f} s", flush=True)
    panel_checks()
    panel_timings()
    leaf_timings()
    qr_checks()
    qr_timings()
    timer.cancel()
    _write()
    fails = [c for c, v in RESULT["checks"].items() if not v["pass"]]
    print(f"{len(RESULT['checks']) - len(fails)} PASS, {len(fails)} FAIL; "
          f"{RESULT['seconds']:.1f} s")


if __name__ == "__main__":
    main()
