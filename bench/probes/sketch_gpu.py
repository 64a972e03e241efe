"""Sketch-preconditioned CholQR on the GPU: correctness, per-stage timings, old vs new.

``python bench/probes/sketch_gpu.py`` (JSON to ``$OUT/sketch.json``, ``OUT`` default /tmp;
``--quick`` for the correctness checks and one shape)

* PASS/FAIL: the CuPy CountSketch kernel against ``S @ a`` built densely from the same
  hash; the fused leaf with ``sub`` (bitwise the leaf on ``a - sub``);
  ``right_solve_upper_gram`` (W and its Gram matrix in the solve's pass; leaf
  kernels + cross products past 64 columns) against ``right_solve_upper`` + ``W^T W`` at
  2^16 x 64 / 256 (row-wise backward error of W against substitution's bound, G against
  W^T W, exact symmetry); ``method="sketch-cholqr"`` at 2^16 x 256 cond 1e15 (the
  issue's targets: orthogonality <= 1e-15, backward <= 2e-15) and its refusal at 1e18.
* Per-stage timings (median of 5 after a warm-up, CUDA events) at 2^20 x 256 and
  2^22 x 64 (cond 1 / 1e8 / 1e12 / 1e15 and 1e8 / 1e12 / 1e15): sketch (shared-memory
  and global-atomics kernels), R0, W (substitution) + G (Gram GEMM) against W+G fused
  (one leaf) or the blocked solve with fused leaves (``BLOCKED_GRAM_FUSED``), the n x n
  steps (host Cholesky, R1^-1 on host and device, condition estimate), Q by
  substitution against GEMM by inv(R1); whole calls ``auto`` (also mode "r") and
  ``sketch-cholqr``, and ``auto`` of the old route (``sketch_old_route.py``, no early
  hand-over, monkeypatched in the same process), against cuSOLVER, with orthogonality
  and backward error.
* lstsq 2^22 x 64 cond 1e12, new against old and the cuSOLVER QR route (geqrf / ormqr /
  trsm through CuPy), normal-equation residual ratio; 65536 x 4096 float64 ``auto`` and
  float32 ``fp32-emulated`` against cuSOLVER.
"""

from __future__ import annotations

import contextlib
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
U = 2.0**-53
ORTH_MAX, BACK_MAX = 1e-15, 2e-15  # the targets


def say(row: dict) -> None:
    ROWS.append(row)
    print({k: (f"{v:.3g}" if isinstance(v, float) else v) for k, v in row.items()},
          flush=True)


def guarded(fn):
    def run(*args, **kw):
        try:
            return fn(*args, **kw)
        except Exception:  # one failing part does not stop the others
            traceback.print_exc()
            say({"what": fn.__name__, "args": repr(args), "status": "ERROR"})
            return None
    return run


def matrix(m, n, cond, seed=0):
    from ill_conditioned import matrix as ill

    return ill(m, n, cond, seed)


def errors(a, q, r):
    n = q.shape[1]
    orth = float(cp.linalg.norm(q.conj().T @ q - cp.eye(n)) / n)
    back = float(cp.linalg.norm(a - q @ r) / cp.linalg.norm(a))
    return orth, back


def backend():
    from mpqr.backends import get_backend

    from mpqr._array_api import array_namespace

    return get_backend(array_namespace(cp.empty(1)))


@contextlib.contextmanager
def old_route():
    """The route before this change: the old sketch module, no early hand-over, the
    sketch kernel with global atomics only."""
    import sketch_old_route
    from mpqr.backends.cupy import sketch as cks

    from mpqr.qr import cholqr, sketch

    saved = sketch.sketch_cholqr, cholqr.hand_over_early, cks.PRIVATE_MAX_BYTES
    sketch.sketch_cholqr = sketch_old_route.sketch_cholqr
    cholqr.hand_over_early = lambda _est: contextlib.nullcontext()  # imported per call
    cks.PRIVATE_MAX_BYTES = 0
    try:
        yield
    finally:
        sketch.sketch_cholqr, cholqr.hand_over_early, cks.PRIVATE_MAX_BYTES = saved


@guarded
def kernel_check():
    from mpqr.backends.cupy.sketch import count_sketch

    rng = np.random.default_rng(0)
    for dt in (np.float64, np.float32, np.complex128):
        a = rng.standard_normal((3000, 9)).astype(dt)
        if dt == np.complex128:
            a = a + 1j * rng.standard_normal((3000, 9))
        for view, k in (("C", 36), ("T", 36), ("C", 360)):  # 36: the shared-memory kernel
            ag = cp.asarray(a) if view == "C" else cp.asarray(np.asfortranarray(a))
            b, s = row_hash(np.arange(3000, dtype=np.uint64), k, 7)
            dense = np.zeros((k, 3000))
            dense[b, np.arange(3000)] = s
            ref = dense @ a
            got = cp.asnumpy(count_sketch(ag, k, 7))
            tol = (1e-4 if dt == np.float32 else 1e-12) * np.abs(ref).max()
            ok = np.abs(got - ref).max() <= tol
            say({"what": "sketch-kernel", "dtype": np.dtype(dt).name, "layout": view,
                 "k": k, "status": "PASS" if ok else "FAIL"})


