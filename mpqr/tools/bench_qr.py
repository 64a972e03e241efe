"""QR: mpqr.qr against cuSOLVER (``cupy.linalg.qr``), time and errors.

``python -m mpqr bench qr``.

For every shape and precision: median time over repeats (CUDA events, after a
warm-up, fresh random normal data), TFLOP/s (LAPACK flop counts), speed-up over
``cupy.linalg.qr`` of the same dtype in the same process, the fraction of the
memory floor (read A, write Q and R, once, at the device-copy rate measured in the
same process) and of the engine's GEMM rate,
backward error ||A - QR||_F / ||A||_F and orthogonality ||I - Q^T Q||_F / n.

``--conds 1,1e8,1e12,1e15``: tall-skinny shapes (``m >= 16 n``, one matrix) are also
timed on ``A = U diag(s) V^T`` with geometric singular values from 1 to ``1/cond``
(``U`` the Q of the Gaussian matrix's ``mpqr.qr``, built on the device); each row
carries its ``cond`` and the route from the explain trace (fallbacks, Gram passes).
"""

from __future__ import annotations

import argparse
import math
from typing import Any

import numpy as np

import mpqr
from mpqr.tools._charts import grouped_bars
from mpqr.tools._timing import (
    default_xp,
    environment,
    is_cupy,
    release_pool,
    shapes_or_default,
    time_it,
    write_json,
)

GPU_SHAPES = [(16384, 16384, 1), (65536, 4096, 1), (2**20, 256, 1), (2**22, 64, 1),
              (2**24, 32, 1), (256, 32, 10000)]
CPU_SHAPES = [(512, 512, 1), (8192, 64, 1), (64, 16, 200)]
PRECISIONS = ["fp16", "fp32-emulated", "fp32", "fp64-emulated", "fp64"]
# engine GEMM rates (FLOP/s) on H200 measured by `bench gemm` (bench/results)
ENGINE_RATE = {"fp16": 690e12, "fp32-emulated": 230e12, "fp32": 50e12,
               "fp64-emulated": 62e12, "fp64": 62e12}


def copy_bandwidth(xp) -> float:
    """Device-copy rate (bytes read + written per second) measured in this process: the
    memory floor's denominator (an H100 reads ~3 TB/s, an H200 ~4.1)."""
    n = 2**27 if is_cupy(xp) else 2**23  # 1 GiB on the GPU
    x = xp.ones(n, dtype=xp.float64)
    y = xp.empty_like(x)

    def copy():
        y[...] = x

    return 2 * 8 * n / time_it(xp, copy, repeat=5)


def qr_flops(m: int, n: int, mode: str) -> float:
    f = 2.0 * m * n * n - 2.0 * n**3 / 3.0  # geqrf
    if mode == "reduced":
        f *= 2.0  # + orgqr
    return f


def _errors(xp, a, q, r) -> tuple[float, float]:
    a64, q64, r64 = (xp.astype(v, xp.float64) for v in (a, q, r))
    n = r.shape[-1]
    res = float(xp.linalg.norm(a64 - q64 @ r64) / xp.linalg.norm(a64))
    eye = xp.eye(n, dtype=xp.float64)
    orth = float(xp.linalg.norm(xp.matrix_transpose(q64) @ q64 - eye) / n /
                 math.sqrt(max(1, math.prod(a.shape[:-2]))))
    return res, orth


def with_cond(xp, a, cond: float, rng) -> Any:
    """``U diag(s) V^T`` of ``a``'s shape and dtype, ``s`` geometric from 1 to ``1/cond``,
    ``U`` the Q of ``mpqr.qr(a)`` (``a`` Gaussian), ``V`` that of an ``n x n`` Gaussian."""
    n = a.shape[-1]
    u = mpqr.qr(xp.astype(a, xp.float64)).Q
    v = xp.linalg.qr(xp.asarray(rng.standard_normal((n, n))))[0]
    s = xp.asarray(cond ** (-np.arange(n) / max(n - 1, 1)))
    return xp.astype((u * s) @ xp.matrix_transpose(v), a.dtype)


def _route(trace) -> str:
    """``method -> fallback -> ...`` and the preconditioned route's Gram passes."""
    steps = [e.data["fallback"] for e in trace.events
             if e.kind == "fallback" and "fallback" in e.data]
    rt = next((e for e in trace.events if e.kind == "route"), None)
    tail = (f" ({rt.data['grams']} Gram passes, cond ~{rt.data['cond_estimate']:.1e})"
            if rt is not None else "")
    return " -> ".join(steps) + tail


def run(shapes, precisions, modes, *, xp, repeat: int, max_seconds: float,
        conds: tuple[float, ...] = (1.0,)) -> dict[str, Any]:
    rng = np.random.default_rng(1)
    rows = []
    bandwidth = copy_bandwidth(xp)
    print(f"device copy: {bandwidth / 1e12:.2f} TB/s (read + write): the memory floor's rate")
    for m, n, batch in shapes:
        tall = batch == 1 and m >= 16 * n
        for cond in (conds if tall else (1.0,)):
            rows += _shape_rows(xp, rng, m, n, batch, cond, precisions, modes, bandwidth,
                                repeat=repeat, max_seconds=max_seconds)
            release_pool(xp)
    return {"environment": {**environment(xp), "copy_bandwidth": bandwidth}, "results": rows}


