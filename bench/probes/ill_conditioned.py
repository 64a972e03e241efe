"""Ill-conditioned tall-skinny QR and least squares on the GPU: does the fast route hold?

``python3 bench/probes/ill_conditioned.py OUT.json [--shapes 4194304x64,...] [--conds 1,1e8]``

Times ``mpqr.qr`` (``method="auto"``, mode reduced) against ``cupy.linalg.qr`` (cuSOLVER)
on ``A = U diag(s) V^T`` with geometric singular values ``s`` from 1 to ``1/cond``, for
2^22 x 64, 2^24 x 32 and 2^20 x 256 float64 at cond 1, 1e8, 1e12 and 1e15; and
``mpqr.lstsq`` on 2^22 x 64 at cond 1e12 against the cuSOLVER QR route (``Q, R = qr(A)``,
``x = R^-1 Q^T b``). Each row: time (median of CUDA-event timings after a warm-up), the
ratio to cuSOLVER, orthogonality ``||I - Q^T Q||_F / n``, backward error
``||A - Q R||_F / ||A||_F`` (least squares: the normal-equation residual
``||A^T (b - A x)|| / (||A||^2 ||x||)``, ``||A|| = 1`` by construction), and the route
from the explain trace (method, fallbacks, Gram passes, estimated cond(A)).

``U`` is the Q of ``mpqr.qr`` of a Gaussian matrix (CholQR2: a few ms even at 2^24 rows),
``V`` that of ``cupy.linalg.qr`` of an ``n x n`` Gaussian; ``A = (U s) V^T`` is one GEMM.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import cupy as cp
import cupyx.scipy.linalg as cxl

import mpqr
from mpqr.bench._timing import environment, release_pool, time_it

SHAPES = [(2**22, 64), (2**24, 32), (2**20, 256)]
CONDS = [1.0, 1e8, 1e12, 1e15]


def matrix(m: int, n: int, cond: float, seed: int = 0):
    """``U diag(s) V^T`` (float64, ``||A||_2 = 1``, ``cond_2(A) = cond``) built on the GPU."""
    rng = cp.random.default_rng(seed)
    u = mpqr.qr(rng.standard_normal((m, n), dtype=cp.float64)).Q
    v = cp.linalg.qr(rng.standard_normal((n, n), dtype=cp.float64))[0]
    s = cond ** (-cp.arange(n, dtype=cp.float64) / max(n - 1, 1))
    u *= s
    a = u @ v.T
    del u
    release_pool(cp)
    return a


def qr_errors(a, q, r) -> tuple[float, float]:
    n = q.shape[1]
    orth = float(cp.linalg.norm(q.T @ q - cp.eye(n)) / n)
    back = float(cp.linalg.norm(a - q @ r) / cp.linalg.norm(a))
    return orth, back


def route(trace) -> dict:
    """What the explain trace says about the route: the method ``auto`` picked, every
    fallback (``from -> to``), the preconditioned route's Gram passes and cond(A)
    estimate, and the Gram products over A (policy GEMMs and fused kernels alike)."""
    ev = trace.events
    method = next((e.data.get("method") for e in ev if e.kind == "method"
                   and e.message.startswith("qr:")), None)
    chain = [f"{e.data.get('method')}->{e.data.get('fallback')}" for e in ev
             if e.kind == "fallback" and "fallback" in e.data]
    rt = next((e for e in ev if e.kind == "route"), None)
    out = {"method": method, "fallbacks": chain,
           "gram_products": sum(g.label.endswith("gram") for g in trace.gemms)}
    if rt is not None:
        out.update(grams=rt.data.get("grams"), shifted=rt.data.get("shifted"),
                   cond_estimate=rt.data["cond_estimate"])
    text = " -> ".join([method or "?", *[c.split("->")[1] for c in chain]])
    if rt is not None:
        text += f" ({rt.data['grams']} Grams, cond~{rt.data['cond_estimate']:.1e})"
    out["text"] = text
    return out


def kernel_profile(call) -> dict:
    """GPU busy time and the top kernels of one call (CUPTI through PyTorch's profiler,
    as ``kernel_time.py`` records them), beside the wall time: what the host adds."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from kernel_time import profiled

    summary, top = profiled(call)
    summary["top_kernels"] = top[:15]
    return summary


