"""QR: mpqr.qr against cuSOLVER (``cupy.linalg.qr``), time and errors.

``python -m mpqr bench qr``.

For every shape and precision: median time over repeats (CUDA events, after a
warm-up, fresh random normal data), TFLOP/s (LAPACK flop counts), speed-up over
``cupy.linalg.qr`` of the same dtype in the same process, the fraction of the
memory floor (read A, write Q and R, once, at the device-copy rate measured in the
same process) and of the engine's GEMM rate (``mpqr.matmul`` at 8192^3 at that precision,
measured in the same process; :data:`FLOP_CONVENTION` says which flops are counted),
backward error ||A - QR||_F / ||A||_F and orthogonality ||I - Q^T Q||_F / n (``Q^T Q`` in
double-double where the backend has that kernel: :func:`orthogonality`).

``--pivoting``: QR with column pivoting (``mpqr.qr(a, pivoting=True)``, mode reduced)
against the unpivoted ``cupy.linalg.qr`` (geqrf + orgqr) of the same dtype in the same
process (cuSOLVER has no geqp3), and against SciPy's geqp3
(``scipy.linalg.qr(pivoting=True)``) on the host at ``--geqp3-shapes``; backward error
``||A[:, P] - QR||_F / ||A||_F``. On the CPU the NumPy backend runs against NumPy's
unpivoted QR and SciPy's geqp3. ``--qrcp-blocks 128,256`` times the first precision
once per block width of the randomized QRCP (the row's ``qrcp_block``).

``--cpu --lapack``: mpqr.qr against ``numpy.linalg.qr`` and ``scipy.linalg.qr(mode=
"economic")`` on the host, timed interleaved (``mpqr.bench.qr_lapack``).

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
from mpqr._array_api import array_namespace
from mpqr.backends import get_backend
from mpqr.bench._charts import grouped_bars
from mpqr.bench._timing import (
    default_xp,
    environment,
    is_cupy,
    parse_shapes,
    release_pool,
    shapes_or_default,
    time_it,
    write_json,
)

#: ``--shapes square`` (the compute-bound shapes) and ``--shapes tall``; the default is both
SQUARE_SHAPES = [(8192, 8192, 1), (16384, 16384, 1), (32768, 32768, 1), (65536, 8192, 1),
                 (65536, 4096, 1)]
TALL_SHAPES = [(2**20, 256, 1), (2**22, 64, 1), (2**24, 32, 1), (256, 32, 10000)]
GPU_SHAPES = SQUARE_SHAPES + TALL_SHAPES
#: the flop convention of every TFLOP/s figure
FLOP_CONVENTION = ("LAPACK's: geqrf 2mn^2 - 2n^3/3 for R, and as much again (orgqr) for "
                   "the reduced Q; per matrix of a batch")
CPU_SHAPES = [(512, 512, 1), (8192, 64, 1), (64, 16, 200)]
PRECISIONS = ["fp16", "fp32-emulated", "fp32", "fp64-emulated", "fp64"]
#: --pivoting: shapes, precisions (fp32-emulated/fp16 on float32 data, against cuSOLVER's
#: float32 QR) and the host geqp3 comparison's shapes
PIVOTED_GPU_SHAPES = [(16384, 16384, 1), (65536, 4096, 1)]
PIVOTED_CPU_SHAPES = [(2000, 2000, 1)]
PIVOTED_PRECISIONS = ["auto", "fp32-emulated", "fp16"]
GEQP3_GPU_SHAPES = [(4096, 4096, 1)]
# engine GEMM rates (FLOP/s) on H200 measured by `bench gemm` (bench/results): used only
# where the run does not measure its own (--no-peak, or the CPU)
# (``auto``: float64 data, whose products it runs natively or on the fp64-accurate engine)
ENGINE_RATE = {"fp16": 690e12, "fp32-emulated": 230e12, "fp32": 50e12,
               "fp64-emulated": 62e12, "fp64": 62e12, "auto": 62e12}
#: the size of the GEMM that measures each precision's engine rate in the bench's process
PEAK_GEMM_N = 8192


def engine_peaks(xp, precisions) -> dict[str, float]:
    """FLOP/s of ``mpqr.matmul`` at ``PEAK_GEMM_N``^3 for each precision, measured in this
    process on the dtype its QR rows use: the denominator of each row's share of the
    engine's peak."""
    rng = np.random.default_rng(3)
    n = PEAK_GEMM_N
    peaks = {}
    for prec in precisions:
        dt = np.float64 if prec.startswith("fp64") else np.float32
        a = xp.asarray(rng.standard_normal((n, n)).astype(dt))
        b = xp.asarray(rng.standard_normal((n, n)).astype(dt))
        t = time_it(xp, lambda a=a, b=b, p=prec: mpqr.matmul(a, b, precision=p), repeat=5)
        peaks[prec] = 2.0 * n**3 / t
        print(f"engine peak {prec:<14} {peaks[prec] / 1e12:8.1f} TFLOP/s "
              f"(mpqr.matmul {n}^3, {np.dtype(dt).name})")
        del a, b
        release_pool(xp)
    return peaks


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
    return res, orthogonality(xp, q64, n) / n / math.sqrt(max(1, math.prod(a.shape[:-2])))


