"""``python -m mpqr demo``: factor and solve one real-sized problem, compared
with the plain SciPy (CPU) or CuPy/cuSOLVER (GPU) route.

Runs on CuPy when a CUDA GPU is visible, otherwise on NumPy (under a minute on
a laptop-class CPU). Prints time, backward error and orthogonality of QR, and
time and accuracy of least squares, for mpqr at several precisions.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import mpqr
from mpqr.tools._timing import default_xp, is_cupy, sync, to_host


def _problem(xp, m: int, n: int, cond: float, seed: int = 0):
    rng = np.random.default_rng(seed)
    u, _ = np.linalg.qr(rng.standard_normal((m, n)))
    v, _ = np.linalg.qr(rng.standard_normal((n, n)))
    s = np.geomspace(1.0, 1.0 / cond, n)
    a = (u * s) @ v.T
    x_true = rng.standard_normal(n)
    b = a @ x_true + 1e-8 * rng.standard_normal(m)
    return xp.asarray(a), xp.asarray(b), a, b, float(s[0])  # ||A||_2 = s[0] by construction


def _timed(xp, fn):
    fn()  # warm-up (kernel compilation, cuBLAS heuristics)
    sync(xp)
    t0 = time.perf_counter()
    out = fn()
    sync(xp)
    return out, time.perf_counter() - t0


def _qr_errors(a: np.ndarray, q: np.ndarray, r: np.ndarray) -> tuple[float, float]:
    n = r.shape[1]
    back = np.linalg.norm(a - q @ r) / np.linalg.norm(a)
    orth = np.linalg.norm(q.T @ q - np.eye(n)) / n
    return float(back), float(orth)


def _ne_residual(a: np.ndarray, b: np.ndarray, x: np.ndarray, anorm: float) -> float:
    """||A^T (b - A x)|| / (||A||_2^2 ||x||): the normal-equation residual (``anorm`` is
    ||A||_2, known from the construction: a host SVD of A would dominate the demo)."""
    return float(np.linalg.norm(a.T @ (b - a @ x)) / (anorm**2 * np.linalg.norm(x)))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mpqr demo", description=__doc__)
    p.add_argument("--cpu", action="store_true", help="use NumPy even if a GPU is visible")
    p.add_argument("--m", type=int, default=None)
    p.add_argument("--n", type=int, default=None)
    p.add_argument("--cond", type=float, default=1e4)
    args = p.parse_args(argv)
    xp = np if args.cpu else default_xp()
    gpu = is_cupy(xp)
    m = args.m or (2**20 if gpu else 6000)
    n = args.n or (256 if gpu else 100)
    print(f"mpqr {mpqr.__version__} demo on {'CuPy (GPU)' if gpu else 'NumPy (CPU)'}: "
          f"A is {m} x {n} float64, cond(A) = {args.cond:.0e}")
    a, b, ah, bh, anorm = _problem(xp, m, n, args.cond)

    print("\nQR factorization (mode='reduced')")
    print(f"{'route':<38}{'time [s]':>10}{'||A-QR||/||A||':>16}{'||I-QtQ||/n':>14}")
    base = "cupy.linalg.qr (cuSOLVER)" if gpu else "numpy.linalg.qr (LAPACK)"
    (q, r), t = _timed(xp, lambda: xp.linalg.qr(a))
    be, oe = _qr_errors(ah, to_host(q), to_host(r))
    print(f"{base:<38}{t:>10.3f}{be:>16.1e}{oe:>14.1e}")
    # method="auto" runs a tall-skinny matrix in its own precision even when fp16 is asked
    # for (faster and at least as accurate); the last row forces the tensor-core QR
    for prec, method in (("auto", "auto"), ("fp32-emulated", "auto"), ("fp16", "auto"),
                         ("fp16", "householder-recursive")):
        (q, r), t = _timed(xp, lambda p=prec, mt=method: mpqr.qr(a, precision=p, method=mt))
        be, oe = _qr_errors(ah, to_host(q), to_host(r))
        label = f"mpqr.qr precision={prec}" + ("" if method == "auto" else " (recursive)")
        print(f"{label:<38}{t:>10.3f}{be:>16.1e}{oe:>14.1e}")
    del q, r

    print("\nLeast squares min ||Ax - b||")
    print(f"{'route':<38}{'time [s]':>10}{'normal-eq resid':>16}")
    if gpu:
        x, t = _timed(xp, lambda: xp.linalg.lstsq(a, b, rcond=None)[0])
        base = "cupy.linalg.lstsq (SVD)"
    else:
        import scipy.linalg as sla

        x, t = _timed(xp, lambda: sla.lstsq(a, b)[0])
        base = "scipy.linalg.lstsq (gelsd)"
    print(f"{base:<38}{t:>10.3f}{_ne_residual(ah, bh, to_host(x), anorm):>16.1e}")
    for prec, refine in (("auto", "auto"), ("fp32-emulated", "auto"), ("fp16", None)):
        x, t = _timed(xp, lambda p=prec, rf=refine: mpqr.lstsq(a, b, precision=p,
                                                                refine=rf)[0])
        label = f"mpqr.lstsq {prec}, refine={refine}"
        print(f"{label:<38}{t:>10.3f}{_ne_residual(ah, bh, to_host(x), anorm):>16.1e}")

    print("\nWhat mpqr chose for lstsq(precision='fp32-emulated') (mpqr.explain):")
    with mpqr.explain() as trace:
        mpqr.lstsq(a, b, precision="fp32-emulated")
    for line in trace.summary().splitlines()[:12]:
        print("  " + line)
    return 0
