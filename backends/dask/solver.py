"""The row-chunked dask solver: :class:`mpqr.lstsq.solver.Solver`'s passes over a dask
``a`` and ``b``, one graph and one gather each (used by the scheduler route and, per
worker, by the collective one)."""

from __future__ import annotations

import math
from typing import Any

from mpqr.backends.dask import _blocks
from mpqr.backends.dask._graph import as_column, compute_pass, groups, reduce_pass, sum_parts
from mpqr.backends.dask.qr import SPLIT_EVERY, factor
from mpqr.backends.dask.refine import refine_fused

from mpqr._errors import LinAlgError
from mpqr.lstsq.gram import (
    GRAM_COND_MAX,
    GRAM_COND_MAX_NO_S,
    GRAM_MIN_ASPECT,
    factor_from_gram,
)
from mpqr.lstsq.solver import RESOLUTION, Solver, ranks, solvable
from mpqr.policy import record_event
from mpqr.qr._kernels import pow2_scale
from mpqr.qr.cholqr import gram_roundoff

__all__ = ["FIRST_STEP_GRAM", "DaskSolver"]

#: CGLS's first step takes ``A^H A t`` from pass 1's Gram matrix while ``n u cond(A)^2``
#: (the relative error it can put in ``||A t||^2``) is at most this; beyond, from a pass
FIRST_STEP_GRAM = 1e-3

