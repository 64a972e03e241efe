"""Operands prepared once, the strided conversion kernels and tc-sgemm's fused unscale, on
the GPU: ``python bench/probes/square2_gpu.py`` (CuPy; < 90 s on an H200; JSON to
``$OUT/square2.json``).

Levers (module constants, A/B'd in one process):

* ``engine_kernels.FAST_SPLIT``: 2-D splits by 32 x 32 tiles indexed by strides (loads
  along the input's contiguous axis, stores along the parts') instead of CuPy's
  elementwise kernel: ``"transposed"`` (the default: only where those axes differ) or
  ``True`` (every 2-D split);
* ``engine_kernels.FAST_UNSCALE_INTO`` + ``tc_sgemm.FUSED_UNSCALE``: tc-sgemm's
  ``C -= P`` / ``C = P`` unscaled into C in one pass;
* ``householder_recursive.PREPARED_OPERANDS``: W1 split once for the trailing update and
  the merge.

1. NVRTC of the new module.
2. Kernel checks (PASS/FAIL, bitwise against the elementwise kernels): splits of float32
   and float64, C-order, row-strided and transposed views, hi only and hi/hf/lo, row and
   column shifts, rows scaled 2^-120..2^100 with Inf/NaN/subnormals; unscale into C
   (assign, subtract, add; float32 and float64 C; a strided C).
3. Product checks: a prepared operand (bitwise), tc-sgemm's fused update (bitwise), the
   transposed prepared operand (within the engine's bound; against float64 and against the
   NumPy backend's emulation of the same product).
4. Conversion rate: GB/s of the split (read float32, write three fp16 parts) against a
   copy (read + write float32), old and new kernel, three layouts.
5. QR 4096^2 backward error / orthogonality, levers off and on, each precision; the
   explain trace says ``prepared=``.
6. QR 16384^2 / 8192^2 at fp32-emulated (each lever alone too at 16384^2), fp16,
   fp64-emulated, levers off / on, beside ``cupy.linalg.qr``; medians of 5.
"""

from __future__ import annotations

import functools
import importlib
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
RESULT: dict = {"checks": {}, "rate_gbs": {}, "qr": [], "qr_errors": {}}
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
            status(f"{fn.__name__} ran", False, tail[-300:])
            return None
    return run


def _mods():
    from mpqr.backends.cupy import engine_kernels as ek

    from mpqr.engines import tc_sgemm

    hr = importlib.import_module("mpqr.qr.householder_recursive")
    return ek, tc_sgemm, hr


def levers(split: bool | str, fused: bool, prepared: bool) -> None:
    ek, tc, hr = _mods()
    ek.FAST_SPLIT = split
    ek.FAST_UNSCALE_INTO = fused
    tc.FUSED_UNSCALE = fused
    hr.PREPARED_OPERANDS = prepared


CONFIGS = {"off": (False, False, False), "split": (True, False, False),
           "split transposed": ("transposed", False, False),
           "fused unscale": (False, True, False), "prepared": (False, False, True),
           "on": ("transposed", True, True), "on, split everywhere": (True, True, True)}


@guarded
def compile_check() -> bool:
    ek, _, _ = _mods()
    try:
        mod = ek._fast_module()
        for name in ("mpqr_split2d_f32", "mpqr_split2d_f64", "mpqr_unscale2d_f32",
                     "mpqr_unscale2d_f64"):
            mod.get_function(name)
        ek._fast_fn.cache_clear()
    except cp.cuda.compiler.CompileException as exc:
        print("NVRTC failed:\n" + str(exc), flush=True)
        status("compile the strided conversion kernels (NVRTC)", False, str(exc)[-2000:])
        return False
    status("compile the strided conversion kernels (NVRTC)", True)
    return True


def _graded(rng, m, n, dtype):
    x = rng.standard_normal((m, n))
    x *= np.exp2(rng.integers(-120, 100, size=(m, 1)).astype(np.float64))
    if dtype == np.float32:
        x = np.clip(x, -3e38, 3e38)
    x = x.astype(dtype)
    x[0, 0], x[1, 1], x[2, 2] = np.inf, -np.inf, np.nan
    x[3, :] = np.float32(1e-40) if dtype == np.float32 else 1e-310  # subnormal row
    x[4, :] = 0
    return cp.asarray(x)


def _same(a, b) -> bool:
    return bool(cp.all(a.view(cp.uint16) == b.view(cp.uint16))) if a.dtype == cp.float16 \
        else bool(cp.all((a == b) | (cp.isnan(a) & cp.isnan(b))))