def _r0(a):
    from mpqr.qr import sketch

    be = backend()
    y = be.sketch_rows(a, sketch.SKETCH_ROWS * a.shape[1], sketch.SEED)
    r0 = cp.linalg.qr(y, mode="r")
    return r0 * cp.sign(cp.diagonal(r0))[:, None]


@guarded
def solve_check():
    """right_solve_upper_gram against right_solve_upper + W^T W."""
    from mpqr.qr.cholqr import right_solve_upper, right_solve_upper_gram

    be = backend()
    for n in (64, 256):
        m = 2**16 // min(DIV, 8)
        a = matrix(m, n, 1e12, seed=3)
        r0 = _r0(a)
        w_old = right_solve_upper(be, a, r0)
        with mpqr.explain() as tr:
            w, g = right_solve_upper_gram(be, a, r0, "auto", "auto", "check")
        fused = [e.message[:80] for e in tr.events if "check" in e.message][:2]
        res = cp.abs(w @ r0 - a)
        bound = 4 * n * U * (cp.abs(w) @ cp.abs(r0))
        ok_w = bool(cp.all(res <= bound))
        g_ref = w.T @ w
        gerr = float(cp.max(cp.abs(g - g_ref) / (cp.abs(w.T) @ cp.abs(w))))
        sym = bool(cp.all(g == g.T))
        diff = float(cp.max(cp.abs(w - w_old)) / cp.max(cp.abs(w_old)))
        _, g2 = right_solve_upper_gram(be, a, r0, "auto", "auto", "check", store=False)
        g2err = float(cp.max(cp.abs(g2 - g)) / cp.max(cp.abs(g)))
        # W_vs_old_rel is information only: two backward-stable solves differ by up to
        # ~u cond(R0) in W itself
        ok = ok_w and gerr <= 8 * m * U and sym and g2err < 1e-12
        say({"what": f"right_solve_upper_gram {m}x{n}", "W_rowwise_within_bound": ok_w,
             "max_res_over_bound": float(cp.max(res / (bound + 1e-300))),
             "G_err_rel": gerr, "G_symmetric": sym, "W_vs_old_rel": diff,
             "G_unstored_vs_stored": g2err, "trace_fused": fused,
             "status": "PASS" if ok else "FAIL"})


@guarded
def sub_kernel_check():
    """The fused leaf on ``a - sub`` is bitwise the leaf on the formed difference."""
    from mpqr.backends.cupy.right_solve import right_solve_gram

    rng = np.random.default_rng(5)
    for n in (20, 64):
        full = cp.asarray(rng.standard_normal((140_001, n + 5)))
        a = full[:, 2:n + 2]
        t = cp.asarray(rng.standard_normal((140_001, n)))
        r = cp.asarray(np.triu(rng.standard_normal((n, n))) + 3 * np.eye(n))
        out, ref = cp.empty((140_001, n)), cp.empty((140_001, n))
        g = right_solve_gram(a, r, out=out, sub=t)
        g_ref = right_solve_gram(a - t, r, out=ref)
        ok = bool((out == ref).all()) and bool((g == g_ref).all()) and bool(
            (right_solve_gram(a, r, sub=t) == g).all())
        say({"what": f"right_solve_gram sub= n={n}", "status": "PASS" if ok else "FAIL"})