class DaskSolver(Solver):
    """:class:`mpqr.lstsq.solver.Solver` with a row-chunked dask ``a`` and ``b``: every
    pass over them is one graph and one gather, the small quantities live on the
    client's host and the results are moved to the blocks' kind of device."""

    qrcp_gelsy = False  # no pivoted QR of a distributed matrix: gelsy's rank from the SVD

    split_every = SPLIT_EVERY

    def __init__(self, backend: Any, a: Any, b: Any, *args: Any, check_finite: bool = True,
                 vector: Any = None, **kw: Any):
        super().__init__(backend, a, b, *args, **kw)
        self.check_finite = check_finite
        # a vector b (which lstsq reads as the column b[:, None]) is read in its own
        # blocks, each viewed as a column inside the block task: no getitem task per block
        self.vector = vector if vector is not None and b.shape == (*vector.shape, 1) \
            else None
        self.host = _blocks.host_backend()
        self.groups = groups(a)
        self.passes = [0]  # passes over A, the factorization's included
        self.first_gram: Any = None  # A^H A from pass 1, for CholQR2's first pass
        record_event("method", f"lstsq (dask): {a.shape} in {len(a.chunks[0])} row blocks "
                     f"({len(self.groups)} block tasks a pass); each pass over A is one "
                     f"graph whose sums meet in trees (split_every={self.split_every}) and "
                     "one gather; the n x n steps and the small vectors on the client",
                     route="dask", blocks=len(a.chunks[0]), block_tasks=len(self.groups),
                     shape=a.shape)

    # --- passes ----------------------------------------------------------------
    def _pass(self, what: str, leaf: Any, small: Any, arrays: list[Any] | None = None
              ) -> dict[str, Any]:
        arrays = [self.a, self.b] if arrays is None else arrays
        grouped = arrays[0] is self.a
        views = tuple(as_column if v is self.b and self.vector is not None else None
                      for v in arrays)
        arrays = [self.vector if f is not None else v for v, f in zip(arrays, views)]
        d, stats = reduce_pass(what, _blocks.bind(leaf), sum_parts, arrays, small,
                               split_every=self.split_every,
                               group=self.groups if grouped else None, views=views)
        self.passes[0] += 1
        return compute_pass(d, stats)

    def _like(self) -> Any:
        return self.xp.empty((0, 0), dtype=self.a.dtype)

    def _to_blocks(self, v: Any) -> Any:
        return None if v is None else self.backend.from_small(v, self.a._meta)

    def _factor(self, prec: str, mode: str) -> Any:
        reuse = self.first_gram is not None and prec in ("auto", self._gram_precision())
        q, r = factor(self.f, want_q=mode != "r", precision=prec, as_dask=False,
                      split_every=self.split_every,
                      first_gram=self.first_gram if reuse else None, passes=self.passes)
        return r if mode == "r" else (q, r)

    def _qh_b(self, q: Any) -> Any:
        out = self._pass("lstsq-QHb", _blocks.qh_leaf, (self.wprec,), [q, self.b])
        return self._to_blocks(out["c"])

    def _resid_sq(self, x: Any) -> Any:
        small = (_blocks.to_host(x), x.shape[1], self.wprec, 0, 0, False)
        return self._to_blocks(self._pass("lstsq-residual", _blocks.residual_leaf, small)["vv"])

    def _refine_pass(self, ea: int, eb: int) -> Any:
        """``pass_fn`` of :func:`mpqr.backends.dask.refine.refine_fused`."""
        xp = self.host.xp

        def run(x: Any, t: Any) -> tuple[Any, Any, Any, Any]:
            cols = [v for v in (x, t) if v is not None]
            kx = 0 if x is None else x.shape[1]
            small = (xp.concat(cols, axis=1), kx, self.wprec, ea, eb, True)
            out = self._pass("lstsq-refine", _blocks.residual_leaf, small)
            w, vv = out["w"], out["vv"]
            return w[:, :kx], vv[:kx], -w[:, kx:], vv[kx:]

        return run

    # --- the route -------------------------------------------------------------
    def run(self) -> tuple[Any, int, Any, Any]:
        host = self.host
        hx = host.xp
        first = self._pass("lstsq-first", _blocks.lstsq_leaf,
                           (self._gram_precision(), self.wprec, self.check_finite))
        if self.check_finite:
            for name in ("a", "b"):
                if not first[f"{name[0]}ok"]:
                    raise ValueError(f"array must not contain infs or NaNs (`{name}`)")
        g, c, bb = first["g"], first["c"], first["bb"]
        with host.ignore_fp_warnings():
            usable = bool(hx.all(hx.isfinite(g)))
        if usable:
            self.first_gram = g
        if not first["bok"]:
            return self._nonfinite_b()
        if self.refine is None:
            return self.direct(self.prec)
        k = self.n
        gf = self._gram_route_from(g)
        if gf is not None and gf.r is not None:  # full rank, well conditioned
            r, s, s1 = gf.r, gf.s, gf.s1
            kappa = GRAM_COND_MAX_NO_S
        else:
            r = _blocks.to_host(self._factor(self.prec, "r"))
            if not bool(host.all_finite(r)):
                raise LinAlgError("lstsq: `a` contains NaN or Inf (check_finite=False): its "
                                  "singular values, rank and solution are undefined")
            s = host.svdvals(r)
            rank_cond, rank_sure, s1 = ranks(hx, s, self.cond, self.u_f, self.u)
            if s1 == 0.0 or rank_sure < k or not solvable(s, self.cond, self.u_f):
                # R may be exactly singular: no triangular solve with it (in-core's rule)
                return self.svd_fallback(rank_cond, rank_sure, s1, stacklevel=6)
            kappa = s1 / float(s[-1])
            if not self.need_s:
                s = None
        method = "ir" if self.refine == "ir" else "cgls"
        ea, eb = self._exponents(s1, float(first["bmax"]))
        # CGLS's first step from pass 1's A^H A where its rounding moves that step by
        # little (relative error of ||A t||^2 up to n u cond(A)^2); else one pass more
        u_g = gram_roundoff(hx, g.dtype, self._gram_precision())
        gram = g if usable and not (ea or eb) and k * u_g * kappa**2 <= FIRST_STEP_GRAM else \
            None
        if ea or eb:
            record_event("scale", f"lstsq: A scaled by 2^{-ea} and b by 2^{-eb} for the "
                         "refinement (its products would under- or overflow)", ea=ea, eb=eb)
            r = pow2_scale(host, r, hx.asarray(-ea, dtype=hx.int32))
            g0, bb, _, _ = self._refine_pass(ea, eb)(hx.zeros(c.shape, dtype=c.dtype), None)
            c = g0
        out = refine_fused(method, host, self._refine_pass(ea, eb), r, c, bb, gram,
                           anorm=math.ldexp(s1, -ea), tol=self.tol, maxiter=self.maxiter,
                           floor_tol=self.floor_tol)
        x, rr = out.x, out.rr
        if ea or eb:
            x = pow2_scale(host, x, hx.asarray(eb - ea, dtype=hx.int32))
            rr = pow2_scale(host, rr, hx.asarray(2 * eb, dtype=hx.int32))
        record_event("refine", f"lstsq (dask): {method} (right-preconditioned by the "
                     f"{self.prec} R) {'converged' if out.converged else 'stopped'} after "
                     f"{out.iterations} iterations, normal-equation residual "
                     f"{out.ratio * self.tol:.2e} (tol {self.tol:.2e}); {self.passes[0]} passes "
                     "over A in all", method=method, iterations=out.iterations,
                     residual=out.ratio * self.tol, converged=out.converged,
                     precision=self.prec, passes=self.passes[0])
        done = self.unconverged(out, method, stacklevel=5)
        if done is not None:
            return done
        return (self._to_blocks(x), k, self._to_blocks(s),
                self._to_blocks(rr) if self.need_s else None)

    def _gram_route_from(self, g: Any) -> Any:
        """The in-core Gram route's decision on pass 1's ``A^H A`` (host), or None."""
        mf, nf = self.f.shape
        if self.u_f > self.u or mf < GRAM_MIN_ASPECT * nf:
            return None
        res = RESOLUTION * math.sqrt(nf) * self.u * GRAM_COND_MAX / 2
        host = self.host
        return factor_from_gram(host, host, g, (mf, nf), host.xp.empty((0, 0), dtype=g.dtype),
                                precision=self._gram_precision(), need_s=self.need_s,
                                cutoff=self.cond, resolution=res)

    def _exponents(self, s1: float, bmax: float) -> tuple[int, int]:
        """As :meth:`Solver._balanced`: ``(ea, eb)`` nonzero when ``||A||`` or
        ``max |b|`` is so far from 1 that the refinement's products could under- or
        overflow."""
        lim = 250 if self.wprec == "fp64" else 30
        ea, eb = math.frexp(s1)[1], math.frexp(bmax)[1]
        return (0, 0) if abs(ea) <= lim and abs(eb) <= lim else (ea, eb)

    def _nonfinite_b(self) -> tuple[Any, int, Any, Any]:
        """NaN/Inf in ``b`` (``check_finite=False``): ``x`` is NaN, never a
        finite-looking answer; ``s`` and the rank from ``R`` as in-core."""
        hx = self.host.xp
        r = _blocks.to_host(self._factor(self.prec, "r"))
        if not bool(self.host.all_finite(r)):
            raise LinAlgError("lstsq: `a` contains NaN or Inf (check_finite=False): its "
                              "singular values, rank and solution are undefined")
        s = self.host.svdvals(r)
        rank_cond, _, s1 = ranks(hx, s, self.cond, self.u, self.u)
        k = self.b.shape[1]
        nan = hx.full((self.n, k), float("nan"), dtype=self.a.dtype)
        rsq = hx.full((k,), float("nan"), dtype=s.dtype)
        record_event("method", "lstsq: `b` holds NaN/Inf: the solution is NaN",
                     path="nonfinite")
        return (self._to_blocks(nan), (rank_cond if s1 > 0 else 0), self._to_blocks(s),
                self._to_blocks(rsq))