def orthogonality(xp, q64, n: int) -> float:
    """``||Q^T Q - I||_F`` of a float64 ``Q``; for 2-D ``Q`` of 2 to ``gram_dd_max_n``
    columns on a backend with a double-double Gram kernel (CuPy: 128), from a
    double-double ``Q^T Q``. A float64 GEMM's own rounding is of the size measured
    there (a few units in the last place of each diagonal entry at ``2^22`` rows), and it
    correlates with that of a factorization whose Gram products ran on the same kernel:
    at ``2^22 x 64`` (H200) the GEMM read ``2.1e-15`` for a Q whose double-double check
    reads ``6.3e-15`` (``bench/probes/split_k_ab.py``)."""
    backend = get_backend(xp)
    eye = xp.eye(n, dtype=xp.float64)
    if q64.ndim == 2 and 2 <= n <= backend.gram_dd_max_n and q64.shape[0] >= n:
        acc = xp.zeros((2, n, n), dtype=xp.float64)  # the bench's one device
        acc = backend.gram_dd_update(q64[:, : n - 1], q64[:, n - 1:], acc)
        return float(xp.linalg.norm((acc[0, ...] - eye) + acc[1, ...]))
    return float(xp.linalg.norm(xp.matrix_transpose(q64) @ q64 - eye))


def _member_errors(xp, a, q, r) -> tuple[float, float]:
    """Worst member of a stack: ``max ||a_i - q_i r_i|| / ||a_i||`` and
    ``max ||q_i^T q_i - I|| / n`` (Frobenius norms, float64)."""
    a64, q64, r64 = (xp.astype(v, xp.float64) for v in (a, q, r))
    n = r.shape[-1]
    num = xp.sqrt(xp.sum((a64 - q64 @ r64) ** 2, axis=(-2, -1)))
    den = xp.sqrt(xp.sum(a64 ** 2, axis=(-2, -1)))
    g = xp.matrix_transpose(q64) @ q64 - xp.eye(n, dtype=xp.float64)
    orth = xp.sqrt(xp.sum(g ** 2, axis=(-2, -1))) / n
    return float(xp.max(num / den)), float(xp.max(orth))


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
        conds: tuple[float, ...] = (1.0,), measure_peaks: bool = True) -> dict[str, Any]:
    rng = np.random.default_rng(1)
    rows = []
    bandwidth = copy_bandwidth(xp)
    print(f"device copy: {bandwidth / 1e12:.2f} TB/s (read + write): the memory floor's rate")
    peaks = engine_peaks(xp, precisions) if measure_peaks and is_cupy(xp) else {}
    peak_of = {p: peaks.get(p, ENGINE_RATE[p]) for p in precisions}
    for m, n, batch in shapes:
        tall = batch == 1 and m >= 16 * n
        for cond in (conds if tall else (1.0,)):
            rows += _shape_rows(xp, rng, m, n, batch, cond, precisions, modes, bandwidth,
                                peak_of, repeat=repeat, max_seconds=max_seconds)
            release_pool(xp)
    return {"environment": {**environment(xp), "copy_bandwidth": bandwidth},
            "flop_convention": FLOP_CONVENTION,
            "engine_peaks_tflops": {p: v / 1e12 for p, v in peaks.items()},
            "results": rows}


