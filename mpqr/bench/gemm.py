"""GEMM engines: TFLOP/s and error of each precision setting.

``python -m mpqr bench gemm``.

Error is max_ij |C - AB|_ij / (|A||B|)_ij over a random sample of output
entries, each computed exactly on the host (exact products, ``math.fsum``),
so the reference is exact even at k = 2^20. Complex rows (ZGEMM/CGEMM and the
emulated engines' 2M/4M/3M products) use the modulus ``|.|`` and take the larger
of the two parts' errors; Gram rows time ``X^T X`` as one-triangle engine
calls (``mpqr.policy.gram``) against the engine's full product.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

import numpy as np

import mpqr
from mpqr.backends import get_backend
from mpqr.bench._charts import grouped_bars
from mpqr.bench._timing import default_xp, environment, time_it, to_host, write_json

GPU_SHAPES = [(8192, 8192, 8192), (16384, 16384, 16384), (2**20, 512, 512), (512, 512, 2**20)]
CPU_SHAPES = [(256, 256, 256), (512, 512, 512), (4096, 64, 64), (64, 64, 4096)]
GPU_COMPLEX_SHAPES = [(8192, 8192, 8192), (16384, 16384, 16384)]
CPU_COMPLEX_SHAPES = [(256, 256, 256)]
#: Gram matrices X^T X of (rows, columns) X
GPU_GRAM_SHAPES = [(2**20, 256), (2**18, 1024)]
CPU_GRAM_SHAPES = [(8192, 256)]

# (label, precision, input dtype, options)
ENGINES = [
    ("cuBLAS/native fp64", "fp64", "float64", None),
    ("fp64-emulated", "fp64-emulated", "float64", None),
    ("cuBLAS/native fp32", "fp32", "float32", None),
    ("fp32-emulated", "fp32-emulated", "float32", None),
    ("fp16", "fp16", "float32", None),
]


# complex: (label, precision, input dtype, options); the native row of a dtype comes first
COMPLEX_ENGINES = [
    ("cuBLAS/native complex128", "fp64", "complex128", None),
    ("fp64-emulated complex", "fp64-emulated", "complex128", None),
    ("fp64-emulated ozaki-int8 forced 2M", "fp64-emulated", "complex128",
     {"engine": "ozaki-int8"}),
    ("fp64-emulated ozaki-int8 forced 4M", "fp64-emulated", "complex128",
     {"engine": "ozaki-int8", "complex_product": "4m"}),
    ("fp64-emulated ozaki-int8 forced 3M", "fp64-emulated", "complex128",
     {"engine": "ozaki-int8", "complex_product": "3m"}),
    ("cuBLAS/native complex64", "fp32", "complex64", None),
    ("fp32-emulated 4M", "fp32-emulated", "complex64", None),
    ("fp32-emulated 3M", "fp32-emulated", "complex64", {"complex_product": "3m"}),
]

# Gram: (label, precision, input dtype, engine forced)
GRAM_ENGINES = [
    ("fp64-emulated ozaki-int8", "fp64-emulated", "float64", "ozaki-int8"),
    ("fp32-emulated tc-sgemm", "fp32-emulated", "float32", "tc-sgemm"),
]


def _exact_entries(a: np.ndarray, b: np.ndarray, rows, cols) -> np.ndarray:
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    out = np.empty(len(rows))
    absd = np.empty(len(rows))
    for t, (i, j) in enumerate(zip(rows, cols)):
        x, y = a[i], b[:, j]
        p = x * y
        f = 134217729.0
        xh = f * x - (f * x - x)
        yh = f * y - (f * y - y)
        e = ((xh * yh - p) + xh * (y - yh) + (x - xh) * yh) + (x - xh) * (y - yh)
        out[t] = math.fsum(np.concatenate([p, e]))
        absd[t] = float(np.abs(x) @ np.abs(y))
    return out, absd


def run(shapes, *, xp, repeat: int, samples: int, slice_sweep: list[int] | None,
        ozaki_terms: list[int] | None) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    rows_out = []
    for m, n, k in shapes:
        a64 = xp.asarray(rng.standard_normal((m, k)))
        b64 = xp.asarray(rng.standard_normal((k, n)))
        a32, b32 = a64.astype(xp.float32), b64.astype(xp.float32)
        ri = rng.integers(0, m, samples)
        ci = rng.integers(0, n, samples)
        host = {
            "float64": (to_host(a64[ri]), to_host(b64[:, ci])),
            "float32": (to_host(a32[ri]), to_host(b32[:, ci])),
        }
        exact = {}
        for dt, (ha, hb) in host.items():
            exact[dt] = _exact_entries(ha, hb, range(samples), range(samples))
        configs = list(ENGINES)
        for sk in slice_sweep or []:
            configs.append((f"fp32-emulated slice_k={sk}", "fp32-emulated", "float32",
                            {"slice_k": sk}))
        if "int8" in get_backend(xp).capabilities:  # the emulation itself, whatever the
            configs.append(("fp64-emulated ozaki-int8 forced", "fp64-emulated",  # policy picks
                            "float64", {"engine": "ozaki-int8"}))
        for t in ozaki_terms or []:
            configs.append((f"fp64-emulated ozaki_terms={t}", "fp64-emulated", "float64",
                            {"engine": "ozaki-int8", "ozaki_terms": t}))
        native_err = {}
        native_t = {}
        for label, prec, dt, opts in configs:
            a, b = (a64, b64) if dt == "float64" else (a32, b32)
            got = _timed_product(xp, a, b, prec, opts, repeat, (m, n, k), label, rows_out)
            if got is None:
                continue
            c, engine, t = got
            vals = to_host(c[ri, ci]).astype(np.float64)
            ex, absd = exact[dt]
            err = float(np.max(np.abs(vals - ex) / absd))
            del c
            tflops = 2.0 * m * n * k / t / 1e12
            row = _result_row((m, n, k), label, prec, engine, dt, t, tflops, err, native_t,
                              native_err)
            rows_out.append(row)
            print(f"{m}x{n}x{k:<8} {label:<34} {engine:<12} {t * 1e3:9.3f} ms "
                  f"{tflops:8.2f} TFLOP/s  err {err:.2e}"
                  + (f"  x{row['speedup_vs_native']:.2f} vs native, err ratio "
                     f"{row['err_ratio_vs_native']:.2f}" if "speedup_vs_native" in row else ""))
    return {"environment": environment(xp), "results": rows_out}


def _exact_complex_entries(a: np.ndarray, b: np.ndarray, samples: int):
    """Exact (real, imag) of ``a[t] @ b[:, t]`` and ``|a[t]| @ |b[:, t]|`` (complex)."""
    a = a.astype(np.complex128)
    b = b.astype(np.complex128)
    n = range(samples)
    re, _ = _exact_entries(np.concatenate([a.real, -a.imag], axis=1),
                           np.concatenate([b.real, b.imag], axis=0), n, n)
    im, _ = _exact_entries(np.concatenate([a.real, a.imag], axis=1),
                           np.concatenate([b.imag, b.real], axis=0), n, n)
    absd = np.array([float(np.abs(a[t]) @ np.abs(b[:, t])) for t in n])
    return re, im, absd


def run_complex(shapes, *, xp, repeat: int, samples: int) -> list[dict[str, Any]]:
    """ZGEMM/CGEMM against the emulated engines' complex products (2M, 4M, 3M)."""
    rng = np.random.default_rng(1)
    rows_out = []
    for m, n, k in shapes:
        a128 = xp.asarray(rng.standard_normal((m, k)) + 1j * rng.standard_normal((m, k)))
        b128 = xp.asarray(rng.standard_normal((k, n)) + 1j * rng.standard_normal((k, n)))
        a64, b64 = a128.astype(xp.complex64), b128.astype(xp.complex64)
        ri = rng.integers(0, m, samples)
        ci = rng.integers(0, n, samples)
        exact = {"complex128": _exact_complex_entries(to_host(a128[ri]), to_host(b128[:, ci]),
                                                      samples),
                 "complex64": _exact_complex_entries(to_host(a64[ri]), to_host(b64[:, ci]),
                                                     samples)}
        native_err, native_t = {}, {}
        for label, prec, dt, opts in COMPLEX_ENGINES:
            a, b = (a128, b128) if dt == "complex128" else (a64, b64)
            got = _timed_product(xp, a, b, prec, opts, repeat, (m, n, k), label, rows_out)
            if got is None:
                continue
            c, engine, t = got
            vals = to_host(c[ri, ci]).astype(np.complex128)
            del c
            re, im, absd = exact[dt]
            err = float(max(np.max(np.abs(vals.real - re) / absd),
                            np.max(np.abs(vals.imag - im) / absd)))
            tflops = 8.0 * m * n * k / t / 1e12  # real flops of the complex product
            row = _result_row((m, n, k), label, prec, engine, dt, t, tflops, err, native_t,
                              native_err)
            rows_out.append(row)
            print(f"{m}x{n}x{k:<8} {label:<36} {engine:<12} {t * 1e3:9.3f} ms "
                  f"{tflops:8.2f} TFLOP/s  err {err:.2e}"
                  + (f"  x{row['speedup_vs_native']:.2f} vs native, err ratio "
                     f"{row['err_ratio_vs_native']:.2f}" if "speedup_vs_native" in row else ""))
    return rows_out