@guarded
def kernel_checks() -> None:
    ek, _, _ = _mods()
    from mpqr.backends import get_backend

    be = get_backend(cp)
    rng = np.random.default_rng(3)
    for dt in (np.float32, np.float64):
        big = _graded(rng, 700, 900, dt)
        views = {"C-order": big[:, :777].copy(), "row-strided": big[3:, 5:700],
                 "transposed": big[3:690, 5:800].T, "F-order": cp.asfortranarray(big[:, :777])}
        for vname, x in views.items():
            for axis in (-1, -2):
                s = be.pow2_shift(x, axis, 14)
                m, n = x.shape
                for parts in ("hi", "hi/hf/lo"):
                    outs = []
                    for fast in (False, True):
                        ek.FAST_SPLIT = fast
                        hi = be.empty_for(x, x.shape, cp.float16)
                        if parts == "hi":
                            be.split_fp16(x, s, hi)
                            outs.append((hi,))
                        elif axis == -1:
                            cat = be.empty_for(x, (m, 2 * n), cp.float16)
                            be.split_fp16(x, s, hi, hf=cat[:, :n], lo=cat[:, n:])
                            outs.append((hi, cat))
                        else:
                            cat = be.empty_for(x, (2 * m, n), cp.float16)
                            be.split_fp16(x, s, hi, hf=cat[m:], lo=cat[:m])
                            outs.append((hi, cat))
                    ek.FAST_SPLIT = "transposed"
                    ok = all(_same(a, b) for a, b in zip(*outs, strict=True))
                    status(f"split {np.dtype(dt).name} {vname} axis {axis} {parts}", ok,
                           "bitwise against the elementwise kernel")
    # unscale into C
    for dt in (np.float32, np.float64):
        p = cp.asarray((rng.standard_normal((300, 400))
                        * np.exp2(rng.integers(-60, 60, size=(300, 400)))).astype(np.float32))
        r = cp.asarray(rng.integers(-40, 40, size=(300, 1)).astype(np.int32))
        c_ = cp.asarray(rng.integers(-40, 40, size=(1, 400)).astype(np.int32))
        base = cp.asarray(rng.standard_normal((310, 420)).astype(dt))
        ek.FAST_UNSCALE_INTO = False
        q_old = ek.unscale(p, r, c_, dt)
        ek.FAST_UNSCALE_INTO = True
        status(f"unscale {np.dtype(dt).name} (new array)", _same(ek.unscale(p, r, c_, dt), q_old),
               "bitwise against the elementwise kernel")
        for mode in (None, True, False):
            ref = base.copy()
            q = q_old
            v = ref[5:305, 7:407]
            if mode is None:
                v[...] = q
            elif mode:
                v -= q
            else:
                v += q
            got = base.copy()
            ok = ek.unscale_into(got[5:305, 7:407], p, r, c_, mode)
            status(f"unscale into {np.dtype(dt).name} C (strided) mode "
                   f"{ {None: 'assign', True: 'subtract', False: 'add'}[mode] }",
                   bool(ok) and _same(got, ref), "bitwise against unscale, then the update")


@guarded
def product_checks() -> None:
    ek, tc, _ = _mods()
    from mpqr.backends import get_backend

    from mpqr.engines.prepared import prepare
    from mpqr.policy import gemm, gemm_sub

    be = get_backend(cp)
    rng = np.random.default_rng(5)
    m, k, n = 3000, 2048, 1500
    a_np = rng.standard_normal((m, k)).astype(np.float32)
    b_np = rng.standard_normal((k, n)).astype(np.float32)
    a, b = cp.asarray(a_np), cp.asarray(b_np)
    plain = gemm(a, b, precision="fp32-emulated")
    pa = prepare(be, a, side="left", engine="tc-sgemm")
    status("prepared A (its own axis) bitwise", _same(gemm(pa, b, precision="fp32-emulated"),
                                                      plain))
    c0 = cp.asarray(rng.standard_normal((m, n)).astype(np.float32))
    outs = []
    for fused in (False, True):
        tc.FUSED_UNSCALE = ek.FAST_UNSCALE_INTO = fused
        c = c0.copy()
        gemm_sub(c, a, b, precision="fp32-emulated")
        outs.append(c)
    status("tc-sgemm C -= A B fused unscale bitwise", _same(*outs))
    # W^T prepared (columns of W scaled), then W used on the left: shifts moved to D
    w_np = (rng.standard_normal((m, k)) * np.exp2(rng.integers(-20, 20, size=(1, k)))
            ).astype(np.float32)
    w = cp.asarray(w_np)
    pw = prepare(be, w.T, side="left", engine="tc-sgemm")
    d_np = rng.standard_normal((k, n)).astype(np.float32)
    d = cp.asarray(d_np)
    ref = w_np.astype(np.float64) @ d_np.astype(np.float64)
    absprod = np.abs(w_np.astype(np.float64)) @ np.abs(d_np.astype(np.float64))
    got = cp.asnumpy(gemm(pw.T, d, precision="fp32-emulated"))
    base = cp.asnumpy(gemm(w, d, precision="fp32-emulated"))
    bound = (2.0**-20 + k * 2.0**-24) * absprod
    e_got = float(np.max(np.abs(got - ref) / absprod))
    e_base = float(np.max(np.abs(base - ref) / absprod))
    status("transposed prepared W (shifts on D) within the engine's bound",
           bool(np.all(np.abs(got - ref) <= bound)),
           f"max |err|/(|W||D|) {e_got:.2e} (unprepared {e_base:.2e})")
    # against the NumPy backend's emulation of the same product
    from mpqr.backends import get_backend as gb

    nbe = gb(np)
    pw_np = prepare(nbe, w_np.T, side="left", engine="tc-sgemm")
    emu = gemm(pw_np.T, d_np, precision="fp32-emulated")
    status("transposed prepared W: GPU against the NumPy emulation",
           bool(np.all(np.abs(got - emu) <= bound)),
           f"max |gpu - numpy|/(|W||D|) {float(np.max(np.abs(got - emu) / absprod)):.2e}")


