"""Least squares of arrays in memory, where they are: SciPy's checks, then one 2-D
problem at a time (:func:`lstsq_2d`, the route described in :mod:`mpqr.lstsq.api`). The
in-memory route of :func:`mpqr.lstsq` (:mod:`mpqr._route` decides the route); the
out-of-core and Dask solvers import it, never the public front :mod:`mpqr.lstsq.api`."""

from __future__ import annotations

from typing import Any

from mpqr._array_api import device
from mpqr._gpu_errors import device_errors
from mpqr._validation import check_cutoff, namespace_of
from mpqr._validation import check_finite as _check_finite
from mpqr.backends import get_backend
from mpqr.lstsq import _scipy_rules as rules
from mpqr.lstsq.batched import lstsq_stack
from mpqr.lstsq.solver import Solver
from mpqr.policy import resolve_precision, validate_precision

__all__ = ["REFINE", "check_options", "lstsq", "lstsq_2d"]

#: Accepted values of ``refine``.
REFINE = ("auto", "cgls", "ir", None)


def lstsq(a: Any, b: Any, cond: float | None = None, overwrite_a: bool = False,
          overwrite_b: bool = False, check_finite: bool = True,
          lapack_driver: str | None = None, *, precision: str | None = None,
          refine: str | None = "auto", tol: float | None = None,
          maxiter: int | None = None) -> tuple[Any, Any, Any, Any]:
    """:func:`mpqr.lstsq` of arrays in memory (see there)."""
    xp = namespace_of(a, b, names=("a", "b"))
    prec_name = check_options(refine, precision, tol, maxiter, cond)
    for name, v in (("a", a), ("b", b)):
        # SciPy casts bool and integers to float64; anything non-numeric is refused
        if not (v.dtype == xp.bool or xp.isdtype(v.dtype, "numeric")):
            raise TypeError(f"`{name}` must have a numeric dtype, got {v.dtype}")
    backend = get_backend(xp)
    if check_finite:
        for name, v in (("a", a), ("b", b)):
            if xp.isdtype(v.dtype, ("real floating", "complex floating")):
                _check_finite(backend, v, name)  # integers and bools are always finite

    def one(a2: Any, b2: Any) -> tuple[Any, Any, Any, Any]:
        rules.check_shapes(a2, b2)
        return lstsq_2d(backend, a2, b2, cond, lapack_driver, prec_name, refine, tol,
                        maxiter)

    if a.ndim < 2:
        raise ValueError("Input array a should be 2D")
    with device_errors(backend, "mpqr.lstsq"):
        # a stack of small problems: all at once where the fused kernel takes them
        out = lstsq_stack(backend, a, b, cond, lapack_driver, prec_name, refine, tol, maxiter)
        return out if out is not None else rules.apply_over_batch(xp, a, b, one)



def check_options(refine: Any, precision: Any, tol: Any, maxiter: Any, cond: Any) -> str:
    """Validate lstsq's scalar options; the resolved precision name."""
    if refine not in REFINE:
        raise ValueError(f"`refine` must be one of 'auto', 'cgls', 'ir' or None; got {refine!r}")
    if precision is not None:
        validate_precision(precision)
    prec_name, _ = resolve_precision(precision)
    if tol is not None and not (isinstance(tol, (int, float)) and tol > 0):
        raise ValueError(f"`tol` must be a positive number, got {tol!r}")
    if maxiter is not None and not (isinstance(maxiter, int) and maxiter >= 1):
        raise ValueError(f"`maxiter` must be a positive integer, got {maxiter!r}")
    rules.check_negative_cond(check_cutoff(cond, "cond"))
    return prec_name


def lstsq_2d(backend: Any, a: Any, b: Any, cond: Any, driver: Any, prec: str,
             refine: str | None, tol: float | None, maxiter: int | None,
             solver: Any = Solver) -> tuple[Any, Any, int, Any]:
    """One 2-D problem (``solver``: the class that solves it; ``mpqr.backends.dask`` passes its
    distributed one)."""
    xp = backend.xp
    m, n = a.shape
    if m == 0 or n == 0:  # SciPy answers before validating the driver
        return rules.empty_result(xp, a, b)
    driver = rules.check_driver(driver)
    wdt = rules.lstsq_dtype(xp, a.dtype, b.dtype)
    aw = a if a.dtype == wdt else xp.astype(a, wdt)
    bw = b if b.dtype == wdt else xp.astype(b, wdt)
    vec = bw.ndim == 1
    b2 = bw[:, None] if vec else bw
    no_rhs = b2.shape[1] == 0  # rank and s still come from `a`: solve for a zero column
    if no_rhs:
        b2 = xp.zeros((m, 1), dtype=wdt, device=device(bw))
    eps = float(xp.finfo(wdt).eps)
    cut = rules.cutoff(cond, driver, eps, single=wdt in (xp.float32, xp.complex64))
    solver = solver(backend, aw, b2, cut, prec, refine, eps, tol, maxiter,
                    need_s=driver != "gelsy")
    x, rank, s, rsq = solver.run()
    if no_rhs:
        x, rsq = x[:, :0], (None if rsq is None else rsq[:0])
    dev = device(x)
    res = rules.residues(xp, rsq, x.dtype, m=m, n=n, rank=rank, driver=driver, vec=vec,
                         k=0 if no_rhs else b2.shape[1], dev=dev)
    if vec:
        x = x[:, 0]
    return x, res, rank, (None if driver == "gelsy" else s)
