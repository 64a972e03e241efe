"""The ``n x n`` steps of a CholQR pass as one device call, checked from eight numbers.

A pass of :mod:`mpqr.qr.cholqr` factors the Gram matrix ``G``, checks it and makes
``X = R^-1``. On a GPU those steps are tiny and latency-bound, so a backend may return
them without a host sync (``backend.chol_steps``: ``R``, ``X`` and the numbers below;
on CuPy one launch up to 64 columns, library calls queued back to back up to 512); the
pass then reads the eight numbers back once and applies the same tests as its host
route (:func:`passes`). Where a test fails the pass redoes its steps on the host route
from the same ``G``, which raises the same :class:`mpqr.BreakdownError` (or takes the
substitution route) as before.

:func:`portable_chol_steps` computes the same triple with Array API calls: the reference
the GPU kernel is tested against, and what the CPU tests run the device route with.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from mpqr._array_api import device

__all__ = ["StepNumbers", "passes", "portable_chol_steps"]


@dataclass(frozen=True)
class StepNumbers:
    """What the checks of a CholQR pass read (``st`` of ``backend.chol_steps``)."""

    nonfinite: bool  #: ``G`` holds NaN or Inf
    gram_diag_min: float  #: smallest diagonal entry of ``G`` (squared column norm)
    dist_to_identity: float  #: ``||G - I||_F`` (the certificate of a second pass)
    chol_failed: bool  #: a pivot was not positive and finite, or R / X is not finite
    r_diag_max: float  #: ``max |diag R|``
    r_diag_min: float  #: ``min |diag R|``
    norm1_r: float  #: ``||R||_1``
    norm1_x: float  #: ``||R^-1||_1``

    @classmethod
    def from_host(cls, st: Any) -> StepNumbers:
        v = [float(s) for s in st]
        return cls(v[0] != 0, v[1], v[2], v[3] != 0, v[4], v[5], v[6], v[7])

    @property
    def cond1(self) -> float:
        """``cond_1(R) = ||R||_1 ||R^-1||_1`` (the inverse-by-GEMM test)."""
        return self.norm1_r * self.norm1_x


def passes(s: StepNumbers, *, u: float, n: int, gram_min: float, certified: bool,
           diag_ratio: float | None = None) -> bool:
    """Whether the host route's checks would all pass: ``G`` finite, no squared column
    norm below ``gram_min``, the certificate ``||G - I||_F <= 1/2`` (``certified``), and a
    Cholesky factor with ``ratio^2 u n < 1``, ``ratio = max|r_ii| / min|r_ii|`` or the
    given ``diag_ratio`` (the column-scaled one, see :mod:`mpqr.qr.cholqr`)."""
    if s.nonfinite or not s.gram_diag_min >= gram_min:
        return False
    if certified and not s.dist_to_identity <= 0.5:
        return False
    hi, lo = s.r_diag_max, s.r_diag_min
    if s.chol_failed or not math.isfinite(hi) or not lo > 0:
        return False
    ratio = hi / lo if diag_ratio is None else diag_ratio
    return ratio ** 2 * u * n < 1


def portable_chol_steps(backend: Any, g: Any) -> tuple[Any, Any, Any]:
    """``(R, X, st)`` as ``backend.chol_steps`` returns them, from Array API calls
    (real 2-D ``g``; a failed Cholesky gives NaN factors and ``st[3] = 1``)."""
    xp = backend.xp
    n = g.shape[-1]
    dev = device(g)
    eye = xp.eye(n, dtype=g.dtype, device=dev)
    d = xp.linalg.diagonal(g)
    finite = bool(xp.all(xp.isfinite(g)))
    failed = False
    try:
        r = xp.linalg.cholesky(g, upper=True) if finite else None
    except Exception:  # each library has its own LinAlgError
        r = None
    if r is None or not bool(xp.all(xp.isfinite(r))):
        failed = True
        r = xp.full((n, n), math.nan, dtype=g.dtype, device=dev)
        x = xp.full((n, n), math.nan, dtype=g.dtype, device=dev)
    else:
        # X R = I row by row, as r^T x^T = I (the backends' right solve)
        x = backend.right_solve_upper(eye, r)
    rd = xp.abs(xp.linalg.diagonal(r))
    st = [0.0 if finite else 1.0, float(xp.min(d)),
          float(xp.linalg.matrix_norm(g - eye, ord="fro")), 1.0 if failed else 0.0,
          float(xp.max(rd)), float(xp.min(rd)),
          float(xp.max(xp.sum(xp.abs(r), axis=0))), float(xp.max(xp.sum(xp.abs(x), axis=0)))]
    return r, x, xp.asarray(st, dtype=xp.float64, device=dev)