def _shape_rows(xp, rng, m, n, batch, cond, precisions, modes, bandwidth, peak_of, *,
                repeat, max_seconds) -> list[dict[str, Any]]:
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
            worst = _member_errors(xp, a, q, r) if batch > 1 else None
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
        if worst:
            rows[-1]["backward_error_worst_member"], rows[-1]["orthogonality_worst_member"] = \
                worst
        print(f"{label:>18} {'cupy.linalg.qr ' + dt:<28} {t * 1e3:10.3f} ms  "
              f"err {res:.1e} orth {orth:.1e}")
    for prec in precisions:
        dt = "float64" if prec in ("auto", "fp64", "fp64-emulated") else "float32"
        a = data[dt]
        for mode in modes:
            release_pool(xp)
            try:
                with mpqr.explain() as tr:
                    out = mpqr.qr(a, mode=mode, precision=prec)
                method = next((e.message for e in tr.events if e.kind == "method"), "")
                route = _route(tr)
                engines = tr.engines()
                worst = None
                if mode == "reduced":
                    res, orth = _errors(xp, a, out.Q, out.R)
                    worst = _member_errors(xp, a, out.Q, out.R) if batch > 1 else None
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
                   "engine_peak_tflops": peak_of[prec] / 1e12,
                   "engine_rate_fraction": flops / t / peak_of[prec],
                   "backward_error": res, "orthogonality": orth,
                   "method": method, "engines": engines}
            if worst:
                row["backward_error_worst_member"], row["orthogonality_worst_member"] = worst
            row.update(_graph_state(xp, a))
            if base.get(dt):
                row["speedup_vs_cusolver"] = base[dt] / t
            rows.append(row)
            sp = f"x{row['speedup_vs_cusolver']:.2f}" if "speedup_vs_cusolver" in row else ""
            er = f"err {res:.1e} orth {orth:.1e}" if res is not None else ""
            print(f"{label:>18} {prec + ' ' + mode:<28} {t * 1e3:10.3f} ms {sp:>8} "
                  f"{row['tflops']:8.2f} TFLOP/s ({100 * row['engine_rate_fraction']:4.1f}% "
                  f"of the engine) floor {100 * row['floor_fraction']:5.1f}% {er} {route}"
                  + (" [graph capture failed]" if row.get("graph_failures") else ""))
    del data
    return rows


def _graph_state(xp, a) -> dict[str, Any]:
    """Whether the timed calls of ``a`` replayed a CUDA graph (CuPy), and why a capture of
    its shape failed: a process whose capture failed launches every kernel from Python."""
    if not is_cupy(xp):
        return {}
    from mpqr.backends.cupy import graphs

    sig = (tuple(a.shape), str(a.dtype))
    return {"graph_replayed": any(k[1:3] == sig for k in graphs.kept()),
            "graph_failures": sorted({v for k, v in graphs.FAILED.items() if k[1:3] == sig})}