def run_gram(shapes, *, xp, repeat: int, samples: int,
             levels: list[int] | None = None) -> list[dict[str, Any]]:
    """``X^T X``: the one-triangle engine call against the engine's full product and the
    native GEMM (speedups of the Gram call over both); ``levels``: also time the Gram call
    with these recursion depths of its column split (``mpqr.engines.gram.LEVELS``)."""
    from mpqr.engines import gram as gram_mod
    from mpqr.policy import gram

    rng = np.random.default_rng(2)
    rows_out = []
    for m, n in shapes:
        x64 = xp.asarray(rng.standard_normal((m, n)))
        ri = rng.integers(0, n, samples)
        ci = rng.integers(0, n, samples)
        for label, prec, dt, engine in GRAM_ENGINES:
            x = x64 if dt == "float64" else x64.astype(xp.float32)
            xt = xp.asarray(x.T.copy()) if hasattr(x, "copy") else x.T
            hx = to_host(x)
            ex, absd = _exact_entries(hx[:, ri].T, hx[:, ci], range(samples), range(samples))
            opts = {"engine": engine}
            calls = {
                "gram": lambda x=x, p=prec, o=opts: gram(x, precision=p, options=o),
                "full": lambda x=x, xt=xt, p=prec, o=opts: mpqr.matmul(xt, x, precision=p,
                                                                      options=o),
                "native": lambda x=x, xt=xt, p=("fp64" if dt == "float64" else "fp32"):
                    mpqr.matmul(xt, x, precision=p),
            }
            times, errs = {}, {}
            try:
                for what, fn in calls.items():
                    c = fn()
                    vals = to_host(c[ri, ci]).astype(np.float64)
                    errs[what] = float(np.max(np.abs(vals - ex) / absd))
                    del c
                    times[what] = time_it(xp, fn, repeat=repeat)
            except (NotImplementedError, ValueError, MemoryError) as exc:
                rows_out.append({"gram": [m, n], "config": label, "error": str(exc)})
                print(f"gram {m}x{n} {label}: skipped ({exc})")
                continue
            default_levels = gram_mod.LEVELS
            for lv in levels or []:
                gram_mod.LEVELS = lv
                try:
                    times[f"gram L={lv}"] = time_it(xp, calls["gram"], repeat=repeat)
                finally:
                    gram_mod.LEVELS = default_levels
            row = {"gram": [m, n], "config": label, "precision": prec, "engine": engine,
                   "dtype": dt, "time_ms": {w: t * 1e3 for w, t in times.items()},
                   "err_vs_absAB": errs, "speedup_vs_full": times["full"] / times["gram"],
                   "speedup_vs_native": times["native"] / times["gram"]}
            rows_out.append(row)
            print(f"gram {m}x{n} {label:<28} gram {times['gram'] * 1e3:9.3f} ms, full "
                  f"{times['full'] * 1e3:9.3f} ms (x{row['speedup_vs_full']:.2f}), native "
                  f"{times['native'] * 1e3:9.3f} ms (x{row['speedup_vs_native']:.2f}); err "
                  f"{errs['gram']:.2e} (full {errs['full']:.2e}, native {errs['native']:.2e})"
                  + "".join(f"; {w} {t * 1e3:.3f} ms" for w, t in times.items()
                            if w.startswith("gram L=")))
    return rows_out