def _shape_rows(xp, rng, m, n, batch, cond, precisions, modes, bandwidth, *, repeat,
                max_seconds) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    shape = (m, n) if batch == 1 else (batch, m, n)
    label = f"{m}x{n}" if batch == 1 else f"{batch}x({m}x{n})"
    data = {"float64": xp.asarray(rng.standard_normal(shape)),
            "float32": xp.asarray(rng.standard_normal(shape).astype(np.float32))}
    if cond != 1.0:
        data = {k: with_cond(xp, v, cond, rng) for k, v in data.items()}
        label += f" cond {cond:.0e}"
    base = {}
    for dt, a in data.items():
        release_pool(xp)
        try:
            t = time_it(xp, lambda a=a: xp.linalg.qr(a), repeat=repeat,
                        max_seconds=max_seconds)
            q, r = xp.linalg.qr(a)
            res, orth = _errors(xp, a, q, r)
            del q, r
        except Exception as exc:  # e.g. cuSOLVER without batched QR
            base[dt] = None
            rows.append({"shape": label, "precision": f"cusolver-{dt}", "error": str(exc)})
            print(f"{label:>18} cusolver {dt}: {exc}")
            continue
        base[dt] = t
        flops = qr_flops(m, n, "reduced") * batch
        rows.append({"shape": label, "cond": cond, "precision": f"cusolver-{dt}",
                     "mode": "reduced", "time_ms": t * 1e3, "tflops": flops / t / 1e12,
                     "backward_error": res, "orthogonality": orth})
        print(f"{label:>18} {'cupy.linalg.qr ' + dt:<28} {t * 1e3:10.3f} ms  "
              f"err {res:.1e} orth {orth:.1e}")
    for prec in precisions:
        dt = "float64" if prec.startswith("fp64") else "float32"
        a = data[dt]
        for mode in modes:
            release_pool(xp)
            try:
                with mpqr.explain() as tr:
                    out = mpqr.qr(a, mode=mode, precision=prec)
                method = next((e.message for e in tr.events if e.kind == "method"), "")
                route = _route(tr)
                engines = tr.engines()
                if mode == "reduced":
                    res, orth = _errors(xp, a, out.Q, out.R)
                else:
                    res = orth = None
                del out
                t = time_it(xp, lambda a=a, p=prec, md=mode: mpqr.qr(a, mode=md, precision=p),
                            repeat=repeat, max_seconds=max_seconds)
            except Exception as exc:
                rows.append({"shape": label, "precision": prec, "mode": mode,
                             "error": f"{type(exc).__name__}: {exc}"})
                print(f"{label:>18} {prec} {mode}: {type(exc).__name__}: {exc}")
                continue
            flops = qr_flops(m, n, mode) * batch
            itemsize = 8 if dt == "float64" else 4
            floor_bytes = (2 if mode == "reduced" else 1) * m * n * batch * itemsize
            floor_t = floor_bytes / bandwidth
            row = {"shape": label, "cond": cond, "precision": prec, "mode": mode,
                   "dtype": dt, "route": route,
                   "time_ms": t * 1e3, "tflops": flops / t / 1e12,
                   "memory_floor_ms": floor_t * 1e3, "floor_fraction": floor_t / t,
                   "engine_rate_fraction": flops / t / ENGINE_RATE[prec],
                   "backward_error": res, "orthogonality": orth,
                   "method": method, "engines": engines}
            if base.get(dt):
                row["speedup_vs_cusolver"] = base[dt] / t
            rows.append(row)
            sp = f"x{row['speedup_vs_cusolver']:.2f}" if "speedup_vs_cusolver" in row else ""
            er = f"err {res:.1e} orth {orth:.1e}" if res is not None else ""
            print(f"{label:>18} {prec + ' ' + mode:<28} {t * 1e3:10.3f} ms {sp:>8} "
                  f"{row['tflops']:8.2f} TFLOP/s floor {100 * row['floor_fraction']:5.1f}% "
                  f"{er} {route}")
    del data
    return rows


def plot(payload: dict[str, Any], path: str) -> bool:
    """Speed-up over cuSOLVER per shape and precision (mode reduced) as a PNG."""
    rows = [r for r in payload["results"] if r.get("mode") == "reduced"
            and "speedup_vs_cusolver" in r]
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    precs = [p for p in PRECISIONS if any(r["precision"] == p for r in rows)]
    series = {p: [next((r["speedup_vs_cusolver"] for r in rows if r["shape"] == s
                        and r["precision"] == p), None) for s in shapes] for p in precs}
    env = payload["environment"]
    return grouped_bars(path, shapes, series, reference=1.0,
                        ylabel="speed-up over cupy.linalg.qr (same dtype)",
                        title=f"mpqr.qr, mode=reduced — {env.get('device')} {env.get('date')}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mpqr bench qr", description=__doc__)
    p.add_argument("--shapes", default=None,
                   help="comma list of MxN or BxMxN (default: the standard GPU shapes)")
    p.add_argument("--precisions", default=",".join(PRECISIONS))
    p.add_argument("--modes", default="reduced,r")
    p.add_argument("--conds", default="1",
                   help="comma list of cond(A) for the tall-skinny shapes (default: 1, "
                        "Gaussian data only), e.g. 1,1e8,1e12,1e15")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--max-seconds", type=float, default=20.0, help="time cap per config")
    p.add_argument("--json", default=None)
    p.add_argument("--png", default=None,
                   help="draw the speed-ups here (needs matplotlib)")
    p.add_argument("--cpu", action="store_true")
    args = p.parse_args(argv)
    xp = np if args.cpu else default_xp()
    shapes = shapes_or_default(args.shapes, xp, GPU_SHAPES, CPU_SHAPES)
    payload = run(shapes, args.precisions.split(","), args.modes.split(","), xp=xp,
                  repeat=args.repeat, max_seconds=args.max_seconds,
                  conds=tuple(float(c) for c in args.conds.split(",")))
    write_json(args.json, payload)
    if args.png:
        plot(payload, args.png)
    return 0
