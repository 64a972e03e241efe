"""``python -m mpqr demo``: factor and solve one real-sized problem, compared
with the plain SciPy (CPU) or CuPy/cuSOLVER (GPU) route.

Runs on CuPy when a CUDA GPU is visible, otherwise on NumPy. The test problem is
built, and every error measured, where the arrays live (on the GPU: no host
factorization, no host copy of ``A``), so the demo's time is the routes' time. A
line is printed before each step, so a long one is visible while it runs. On a GPU
the kernels the demo's routes use are first compiled in parallel processes (``python
-m mpqr warmup``; ``--no-warmup`` shows each first call compiling its own). Prints
time, backward error and orthogonality of QR, and time and accuracy of least squares,
for mpqr at several precisions.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import mpqr
from mpqr.bench._timing import default_xp, is_cupy, sync


def _say(text: str, *, end: str = "\n") -> None:
    print(text, end=end, flush=True)


def _problem(xp, m: int, n: int, cond: float, seed: int = 0):
    """``A = U diag(s) V^T`` with geometric ``s`` from 1 to ``1/cond`` and ``b = A x + noise``,
    drawn and multiplied on ``xp``'s device. ``||A||_2 = s[0] = 1`` by construction."""
    rng = xp.random.default_rng(seed)
    u = xp.linalg.qr(rng.standard_normal((m, n)))[0]
    v = xp.linalg.qr(rng.standard_normal((n, n)))[0]
    s = xp.asarray(np.geomspace(1.0, 1.0 / cond, n))
    a = (u * s) @ v.T
    del u
    b = a @ rng.standard_normal(n) + 1e-8 * rng.standard_normal(m)
    sync(xp)
    return a, b, 1.0


def _timed(xp, fn):
    """``(out, first, again)``: seconds of the first call (which compiles GPU kernels
    on first use, cached on disk by CuPy for later processes) and of a repeated call."""
    times = []
    for _ in range(2):
        t0 = time.perf_counter()
        out = fn()
        sync(xp)
        times.append(time.perf_counter() - t0)
    return out, *times


def _qr_errors(xp, a, q, r) -> tuple[float, float]:
    n = r.shape[1]
    back = xp.linalg.norm(a - q @ r) / xp.linalg.norm(a)
    orth = xp.linalg.norm(q.T @ q - xp.eye(n, dtype=q.dtype)) / n
    return float(back), float(orth)


def _ne_residual(xp, a, b, x, anorm: float) -> float:
    """``||A^T (b - A x)|| / (||A||_2^2 ||x||)``: the normal-equation residual (``anorm``
    is ``||A||_2``, known from the construction: an SVD of A would dominate the demo)."""
    return float(xp.linalg.norm(a.T @ (b - a @ x)) / (anorm**2 * xp.linalg.norm(x)))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mpqr demo",
                                description=__doc__.replace("``", ""))
    p.add_argument("--cpu", action="store_true", help="use NumPy even if a GPU is visible")
    p.add_argument("--m", type=int, default=None,
                   help="rows of A (default: 1048576 on a GPU, 6000 on the CPU)")
    p.add_argument("--n", type=int, default=None,
                   help="columns of A (default: 256 on a GPU, 100 on the CPU)")
    p.add_argument("--cond", type=float, default=1e4,
                   help="condition number of A: singular values spaced geometrically from "
                        "1 to 1/cond (default: %(default)g)")
    p.add_argument("--no-warmup", action="store_true",
                   help="on a GPU, let each first call compile its kernels as it reaches them "
                        "(by default they are compiled ahead, in parallel, as "
                        "`python -m mpqr warmup` does)")
    args = p.parse_args(argv)
    t_start = time.perf_counter()
    xp = np if args.cpu else default_xp()
    gpu = is_cupy(xp)
    m = args.m or (2**20 if gpu else 6000)
    n = args.n or (256 if gpu else 100)
    _say(f"mpqr {mpqr.__version__} demo on {'CuPy (GPU)' if gpu else 'NumPy (CPU)'}: "
         f"A is {m} x {n} float64, cond(A) = {args.cond:.0e}")
    # the kernels of the first table are compiled before it, the rest while it runs
    from mpqr.backends.cupy.warmup import DEMO_FIRST, mark

    later = None
    if gpu and not args.no_warmup:
        from mpqr.backends.cupy.warmup import describe, warm

        _say("compiling the GPU kernels of the first table ahead of first use ...", end=" ")
        done = warm(first=DEMO_FIRST)
        later = done["background"]
        _say(describe(done))
    _say("building A and b ...", end=" ")
    t0 = time.perf_counter()
    a, b, anorm = _problem(xp, m, n, args.cond)
    _say(f"{time.perf_counter() - t0:.1f} s")

    def row(label: str, fn, errors) -> None:
        # the label goes out before the (warm-up and timed) calls run
        _say(f"{label:<38}", end="")
        out, first, t = _timed(xp, fn)
        _say(f"{first:>10.3f}{t:>10.3f}" + "".join(f"{e:>16.1e}" for e in errors(out)))

    mark(DEMO_FIRST[0])  # (tags the kernels while `python -m mpqr warmup --record` runs)
    _say("\nQR factorization (mode='reduced')")
    _say(f"{'route':<38}{'first [s]':>10}{'again [s]':>10}{'||A-QR||/||A||':>16}"
         f"{'||I-QtQ||/n':>16}")
    base = "cupy.linalg.qr (cuSOLVER)" if gpu else "numpy.linalg.qr (LAPACK)"
    qr_errors = lambda qr: _qr_errors(xp, a, *qr)  # noqa: E731
    row(base, lambda: xp.linalg.qr(a), qr_errors)
    # method="auto" runs a tall-skinny matrix in its own precision even when fp16 is asked
    # for (faster and at least as accurate); the last row forces the tensor-core QR
    for prec, method in (("auto", "auto"), ("fp32-emulated", "auto"), ("fp16", "auto"),
                         ("fp16", "householder-recursive")):
        label = f"mpqr.qr precision={prec}" + ("" if method == "auto" else " (recursive)")
        row(label, lambda p=prec, mt=method: mpqr.qr(a, precision=p, method=mt), qr_errors)

    mark("demo-lstsq")
    _say("\nLeast squares min ||Ax - b||")
    _say(f"{'route':<38}{'first [s]':>10}{'again [s]':>10}{'normal-eq resid':>16}")
    ls_error = lambda x: (_ne_residual(xp, a, b, x, anorm),)  # noqa: E731
    if gpu:
        row("cupy.linalg.lstsq (SVD)", lambda: xp.linalg.lstsq(a, b, rcond=None)[0], ls_error)
    else:
        import scipy.linalg as sla

        row("scipy.linalg.lstsq (gelsd)", lambda: sla.lstsq(a, b)[0], ls_error)
    for prec, refine in (("auto", "auto"), ("fp32-emulated", "auto"), ("fp16", None)):
        row(f"mpqr.lstsq {prec}, refine={refine}",
            lambda p=prec, rf=refine: mpqr.lstsq(a, b, precision=p, refine=rf)[0], ls_error)

    _say("\nWhat mpqr chose for lstsq(precision='fp32-emulated') (mpqr.explain):")
    with mpqr.explain() as trace:
        mpqr.lstsq(a, b, precision="fp32-emulated")
    for line in trace.summary().splitlines()[:12]:
        _say("  " + line)
    mark(None)
    if later is not None:  # not needed any more: the rest compiles on first use
        later.cancel()
    _say(f"\ndemo done in {time.perf_counter() - t_start:.1f} s")
    sys.stdout.flush()
    return 0