@guarded
def route_check():
    m, n = 2**16 // min(DIV, 8), 256
    a = matrix(m, n, 1e15)
    with mpqr.explain() as tr:
        q, r = mpqr.qr(a, method="sketch-cholqr")
    orth, back = errors(a, q, r)
    ok = orth <= ORTH_MAX and back <= BACK_MAX and bool(cp.all(cp.diagonal(r) > 0))
    say({"what": "sketch-cholqr 65536x256 cond 1e15", "orth": orth, "backward": back,
         "route": [e.message[:160] for e in tr.events
                   if e.kind in ("route", "apply-inverse")],
         "status": "PASS" if ok else "FAIL"})
    r2 = mpqr.qr(a, mode="r", method="sketch-cholqr")
    d = float(cp.max(cp.abs(r2 - r)) / cp.max(cp.abs(r)))
    say({"what": "sketch-cholqr mode r = reduced R", "rel_diff": d,
         "status": "PASS" if d < 1e-12 else "FAIL"})
    a = matrix(m, 64, 1e18)
    try:
        mpqr.qr(a, method="sketch-cholqr")
        ok = False
    except mpqr.BreakdownError:
        ok = True
    say({"what": "sketch-cholqr refuses cond 1e18", "status": "PASS" if ok else "FAIL"})
    # auto at cond 1e8: CholQR2 stops after its first factor, the sketch takes over
    a = matrix(2**18 // DIV, 256, 1e8)
    with mpqr.explain() as tr:
        q, r = mpqr.qr(a)
    orth, back = errors(a, q, r)
    fb = [e.data.get("reason", "")[:100] for e in tr.events if e.kind == "fallback"]
    ok = orth <= ORTH_MAX and back <= BACK_MAX
    say({"what": "auto 262144x256 cond 1e8", "orth": orth, "backward": back,
         "fallback": fb, "early": any("stopped after" in f for f in fb),
         "status": "PASS" if ok else "FAIL"})


def stages(a):
    """Per-stage times (ms) of the sketch route, each stage timed alone."""
    from mpqr.qr import sketch
    from mpqr.qr.cholqr import (
        _times_upper,
        inverse_and_cond,
        right_solve_upper,
        right_solve_upper_gram,
    )
    from mpqr.qr.cholqr_precond import estimate_cond
    from mpqr.qr.gram_blocked import gram

    be = backend()
    n = a.shape[1]
    k = sketch.SKETCH_ROWS * n
    ms = {}

    def t(name, fn, repeat=5):
        ms[name] = time_it(cp, fn, repeat=repeat, max_seconds=2) * 1e3

    from mpqr.policy import fused_gemm

    m = a.shape[0]
    ms["fused_by_policy"] = fused_gemm(be, a.dtype, (n, n, m), engine="native-fp64",
                                       precision="auto", label="probe")
    t("sketch", lambda: be.sketch_rows(a, k, sketch.SEED))
    from mpqr.backends.cupy import sketch as cks

    saved, cks.PRIVATE_MAX_BYTES = cks.PRIVATE_MAX_BYTES, 0
    try:
        t("sketch_global_atomics", lambda: be.sketch_rows(a, k, sketch.SEED))
    finally:
        cks.PRIVATE_MAX_BYTES = saved
    y = be.sketch_rows(a, k, sketch.SEED)
    t("r0_device_qr", lambda: cp.linalg.qr(y, mode="r"))
    r0 = _r0(a)
    t("W_old_subst", lambda: right_solve_upper(be, a, r0))
    w_old = right_solve_upper(be, a, r0)
    t("G_old_gram", lambda: gram(be, w_old, "auto", "g"))
    w_old = None
    release_pool(cp)
    from mpqr.qr import cholqr

    if n > 64:
        cholqr.BLOCKED_GRAM_FUSED = True
        try:
            t("WG_blocked_fused_leaves", lambda: right_solve_upper_gram(be, a, r0, "auto",
                                                                        "auto", "g"))
        finally:
            cholqr.BLOCKED_GRAM_FUSED = False
    else:
        t("WG_new_fused", lambda: right_solve_upper_gram(be, a, r0, "auto", "auto", "g"))
        t("G_new_unstored", lambda: right_solve_upper_gram(be, a, r0, "auto", "auto", "g",
                                                           store=False))
    w, g = right_solve_upper_gram(be, a, r0, "auto", "auto", "g")

    def host_steps():
        sb, gh = be.small(g, limit=g.size)
        r1 = sb.cholesky(gh, upper=True)
        return sb, r1

    t("host_chol", host_steps)
    sb, r1 = host_steps()
    t("host_inverse", lambda: inverse_and_cond(sb, r1), repeat=3)
    r1dev = cp.asarray(r1)
    t("device_inverse", lambda: be.right_solve_upper(cp.eye(n), r1dev))
    t("host_estimate_cond", lambda: estimate_cond(sb, r1, "auto"))
    ms["estimated_cond_W"] = float(estimate_cond(sb, r1, "auto"))
    x, kappa = inverse_and_cond(sb, r1)
    ms["cond1_R1"] = kappa
    r1d, xd = cp.asarray(r1), cp.asarray(x)
    t("Q_old_subst", lambda: right_solve_upper(be, w, r1d))
    t("Q_new_gemm", lambda: _times_upper(be, w, xd, "q", "auto"))
    q = _times_upper(be, w, xd, "q", "auto")
    ms["Q_new_orth"] = float(cp.linalg.norm(q.T @ q - cp.eye(n)) / n)
    w = q = None
    release_pool(cp)
    return ms


@guarded
def bench_qr(m, n, cond, t_ref=None):
    a = matrix(m, n, cond)
    if t_ref is None:
        t_ref = time_it(cp, lambda: cp.linalg.qr(a), repeat=5, max_seconds=6)
    row = {"what": "qr", "shape": f"{m}x{n}", "cond": cond, "cusolver_ms": t_ref * 1e3}
    for tag, ctx in (("new", contextlib.nullcontext), ("old", old_route)):
        for meth in ("auto", "sketch-cholqr"):
            if tag == "old" and (meth != "auto" or cond == 1.0):
                continue  # the run's limit: the old route's auto only, where it differs
            key = f"{meth}_{tag}"
            try:
                with ctx():
                    with mpqr.explain() as tr:
                        q, r = mpqr.qr(a, method=meth)
                    orth, back = errors(a, q, r)
                    del q, r
                    release_pool(cp)
                    t = time_it(cp, lambda meth=meth: mpqr.qr(a, method=meth), repeat=5,
                                max_seconds=3)
                    tr_ = time_it(cp, lambda meth=meth: mpqr.qr(a, mode="r", method=meth),
                                  repeat=5, max_seconds=3) if (meth == "auto" and
                                                                tag == "new") else None
                row.update({f"{key}_ms": t * 1e3, f"{key}_speedup": t_ref / t,
                            f"{key}_orth": orth, f"{key}_backward": back,
                            f"{key}_ok": orth <= ORTH_MAX and back <= BACK_MAX,
                            f"{key}_route": [e.message[:110] for e in tr.events
                                             if e.kind in ("route", "fallback",
                                                           "apply-inverse")]})
                if tr_ is not None:
                    row[f"{key}_mode_r_ms"] = tr_ * 1e3
            except Exception as exc:
                row[f"{key}_error"] = repr(exc)[:200]
    try:
        row.update({f"stage_{k}": v for k, v in stages(a).items()})
    except Exception:
        traceback.print_exc()
    say(row)
    return t_ref


@guarded
def bench_square(dtype, precision):
    m, n = 65536 // DIV, 4096 // DIV
    a = cp.random.default_rng(0).standard_normal((m, n), dtype=cp.float64).astype(dtype)
    t_ref = time_it(cp, lambda: cp.linalg.qr(a), repeat=5, max_seconds=5)
    t = time_it(cp, lambda: mpqr.qr(a, precision=precision), repeat=5, max_seconds=5)
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

    t_ref = time_it(cp, cusolver, repeat=5, max_seconds=6)
    ref = ne(cusolver())
    row = {"what": "lstsq", "shape": f"{m}x{n}", "cond": cond, "cusolver_ms": t_ref * 1e3,
           "cusolver_normal_residual": ref}
    for tag, ctx in (("new", contextlib.nullcontext), ("old", old_route)):
        with ctx():
            with mpqr.explain() as tr:
                x = mpqr.lstsq(a, b)[0]
            got = ne(x)
            t = time_it(cp, lambda: mpqr.lstsq(a, b), repeat=5, max_seconds=6)
        row.update({f"{tag}_ms": t * 1e3, f"{tag}_speedup": t_ref / t,
                    f"{tag}_normal_residual": got, f"{tag}_ratio": got / ref,
                    f"{tag}_route": [e.message[:110] for e in tr.events
                                     if e.kind in ("route", "fallback", "refine")]})
    row["status"] = "PASS" if row["new_ratio"] <= 2 else "FAIL (target: <= 2x)"
    say(row)


#: rows divided by this (``--rows-div N``: a dry run of the script on small shapes)
DIV = int(sys.argv[sys.argv.index("--rows-div") + 1]) if "--rows-div" in sys.argv else 1


def main() -> int:
    quick = "--quick" in sys.argv
    kernel_check()
    sub_kernel_check()
    solve_check()
    route_check()
    t_ref = None
    for cond in ((1e12,) if quick else (1.0, 1e8, 1e12, 1e15)):
        t_ref = bench_qr(2**20 // DIV, 256, cond, t_ref)
    t_ref = None
    for cond in (() if quick else (1e8, 1e12, 1e15)):
        t_ref = bench_qr(2**22 // DIV, 64, cond, t_ref)
    if not quick:
        bench_lstsq(2**22 // DIV)
        bench_square(cp.float64, "auto")
        bench_square(cp.float32, "fp32-emulated")
    out = Path(os.environ.get("OUT", "/tmp")) / "sketch.json"
    out.write_text(json.dumps({"device": cp.cuda.runtime.getDeviceProperties(0)["name"]
                               .decode(), "seconds": time.perf_counter() - T0,
                               "rows": ROWS}, indent=1, default=str))
    print(f"wrote {out} ({time.perf_counter() - T0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
