"""Polynomial and spline regression with ``mpqr.lstsq``.

Least-squares fits of noisy samples: a degree-``d`` polynomial in the
Chebyshev basis (well conditioned), a cubic B-spline on uniform knots, and the
ill-conditioned monomial basis ``1, t, t^2, ...``. The design matrices are tall
and skinny, the shape where QR-based least squares shines.

The fits ask for ``precision="fp16"``: products at least fp16-accurate. On a
tall-skinny matrix a QR in the input's own float64 (CholQR2, or the library's QR
for small ones) is both faster than the fp16 tensor-core QR and more accurate,
so ``lstsq`` factors in float64 and says so in the trace (a ``precision``
event); CGLS preconditioned by that ``R`` (Zhang, Baharlouei & Wu, Algorithm 3)
then converges in one or two iterations, for the monomial basis too.
The fp16 factorization itself, with its refinement and fallbacks, runs where
the matrix is not tall-skinny (``tests/test_lstsq_refine.py``).

Run: ``python docs/examples/polynomial_regression.py``
"""

from __future__ import annotations

import numpy as np
from numpy.polynomial import chebyshev
from scipy.interpolate import BSpline

import mpqr


def chebyshev_design(t: np.ndarray, degree: int) -> np.ndarray:
    return chebyshev.chebvander(t, degree)


def spline_design(t: np.ndarray, interior_knots: int, order: int = 3) -> np.ndarray:
    """Cubic B-spline basis on ``interior_knots`` uniform knots in [-1, 1] (dense)."""
    inner = np.linspace(-1.0, 1.0, interior_knots + 2)
    knots = np.r_[[-1.0] * order, inner, [1.0] * order]
    return BSpline.design_matrix(t, knots, order).toarray()


def fit(a: np.ndarray, y: np.ndarray, precision: str) -> dict:
    with mpqr.explain() as trace:
        x, _, rank, s = mpqr.lstsq(a, y, precision=precision)
    ref = np.linalg.lstsq(a, y, rcond=None)[0]
    refine = [e for e in trace.events if e.kind == "refine"]
    fast = any(e.kind == "method" and e.message.startswith("lstsq: small-input fast path")
               for e in trace.events)
    path = ("fallback" if any(e.kind == "fallback" for e in trace.events)
            else "direct" if fast else "refine")
    chosen = [e.data["precision"] for e in trace.events if e.kind == "precision"]
    return {"x": x, "ref": ref, "rank": rank, "cond": float(s[0] / s[-1]),
            "factored": chosen[0] if chosen else precision,
            "rel_diff": float(np.linalg.norm(x - ref) / np.linalg.norm(ref)),
            "iterations": refine[0].data["iterations"] if refine else 0,
            "residual": float(np.linalg.norm(a @ x - y)), "path": path}


def main(samples: int = 5000, degree: int = 12, knots: int = 20, monomial_degree: int = 8,
         seed: int = 0,
         precision: str = "fp16", verbose: bool = True) -> dict:
    rng = np.random.default_rng(seed)
    t = np.sort(rng.uniform(-1.0, 1.0, samples))
    y = np.sin(3 * t) + 0.5 * np.cos(7 * t) + 0.01 * rng.standard_normal(samples)
    out = {}
    for name, a in (("chebyshev", chebyshev_design(t, degree)),
                    ("bspline", spline_design(t, knots)),
                    ("monomial", np.vander(t, monomial_degree + 1, increasing=True))):
        out[name] = {**fit(a, y, precision), "a": a, "y": y}
        if verbose:
            r = out[name]
            print(f"{name:<10} {a.shape[0]}x{a.shape[1]}  cond {r['cond']:.1e}  "
                  f"precision={precision} (factored at {r['factored']}): "
                  + (f"{r['iterations']} CGLS iterations" if r["path"] == "refine"
                     else "solved directly (small-input fast path)" if r["path"] == "direct"
                     else "refactored at working precision") + ", "
                  f"||x - x_numpy|| / ||x_numpy|| = {r['rel_diff']:.1e}, "
                  f"residual {r['residual']:.4f}")
    return out


if __name__ == "__main__":
    main()