def _ms(fn, repeat=10) -> float:
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
def rates() -> None:
    ek, _, _ = _mods()
    from mpqr.backends import get_backend

    be = get_backend(cp)
    big = cp.random.default_rng(7).standard_normal((16384, 16384), dtype=cp.float32)
    views = {"C-order 16384x8192": big[:, :8192].copy(), "row-strided 16384x8192": big[:, :8192],
             "transposed 8192x16384": big[:, :8192].T}
    for vname, x in views.items():
        m, n = x.shape
        s = be.pow2_shift(x, -1, 14)
        hi = be.empty_for(x, x.shape, cp.float16)
        cat = be.empty_for(x, (m, 2 * n), cp.float16)
        dst = cp.empty_like(x)
        copy_ms = _ms(functools.partial(cp.copyto, dst, x))
        row = {"copy_GBs": 8 * m * n / copy_ms / 1e6}
        both = functools.partial(be.split_fp16, x, s, hi, hf=cat[:, :n], lo=cat[:, n:])
        hi_only = functools.partial(be.split_fp16, x, s, hi)
        for fast in (False, True):
            ek.FAST_SPLIT = fast
            tag = "new" if fast else "old"
            t = _ms(both)
            row[f"split_{tag}_GBs"] = 10 * m * n / t / 1e6
            row[f"split_{tag}_ms"] = t
            row[f"hi_{tag}_GBs"] = 6 * m * n / _ms(hi_only) / 1e6
        ek.FAST_SPLIT = "transposed"
        RESULT["rate_gbs"][vname] = row
        print(f"rate {vname}: copy {row['copy_GBs']:.0f} GB/s; split old "
              f"{row['split_old_GBs']:.0f} ({row['split_old_ms']:.2f} ms), new "
              f"{row['split_new_GBs']:.0f} ({row['split_new_ms']:.2f} ms); hi only old "
              f"{row['hi_old_GBs']:.0f}, new {row['hi_new_GBs']:.0f}", flush=True)
    # the unscaling of a product (float32 in, float32 out) and C -= unscale(P) into a view
    c = big[:, :8192].copy()
    r = cp.asarray(np.random.default_rng(8).integers(-20, 20, size=(16384, 1)), dtype=cp.int32)
    s_ = cp.asarray(np.random.default_rng(9).integers(-20, 20, size=(1, 8192)), dtype=cp.int32)
    row = {}
    view = big[:, 4096:12288]
    for fast in (False, True):
        ek.FAST_UNSCALE_INTO = fast
        tag = "new" if fast else "old"
        row[f"unscale_{tag}_GBs"] = 8 * c.size / _ms(functools.partial(ek.unscale, c, r, s_,
                                                                      cp.float32)) / 1e6

        def sub(fast=fast, view=view, c=c):
            if fast:
                ek.unscale_into(view, c, r, s_, True)
            else:
                view.__isub__(ek.unscale(c, r, s_, cp.float32))
        row[f"sub_{tag}_ms"] = _ms(sub)
    ek.FAST_UNSCALE_INTO = True
    RESULT["rate_gbs"]["unscale 16384x8192"] = row
    print(f"unscale 16384x8192: old {row['unscale_old_GBs']:.0f} GB/s, new "
          f"{row['unscale_new_GBs']:.0f}; C -= unscale(P) into a view: old "
          f"{row['sub_old_ms']:.2f} ms (unscale + subtract), new {row['sub_new_ms']:.2f} ms",
          flush=True)
    del big, views, c, view
    cp.get_default_memory_pool().free_all_blocks()