def bench_qr(m: int, n: int, cond: float, repeat: int, prof: bool = False) -> dict:
    a = matrix(m, n, cond)
    t_ref = time_it(cp, lambda: cp.linalg.qr(a), repeat=repeat, max_seconds=10)
    q, r = cp.linalg.qr(a)
    ref_orth, ref_back = qr_errors(a, q, r)
    del q, r
    release_pool(cp)
    with mpqr.explain() as trace:
        q, r = mpqr.qr(a)
    orth, back = qr_errors(a, q, r)
    del q, r
    release_pool(cp)
    t = time_it(cp, lambda: mpqr.qr(a), repeat=repeat, max_seconds=10)
    row = {"what": "qr", "shape": f"{m}x{n}", "cond": cond, "mpqr_ms": t * 1e3,
           "cusolver_ms": t_ref * 1e3, "speedup": t_ref / t, "orthogonality": orth,
           "backward_error": back, "cusolver_orthogonality": ref_orth,
           "cusolver_backward_error": ref_back, "route": route(trace)}
    if prof:
        row["profile"] = kernel_profile(lambda: mpqr.qr(a))
        row["events"] = [f"{e.kind}: {e.message}"[:200] for e in trace.events]
    return row


def bench_lstsq(m: int, n: int, cond: float, repeat: int) -> dict:
    a = matrix(m, n, cond)
    b = cp.random.default_rng(1).standard_normal(m, dtype=cp.float64)

    def cusolver():
        q, r = cp.linalg.qr(a)
        return cxl.solve_triangular(r, q.T @ b)

    def ne(x) -> float:  # ||A||_2 = 1
        return float(cp.linalg.norm(a.T @ (b - a @ x)) / cp.linalg.norm(x))

    t_ref = time_it(cp, cusolver, repeat=repeat, max_seconds=10)
    ref = ne(cusolver())
    release_pool(cp)
    with mpqr.explain() as trace:
        x = mpqr.lstsq(a, b)[0]
    got = ne(x)
    del x
    release_pool(cp)
    t = time_it(cp, lambda: mpqr.lstsq(a, b), repeat=repeat, max_seconds=10)
    row = {"what": "lstsq", "shape": f"{m}x{n}", "cond": cond, "mpqr_ms": t * 1e3,
           "cusolver_ms": t_ref * 1e3, "speedup": t_ref / t, "normal_residual": got,
           "cusolver_normal_residual": ref, "route": route(trace)}
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", help="JSON file to write")
    p.add_argument("--shapes", default=None, help="comma list of MxN (default: the three)")
    p.add_argument("--conds", default=None, help="comma list (default: 1,1e8,1e12,1e15)")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--no-lstsq", action="store_true")
    p.add_argument("--profile", action="store_true",
                   help="also record each qr row's kernels (needs PyTorch with CUDA)")
    args = p.parse_args(argv)
    shapes = SHAPES if not args.shapes else [
        tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    conds = CONDS if not args.conds else [float(c) for c in args.conds.split(",")]
    if args.profile:
        import torch
        torch.zeros(1, device="cuda")  # CUPTI and the primary context, before CuPy's work
    rows = []
    print(f"{'':5} {'shape':>11} {'cond':>7} {'mpqr ms':>9} {'cuSOLVER':>9} {'ratio':>6} "
          f"{'orth':>8} {'backward':>8}  route")
    for m, n in shapes:
        for cond in conds:
            row = bench_qr(m, n, cond, args.repeat, args.profile)
            release_pool(cp)
            rows.append(row)
            print(f"{'qr':5} {row['shape']:>11} {cond:7.0e} {row['mpqr_ms']:9.2f} "
                  f"{row['cusolver_ms']:9.2f} {row['speedup']:6.2f} "
                  f"{row['orthogonality']:8.1e} {row['backward_error']:8.1e}  "
                  f"{row['route']['text']}", flush=True)
            if args.profile:
                pr = row["profile"]
                print(f"      GPU busy {pr['gpu_busy_ms']:.2f} ms of span "
                      f"{pr['gpu_span_ms']:.2f}, {pr['kernels']} kernels", flush=True)
                for t in pr["top_kernels"][:10]:
                    print(f"      {t['ms']:8.3f} ms {t['count']:4d}x {t['name'][:100]}")
                for e in row["events"]:
                    print(f"      . {e}")
    if not args.no_lstsq:
        row = bench_lstsq(2**22, 64, 1e12, args.repeat)
        release_pool(cp)
        rows.append(row)
        print(f"{'lstsq':5} {row['shape']:>11} {1e12:7.0e} {row['mpqr_ms']:9.2f} "
              f"{row['cusolver_ms']:9.2f} {row['speedup']:6.2f} "
              f"ne {row['normal_residual']:.1e} (cuSOLVER {row['cusolver_normal_residual']:.1e})"
              f"  {row['route']['text']}", flush=True)
    payload = {"environment": environment(cp), "results": rows}
    with open(args.out, "w") as f:
        json.dump(payload, f, indent=2, default=lambda v: None if isinstance(v, float)
                  and not math.isfinite(v) else str(v))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
