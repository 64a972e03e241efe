"""The ``tc-fp16`` product with its epilogue fused (Triton) against the engine's separate
passes: checks, product timings, tile configurations and the fp16 QR, A/B in one process.

``python3 bench/probes/fused_gemm.py OUT.json [checks] [gemm] [configs] [qr]`` (default:
all; a GPU with Triton installed).

* ``checks``: the fused result against the separate passes' on odd shapes, strides, views,
  rows scaled over float32's range, subnormal rows, Inf/NaN and 64-bit offsets; the
  differences must lie within the float32 accumulation's bound ``2 k u32 |A||B|`` (and
  ``2 u32 |C|`` for ``C -= A B``) and the non-finite outputs must be the same.
* ``gemm``: ``C -= A B`` through the policy (engine ``tc-fp16``) at the fp16 QR's shapes.
* ``configs``: the tile shapes of :data:`mpqr.backends.cupy.triton_gemm.CONFIGS` and others.
* ``qr``: ``householder-recursive`` at ``precision="fp16"`` (16384^2, 32768^2,
  65536 x 8192; modes reduced and r), fused and separate alternating twice, beside
  cuSOLVER, with backward error and orthogonality.
"""

from __future__ import annotations

import json
import sys
import time

import cupy as cp
from mpqr.backends.cupy import triton_gemm as tg

import mpqr
from mpqr.bench._timing import environment, release_pool, time_it
from mpqr.policy import gemm_into, gemm_sub

U32 = 2.0**-24
FP16 = {"engine": "tc-fp16"}


def switched(on, fn):
    """fn() with the fused kernel on or off."""
    keep = tg.ENABLED
    tg.ENABLED = on
    try:
        return fn()
    finally:
        tg.ENABLED = keep


def check(name, a, b, c0, mode):
    """One case: the fused and the separate result of ``c0 -= a @ b`` (``mode="sub"``) or
    ``c = a @ b`` (``"set"``)."""
    def run():
        c = c0.copy() if mode == "sub" else cp.full_like(c0, cp.nan)
        (gemm_sub if mode == "sub" else gemm_into)(c, a, b, precision="fp16", options=FP16)
        return c
    with mpqr.explain() as tr:
        on = switched(True, run)
        off = switched(False, run)
    kernels = sorted({str(d.params.get("kernel")) for d in tr.gemms})
    k = a.shape[1]
    a64, b64 = a.astype(cp.float64), b.astype(cp.float64)
    bound = 2 * k * U32 * (cp.abs(a64) @ cp.abs(b64)) \
        + 2 * U32 * cp.abs(c0.astype(cp.float64)) * (mode == "sub")
    fin = cp.isfinite(on) & cp.isfinite(off)
    d = cp.abs(on.astype(cp.float64) - off.astype(cp.float64))
    ratio = float(cp.max(cp.where(fin, d / cp.maximum(bound, 1e-300), 0.0)))
    same = bool(cp.all(cp.isnan(on) == cp.isnan(off)) and cp.all(cp.isinf(on) == cp.isinf(off))
                and cp.all(cp.where(cp.isinf(on), on == off, True)))
    ok = ratio <= 1.0 and same
    print(f"check {name:<30} {mode:<4} diff/bound {ratio:.3f} nonfinite-equal {same} "
          f"kernel {kernels} {'ok' if ok else 'FAIL'}", flush=True)
    return {"case": name, "mode": mode, "diff_over_bound": ratio, "nonfinite_equal": same,
            "kernels": kernels, "ok": ok}


def checks():
    rng = cp.random.default_rng(3)
    f32 = cp.float32

    def normal(*shape):
        return rng.standard_normal(shape, dtype=f32)

    m, n, k = 2000, 1500, 777
    a, b, c = normal(m, k), normal(k, n), normal(m, n)
    rows = [check("plain", a, b, c, "set"), check("plain", a, b, c, "sub"),
            check("A transposed view", cp.asfortranarray(a), b, c, "sub"),
            check("A^T of a wide array", normal(k, m).T, b, c, "sub")]
    big = normal(m + 37, n + 300)
    rows.append(check("C a column block", a, b, big[37:, 100:100 + n], "sub"))
    rows.append(check("B a block, k odd", a[:, :775], normal(900, n + 5)[3:778, 5:], c, "sub"))
    sc = a * (f32(2.0) ** rng.integers(-120, 100, (m, 1)).astype(f32))
    rows.append(check("rows scaled 2^-120..2^100", sc, b, c, "sub"))
    sub = a.copy()
    sub[:10] *= f32(1e-40)  # float32 subnormals
    rows.append(check("subnormal rows", sub, b, c * 0, "sub"))
    bad = a.copy()
    bad[3, 5] = cp.inf
    bad[7, 9] = cp.nan
    bb = b.copy()
    bb[11, 4] = -cp.inf
    rows.append(check("Inf and NaN", bad, bb, c, "sub"))
    keep = tg.WIDE_FROM
    tg.WIDE_FROM = 0
    try:
        rows.append(check("64-bit offsets", a, b, c, "sub"))
    finally:
        tg.WIDE_FROM = keep
    rows.append(check("too small: separate passes", a[:100], b[:, :100], c[:100, :100], "sub"))
    return rows


GEMM_SHAPES = [(16384, 8192, 8192), (8192, 8192, 16384), (16384, 1024, 1024),
               (1024, 1024, 16384), (65536, 4096, 4096), (4096, 4096, 65536),
               (32768, 16384, 16384)]