#: square sizes the break-even report checks
BREAK_EVEN_SIZES = (*(2**e for e in range(8, 17)), 3 * 2**12, 3 * 2**13, 3 * 2**14)


def break_even(xp: Any, sizes: tuple[int, ...] = BREAK_EVEN_SIZES) -> dict[str, Any]:
    """The cost model's choice for ``fp64-emulated`` at square sizes: engine and predicted
    times, and the smallest size where it picks the INT8 Ozaki engine (None if none)."""
    from mpqr.policy import as_gemm_options, decide

    backend = get_backend(xp)
    rows, first = [], None
    for n in sorted(sizes):
        d = decide(backend, xp.float64, n, n, n, 1, "fp64-emulated", "bench",
                   as_gemm_options(None))
        rows.append({"n": n, "engine": d.engine, "predicted_s": dict(d.predicted_s or {})})
        if first is None and d.engine.startswith("ozaki"):
            first = n
    print(f"cost model: fp64-emulated picks ozaki-int8 from n = {first} (square n^3) on "
          f"{backend.device_name()}" if first else "cost model: fp64-emulated keeps native "
          "DGEMM at every size checked")
    return {"first_ozaki_n": first, "rates": dict(backend.rates()), "sizes": rows}


def plot(payload: dict[str, Any], path: str) -> bool:
    """TFLOP/s of each precision setting per shape (default engine knobs) as a PNG."""
    rows = [r for r in payload["results"] if "tflops" in r and "=" not in str(r["config"])]
    shapes = list(dict.fromkeys("x".join(map(str, r["shape"])) for r in rows))
    configs = list(dict.fromkeys(r["config"] for r in rows))
    series = {c: [next((r["tflops"] for r in rows if r["config"] == c
                        and "x".join(map(str, r["shape"])) == s), None) for s in shapes]
              for c in configs}
    env = payload["environment"]
    return grouped_bars(path, shapes, series, ylabel="TFLOP/s",
                        title=f"mpqr.matmul — {env.get('device')} {env.get('date')}")


