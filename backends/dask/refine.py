"""Refinement of a least-squares solution with a row-chunked ``A``: one pass over ``A``
per step, the ``n x k`` quantities on the client's host.

A pass (``pass_fn(x, t)``) returns, for the current iterate ``x`` and a search
direction ``t``, the normal-equation residual ``A^H (b - A x)`` and ``||b - A x||^2``
(the iterate's measure and SciPy's ``residues``, from the true residual) together with
``A^H A t`` and ``||A t||^2`` (the next step's products): the two products with ``A``
that :func:`mpqr.lstsq.refine.cgls` runs one after the other share one sweep of each
block. So CGLS measures each iterate one pass after it is formed, and its first step,
from ``x = 0``, takes ``A^H b``, ``||b||^2`` and ``A^H A`` from the factorization's own
pass (where they are at the working precision): a well-conditioned problem is factored,
stepped and verified in two passes.

The stopping rule is :mod:`mpqr.lstsq.refine`'s, with one difference: a run ends as
soon as the measure is at the rounding floor (``floor_tol``, default ``tol`` only),
where the in-core loop may take one more step to see it stall; a step costs a pass
over ``A`` here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mpqr.lstsq.refine import _accept, _ratio, _safe_div
from mpqr.qr._kernels import ct

__all__ = ["Outcome", "refine_fused"]


@dataclass
class Outcome:
    """A fused refinement run: the returned iterate, its measured ``||b - A x||^2``."""

    x: Any
    iterations: int
    converged: bool
    ratio: float
    rr: Any
    passes: int
    nonfinite: bool = False


def refine_fused(method: str, host: Any, pass_fn: Any, r: Any, c: Any, bb: Any, gram: Any,
                 *, anorm: float, tol: float, maxiter: int, floor_tol: float | None,
                 patience: int = 3) -> Outcome:
    """CGLS (``method="cgls"``) or iterative refinement on the semi-normal equations
    (``"ir"``), right-preconditioned by the upper-triangular ``r`` (host arrays).

    ``c = A^H b`` and ``bb = ||b||^2`` (per column) measure ``x = 0``; ``gram``: ``A^H A``
    for CGLS's first step, or None (a pass makes it then). ``pass_fn(x, t)`` as in the
    module docstring, either argument None to leave it out: ``(g, rr, h, qq)``.
    """
    xp = host.xp
    rh = xp.asarray(ct(xp, r), copy=True)

    def rinv(v: Any) -> Any:
        return host.solve_triangular(r, v, lower=False)

    def rhinv(v: Any) -> Any:
        return host.solve_triangular(rh, v, lower=True)

    def norms(v: Any) -> Any:
        return xp.linalg.vector_norm(v, axis=0)

    def measure(x: Any, g: Any, rr: Any) -> tuple[float, bool]:
        target = tol * anorm * (anorm * norms(x) + xp.sqrt(xp.maximum(rr, 0.0)))
        return _ratio(xp, norms(g), target)

    dt = c.dtype
    x = xp.zeros(c.shape, dtype=dt)
    ratio, nonfinite = measure(x, c, bb)
    best = (ratio, x, bb)
    if nonfinite or ratio <= 1.0:
        return Outcome(x, 0, not nonfinite, ratio, bb, 0, nonfinite)
    passes = it = 0
    mark, stall = ratio, 0
    if method == "ir":
        g, t = c, None
    else:
        s = rhinv(c)
        gamma = norms(s) ** 2
        p = s
        t = rinv(p)
        if gram is not None:
            h = gram @ t
            qq = xp.real(xp.sum(xp.conj(t) * h, axis=0))
        else:
            _, _, h, qq = pass_fn(None, t)
            passes += 1
        g = c
    for step in range(1, maxiter + 1):
        it = step
        if method == "ir":
            x = x + rinv(rhinv(g))
            g, rr, _, _ = pass_fn(x, None)
        else:
            alpha = xp.astype(_safe_div(xp, gamma, qq), dt)
            x = x + alpha * t
            s = rhinv(g - alpha * h)  # the normal residual at the new x, predicted
            gamma_new = norms(s) ** 2
            p = s + xp.astype(_safe_div(xp, gamma_new, gamma), dt) * p
            gamma = gamma_new
            t = rinv(p)
            g, rr, h, qq = pass_fn(x, t)  # measures x; products for the next step
        passes += 1
        ratio, nonfinite = measure(x, g, rr)
        if nonfinite:
            return Outcome(x, it, False, float("nan"), rr, passes, True)
        if ratio < best[0]:
            best = (ratio, x, rr)
        if best[0] <= 1.0 or (floor_tol is not None and best[0] * tol <= floor_tol):
            break
        if best[0] < 0.5 * mark:
            mark, stall = best[0], 0
        else:
            stall += 1
            if stall >= patience:
                break
    return Outcome(best[1], it, _accept(best[0], tol, floor_tol), best[0], best[2], passes)