def _errors(a, q, r) -> tuple[float, float]:
    a64, q64, r64 = (x.astype(cp.float64) for x in (a, q, r))
    back = float(cp.linalg.norm(a64 - q64 @ r64) / cp.linalg.norm(a64))
    n = q64.shape[1]
    orth = float(cp.linalg.norm(q64.T @ q64 - cp.eye(n)) / np.sqrt(n))
    return back, orth


@guarded
def qr_checks() -> None:
    import mpqr

    rng = np.random.default_rng(11)
    for prec, dt in (("fp32-emulated", np.float32), ("fp64-emulated", np.float64),
                     ("fp16", np.float32)):
        a = cp.asarray(rng.standard_normal((4096, 4096)).astype(dt))
        errs = {}
        for name in ("off", "on"):
            levers(*CONFIGS[name])
            with mpqr.explain() as trace:
                q, r = mpqr.qr(a, precision=prec, method="householder-recursive")
            errs[name] = _errors(a, q, r)
            if name == "on" and prec == "fp32-emulated":
                prepared = [g for g in trace.gemms if "prepared=" in str(g)]
                status("explain says prepared= (4096^2 fp32-emulated)", len(prepared) > 0,
                       f"{len(prepared)} products read prepared operands")
        levers(*CONFIGS["on"])
        (b0, o0), (b1, o1) = errs["off"], errs["on"]
        RESULT["qr_errors"][prec] = errs
        status(f"qr 4096^2 {prec} levers on", b1 <= 2 * b0 + 1e-15 and o1 <= 2 * o0 + 1e-15,
               f"backward {b1:.2e} (off {b0:.2e}), orthogonality {o1:.2e} (off {o0:.2e})")


@guarded
def qr_timings() -> None:
    import mpqr

    rng = cp.random.default_rng(13)
    plan = [(16384, np.float32, "fp32-emulated", list(CONFIGS)),
            (16384, np.float32, "fp16", ["off", "on"]),
            (16384, np.float64, "fp64-emulated", ["off", "on"]),
            (8192, np.float32, "fp32-emulated", ["off", "fused unscale", "prepared", "on"]),
            (8192, np.float32, "fp16", ["off", "on"]),
            (8192, np.float64, "fp64-emulated", ["off", "on"])]
    bases: dict = {}
    for nn, dt, prec, configs in plan:
        if time.perf_counter() - T0 > 76:
            print(f"skipped {nn}^2 {prec}: time budget", flush=True)
            continue
        a = rng.standard_normal((nn, nn), dtype=dt)
        key = (nn, np.dtype(dt).name)
        if key not in bases:
            bases[key] = _ms(functools.partial(cp.linalg.qr, a), repeat=3 if nn > 8192 else 5)
        base = bases[key]
        row = {"shape": f"{nn}x{nn}", "precision": prec, f"cusolver_{key[1]}_ms": base}
        times = {c: [] for c in configs}
        call = functools.partial(mpqr.qr, a, precision=prec, method="householder-recursive")
        for c in configs:  # warm-up (compiles)
            levers(*CONFIGS[c])
            call()
        cp.cuda.Device().synchronize()
        for _ in range(5):
            for c in configs:
                levers(*CONFIGS[c])
                s, e = cp.cuda.Event(), cp.cuda.Event()
                s.record()
                call()
                e.record()
                e.synchronize()
                times[c].append(cp.cuda.get_elapsed_time(s, e))
        levers(*CONFIGS["on"])
        for c in configs:
            t = float(np.median(times[c]))
            row[f"{c}_ms"] = t
            row[f"{c}_speedup"] = base / t
        RESULT["qr"].append(row)
        cells = [f"{c} {row[c + '_ms']:.1f} ms ({row[c + '_speedup']:.2f}x)" for c in configs]
        print(f"qr {nn}^2 {prec}: cuSOLVER {base:.1f} ms; " + ", ".join(cells), flush=True)
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
    print(f"{RESULT['device']}, CuPy {cp.__version__}", flush=True)
    if compile_check():
        kernel_checks()
        product_checks()
        rates()
        qr_checks()
        qr_timings()
    else:
        levers(False, False, True)  # the prepared operands run on the old kernels
        product_checks()
        qr_checks()
    timer.cancel()
    fails = [k for k, v in RESULT["checks"].items() if not v["pass"]]
    print(f"\n{len(RESULT['checks']) - len(fails)} PASS, {len(fails)} FAIL"
          + (": " + "; ".join(fails) if fails else "")
          + f"  ({time.perf_counter() - T0:.0f} s)")
    _write()


if __name__ == "__main__":
    main()