def _timed_product(xp, a, b, prec, opts, repeat, shape, label, rows_out):
    """``(C, engine, seconds)`` of one ``mpqr.matmul`` configuration, or None when it
    cannot run (the reason goes to ``rows_out`` and the console)."""
    try:
        with mpqr.explain() as tr:
            c = mpqr.matmul(a, b, precision=prec, options=opts)
        t = time_it(xp, lambda: mpqr.matmul(a, b, precision=prec, options=opts), repeat=repeat)
    except (NotImplementedError, ValueError, MemoryError) as exc:
        m, n, k = shape
        rows_out.append({"shape": [m, n, k], "config": label, "error": str(exc)})
        print(f"{m}x{n}x{k} {label}: skipped ({exc})")
        return None
    return c, tr.gemms[0].engine, t


def _result_row(shape, label, prec, engine, dt, t, tflops, err, native_t, native_err):
    """One result row; a native configuration (fp64/fp32) becomes the reference of its
    dtype, later ones get their speed-up and error ratio against it."""
    if prec in ("fp64", "fp32"):
        native_err[dt], native_t[dt] = err, t
    row = {"shape": list(shape), "config": label, "precision": prec, "engine": engine,
           "dtype": dt, "time_ms": t * 1e3, "tflops": tflops, "err_vs_absAB": err}
    if dt in native_t and prec not in ("fp64", "fp32"):
        row["speedup_vs_native"] = native_t[dt] / t
        row["err_ratio_vs_native"] = err / native_err[dt] if native_err[dt] else None
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mpqr bench gemm", description=__doc__)
    p.add_argument("--shapes", default=None,
                   help="comma list of MxNxK (default: the standard GPU shapes, small on CPU)")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--samples", type=int, default=64, help="output entries checked exactly")
    p.add_argument("--slice-sweep", default="", help="comma list of tc-sgemm slice_k to try")
    p.add_argument("--ozaki-terms", default="", help="comma list of Ozaki term counts to try")
    p.add_argument("--kinds", default="real,complex,gram",
                   help="comma list of row kinds: real, complex (ZGEMM/CGEMM), gram (X^T X)")
    p.add_argument("--complex-shapes", default=None, help="comma list of MxNxK (complex rows)")
    p.add_argument("--gram-shapes", default=None, help="comma list of MxN (Gram rows)")
    p.add_argument("--gram-levels", default="0,1,2,3",
                   help="comma list of column-split depths to time the Gram call with")
    p.add_argument("--json", default=None, help="write results here")
    p.add_argument("--png", default=None, help="draw the rates here (needs matplotlib)")
    p.add_argument("--cpu", action="store_true", help="force the NumPy backend")
    p.add_argument("--tune", action="store_true",
                   help="run mpqr.tune() first (measured rates for the cost model) and "
                        "report the fp64-emulated break-even size it gives")
    args = p.parse_args(argv)
    xp = np if args.cpu else default_xp()
    if args.shapes:
        shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    else:
        shapes = GPU_SHAPES if xp is not np else CPU_SHAPES
    sweep = [int(v) for v in args.slice_sweep.split(",") if v]
    terms = [int(v) for v in args.ozaki_terms.split(",") if v]
    if args.tune:
        from mpqr.tune import tune

        tune(xp)
    kinds = {v for v in args.kinds.split(",") if v}
    bad = kinds - {"real", "complex", "gram"}
    if bad:
        p.error(f"--kinds takes real, complex, gram; got {sorted(bad)}")
    on_gpu = xp is not np
    if "real" in kinds:
        out = run(shapes, xp=xp, repeat=args.repeat, samples=args.samples, slice_sweep=sweep,
                  ozaki_terms=terms)
    else:
        out = {"environment": environment(xp), "results": []}
    if "complex" in kinds:
        cshapes = ([tuple(int(v) for v in s.split("x")) for s in args.complex_shapes.split(",")]
                   if args.complex_shapes else
                   (GPU_COMPLEX_SHAPES if on_gpu else CPU_COMPLEX_SHAPES))
        out["complex"] = run_complex(cshapes, xp=xp, repeat=args.repeat, samples=args.samples)
    if "gram" in kinds:
        gshapes = ([tuple(int(v) for v in s.split("x")) for s in args.gram_shapes.split(",")]
                   if args.gram_shapes else (GPU_GRAM_SHAPES if on_gpu else CPU_GRAM_SHAPES))
        out["gram"] = run_gram(gshapes, xp=xp, repeat=args.repeat, samples=args.samples,
                               levels=[int(v) for v in args.gram_levels.split(",") if v])
    out["break_even"] = break_even(xp)
    write_json(args.json, out)
    if args.png:
        plot(out, args.png)
    return 0