def operands(m, n, k, seed):
    rng = cp.random.default_rng(seed)
    return (rng.standard_normal((m, k), dtype=cp.float32),
            rng.standard_normal((k, n), dtype=cp.float32),
            rng.standard_normal((m, n), dtype=cp.float32))


def time_sub(a, b, c):
    return time_it(cp, lambda: gemm_sub(c, a, b, precision="fp16", options=FP16), repeat=5)


def gemms():
    rows = []
    for m, n, k in GEMM_SHAPES:
        release_pool(cp)
        a, b, c = operands(m, n, k, 5)
        ts = {True: [], False: []}
        for _ in range(2):
            for on in (True, False):
                ts[on].append(switched(on, lambda a=a, b=b, c=c: time_sub(a, b, c)))
        on, off = min(ts[True]), min(ts[False])
        tf = 2.0 * m * n * k / 1e12
        print(f"gemm_sub {m}x{n}x{k}: fused {on * 1e3:.2f} ms ({tf / on:.0f} TFLOP/s), "
              f"separate {off * 1e3:.2f} ms ({tf / off:.0f})", flush=True)
        rows.append({"m": m, "n": n, "k": k, "fused_ms": on * 1e3, "separate_ms": off * 1e3,
                     "fused_tflops": tf / on, "separate_tflops": tf / off})
    return rows


def configs():
    rows = []
    cands = [(128, 128, 64, 8, 4), (128, 256, 64, 8, 3), (128, 256, 64, 8, 4),
             (128, 128, 32, 4, 4), (64, 128, 64, 4, 4)]
    keep = tg.CONFIGS
    for m, n, k in [(16384, 8192, 8192), (2048, 2048, 16384), (16384, 1024, 1024)]:
        release_pool(cp)
        a, b, c = operands(m, n, k, 6)
        for cfg in cands:
            tg.CONFIGS = (cfg,)
            try:
                t = time_sub(a, b, c)
                tf, err = 2.0 * m * n * k / 1e12 / t, None
            except Exception as e:  # a configuration that does not fit
                t, tf, err = None, None, f"{type(e).__name__}: {str(e)[:120]}"
            finally:
                tg.CONFIGS = keep
            print(f"config {m}x{n}x{k} {cfg}: "
                  + (f"{t * 1e3:.2f} ms {tf:.0f} TFLOP/s" if t else err), flush=True)
            rows.append({"shape": [m, n, k], "config": list(cfg), "ms": t and t * 1e3,
                         "tflops": tf, "error": err})
    return rows


def measure(a, q, r):
    a64, q64, r64 = (v.astype(cp.float64) for v in (a, q, r))
    be = float(cp.linalg.norm(a64 - q64 @ r64) / cp.linalg.norm(a64))
    del r64
    orth = float(cp.linalg.norm(q64.T @ q64 - cp.eye(q.shape[1])) / q.shape[1])
    return be, orth


def fp16_qr(a, mode="reduced"):
    return mpqr.qr(a, precision="fp16", method="householder-recursive", mode=mode)


def qrs():
    rows = []
    for m, n in ((16384, 16384), (32768, 32768), (65536, 8192)):
        release_pool(cp)
        a = cp.random.default_rng(m + n).standard_normal((m, n), dtype=cp.float32)
        base = time_it(cp, lambda a=a: cp.linalg.qr(a), repeat=2)
        release_pool(cp)
        acc = {}
        for on in (True, False):
            q, r = switched(on, lambda a=a: fp16_qr(a))
            acc[on] = measure(a, q, r)
            del q, r
            release_pool(cp)
        for mode in ("reduced", "r"):
            ts = {True: [], False: []}
            for _ in range(2):
                for on in (True, False):
                    ts[on].append(switched(on, lambda a=a, mode=mode: time_it(
                        cp, lambda: fp16_qr(a, mode), repeat=2)))
                    release_pool(cp)
            row = {"m": m, "n": n, "mode": mode, "cusolver_ms": base * 1e3}
            for on, name in ((True, "fused"), (False, "separate")):
                row[name] = {"ms": min(ts[on]) * 1e3, "runs_ms": [t * 1e3 for t in ts[on]],
                             "speedup": base / min(ts[on]), "backward": acc[on][0],
                             "orthogonality": acc[on][1]}
            rows.append(row)
            print(f"qr fp16 {m}x{n} {mode} (cuSOLVER {base * 1e3:.1f} ms): " + "; ".join(
                f"{nm} {row[nm]['ms']:.1f} ms x{row[nm]['speedup']:.2f} back "
                f"{row[nm]['backward']:.2e} orth {row[nm]['orthogonality']:.2e}"
                for nm in ("fused", "separate")), flush=True)
    return rows


def main(argv):
    out = argv[0]
    parts = argv[1:] or ["checks", "gemm", "configs", "qr"]
    res = {"environment": environment(cp), "triton_available": tg.available()}
    t0 = time.perf_counter()
    for part in parts:
        res[part] = {"checks": checks, "gemm": gemms, "configs": configs, "qr": qrs}[part]()
        with open(out, "w") as f:
            json.dump(res, f, indent=1)
        print(f"[{part} done at {time.perf_counter() - t0:.0f} s]", flush=True)
    return 1 if any(not r["ok"] for r in res.get("checks", [])) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
