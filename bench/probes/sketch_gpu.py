"""Sketch-preconditioned CholQR on the GPU: correctness and timings against cuSOLVER.

``python bench/probes/sketch_gpu.py`` (JSON to ``$OUT/sketch.json``, ``OUT`` default /tmp)

* PASS/FAIL: the CuPy CountSketch kernel against ``S @ a`` with ``S`` built densely from
  the same hash (float64, float32, complex128, a transposed view); ``method=
  "sketch-cholqr"`` at 2^16 x 256 cond 1e15 (orthogonality, backward error, positive
  diagonal) and its refusal at cond 1e18.
* Timings (median of 5 after a warm-up, CUDA events), float64 ``A = U diag(s) V^T``
  (``bench/probes/ill_conditioned.py``'s matrices): ``mpqr.qr`` ``auto`` and
  ``sketch-cholqr`` against ``cupy.linalg.qr`` at 2^20 x 256 (cond 1, 1e8, 1e12, 1e15)
  and 2^22 x 64 (1e12, 1e15), with a per-phase breakdown of the sketch route (sketch,
  R0, apply R0^-1, CholQR = Gram + Cholesky + apply); 65536 x 4096 float64 ``auto`` and
  float32 ``fp32-emulated`` against cuSOLVER in the same dtype; lstsq 2^22 x 64 cond 1e12
  against the cuSOLVER QR route (geqrf / ormqr / trsm through CuPy) with the
  normal-equation residuals' ratio.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

import cupy as cp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from mpqr.backends.sketch_hash import row_hash

import mpqr
from mpqr.bench._timing import release_pool, time_it

ROWS: list[dict] = []
T0 = time.perf_counter()


def say(row: dict) -> None:
    ROWS.append(row)
    print({k: (f"{v:.3g}" if isinstance(v, float) else v) for k, v in row.items()},
          flush=True)


def guarded(fn):
    def run(*args):
        try:
            fn(*args)
        except Exception:  # one failing part does not stop the others
            traceback.print_exc()
            say({"what": fn.__name__, "args": repr(args), "status": "ERROR"})
    return run


def matrix(m, n, cond, seed=0):
    from ill_conditioned import matrix as ill

    return ill(m, n, cond, seed)


def errors(a, q, r):
    n = q.shape[1]
    orth = float(cp.linalg.norm(q.conj().T @ q - cp.eye(n)) / n)
    back = float(cp.linalg.norm(a - q @ r) / cp.linalg.norm(a))
    return orth, back


@guarded
def kernel_check():
    from mpqr.backends.cupy.sketch import count_sketch

    rng = np.random.default_rng(0)
    for dt in (np.float64, np.float32, np.complex128):
        a = rng.standard_normal((3000, 9)).astype(dt)
        if dt == np.complex128:
            a = a + 1j * rng.standard_normal((3000, 9))
        for view in ("C", "T"):
            ag = cp.asarray(a) if view == "C" else cp.asarray(np.asfortranarray(a))
            k = 36
            b, s = row_hash(np.arange(3000, dtype=np.uint64), k, 7)
            dense = np.zeros((k, 3000))
            dense[b, np.arange(3000)] = s
            ref = dense @ a
            got = cp.asnumpy(count_sketch(ag, k, 7))
            tol = (1e-4 if dt == np.float32 else 1e-12) * np.abs(ref).max()
            ok = np.abs(got - ref).max() <= tol
            say({"what": "sketch-kernel", "dtype": np.dtype(dt).name, "layout": view,
                 "status": "PASS" if ok else "FAIL"})


@guarded
def route_check():
    m, n = 2**16, 256
    u = 2.0**-53
    a = matrix(m, n, 1e15)
    with mpqr.explain() as tr:
        q, r = mpqr.qr(a, method="sketch-cholqr")
    orth, back = errors(a, q, r)
    ok = orth <= 8 * n**0.5 * u / n and back <= 8 * n**0.5 * u and bool(
        cp.all(cp.diagonal(r) > 0))
    say({"what": "sketch-cholqr 65536x256 cond 1e15", "orth": orth, "backward": back,
         "route": [e.message[:160] for e in tr.events if e.kind == "route"],
         "status": "PASS" if ok else "FAIL"})
    a = matrix(m, 64, 1e18)
    try:
        mpqr.qr(a, method="sketch-cholqr")
        ok = False
    except mpqr.BreakdownError:
        ok = True
    say({"what": "sketch-cholqr refuses cond 1e18", "status": "PASS" if ok else "FAIL"})


def phases(a):
    """Per-phase times of the sketch route (each phase timed alone, synchronized)."""
    from mpqr.backends import get_backend

    from mpqr.qr import sketch
    from mpqr.qr.cholqr import right_solve_upper

    be = get_backend(mpqr._array_api.array_namespace(cp.empty(1)))
    n = a.shape[1]
    k = sketch.SKETCH_ROWS * n
    out = {"sketch_ms": time_it(cp, lambda: be.sketch_rows(a, k, sketch.SEED)) * 1e3}
    y = be.sketch_rows(a, k, sketch.SEED)
    out["r0_ms"] = time_it(cp, lambda: cp.linalg.qr(y, mode="r")) * 1e3
    r0 = cp.linalg.qr(y, mode="r")
    r0 = r0 * cp.sign(cp.diagonal(r0))[:, None]
    out["apply_ms"] = time_it(cp, lambda: right_solve_upper(be, a, r0)) * 1e3
    w = right_solve_upper(be, a, r0)
    out["cholqr_ms"] = time_it(cp, lambda: mpqr.qr(w, method="cholqr")) * 1e3
    return out


@guarded
def bench_qr(m, n, cond, with_phases=True):
    a = matrix(m, n, cond)
    t_ref = time_it(cp, lambda: cp.linalg.qr(a), repeat=5, max_seconds=8)
    row = {"what": "qr", "shape": f"{m}x{n}", "cond": cond, "cusolver_ms": t_ref * 1e3}
    for meth in ("auto", "sketch-cholqr", "preconditioned-cholqr"):
        try:
            with mpqr.explain() as tr:
                q, r = mpqr.qr(a, method=meth)
            orth, back = errors(a, q, r)
            del q, r
            release_pool(cp)
            t = time_it(cp, lambda meth=meth: mpqr.qr(a, method=meth), repeat=5,
                        max_seconds=8)
            row.update({f"{meth}_ms": t * 1e3, f"{meth}_speedup": t_ref / t,
                        f"{meth}_orth": orth, f"{meth}_backward": back,
                        f"{meth}_route": [e.message[:120] for e in tr.events
                                          if e.kind in ("route", "fallback")]})
        except Exception as exc:
            row[f"{meth}_error"] = repr(exc)[:200]
    if with_phases:
        row.update(phases(a))
    say(row)


@guarded
def bench_square(dtype, precision):
    m, n = 65536, 4096
    a = cp.random.default_rng(0).standard_normal((m, n), dtype=cp.float64).astype(dtype)
    t_ref = time_it(cp, lambda: cp.linalg.qr(a), repeat=5, max_seconds=8)
    t = time_it(cp, lambda: mpqr.qr(a, precision=precision), repeat=5, max_seconds=8)
    q, r = mpqr.qr(a, precision=precision)
    orth, back = errors(a.astype(cp.float64), q.astype(cp.float64), r.astype(cp.float64))
    say({"what": "qr", "shape": f"{m}x{n}", "dtype": cp.dtype(dtype).name,
         "precision": precision, "mpqr_ms": t * 1e3, "cusolver_ms": t_ref * 1e3,
         "speedup": t_ref / t, "orth": orth, "backward": back})


@guarded
def bench_lstsq(m=2**22, n=64, cond=1e12):
    import cupyx.scipy.linalg as cxl

    a = matrix(m, n, cond)
    b = cp.random.default_rng(1).standard_normal(m, dtype=cp.float64)

    def cusolver():
        q, r = cp.linalg.qr(a)
        return cxl.solve_triangular(r, q.T @ b)

    def ne(x):  # ||A||_2 = 1
        return float(cp.linalg.norm(a.T @ (b - a @ x)) / cp.linalg.norm(x))

    t_ref = time_it(cp, cusolver, repeat=5, max_seconds=8)
    ref = ne(cusolver())
    with mpqr.explain() as tr:
        x = mpqr.lstsq(a, b)[0]
    got = ne(x)
    t = time_it(cp, lambda: mpqr.lstsq(a, b), repeat=5, max_seconds=8)
    say({"what": "lstsq", "shape": f"{m}x{n}", "cond": cond, "mpqr_ms": t * 1e3,
         "cusolver_ms": t_ref * 1e3, "speedup": t_ref / t, "normal_residual": got,
         "cusolver_normal_residual": ref, "ratio": got / ref,
         "status": "PASS" if got <= 2 * ref else "FAIL (target: <= 2x)",
         "route": [e.message[:120] for e in tr.events if e.kind in ("route", "fallback")]})


def main() -> int:
    kernel_check()
    route_check()
    for cond in (1.0, 1e8, 1e12, 1e15):
        bench_qr(2**20, 256, cond)
    for cond in (1e12, 1e15):
        bench_qr(2**22, 64, cond)
    bench_square(cp.float64, "auto")
    bench_square(cp.float32, "fp32-emulated")
    bench_lstsq()
    out = Path(os.environ.get("OUT", "/tmp")) / "sketch.json"
    out.write_text(json.dumps({"device": cp.cuda.runtime.getDeviceProperties(0)["name"]
                               .decode(), "seconds": time.perf_counter() - T0,
                               "rows": ROWS}, indent=1, default=str))
    print(f"wrote {out} ({time.perf_counter() - T0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
