"""Least squares: :func:`mpqr.lstsq` (SciPy's contract) and its refinement solvers."""

from mpqr.lstsq.api import REFINE, lstsq
from mpqr.lstsq.refine import RefineResult, cgls, iterative_refinement

__all__ = ["REFINE", "RefineResult", "cgls", "iterative_refinement", "lstsq"]
