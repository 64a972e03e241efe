"""``mpqr.lstsq`` on host arrays, out of core when ``[A | b]`` exceeds the budget.

**One-pass Gram route** (float64 and float32, ``N + k <= backend.gram_dd_max_n``: a GPU
backend's kernel; otherwise as the Gram route below; float32 pieces are widened to
float64 on the device): the one pass forms the Gram matrix of ``[A | b]`` in double-double
arithmetic (exact products, compensated sums: :mod:`mpqr.lstsq.double_double`), which
holds ``G = A^H A``, ``C = A^H b`` and ``||b||^2`` to about ``M 2^-104`` relative. The
same certificate as below gives ``R = chol(G)`` and ``s``; then ``x`` is corrected by
``x += R^-1 R^-H (C - G x)`` with ``C - G x`` formed in double-double, which is
``A^H (b - A x)`` to far below float64's rounding: the normal-equation residual is
measured without a pass (plus a bound on the pass's own rounding), and
``||b - A x||^2 = ||b||^2 - x^H C - x^H (C - G x)`` keeps its relative accuracy even for a
near-exact fit. An out-of-core pass is bound by the host link, so the GPU's extra
arithmetic costs no time; where the corrections do not meet ``tol``, refinement passes
follow as below.

**Gram route** (with refinement, at the working precision, ``M >= 16 N``; the route of
:mod:`mpqr.lstsq.gram` in core): one pass over ``[A | b]`` forms ``G = A^H A`` and
``A^H b``. The eigenvalues of ``G`` alone decide (``b`` never enters the certificate:
for a good fit ``[A | b]`` is ill-conditioned however well conditioned ``A`` is):
``cond(A) <= GRAM_COND_MAX`` and a certainly full rank give ``R = chol(G)``, SciPy's
``s = sqrt(eig(G))`` and ``x0 = R^-1 R^-H A^H b`` from ``n x n`` work only. One
refinement pass over ``[A | b]`` then forms ``r = b - A x0``, ``A^H r`` and ``||r||``
in the working precision, measures the normal-equation backward error of ``x0`` and
corrects ``x1 = x0 + R^-1 R^-H A^H r``. The error of ``x1`` is bounded without
another pass: ``A^H (b - A x1) = A^H r - G d - (A^H A - G) d`` with ``d = x1 - x0``,
so ``||A^H (b - A x1)|| <= ||A^H r - G d|| + (M + N) u ||A||^2 ||d||`` beyond the
rounding of the measurement itself, and ``||b - A x1||^2 = ||r||^2 - ||R^-H A^H r||^2``.
When that bound meets ``tol`` (it does by orders of magnitude at ``cond(A) <= 4``),
``x1`` is returned after two passes in all; otherwise refinement continues.

**QR route** (ill-conditioned or rank-deficient ``A``, a low-precision factorization,
``refine=None``): one TSQR pass over ``[A | b]`` by row pieces: its ``R_aug`` holds
``R``, ``Q^H b`` and, in its trailing block, the residual norms. The singular values of
``R`` give ``s`` and the rank (SciPy's ``cond`` cutoff, with the in-core rule for an
uncertain rank at a low factorization precision: refactor at the working precision).
Full rank: ``x = R^-1 Q^H b``, then, unless ``refine=None``, refinement on the
semi-normal equations, ``x += R^-1 R^-H A^H (b - A x)``, one pass over ``[A | b]``
each, residuals in the working precision, until the normal-equation backward error
meets ``tol``. Rank deficient: the minimum-norm solution from the SVD of ``R``. A
declined Gram route costs its one pass. The explain trace counts the passes.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

from mpqr._array_api import device
from mpqr._errors import LinAlgError, RefinementWarning
from mpqr.lstsq import _scipy_rules as rules
from mpqr.lstsq import double_double as dd
from mpqr.lstsq.gram import GRAM_COND_MAX, GRAM_MIN_ASPECT, factor_from_gram
from mpqr.lstsq.solver import RESOLUTION, UNIT, ranks, solvable
from mpqr.ooc.budget import format_bytes, resolve_budget, tall_plan
from mpqr.ooc.driver import IN_CORE_FACTOR
from mpqr.ooc.gram_route import check_piece, gram_pass
from mpqr.ooc.run import Run, progress_bar
from mpqr.ooc.tall import tsqr_stream
from mpqr.policy import double_double_gram, gemm, record_event
from mpqr.qr._kernels import ct, solve_upper
from mpqr.qr.choice import factor_precision

__all__ = ["lstsq"]

_NONFINITE = "array must not contain infs or NaNs"

#: rows of a float32 piece widened to float64 at a time for the double-double Gram
#: matrix (at most ``2^18 (n + k)`` float64 values of temporary device memory; H200,
#: 2^26 x 64 float32: 0.63 s a call in sub-blocks of 2^16 rows, 0.55 s in 2^18 or unsplit)
_WIDEN_ROWS = 2**18


class _Dims:
    def __init__(self, x: Any):
        self.shape = tuple(int(s) for s in x.shape)
        self.ndim = len(self.shape)


def lstsq(a: Any, b: Any, cond: Any, check_finite: bool, lapack_driver: Any, *,
          prec_name: str, refine: Any, tol: Any, maxiter: Any, device: Any,
          memory_budget: Any, progress: Any) -> tuple[Any, Any, Any, Any]:
    """:func:`mpqr.lstsq` for host ``a`` and ``b`` (already validated by the api)."""
    from mpqr.backends.host import arrays as host

    backend = host.device_backend(device)
    hx = host.device_backend(None).xp  # the host namespace of the results
    da, db = _Dims(a), _Dims(b)
    rules.check_shapes(da, db)
    m, n = da.shape
    wdt = rules.lstsq_dtype(hx, a.dtype, b.dtype)
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
        how = {"gram": "the Gram route: A^H A and A^H b",
               "gram-dd": "the Gram route: A^H A and A^H b in double-double"}.get(
                   prob.method, "TSQR of [a | b]")
        npass = prob.refinements
        run.finish(f"out of core ({how} by row pieces of {plan.rows} x {n + kb}, then "
                   f"{npass} refinement pass{'' if npass == 1 else 'es'}; budget "
                   f"{format_bytes(budget)} "
                   f"from {source})", route="out-of-core", method=prob.method,
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
    from mpqr.backends.host import arrays as host
    from mpqr.lstsq.in_memory import lstsq as lstsq_in_core

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
        self.method = "tsqr"

    def _factor(self, run: Any, plan: Any, prec: str) -> tuple[Any, Any, Any]:
        raug = tsqr_stream(run, self.A, plan, precision=prec, want_q=False, q_out=None,
                           check=self.check, extra=self.B)
        n = self.n
        return raug[:n, :n], raug[:n, n:], raug[n:, n:]

    def _ranks(self, s: Any, u_f: float) -> tuple[int, int, float]:
        return ranks(self.xp, s, self.cond, u_f, self.u)

    def solve(self, run: Any, plan: Any) -> tuple[Any, int, Any, Any]:
        if self.refine is not None and self.u_f <= self.u and \
                self.m >= GRAM_MIN_ASPECT * self.n:
            dd = self._dd_applies()
            out = self._dd_route(run, plan) if dd else self._gram_route(run, plan)
            if out is not None:
                self.method = "gram-dd" if dd else "gram"
                return out
        return self._qr_route(run, plan)

    def _dd_applies(self) -> bool:
        # float32 pieces are widened to float64 on the device (the pass is link-bound)
        return (self.A.dtype.name in ("float64", "float32")
                and self.n + self.B.shape[1] <= self.backend.gram_dd_max_n)

    def _dd_route(self, run: Any, plan: Any) -> tuple[Any, int, Any, Any] | None:
        """One pass over ``[a | b]`` for its Gram matrix in double-double, then every step
        on ``n x n`` quantities (module docstring); None where ``A^H A`` does not certify
        the route (the pass is then lost)."""
        xp, be = self.xp, self.backend
        m, n, kb = self.m, self.n, self.B.shape[1]
        nt = n + kb
        double_double_gram(self.A.dtype.name, (m, nt), label="lstsq:gram-dd",
                           why="the solution, its normal-equation residual and the residual "
                               "norms then follow from A^H A, A^H b and ||b||^2 alone, "
                               "without a refinement pass over [a | b]")
        items = [[(self.A, (r0, r1, 0, n)), (self.B, (r0, r1, 0, kb))]
                 for r0, r1, _c0, _c1 in plan.regions]
        acc = bmax = None
        with be.ignore_fp_warnings():  # NaN/Inf in b are reported through max |b|
            for ai, bi in run.over_multi(items, "[a | b]"):
                check_piece(be, ai, self.check)
                check_piece(be, bi, self.check)
                if acc is None:
                    acc = xp.zeros((2, nt, nt), dtype=xp.float64, device=device(ai))
                # float32 widened a sub-block at a time: the piece's float64 copy would
                # double its device memory, beyond what the budget's plan counted
                step = ai.shape[0] if ai.dtype == xp.float64 else _WIDEN_ROWS
                for r0 in range(0, ai.shape[0], step):
                    r1 = min(r0 + step, ai.shape[0])
                    acc = be.gram_dd_update(xp.astype(ai[r0:r1, :], xp.float64, copy=False),
                                            xp.astype(bi[r0:r1, :], xp.float64, copy=False),
                                            acc)
                mi = xp.max(xp.abs(bi)) if kb else xp.zeros((), dtype=ai.dtype)
                # NaN must survive the running maximum (a comparison would drop it)
                bmax = mi if bmax is None else xp.where(xp.isnan(mi) | xp.isnan(bmax),
                                                         mi + bmax, xp.maximum(mi, bmax))
        bmax = float(bmax)
        sb, acc = be.small(acc, limit=2 * nt * nt)
        xs = sb.xp
        g, c = (acc[0, :n, :n], acc[1, :n, :n]), (acc[0, :n, n:], acc[1, :n, n:])
        bb = (xs.linalg.diagonal(acc[0, n:, n:]), xs.linalg.diagonal(acc[1, n:, n:]))
        with be.ignore_fp_warnings():  # an over- or underflowing G is declined below
            # the n x n work stays in the small backend (R, s, x on the host)
            gf = factor_from_gram(sb, sb, g[0], (m, n), g[0], precision="fp64", need_s=True,
                                  cutoff=self.cond, resolution=RESOLUTION * math.sqrt(n) *
                                  self.u * GRAM_COND_MAX / 2,
                                  use="gives x = R^-1 R^-H A^H b, corrected from A^H A")
        if self._declined(gf, bmax, bool(xs.all(xs.isfinite(c[0])))):
            return None
        wdt = getattr(xs, self.A.dtype.name)  # the results in the working dtype
        r, s = gf.r, xs.astype(gf.s, wdt)
        if not math.isfinite(bmax):  # b holds NaN/Inf (check_finite=False)
            record_event("method", "lstsq: `b` holds NaN/Inf: the solution is NaN",
                         path="nonfinite")
            return (xp.full((n, kb), float("nan"), dtype=ai.dtype), n, s,
                    xp.full((kb,), float("nan"), dtype=s.dtype))
        x, rsq = self._dd_solve(sb, r, g, c, bb, gf.s1, wdt)
        if rsq is None:
            record_event("fallback", "lstsq: the corrections from the double-double Gram "
                         "matrix did not reach tol; refinement passes over [a | b]",
                         path="refine")
            r, x, g0 = (be.from_small(xs.astype(v, wdt), ai) for v in (r, x, g[0]))
            return self._refine(run, plan, r, x, s, gf.s1, gram=g0)
        return xs.astype(x, wdt), n, s, xs.astype(rsq, wdt)

    def _dd_solve(self, sb: Any, r: Any, g: Any, c: Any, bb: Any, s1: float, wdt: Any
                  ) -> tuple[Any, Any]:
        """``x`` solving ``G x = C`` (double-double ``G``, ``C``; ``R^H R = G``) by
        corrections ``x += R^-1 R^-H (C - G x)``, the residual formed in double-double, and
        ``||b - A x||^2 = ||b||^2 - x^H C - x^H (C - G x)``, as ``(x, that)``; where the
        normal-equation residual does not reach ``tol`` in 10 corrections (then ``(x,
        None)``). For a working dtype ``wdt`` below float64 the residual and its norm are
        those of ``x`` rounded to it."""
        xs = sb.xp
        m, n = self.m, self.n
        if c[0].shape[1] == 0:  # b with no columns: nothing to solve
            return (xs.zeros((n, 0), dtype=c[0].dtype, device=device(c[0])),
                    xs.zeros((0,), dtype=c[0].dtype, device=device(c[0])))
        x = sb.solve_triangular(r, sb.solve_triangular(ct(xs, r), c[0], lower=True),
                                lower=False)
        trace_g = float(xs.sum(xs.linalg.diagonal(g[0])))
        bnorm = xs.sqrt(xs.abs(bb[0]))
        def measure(x: Any) -> tuple[Any, Any, float]:
            # (C - G x rounded, ||b - A x||^2, the normal-equation residual), in double-double
            gx = dd.matvec(xs, g, x)
            t = dd.add(xs, c, (-gx[0], -gx[1]))
            xc, xt = dd.dot_rows(xs, x, c), dd.dot_rows(xs, x, t)
            rsq = dd.add(xs, dd.add(xs, bb, (-xc[0], -xc[1])), (-xt[0], -xt[1]))[0]
            rsq = xs.where(rsq > 0, rsq, xs.zeros_like(rsq))
            tf = t[0] + t[1]
            xn = xs.sqrt(xs.sum(x * x, axis=0))
            den = s1 * (s1 * xn + xs.sqrt(rsq)) + 1e-300
            # the pass's own rounding: |C - G x - A^H (b - A x)| <= gamma (|A|^H |b| +
            # |A|^H |A| |x|), gamma = 4 (m + n) u_dd, ||A||_F^2 = trace(G)
            slack = 4 * (m + n) * dd.UNIT_DD * (trace_g * xn + math.sqrt(trace_g) * bnorm)
            return tf, rsq, float(xs.max((xs.sqrt(xs.sum(tf * tf, axis=0)) + slack) / den))

        for it in range(10):
            tf, rsq, omega = measure(x)
            if omega <= self.tol or (self.floor_tol is not None and it > 0
                                     and omega <= self.floor_tol):
                if wdt != xs.float64:  # what is returned: x rounded to the working dtype
                    x = xs.astype(xs.astype(x, wdt), xs.float64)
                    _tf, rsq, omega = measure(x)
                record_event("refine", f"lstsq: out of core in one pass: A^H A, A^H b and "
                             f"||b||^2 in double-double, {it} correction"
                             f"{'' if it == 1 else 's'} from them (no pass over [a | b]), "
                             f"normal-equation residual {omega:.2e}", iterations=it,
                             residual=omega, passes=1)
                return x, rsq
            if not math.isfinite(omega):
                break
            x = x + sb.solve_triangular(r, sb.solve_triangular(ct(xs, r), tf, lower=True),
                                        lower=False)
        return x, None

    def _declined(self, gf: Any, bmax: float, h_finite: bool) -> bool:
        """Whether the Gram route is declined (recorded in the trace): ``A^H A`` does not
        certify it (``gf`` from :func:`factor_from_gram`), or ``A`` or ``b`` (``bmax``: the
        largest ``|b|``) is large or small enough for the refinement's products to under-
        or overflow, or ``A^H b`` is not finite (``h_finite``)."""
        why = None
        if gf is None or gf.r is None:
            why = "A^H A does not certify it"
        elif math.isfinite(bmax):
            lim = 250 if self.wprec == "fp64" else 30  # the refinement's own products
            ea = math.frexp(gf.s1)[1]
            eb = math.frexp(bmax)[1] if bmax > 0 else 0
            if abs(ea) > lim or abs(eb) > lim or not h_finite:
                why = (f"||A|| ~ 2^{ea} or max |b| ~ 2^{eb}: its products with A and b "
                       "could under- or overflow")
        if why is None:
            return False
        record_event("fallback", f"lstsq: out-of-core Gram route declined ({why}); TSQR of "
                     "[a | b] (one more pass)", path="tsqr")
        return True

    def _gram_precision(self) -> str:
        # as in core: "auto", or fp64 on float32 input: the working precision's GEMM
        return self.wprec if self.prec == "auto" or UNIT[self.prec] < self.u else self.prec

    def _gram_route(self, run: Any, plan: Any) -> tuple[Any, int, Any, Any] | None:
        """One pass over ``[a | b]``, then the refinement (see the module docstring);
        None where the Gram matrix does not certify the route (the pass is then lost)."""
        xp, be = self.xp, self.backend
        m, n = self.m, self.n
        gp = gram_pass(run, self.A, plan, precision=self._gram_precision(),
                       label="lstsq:gram", check=self.check, rhs=self.B, wprec=self.wprec,
                       name="[a | b]")
        with be.ignore_fp_warnings():  # an over- or underflowing G is declined below
            sb, g = be.small(gp.g)
            gf = factor_from_gram(be, sb, g, (m, n), gp.g, precision=self._gram_precision(),
                                  need_s=True, cutoff=self.cond,
                                  resolution=RESOLUTION * math.sqrt(n) * self.u *
                                  GRAM_COND_MAX / 2, use="gives x0 = R^-1 R^-H A^H b")
        if self._declined(gf, gp.bmax, bool(xp.all(xp.isfinite(gp.h)))):
            return None
        r, s = gf.r, gf.s
        if not math.isfinite(gp.bmax):  # b holds NaN/Inf (check_finite=False)
            record_event("method", "lstsq: `b` holds NaN/Inf: the solution is NaN",
                         path="nonfinite")
            kb = gp.h.shape[1]
            return (xp.full((n, kb), float("nan"), dtype=gp.h.dtype), n, s,
                    xp.full((kb,), float("nan"), dtype=s.dtype))
        y = be.solve_triangular(ct(xp, r), gp.h, lower=True)
        x = be.solve_triangular(r, y, lower=False)
        return self._refine(run, plan, r, x, s, gf.s1, gram=be.from_small(g, gp.g))

    def _qr_route(self, run: Any, plan: Any) -> tuple[Any, int, Any, Any]:
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
        x = solve_upper(be, r, c)
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

    def _refine(self, run: Any, plan: Any, r: Any, x: Any, s: Any, s1: float,
                gram: Any = None) -> Any:
        """Refinement passes from ``x``; with ``gram`` (``G``, ``R^H R = G``) each
        correction's normal-equation error is bounded without a pass (module docstring)
        and returned once the bound meets ``tol``."""
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
            # in float64: for float32 data near its subnormals the denominator underflows
            gn, xn, rn = (xp.astype(v, xp.float64) for v in (gn, xn, xp.sqrt(rr)))
            omega = float(xp.max(gn / (s1 * (s1 * xn + rn) + 1e-300)))
            if best is None or omega < best[0]:
                best = (omega, x, rr)
            converged = omega <= self.tol or (self.floor_tol is not None and it > 0
                                              and omega <= self.floor_tol)
            if not math.isfinite(omega):
                break
            if gram is not None:
                # the correction costs no pass and its error is bounded: taken whenever
                # the bound meets tol (also after a converged measurement: it only gains)
                y = be.solve_triangular(ct(xp, r), g, lower=True)
                d = be.solve_triangular(r, y, lower=False)
                x1 = x + d
                bound, rr1 = self._bound(gram, g, d, y, x1, rr, s1)
                if bound <= self.tol:
                    record_event("refine", f"lstsq: out-of-core refinement: normal-equation "
                                 f"residual {omega:.2e} measured in pass {it + 1} over "
                                 f"[a | b]; after its correction at most {bound:.2e} "
                                 "(bounded through A^H A, no further pass)",
                                 iterations=it + 1, residual=bound, measured=omega)
                    return x1, self.n, s, rr1
            if converged:
                record_event("refine", f"lstsq: out-of-core refinement converged after "
                             f"{it} corrections ({it + 1} passes over [a | b]), "
                             f"normal-equation residual {omega:.2e}", iterations=it,
                             residual=omega)
                return x, self.n, s, rr
            if gram is None:
                x1 = x + solve_upper(be, r, g, normal=True)
            x = x1
        omega, x, rr = best
        if self.refine != "auto":
            warnings.warn(f"lstsq: refinement did not reach tol={self.tol:.2e} in "
                          f"{self.maxiter} iterations (normal-equation residual "
                          f"{omega:.2e}); returning the best iterate", RefinementWarning,
                          stacklevel=4)
        record_event("refine", f"lstsq: out-of-core refinement stopped at normal-equation "
                     f"residual {omega:.2e}", residual=omega, converged=False)
        return x, self.n, s, rr

    def _bound(self, gram: Any, g: Any, d: Any, y: Any, x: Any, rr: Any, s1: float
               ) -> tuple[float, Any]:
        """``(bound on the normal-equation error of x = x_prev + d, ||b - A x||^2)`` from
        ``g = A^H (b - A x_prev)``, ``rr = ||b - A x_prev||^2``, ``y = R^-H g``: see the
        module docstring (``(M + N) u ||A||^2`` bounds the rounding of ``G``)."""
        xp, be = self.xp, self.backend
        e = g - gemm(gram, d, precision=self.wprec, label="lstsq:gram-bound", backend=be)
        rr1 = rr - be.column_norms(y) ** 2
        rr1 = xp.where(rr1 > 0, rr1, xp.zeros_like(rr1))
        num = be.column_norms(e) + (self.m + self.n) * self.u * s1 * s1 * be.column_norms(d)
        den = s1 * (s1 * be.column_norms(x) + xp.sqrt(rr1)) + 1e-300
        return float(xp.max(num / den)), rr1
