"""The certified panel in one launch against the three launches, on the GPU:
``python bench/probes/square_gpu.py`` (CuPy; < 90 s on an H200; JSON to
``$OUT/square.json``).

1. Compile check: ``panel_cholqr.cu`` + ``panel_fused.cu`` through NVRTC (CuPy's
   ``RawModule``, as ``backends/cupy/modules.py`` builds them); the log on failure.
2. Panel checks (PASS/FAIL): ``kernels/panel_fused.cu`` (``"warp"`` and ``"block"``
   n x n steps) against the three launches on the same input: the panel (S R and Y),
   W, L, tau and the certificate, float32 and float64, tall and short panels, a view
   inside a wider matrix, a panel whose certificate fails; the barrier counter back at
   zero after each launch.
3. Panel timings (µs a panel, CUDA events over a batch of launches on distinct copies):
   16384 x 32 and 8192 x 32, float32 and float64; the one launch taken apart by its
   ``stop`` argument (returns after barrier k of the grid).
4. Full QR (mode reduced, ``method="householder-recursive"``: the route the panel serves)
   with ``panel_cholqr.ONE_LAUNCH`` off / ``"warp"`` / ``"block"`` (and ``FUSED_BLOCKS``,
   ``CERTIFIED_LEAF_SUB``: the leaf in sub-blocks of 128 / 256 columns):
   4096² backward error and orthogonality (PASS/FAIL against the three launches), then
   8192² and 16384² at fp32-emulated, fp16 and fp64-emulated against ``cupy.linalg.qr``,
   medians of 5 CUDA-synchronised calls after a warm-up, the configurations alternated.
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
RESULT: dict = {"checks": {}, "compile": {}, "panel_us": {}, "stages_us": {}, "qr": []}
T0 = time.perf_counter()


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


@guarded
def compile_check() -> bool:
    """NVRTC on the modules the library loads (so the later calls find them compiled)."""
    from mpqr.backends.cupy import panel_cholqr as k

    t0 = time.perf_counter()
    for dtype_name in ("float32", "float64"):
        try:
            kernels = k._fused_module(dtype_name)
        except cp.cuda.compiler.CompileException as exc:
            print("NVRTC failed:\n" + str(exc), flush=True)
            try:
                exc.dump(sys.stdout)
            except Exception:
                pass
            status(f"compile panel_fused.cu {dtype_name} (NVRTC)", False, str(exc)[-2000:])
            return False
        for steps, f in zip(("warp", "block"), kernels, strict=True):
            RESULT["compile"][f"{dtype_name} {steps}"] = {
                "regs": f.num_regs, "local_bytes": f.local_size_bytes,
                "shared_bytes": f.shared_size_bytes}
    status("compile panel_fused.cu (NVRTC)", True,
           f"{time.perf_counter() - t0:.1f} s; " + json.dumps(RESULT["compile"]))
    return True


def _panel(k, a0, lo, hi, mode, with_w=True):
    """Factor columns lo:hi of a copy of a0 with ONE_LAUNCH = mode; host copies back."""
    work = a0.copy()
    w = cp.zeros_like(work)
    cert = cp.zeros(4, cp.int32)
    old = k.ONE_LAUNCH
    k.ONE_LAUNCH = mode
    try:
        ltop, tau = k.certified_panel(work[:, lo:hi], w[:, lo:hi] if with_w else None, cert)
    finally:
        k.ONE_LAUNCH = old
    cp.cuda.Device().synchronize()
    return {"work": cp.asnumpy(work), "w": cp.asnumpy(w), "l": cp.asnumpy(ltop),
            "tau": cp.asnumpy(tau), "cert": cp.asnumpy(cert)}


@guarded
def panel_checks() -> None:
    from mpqr.backends.cupy import panel_cholqr as k

    rng = np.random.default_rng(5)
    cases = [((16384, 32), 0, 32), ((8192, 32), 0, 32), ((5000, 40), 3, 35), ((1000, 17), 0, 17),
             ((32, 32), 0, 32), ((200, 8), 0, 8), ((100000, 32), 0, 32)]
    for dtype in (np.float32, np.float64):
        u = 2.0**-24 if dtype == np.float32 else 2.0**-53
        for shape, lo, hi in cases:
            a0 = cp.asarray(rng.standard_normal(shape).astype(dtype))
            ref = _panel(k, a0, lo, hi, None)
            for mode in ("warp", "block"):
                got = _panel(k, a0, lo, hi, mode)
                worst = 0.0
                bitwise = True
                for key in ("work", "w", "l", "tau"):
                    d = np.abs(got[key].astype(np.float64) - ref[key]).max()
                    scale = max(np.abs(ref[key]).max(), 1e-300)
                    worst = max(worst, d / scale)
                    bitwise &= np.array_equal(got[key], ref[key])
                ok = (worst <= 16 * u and got["cert"][0] == ref["cert"][0] == 0
                      and got["cert"][1] == 0 and got["cert"][2] == 0)
                status(f"panel {mode} {np.dtype(dtype).name} {shape}[:, {lo}:{hi}]", ok,
                       f"max rel diff {worst:.2e} (bitwise {bitwise}); cert {got['cert'].tolist()}")
        # the one launch on one block per SM: other partial sums, same factors to
        # working precision
        a0 = cp.asarray(rng.standard_normal((16384, 32)).astype(dtype))
        ref = _panel(k, a0, 0, 32, None)
        k.FUSED_BLOCKS = k._sm_count(cp.cuda.Device().id)
        try:
            got = _panel(k, a0, 0, 32, "block")
        finally:
            k.FUSED_BLOCKS = None
        worst = max(np.abs(got[x].astype(np.float64) - ref[x]).max()
                    / max(np.abs(ref[x]).max(), 1e-300) for x in ("work", "w", "l", "tau"))
        status(f"panel block {np.dtype(dtype).name} (16384, 32), one block per SM",
               worst <= 64 * u and got["cert"].tolist() == [0, 0, 0, 0],
               f"max rel diff {worst:.2e}; cert {got['cert'].tolist()}")
        # the rows in a second launch (panel_apply) after the one launch's n x n steps
        for shape, lo, hi in cases[:3]:
            a0 = cp.asarray(rng.standard_normal(shape).astype(dtype))
            ref = _panel(k, a0, lo, hi, None)
            k.ONE_LAUNCH_ROWS = False
            try:
                got = _panel(k, a0, lo, hi, "block")
            finally:
                k.ONE_LAUNCH_ROWS = True
            same = all(np.array_equal(got[x], ref[x]) for x in ("work", "w", "l", "tau"))
            status(f"panel block, rows apart {np.dtype(dtype).name} {shape}[:, {lo}:{hi}]",
                   same and got["cert"].tolist() == [0, 0, 0, 0],
                   f"bitwise {same}; cert {got['cert'].tolist()}")
        # a panel whose certificate fails (a repeated column): counted once, like the three
        a = rng.standard_normal((4096, 32)).astype(dtype)
        a[:, 20] = a[:, 7]
        a0 = cp.asarray(a)
        ref = _panel(k, a0, 0, 32, None)
        for mode in ("warp", "block"):
            got = _panel(k, a0, 0, 32, mode)
            status(f"panel {mode} {np.dtype(dtype).name} failing certificate",
                   got["cert"][0] == ref["cert"][0] == 1 and got["cert"][1] == 0,
                   f"cert {got['cert'].tolist()} (three launches {ref['cert'].tolist()})")
        # the leaf's loop (raw pointers, one cert for all panels) with the one launch, and
        # in sub-blocks of 64 / 128 columns
        a0 = cp.asarray(rng.standard_normal((3000, 300)).astype(dtype))
        outs = {}
        for cfg in ((None, None), ("block", None), ("block", 64), (None, 128)):
            work = a0.copy()
            w = cp.zeros_like(work)
            cert = cp.zeros(4, cp.int32)
            _config(k, cfg[0], None, cfg[1])
            try:
                from mpqr.backends import get_backend

                from mpqr._array_api import array_namespace
                tau = k.certified_leaf(get_backend(array_namespace(work)), work, w, 40, 290,
                                       cert)
            finally:
                _config(k, None, None)
            outs[cfg] = (cp.asnumpy(work), cp.asnumpy(tau), cp.asnumpy(cert))
        ref = outs[(None, None)]
        for cfg in list(outs)[1:]:
            got = outs[cfg]
            d = max(np.abs(got[i].astype(np.float64) - ref[i]).max()
                    / max(np.abs(ref[i]).max(), 1e-300) for i in range(2))
            status(f"leaf 3000x300 cols 40:290 {cfg[0] or 'three launches'}, sub-blocks "
                   f"{cfg[1]} {np.dtype(dtype).name}",
                   d <= 256 * u and got[2].tolist() == [0, 0, 0, 0],
                   f"max rel diff {d:.2e} (R, Y, tau); cert {got[2].tolist()}")


_SPIN = cp.RawKernel(r"""
extern "C" __global__ void spin(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}""", "spin")


def _batch_us(launch, copies, base) -> float:
    """µs per launch: one launch per distinct copy of ``base`` (restored before each batch),
    CUDA events around the batch, queued behind a ~5 ms spin so that the host's launch
    cost is not in it."""
    best = []
    for rep in range(4):
        for c in copies:
            cp.copyto(c, base)
        cp.cuda.Device().synchronize()
        _SPIN((1,), (1,), (np.int64(10_000_000),))
        s, e = cp.cuda.Event(), cp.cuda.Event()
        s.record()
        for c in copies:
            launch(c)
        e.record()
        e.synchronize()
        if rep:  # the first is the warm-up
            best.append(cp.cuda.get_elapsed_time(s, e) * 1e3 / len(copies))
    return float(np.median(best))


def _three_or_one(k, w, cert, ws, ltop, tau, c) -> None:
    k._launch(c, w, cert, ws, ltop, tau)


def _one(k, kern, m, n, ws, cert, w, ltop, tau, stop, c) -> None:
    k._launch_fused(kern, c, cp.int64(n), m, n, ws, cert, w, cp.int64(n), ltop, tau, stop=stop)


@guarded
def panel_timings() -> None:
    from mpqr.backends.cupy import panel_cholqr as k

    rng = np.random.default_rng(7)
    for dtype in (np.float32, np.float64):
        for m in (16384, 8192):
            n = 32
            base = cp.asarray(rng.standard_normal((m, n)).astype(dtype))
            count = 60
            copies = [base.copy() for _ in range(count)]
            ws = k._workspace()
            cert = cp.zeros(4, cp.int32)
            w = cp.empty_like(base)
            ltop = cp.empty((n, n), dtype)
            tau = cp.empty(n, dtype)
            row = {}
            sms = k._sm_count(cp.cuda.Device().id)
            configs = ((None, None), ("warp", None), ("block", None), ("block", sms),
                       ("block", None, None, False), ("block", sms, None, False))
            for cfg in configs * 2:
                _config(k, *cfg)
                try:
                    t = _batch_us(functools.partial(_three_or_one, k, w, cert, ws, ltop, tau),
                                  copies, base)
                finally:
                    _config(k, None, None)
                key = ((cfg[0] or "three launches") + (f" {cfg[1]} blocks" if cfg[1] else "")
                       + (" rows apart" if len(cfg) > 3 else ""))
                row[key] = min(row.get(key, 1e30), t)
            fails = int(cert[0].get())
            label = f"{np.dtype(dtype).name} {m}x{n}"
            RESULT["panel_us"][label] = row | {"cert_failures": fails}
            print(f"panel {label}: " + ", ".join(f"{a} {b:.1f} us" for a, b in row.items())
                  + f" (cert failures {fails})", flush=True)
            # the one launch taken apart: stop after barrier s (1..6), 0 = whole
            names = ["Gram 1 partials", "Gram 1 summed", "chol + X1 (block 0)",
                     "Gram 2 partials", "Gram 2 summed", "cert, R2, LU, T (block 0)",
                     "rows: Y and W"]
            for mode in ("warp", "block"):
                kern = k._fused_module(np.dtype(dtype).name)[mode == "block"]
                cum = []
                for s in (1, 2, 3, 4, 5, 6, 0):
                    launch = functools.partial(_one, k, kern, m, n, ws, cert, w, ltop, tau, s)
                    cum.append(_batch_us(launch, copies, base))
                stages = {nm: cum[i] - (cum[i - 1] if i else 0.0) for i, nm in enumerate(names)}
                RESULT["stages_us"][f"{label} {mode}"] = {"cumulative": cum, "stages": stages}
                print(f"  stages {mode}: " + ", ".join(f"{nm} {v:.1f}" for nm, v in stages.items())
                      + f" (whole {cum[-1]:.1f} us)", flush=True)
            _config(k, None, None)
            ok = int(cert[1].get()) == 0 and int(cert[2].get()) == 0
            status(f"barrier counter at zero after the timed launches {label}", ok,
                   f"cert {cp.asnumpy(cert).tolist()}")
            del copies
            cp.get_default_memory_pool().free_all_blocks()


def _errors(a, q, r) -> tuple[float, float]:
    a64, q64, r64 = (x.astype(cp.float64) for x in (a, q, r))
    back = float(cp.linalg.norm(a64 - q64 @ r64) / cp.linalg.norm(a64))
    n = q64.shape[1]
    orth = float(cp.linalg.norm(q64.T @ q64 - cp.eye(n)) / np.sqrt(n))
    return back, orth


def _time(fn, repeat=5) -> float:
    fn()
    cp.cuda.Device().synchronize()
    ts = []
    for _ in range(repeat):
        s, e = cp.cuda.Event(), cp.cuda.Event()
        s.record()
        fn()
        e.record()
        e.synchronize()
        ts.append(cp.cuda.get_elapsed_time(s, e))
    return float(np.median(ts))


@guarded
def qr_checks() -> None:
    from mpqr.backends.cupy import panel_cholqr as k

    import mpqr

    rng = np.random.default_rng(11)
    configs = {"off": (None, None), "warp": ("warp", None), "block": ("block", None),
               "block rows apart": ("block", None, None, False),
               "block sub128": ("block", None, 128)}
    for prec, dt in (("fp32-emulated", np.float32), ("fp64-emulated", np.float64),
                     ("fp16", np.float32)):
        a = cp.asarray(rng.standard_normal((4096, 4096)).astype(dt))
        errs = {}
        for name, cfg in configs.items():
            _config(k, *cfg)
            try:
                with mpqr.explain() as trace:
                    q, r = mpqr.qr(a, precision=prec, method="householder-recursive")
                leaves = [e for e in trace.events if e.kind == "panel"]
                again = any("factored again" in e.message for e in leaves)
                errs[name] = (*_errors(a, q, r), again)
            finally:
                _config(k, None, None)
        b0, o0, _ = errs["off"]
        for name in list(configs)[1:]:
            b, o, again = errs[name]
            ok = b <= 2 * b0 + 1e-15 and o <= 2 * o0 + 1e-15 and not again
            status(f"qr 4096^2 {prec} {name}", ok,
                   f"backward {b:.2e} (off {b0:.2e}), orthogonality {o:.2e} (off {o0:.2e})"
                   f"{', factored again' if again else ''}")


def _config(k, one, blocks, sub=None, rows=True) -> None:
    from mpqr.backends import panel_cholqr as portable

    k.ONE_LAUNCH, k.FUSED_BLOCKS, k.ONE_LAUNCH_ROWS = one, blocks, rows
    portable.CERTIFIED_LEAF_SUB = sub


@guarded
def qr_timings(shapes=(16384, 8192)) -> None:
    from mpqr.backends.cupy import panel_cholqr as k

    import mpqr

    rng = cp.random.default_rng(13)
    sms = k._sm_count(cp.cuda.Device().id)
    configs = {"off": (None, None), "block": ("block", None),
               "block rows apart": ("block", None, None, False),
               f"block {sms} blocks rows apart": ("block", sms, None, False)}
    for nn in shapes:
        for dt in (np.float32, np.float64):
            if time.perf_counter() - T0 > 76:
                print(f"skipped {nn}^2 {np.dtype(dt).name}: time budget", flush=True)
                continue
            a = rng.standard_normal((nn, nn), dtype=dt)
            base = _time(functools.partial(cp.linalg.qr, a), repeat=3 if nn > 8192 else 5)
            precs = ("fp32-emulated", "fp16") if dt == np.float32 else ("fp64-emulated",)
            for prec in precs:
                if time.perf_counter() - T0 > 78:
                    print(f"skipped {nn}^2 {prec}: time budget", flush=True)
                    continue
                row = {"shape": f"{nn}x{nn}", "precision": prec,
                       f"cusolver_{np.dtype(dt).name}_ms": base}
                times = {c: [] for c in configs}
                call = functools.partial(mpqr.qr, a, precision=prec,
                                         method="householder-recursive")
                for c in configs:  # warm-up (compiles)
                    _config(k, *configs[c])
                    call()
                cp.cuda.Device().synchronize()
                for _ in range(5):
                    for c in configs:
                        _config(k, *configs[c])
                        s, e = cp.cuda.Event(), cp.cuda.Event()
                        s.record()
                        call()
                        e.record()
                        e.synchronize()
                        times[c].append(cp.cuda.get_elapsed_time(s, e))
                _config(k, None, None)
                for c in configs:
                    t = float(np.median(times[c]))
                    row[f"{c}_ms"] = t
                    row[f"{c}_speedup"] = base / t
                RESULT["qr"].append(row)
                cells = [f"{c} {row[c + '_ms']:.1f} ms ({row[c + '_speedup']:.2f}x)"
                         for c in configs]
                print(f"qr {nn}^2 {prec}: cuSOLVER {base:.1f} ms; " + ", ".join(cells), flush=True)
            del a
            cp.get_default_memory_pool().free_all_blocks()


def _write() -> None:
    RESULT["seconds"] = time.perf_counter() - T0
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "square.json").write_text(json.dumps(RESULT, indent=1, default=str))
    print(f"wrote {OUT / 'square.json'}", flush=True)


def _watchdog() -> None:
    """A launch that never returns (a grid barrier that waits for a block not resident)
    would hold the probe: at 88 s the results so far are written and the process ends."""
    print("FAIL  watchdog: the probe did not finish in 88 s (a launch that does not return?)",
          flush=True)
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
    print(f"{RESULT['device']}, CuPy {cp.__version__}", flush=True)
    if compile_check():
        panel_checks()
        panel_timings()
        qr_checks()
        qr_timings()
    timer.cancel()
    fails = [k for k, v in RESULT["checks"].items() if not v["pass"]]
    print(f"\n{len(RESULT['checks']) - len(fails)} PASS, {len(fails)} FAIL"
          + (": " + "; ".join(fails) if fails else "")
          + f"  ({time.perf_counter() - T0:.0f} s)")
    _write()


if __name__ == "__main__":
    main()
