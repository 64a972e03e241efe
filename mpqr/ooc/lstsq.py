"""``mpqr.lstsq`` on host arrays, out of core when ``[A | b]`` exceeds the budget.

Pass 1 is one TSQR pass over ``[A | b]`` by row pieces: its ``R_aug`` holds ``R``,
``Q^H b`` and, in its trailing block, the residual norms. The singular values of
``R`` give ``s`` and the rank (SciPy's ``cond`` cutoff, with the in-core rule for
an uncertain rank at a low factorization precision: refactor at the working
precision). Full rank: ``x = R^-1 Q^H b``, then, unless ``refine=None``, refinement
on the semi-normal equations, ``x += R^-1 R^-H A^H (b - A x)``, one pass over
``[A | b]`` each, residuals in the working precision, until the normal-equation
backward error meets ``tol``. Rank deficient: the minimum-norm solution from the
SVD of ``R``. The explain trace counts the passes.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

from mpqr._errors import LinAlgError, RefinementWarning
from mpqr.lstsq import _scipy_rules as rules
from mpqr.lstsq.solver import UNIT, ranks, solvable
from mpqr.ooc.budget import format_bytes, resolve_budget, tall_plan
from mpqr.ooc.driver import IN_CORE_FACTOR
from mpqr.ooc.run import Run, progress_bar
from mpqr.ooc.tall import tsqr_stream
from mpqr.policy import gemm, record_event
from mpqr.qr._kernels import ct
from mpqr.qr.choice import factor_precision

__all__ = ["lstsq"]

_NONFINITE = "array must not contain infs or NaNs"


class _Dims:
    def __init__(self, x: Any):
        self.shape = tuple(int(s) for s in x.shape)
        self.ndim = len(self.shape)


def lstsq(a: Any, b: Any, cond: Any, check_finite: bool, lapack_driver: Any, *,
          prec_name: str, refine: Any, tol: Any, maxiter: Any, device: Any,
          memory_budget: Any, progress: Any) -> tuple[Any, Any, Any, Any]:
    """:func:`mpqr.lstsq` for host ``a`` and ``b`` (already validated by the api)."""
    from mpqr.backends import host

    backend = host.device_backend(device)
    hx = host.device_backend(None).xp  # the host namespace of the results
    da, db = _Dims(a), _Dims(b)
    rules.check_shapes(da, db)
    m, n = da.shape
    wdt = rules.lapack_dtype(hx, a.dtype, b.dtype)
    if m == 0 or n == 0:
        return rules.empty_result(hx, hx.asarray(a[...]), hx.asarray(b[...]))
    driver = rules.check_driver(lapack_driver)
    if hx.isdtype(wdt, "complex floating") and prec_name in ("fp16", "fp32-emulated",
                                                             "fp64-emulated"):
        raise NotImplementedError(
            f"`precision`={prec_name!r} is not supported for complex input ({wdt}): the "
            "emulated engines are real-only; use precision 'auto', 'fp32' or 'fp64'")
    A, B = host.HostArray(a, "a", wdt), host.HostArray(b, "b", wdt)
    kb = B.shape[1]
    budget, source = resolve_budget(memory_budget, backend)
    working = IN_CORE_FACTOR * m * (n + kb) * A.itemsize
    if budget is None or working <= budget:
        record_event("out-of-core", f"lstsq: in core on {backend.name}: the working set "
                     f"(~{format_bytes(working)}) fits the device-memory budget "
                     f"({'none' if budget is None else format_bytes(budget)}, {source})",
                     route="in-core", budget=budget, working_set=working)
        return _in_core(backend, A, B, a, b, cond, check_finite, driver, prec_name, refine,
                        tol, maxiter)
    if m < n:
        raise NotImplementedError(
            f"out-of-core lstsq needs at least as many rows as columns, got {m} x {n}; "
            "raise `memory_budget`")
    prob = _Problem(backend, A, B, cond, driver, prec_name, refine, tol, maxiter,
                    check_finite)
    plan = tall_plan(m, n + kb, A.itemsize, budget, what="a row piece of [a | b]")
    total = (1 + 2) * m * (n + kb) * A.itemsize
    bar = progress_bar(progress, total, total / 25e9, "mpqr.lstsq")
    run = Run(backend, backend.host_staging(wdt, plan.block_elems), bar, "lstsq")
    try:
        x, rank, s, rsq = prob.solve(run, plan)
        run.finish(f"out of core (TSQR of [a | b] by row pieces of {plan.rows} x {n + kb}, "
                   f"then {prob.refinements} refinement passes; budget "
                   f"{format_bytes(budget)} from {source})", route="out-of-core",
                   refinement_passes=prob.refinements, piece_rows=plan.rows, budget=budget)
    finally:
        run.close()
    x, s = host.to_host(x), (None if s is None else host.to_host(s))
    vec = B.vector
    rsq = None if rsq is None else hx.asarray(host.to_host(rsq))
    res = rules.residues(hx, rsq, x.dtype, m=m, n=n, rank=rank, driver=driver, vec=vec,
                         k=kb, dev=None)
    if vec:
        x = x[:, 0]
    return x, res, rank, (None if driver == "gelsy" else s)


def _in_core(backend: Any, A: Any, B: Any, a: Any, b: Any, cond: Any, check_finite: bool,
             driver: Any, prec_name: str, refine: Any, tol: Any, maxiter: Any) -> Any:
    from mpqr.backends import host
    from mpqr.lstsq.api import lstsq as lstsq_in_core

    kw = dict(cond=cond, check_finite=check_finite, lapack_driver=driver,
              precision=prec_name, refine=refine, tol=tol, maxiter=maxiter)
    if backend.name == "numpy":
        aa = a if host.in_memory(a) else A.x[...]
        bb = b if host.in_memory(b) else B.x[...]
        return lstsq_in_core(aa, bb, **kw)
    xp = backend.xp
    m = A.shape[0]
    ad = xp.asarray(A.read(0, m, 0, A.shape[1]))
    bd = xp.asarray(B.read(0, m, 0, B.shape[1]))
    if B.vector:
        bd = bd[:, 0]
    x, res, rank, s = lstsq_in_core(ad, bd, **kw)
    return (host.to_host(x), host.to_host(res), rank if isinstance(rank, int)
            else host.to_host(rank), None if s is None else host.to_host(s))


class _Problem:
    def __init__(self, backend: Any, A: Any, B: Any, cond: Any, driver: str, prec: str,
                 refine: Any, tol: Any, maxiter: Any, check_finite: bool):
        self.backend, self.xp, self.A, self.B = backend, backend.xp, A, B
        m, n = A.shape
        self.m, self.n = m, n
        wdt = getattr(self.xp, A.dtype.name)
        own = factor_precision(backend, prec, wdt, m, n)
        if own != prec:
            record_event("precision", f"lstsq: precision={prec!r} on a tall-skinny {m}x{n} "
                         f"matrix: its QR runs in the input's own precision ({own})",
                         requested=prec, precision=own)
        self.prec = own
        self.u = float(self.xp.finfo(wdt).eps) / 2
        self.cond = rules.cutoff(cond, driver, self.u * 2,
                                 single=A.dtype.name in ("float32", "complex64"))
        self.u_f = max(UNIT[own], self.u)
        self.wprec = "fp64" if A.dtype.name in ("float64", "complex128") else "fp32"
        self.refine, self.driver = refine, driver
        self.tol = tol if tol is not None else self.u
        self.floor_tol = None if tol is not None else math.sqrt(m) * self.u
        self.maxiter = maxiter if maxiter is not None else 50
        self.check = _NONFINITE if check_finite else None
        self.refinements = 0

    def _factor(self, run: Any, plan: Any, prec: str) -> tuple[Any, Any, Any]:
        raug = tsqr_stream(run, self.A, plan, precision=prec, want_q=False, q_out=None,
                           check=self.check, extra=self.B)
        n = self.n
        return raug[:n, :n], raug[:n, n:], raug[n:, n:]

    def _ranks(self, s: Any, u_f: float) -> tuple[int, int, float]:
        return ranks(self.xp, s, self.cond, u_f, self.u)

    def solve(self, run: Any, plan: Any) -> tuple[Any, int, Any, Any]:
        xp, be = self.xp, self.backend
        r, c, rho = self._factor(run, plan, self.prec)
        if not bool(xp.all(xp.isfinite(r))):
            raise LinAlgError("lstsq: `a` contains NaN or Inf (check_finite=False): its "
                              "singular values, rank and solution are undefined")
        s = be.svdvals(r)
        rank, sure, s1 = self._ranks(s, self.u_f)
        if not bool(xp.all(xp.isfinite(c))):
            record_event("method", "lstsq: `b` holds NaN/Inf: the solution is NaN",
                         path="nonfinite")
            nan = xp.full(c.shape, float("nan"), dtype=c.dtype)
            return nan, (rank if s1 > 0 else 0), s, xp.full((c.shape[1],), float("nan"),
                                                            dtype=s.dtype)
        if s1 == 0.0 or sure < self.n:
            if self.u_f > self.u:
                record_event("fallback", f"lstsq: rank uncertain at precision {self.prec!r}; "
                             "refactoring at the working precision (one more pass)",
                             path="svd")
                r, c, rho = self._factor(run, plan, "auto")
                s = be.svdvals(r)
                rank, _sure, s1 = self._ranks(s, self.u)
            if s1 == 0.0 or rank < self.n:
                return self._min_norm(r, c, rank if s1 > 0 else 0), (rank if s1 > 0 else 0), \
                    s, None
        rsq = be.column_norms(rho) ** 2 if rho.shape[0] else \
            xp.zeros((c.shape[1],), dtype=s.dtype)
        if not solvable(s, self.cond, self.u):
            # full rank by the cutoff, but R too close to singular for its solves (an
            # exactly zero column of A: an exactly zero pivot): gelsd's SVD formula
            return self._min_norm(r, c, self.n), self.n, s, rsq
        x = be.solve_triangular(r, c, lower=False)
        if self.refine is None:
            return x, self.n, s, rsq
        return self._refine(run, plan, r, x, s, s1)

    def _min_norm(self, r: Any, c: Any, k: int) -> Any:
        xp = self.xp
        u, sv, vh = self.backend.svd(r)
        if k == 0:
            return xp.zeros(c.shape, dtype=c.dtype)
        y = gemm(ct(xp, u[:, :k]), c, precision=self.wprec, label="lstsq:svd-Uc",
                 backend=self.backend) / xp.astype(sv[:k, None], c.dtype)
        what = ("rank deficient; minimum-norm solution" if k < r.shape[-1] else
                f"rank {k}, but R is too close to singular for a triangular solve; the "
                "solution")
        record_event("fallback", f"lstsq: {what} from the QR-SVD", rank=k, path="svd")
        return gemm(ct(xp, vh[:k, :]), y, precision=self.wprec, label="lstsq:svd-Vy",
                    backend=self.backend)

    def _refine(self, run: Any, plan: Any, r: Any, x: Any, s: Any, s1: float) -> Any:
        xp, be = self.xp, self.backend
        kb = self.B.shape[1]
        items = [[(self.A, (r0, r1, 0, self.n)), (self.B, (r0, r1, 0, kb))]
                 for r0, r1, _c0, _c1 in plan.regions]
        best = None
        for it in range(self.maxiter):
            g = None
            rr = None
            for ab in run.over_multi(items, "[a | b]"):
                ai, bi = ab
                res = bi - gemm(ai, x, precision=self.wprec, label="lstsq:residual-Ax",
                                backend=be)
                gi = gemm(ct(xp, ai), res, precision=self.wprec, label="lstsq:A^H r",
                          backend=be)
                ri = be.column_norms(res) ** 2
                g = gi if g is None else g + gi
                rr = ri if rr is None else rr + ri
            self.refinements += 1
            gn = be.column_norms(g)
            xn = be.column_norms(x)
            omega = float(xp.max(gn / (s1 * (s1 * xn + xp.sqrt(rr)) + 1e-300)))
            if best is None or omega < best[0]:
                best = (omega, x, rr)
            if omega <= self.tol or (self.floor_tol is not None and it > 0
                                     and omega <= self.floor_tol):
                record_event("refine", f"lstsq: out-of-core refinement converged after "
                             f"{it} corrections ({it + 1} passes over [a | b]), "
                             f"normal-equation residual {omega:.2e}", iterations=it,
                             residual=omega)
                return x, self.n, s, rr
            if not math.isfinite(omega):
                break
            y = be.solve_triangular(ct(xp, r), g, lower=True)
            x = x + be.solve_triangular(r, y, lower=False)
        omega, x, rr = best
        if self.refine != "auto":
            warnings.warn(f"lstsq: refinement did not reach tol={self.tol:.2e} in "
                          f"{self.maxiter} iterations (normal-equation residual "
                          f"{omega:.2e}); returning the best iterate", RefinementWarning,
                          stacklevel=4)
        record_event("refine", f"lstsq: out-of-core refinement stopped at normal-equation "
                     f"residual {omega:.2e}", residual=omega, converged=False)
        return x, self.n, s, rr