def run_pivoted(shapes, precisions, geqp3_shapes, *, xp, repeat: int,
                max_seconds: float, qrcp_blocks: list[int] | None = None) -> dict[str, Any]:
    """The ``--pivoting`` rows (module docstring); with ``qrcp_blocks``, the first
    precision's rows once per randomized-QRCP block width."""
    import scipy.linalg as sla

    rng = np.random.default_rng(2)
    rows = []

    def errors(a, q, r, p):
        a64, q64, r64 = (xp.astype(v, xp.float64) for v in (a, q, r))
        ap = xp.take(a64, xp.astype(p, xp.int64), axis=1)
        res = float(xp.linalg.norm(ap - q64 @ r64) / xp.linalg.norm(a64))
        k = q.shape[1]
        orth = float(xp.linalg.norm(xp.matrix_transpose(q64) @ q64 - xp.eye(k, dtype=xp.float64))
                     / k)
        return res, orth

    for m, n, _ in dict.fromkeys([*shapes, *geqp3_shapes]):
        label = f"{m}x{n}"
        host = {"float64": rng.standard_normal((m, n))}
        host["float32"] = host["float64"].astype(np.float32)
        data = {dt: xp.asarray(v) for dt, v in host.items()}
        base = {}
        for dt, a in data.items():
            release_pool(xp)
            t = time_it(xp, lambda a=a: xp.linalg.qr(a), repeat=repeat, max_seconds=max_seconds)
            base[dt] = t
            rows.append({"shape": label, "precision": f"unpivoted-{dt}", "mode": "reduced",
                         "time_ms": t * 1e3})
            name = "cupy.linalg.qr" if is_cupy(xp) else "numpy.linalg.qr"
            print(f"{label:>12} {name + ' ' + dt + ' (no pivoting)':<40} {t * 1e3:10.1f} ms")
        geqp3 = None
        if (m, n, 1) in geqp3_shapes:
            geqp3 = time_it(np, lambda h=host["float64"]: sla.qr(h, mode="economic",
                                                                   pivoting=True,
                                                                   check_finite=False),
                            repeat=max(1, min(repeat, 2)), warmup=0, max_seconds=max_seconds)
            rows.append({"shape": label, "precision": "scipy-geqp3-float64", "mode": "reduced",
                         "time_ms": geqp3 * 1e3})
            print(f"{label:>12} {'scipy geqp3 float64 (host)':<40} {geqp3 * 1e3:10.1f} ms")
        runs = [(prec, None) for prec in (precisions if (m, n, 1) in shapes else precisions[:1])]
        if qrcp_blocks and (m, n, 1) in shapes:
            runs[:1] = [(precisions[0], b) for b in qrcp_blocks]
        for prec, blk in runs:
            dt = "float64" if prec in ("auto", "fp64", "fp64-emulated") else "float32"
            a = data[dt]
            release_pool(xp)
            backend_cls = type(get_backend(array_namespace(a)))
            saved = backend_cls.qrcp_block
            if blk is not None:
                backend_cls.qrcp_block = blk
            try:
                with mpqr.explain() as tr:
                    q, r, p = mpqr.qr(a, pivoting=True, precision=prec)
                res, orth = errors(a, q, r, p)
                method = next((e.message for e in tr.events if e.kind == "method"), "")
                dg = xp.abs(xp.diagonal(r))  # NumPy and CuPy (the raw modules) both have it
                increases = int(xp.sum(xp.astype(dg[1:] > dg[:-1], xp.int32)))
                del q, r, p, dg
                t = time_it(xp, lambda a=a, pr=prec: mpqr.qr(a, pivoting=True, precision=pr),
                            repeat=repeat, max_seconds=max_seconds)
                t_rand = None
                if prec == "auto" and blk is None:  # the opt-in, non-monotone order
                    t_rand = time_it(xp, lambda a=a: mpqr.qr(a, pivoting="randomized"),
                                     repeat=repeat, max_seconds=max_seconds)
            except Exception as exc:
                rows.append({"shape": label, "precision": prec, "pivoting": True,
                             "error": f"{type(exc).__name__}: {exc}"})
                print(f"{label:>12} {prec} pivoting: {type(exc).__name__}: {exc}")
                continue
            finally:
                backend_cls.qrcp_block = saved
            row = {"shape": label, "precision": prec, "mode": "reduced", "pivoting": True,
                   "dtype": dt, "time_ms": t * 1e3, "backward_error": res,
                   "orthogonality": orth, "method": method,
                   "diagonal_increases": increases, "time_vs_unpivoted": t / base[dt]}
            if t_rand is not None:
                row["randomized_time_ms"] = t_rand * 1e3
            if blk is not None:
                row["qrcp_block"] = blk
            if geqp3 is not None and dt == "float64":
                row["speedup_vs_geqp3"] = geqp3 / t
            rows.append(row)
            vs = f"{row['time_vs_unpivoted']:.2f}x unpivoted"
            gq = f", {row['speedup_vs_geqp3']:.1f}x faster than geqp3" if \
                "speedup_vs_geqp3" in row else ""
            tag = f"mpqr pivoting {prec} {dt}" + (f" b={blk}" if blk is not None else "")
            print(f"{label:>12} {tag:<40} {t * 1e3:10.1f} ms "
                  f"({vs}{gq}) err {res:.1e} orth {orth:.1e} |diag(R)| increases {increases}"
                  + (f"; pivoting='randomized' {t_rand * 1e3:.1f} ms" if t_rand else ""))
        del data
    return {"environment": environment(xp), "results": rows}


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
                   help="comma list of MxN or BxMxN, or 'square' / 'tall' (default: both) / "
                   "'batched' (stacks of small matrices)")
    p.add_argument("--no-peak", action="store_true",
                   help="skip measuring each engine's GEMM rate (shares use H200 constants)")
    p.add_argument("--precisions", default=",".join(PRECISIONS))
    p.add_argument("--modes", default="reduced,r")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--max-seconds", type=float, default=20.0, help="time cap per config")
    p.add_argument("--conds", default="1",
                   help="comma list of cond(A) for the tall-skinny shapes (default: Gaussian only)")
    p.add_argument("--sweep", action="store_true",
                   help="with --shapes batched: the stack sweep instead (n = 8..512, m/n = "
                   "1..16, float32 and float64, about --sweep-mb a stack) against "
                   "cupy.linalg.qr and torch.linalg.qr (mpqr.bench.batched_sweep)")
    p.add_argument("--sweep-mb", type=float, default=64.0,
                   help="--sweep: megabytes of data a stack (batch capped at 65536)")
    p.add_argument("--budget-s", type=float, default=None,
                   help="--sweep: the whole sweep within about this many seconds (the "
                   "looping baselines scaled from 16 members where the whole stack would "
                   "not fit a row's share; rows past it skipped and listed)")
    p.add_argument("--json", default=None)
    p.add_argument("--png", default=None,
                   help="draw the speed-ups here (needs matplotlib)")
    p.add_argument("--cpu", action="store_true")
    p.add_argument("--lapack", action="store_true",
                   help="with --cpu: mpqr.qr against numpy.linalg.qr and "
                   "scipy.linalg.qr(mode='economic'), float64, timed interleaved "
                   "(default shape 4000x4000)")
    p.add_argument("--threads", type=int, default=None,
                   help="with --lapack: BLAS threads of every call (default: the BLAS's own)")
    p.add_argument("--pivoting", action="store_true",
                   help="only the QR-with-column-pivoting rows (default shapes 16384x16384, "
                   "65536x4096 on the GPU, 2000x2000 on the CPU; precisions "
                   f"{','.join(PIVOTED_PRECISIONS)})")
    p.add_argument("--geqp3-shapes", default=None,
                   help="--pivoting: shapes also timed with SciPy's geqp3 on the host "
                   "(default 4096x4096 on the GPU, the --shapes on the CPU)")
    p.add_argument("--qrcp-blocks", default=None,
                   help="--pivoting: comma list of block widths of the randomized QRCP to "
                   "time the first precision at (default: the backend's own)")
    args = p.parse_args(argv)
    xp = np if args.cpu else default_xp()
    if args.lapack:
        from mpqr.bench.qr_lapack import LAPACK_SHAPES, run_lapack

        if not args.cpu:
            p.error("--lapack compares the NumPy backend with the host's LAPACK: add --cpu")
        shapes = parse_shapes(args.shapes) if args.shapes else LAPACK_SHAPES
        write_json(args.json, run_lapack(shapes, repeat=args.repeat, threads=args.threads))
        return 0
    if args.pivoting:
        shapes = shapes_or_default(args.shapes, xp, PIVOTED_GPU_SHAPES, PIVOTED_CPU_SHAPES)
        geqp3 = shapes_or_default(args.geqp3_shapes, xp, GEQP3_GPU_SHAPES, shapes)
        precs = args.precisions.split(",") if args.precisions != ",".join(PRECISIONS) \
            else PIVOTED_PRECISIONS
        blocks = [int(b) for b in args.qrcp_blocks.split(",")] if args.qrcp_blocks else None
        payload = run_pivoted(shapes, precs, geqp3, xp=xp, repeat=args.repeat,
                              max_seconds=args.max_seconds, qrcp_blocks=blocks)
        write_json(args.json, payload)
        return 0
    if args.sweep:
        from mpqr.bench.batched_sweep import run_sweep

        if args.shapes != "batched" or args.cpu:
            p.error("--sweep runs with --shapes batched on the GPU")
        payload = {"environment": environment(xp),
                   "sweep": run_sweep(xp, target=int(args.sweep_mb * (1 << 20)),
                                      repeat=min(args.repeat, 5),
                                      budget_s=args.budget_s)}
        write_json(args.json, payload)
        return 0
    from mpqr.bench.batched_shapes import BATCHED_SHAPES

    preset = {"square": SQUARE_SHAPES, "tall": TALL_SHAPES,
              "batched": BATCHED_SHAPES}.get(args.shapes or "")
    shapes = preset or shapes_or_default(args.shapes, xp, GPU_SHAPES, CPU_SHAPES)
    payload = run(shapes, args.precisions.split(","), args.modes.split(","), xp=xp,
                  repeat=args.repeat, max_seconds=args.max_seconds,
                  conds=tuple(float(c) for c in args.conds.split(",")),
                  measure_peaks=not args.no_peak)
    write_json(args.json, payload)
    if args.png:
        plot(payload, args.png)
    return 0
