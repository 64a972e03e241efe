"""One least-squares problem after validation: the Gram route, the QR route, rank
decisions, refinement and the direct and minimum-norm solutions (the route is
described in :mod:`mpqr.lstsq.api`)."""

from __future__ import annotations

import contextlib
import math
import warnings
from typing import Any

from mpqr._array_api import device
from mpqr._errors import LinAlgError, RefinementWarning
from mpqr.lstsq.gram import (
    GRAM_COND_MAX,
    GRAM_MIN_ASPECT,
    GramFactor,
    certified_cholesky,
    gram_factor,
    norm2_estimate,
)
from mpqr.lstsq.refine import cgls, iterative_refinement
from mpqr.policy import gemm, record_event
from mpqr.qr._kernels import ct, pow2_scale, times_pow2, unit_shift
from mpqr.qr.choice import factor_precision
from mpqr.qr.cholqr import reuse_first_gram
from mpqr.qr.in_memory import qr

__all__ = ["RESOLUTION", "UNIT", "Solver", "ranks", "solvable"]

#: Unit roundoff of the factorization for each precision setting ("auto": working).
UNIT = {"fp16": 2.0**-11, "fp32": 2.0**-24, "fp32-emulated": 2.0**-24, "fp64": 2.0**-53,
         "fp64-emulated": 2.0**-53, "auto": 0.0}

#: Singular values of a factorization in precision u_f are trusted down to
#: ``RESOLUTION * sqrt(N) * u_f * s[0]`` (backward error of Householder QR).
RESOLUTION = 10.0


def ranks(xp: Any, s: Any, cond: float, u_f: float, u: float) -> tuple[int, int, float]:
    """``(rank by cond, rank certain at the factorization precision u_f, s[0])`` from the
    singular values ``s`` (descending) of an R factored at unit roundoff ``u_f``; ``u``:
    the working precision's."""
    s1 = float(s[0])
    cut = cond * s1
    delta = RESOLUTION * math.sqrt(s.shape[0]) * u_f * s1 if u_f > u else 0.0
    return int(xp.sum(xp.astype(s > cut, xp.int32))), \
        int(xp.sum(xp.astype(s > cut + delta, xp.int32))), s1


def solvable(s: Any, cond: float, u_f: float) -> bool:
    """Whether solves with an R of singular values ``s`` (descending) factored at unit
    roundoff ``u_f`` are safe: ``s[-1]`` lies above the cutoff ``cond * s[0]`` by more
    than the factorization's rounding, ``RESOLUTION * sqrt(N) * u_f * s[0]``.

    Below that, R may be exactly singular although its computed smallest singular value
    is not zero: an exactly zero column of A gives an exactly zero pivot in R and a
    singular value at the rounding level, which the default cutoff (``eps``) counts for
    about one Gaussian 300 x 20 matrix in a hundred (so does SciPy's ``gelsd``). Such
    problems are solved from the SVD of R, never by a triangular solve.
    """
    s1 = float(s[0])
    return s1 > 0.0 and float(s[-1]) > (cond + RESOLUTION * math.sqrt(s.shape[0]) * u_f) * s1


class Solver:
    """One 2-D problem in the working dtype; ``b`` is 2-D."""

    #: ``gelsy``'s direct solutions on QR with column pivoting (needs ``a`` in memory)
    qrcp_gelsy = True

    def __init__(self, backend: Any, a: Any, b: Any, cond: float, prec: str,
                 refine: str | None, eps: float, tol: float | None, maxiter: int | None,
                 need_s: bool = True):
        self.backend, self.xp = backend, backend.xp
        self.need_s = need_s  # False for gelsy: no singular values and no residues
        m, n = a.shape
        self.under = m < n
        # the tall matrix that is factored: A, or A^H for M < N
        self.f = ct(backend.xp, a) if self.under else a
        own = factor_precision(backend, prec, a.dtype, *self.f.shape)
        if own != prec:
            # qr would factor in the input's own precision anyway: size the rank decisions,
            # the Gram route and the refinement by what R really is
            record_event("precision", f"lstsq: precision={prec!r} on a tall-skinny "
                         f"{max(m, n)}x{min(m, n)} matrix: its QR runs in the input's own, "
                         f"at least as accurate precision ({own}), which sets the "
                         "resolution of the rank decisions", requested=prec, precision=own)
            prec = own
        self.a, self.b, self.cond, self.prec, self.refine = a, b, cond, prec, refine
        self.m, self.n = m, n
        self.u = eps / 2
        self.u_f = max(UNIT[prec], self.u)
        self.wprec = "fp64" if a.dtype in (self.xp.float64, self.xp.complex128) else "fp32"
        # default: the unit roundoff, accepting a stall at the rounding floor of the
        # products with A (about sqrt(max(M, N)) u); an explicit tol is strict
        self.tol = tol if tol is not None else self.u
        self.floor_tol = None if tol is not None else math.sqrt(max(m, n)) * self.u
        self.maxiter = maxiter if maxiter is not None else 50

    # --- helpers ---------------------------------------------------------------
    def _gemm(self, x: Any, y: Any, what: str) -> Any:
        return gemm(x, y, precision=self.wprec, label=f"lstsq:{what}", backend=self.backend)

    def _svdvals(self, r: Any) -> Any:
        xp = self.xp
        if not bool(xp.all(xp.isfinite(r))):
            raise LinAlgError("lstsq: `a` contains NaN or Inf (check_finite=False): its "
                              "singular values, rank and solution are undefined")
        return self.backend.svdvals(r)

    def _ranks(self, s: Any, u_f: float) -> tuple[int, int, float]:
        return ranks(self.xp, s, self.cond, u_f, self.u)

    def _factor(self, prec: str, mode: str) -> Any:
        return qr(self.f, mode=mode, precision=prec)

    def _resid_sq(self, x: Any) -> Any:
        r = self.b - self._gemm(self.a, x, "residual-Ax")
        return self.backend.column_norms(r) ** 2

    # --- the operations on A and b (overridden by mpqr.backends.dask's distributed solver) ---
    def _b_finite(self) -> bool:
        return bool(self.xp.all(self.xp.isfinite(self.b)))

    def _max_abs_b(self) -> float:
        return float(self.xp.max(self.xp.abs(self.b)))

    def _qh_b(self, q: Any) -> Any:
        return self._gemm(ct(self.xp, q), self.b, "QHb")

    def _column_sq(self, v: Any) -> Any:
        return self.backend.column_norms(v) ** 2

    def _refiner(self, method: str) -> Any:
        return iterative_refinement if method == "ir" else cgls

    # --- paths ---------------------------------------------------------------
    def run(self) -> tuple[Any, int, Any, Any]:
        xp = self.xp
        if not self._b_finite():
            # NaN/Inf in b (check_finite=False): x is NaN, never a finite-looking answer
            r = self._factor(self.prec, "r")
            s = self._svdvals(r)
            rank_cond, _, s1 = self._ranks(s, self.u)
            nan = xp.full((self.n, self.b.shape[1]), float("nan"), dtype=self.a.dtype,
                          device=device(r))
            rsq = xp.full((self.b.shape[1],), float("nan"), dtype=s.dtype, device=device(s))
            record_event("method", "lstsq: `b` holds NaN/Inf: the solution is NaN",
                         path="nonfinite")
            return nan, (rank_cond if s1 > 0 else 0), s, rsq
        if self.refine is None:
            return self.direct(self.prec)
        k = min(self.m, self.n)
        gf = self._gram_route()
        if gf is not None and gf.r is not None:  # full rank, well conditioned: one pass
            r, s, s1 = gf.r, gf.s, gf.s1
            rank_cond = rank_sure = k
            clear = True  # cond(A) certified small
        else:
            # a declined Gram route's G is the first Gram matrix of the QR route's CholQR2
            # when both run the same precision (one pass over A fewer)
            reuse = gf is not None and self.prec in ("auto", self._gram_precision())
            with reuse_first_gram(self.f, *gf.gram) if reuse else contextlib.nullcontext():
                r = self._factor(self.prec, "r")
            s, s1 = None, self._full_rank_certificate(r)
            if s1 is None:  # no certificate (or singular values wanted): the SVD of R decides
                s = self._svdvals(r)
                rank_cond, rank_sure, s1 = self._ranks(s, self.u_f)
                # full rank by the cutoff is not enough to precondition with R
                clear = solvable(s, self.cond, self.u_f)
            else:
                rank_cond = rank_sure = k
                clear = True  # sigma_min(R) certified above the cutoff with a margin
        if s1 == 0.0 or rank_sure < k or not clear:
            return self.svd_fallback(rank_cond, rank_sure, s1, stacklevel=5)
        side = "left" if self.under else "right"
        method = "ir" if self.refine == "ir" else "cgls"
        run = self._refiner(method)
        a, b, r, s1, ea, eb = self._balanced(r, s1)
        out = run(self.backend, a, b, r, side=side, anorm=s1, tol=self.tol,
                  maxiter=self.maxiter, wprec=self.wprec, floor_tol=self.floor_tol)
        if ea or eb:
            out.x = self._pow2(out.x, eb - ea)
            if out.residual is not None:
                out.residual = self._pow2(out.residual, eb)
        record_event("refine", f"lstsq: {method} ({side}-preconditioned by the "
                     f"{self.prec} R) {'converged' if out.converged else 'stopped'} after "
                     f"{out.iterations} iterations, normal-equation residual "
                     f"{out.ratio * self.tol:.2e} (tol {self.tol:.2e})", method=method,
                     iterations=out.iterations, residual=out.ratio * self.tol,
                     converged=out.converged, precision=self.prec)
        done = self.unconverged(out, method, stacklevel=5)
        if done is not None:
            return done
        rsq = None
        # residues only where SciPy gives them (M > N; gelsy none): a square system's
        # residual of huge entries would square past the range for nothing
        if out.residual is not None and self.need_s and self.m > self.n:
            rsq = self._column_sq(out.residual)
        return out.x, k, s, rsq

    def _pow2(self, x: Any, e: int) -> Any:
        return pow2_scale(self.backend, x, self.xp.asarray(e, dtype=self.xp.int32,
                                                            device=device(x)))

    def _balanced(self, r: Any, s1: float) -> tuple[Any, Any, Any, float, int, int]:
        """``(A, b, R, ||A||, ea, eb)`` for the refinement, ``A`` and ``R`` scaled by
        ``2**-ea`` and ``b`` by ``2**-eb`` (exactly) when ``||A||`` or ``max |b|`` is so
        far from 1 that the products with ``A`` could underflow or overflow (at
        ``2**-700`` every ``A^H r`` underflows to 0 and CGLS would stop at ``x = 0``);
        then ``x = 2**(eb - ea) x_scaled``. Otherwise no copies and ``ea = eb = 0``."""
        lim = 250 if self.wprec == "fp64" else 30
        ea = math.frexp(s1)[1]
        eb = math.frexp(self._max_abs_b())[1]
        if abs(ea) <= lim and abs(eb) <= lim:
            return self.a, self.b, r, s1, 0, 0
        record_event("scale", f"lstsq: A scaled by 2^{-ea} and b by 2^{-eb} for the "
                     "refinement (its products would under- or overflow)", ea=ea, eb=eb)
        return (self._pow2(self.a, -ea), self._pow2(self.b, -eb), self._pow2(r, -ea),
                math.ldexp(s1, -ea), ea, eb)

    def _gram_route(self) -> GramFactor | None:
        """:func:`mpqr.lstsq.gram.gram_factor` where it applies: a tall factored matrix
        (``M >= 16 N``) and a factorization at the working precision (a low-precision
        Gram matrix would not give SciPy's singular values)."""
        mf, nf = self.f.shape
        if self.u_f > self.u or mf < GRAM_MIN_ASPECT * nf:
            return None
        res = RESOLUTION * math.sqrt(nf) * self.u * GRAM_COND_MAX / 2
        return gram_factor(self.backend, self.f, precision=self._gram_precision(),
                           need_s=self.need_s, cutoff=self.cond, resolution=res)

    def _gram_precision(self) -> str:
        # "auto", or fp64 on float32 input: the working precision's GEMM
        return self.wprec if self.prec == "auto" or UNIT[self.prec] < self.u else self.prec

    def _full_rank_certificate(self, r: Any) -> float | None:
        """``||A||_2`` estimate if ``sigma_min(R) > cutoff + resolution`` is proven, else None.

        Only for ``lapack_driver="gelsy"`` (no singular values to return): the SVD
        of R is replaced by a Cholesky test, ``R^H R - tau^2 I`` positive definite
        iff ``sigma_min(R) > tau``, with ``tau`` at least ``10 sqrt(n u) ||R||`` so
        the rounding of the Gram matrix cannot fake it; ``||R||_2`` is bounded
        by twice a power-iteration estimate (and by ``||R||_F``).
        """
        if self.need_s:
            return None
        xp = self.xp
        k = r.shape[-1]
        mx = float(xp.max(xp.abs(r)))  # NaN or Inf when R holds them: one sync for both
        if not (math.isfinite(mx) and mx > 0.0):
            return None
        # the test is scale-free: on R / 2^e (exact), R^H R and the norms cannot overflow
        # (unscaled, ||A|| = 2^600 made them Inf, declined the test and warned)
        e = math.frexp(mx)[1]
        rs = self._pow2(r, -e)
        g = self._gemm(ct(xp, rs), rs, "rank-gram")
        est = norm2_estimate(lambda x, y: self._gemm(x, y, "rank-power"), self.backend, g)
        if est == 0.0:
            return None
        s1_up = min(2.0 * est, float(xp.linalg.matrix_norm(rs)))
        u_f = self.u_f if self.u_f > self.u else 0.0
        tau = s1_up * max(self.cond + RESOLUTION * math.sqrt(k) * u_f,
                          10.0 * math.sqrt(k * self.u))
        g = g - (tau * tau) * xp.eye(k, dtype=g.dtype, device=device(g))
        if certified_cholesky(self.backend, g) is None:
            return None
        tau = math.ldexp(tau, e)
        record_event("rank", f"lstsq: full rank certified without an SVD (sigma_min(R) > "
                     f"{tau:.2e}, Cholesky test)", rank=k, tau=tau)
        return math.ldexp(est, e)

    def unconverged(self, out: Any, method: str, *, stacklevel: int) -> Any:
        """What a refinement that did not reach ``tol`` leads to: with ``refine="auto"``
        the direct solution at the working precision (a ``fallback`` event); with a
        refinement asked for by name its best iterate stands, after a
        ``RefinementWarning`` (None: the caller returns it). None too where it converged
        or met a non-finite value (which the caller reports)."""
        if out.converged or out.nonfinite:
            return None
        if self.refine == "auto":
            record_event("fallback", "lstsq: refinement did not converge; refactoring at "
                         "the working precision and solving directly", path="direct")
            return self.direct("auto")
        warnings.warn(
            f"lstsq: {method} did not reach tol={self.tol:.2e} in {out.iterations} "
            f"iterations (normal-equation residual {out.ratio * self.tol:.2e}); returning "
            "the best iterate. Use refine='auto' or a higher `precision`.",
            RefinementWarning, stacklevel=stacklevel)
        return None

    def svd_fallback(self, rank_cond: int, rank_sure: int, s1: float, *,
                     stacklevel: int) -> tuple[Any, int, Any, Any]:
        """The minimum-norm solution from the QR-SVD at the working precision, for an R
        that is rank deficient, whose rank is uncertain at a low factorization precision
        (refactored then), or that lies too close to singular to precondition
        (:func:`solvable`); the reason goes to the explain trace."""
        k = min(self.m, self.n)
        low = self.u_f > self.u
        if low and rank_cond > rank_sure:
            why = (f"rank uncertain at precision {self.prec!r}: a singular value of R "
                   f"lies within {RESOLUTION:g} sqrt(n) u_f ||A|| of the cutoff")
        elif rank_cond < k or s1 == 0.0:
            why = "rank deficient"
        else:
            why = (f"R too close to singular to precondition: its smallest singular "
                   f"value lies within {RESOLUTION:g} sqrt(n) u ||A|| of the cutoff")
        record_event("fallback", f"lstsq: {why}; minimum-norm solution from the QR-SVD at "
                     "the working precision" + (" (refactoring)" if low else ""),
                     rank=rank_cond, path="svd")
        if low and self.refine != "auto":  # the caller asked for refinement by name
            warnings.warn(
                f"lstsq: refine={self.refine!r} was not run: {why}, so the problem was "
                "refactored at the working precision and solved directly (the answer "
                "is as accurate as SciPy's; the time is not that of the requested "
                "path). Use a higher `precision` for ill-conditioned problems.",
                RefinementWarning, stacklevel=stacklevel)
        return self.direct("auto" if low else self.prec)

    def direct(self, prec: str) -> tuple[Any, int, Any, Any]:
        """QR (with Q) at ``prec``, then ``R^-1 Q^H b`` or the truncated SVD solution;
        ``gelsy`` (no singular values wanted): QR with column pivoting, its rank and the
        minimum-norm solution of the truncated problem (:mod:`mpqr.lstsq.gelsy`)."""
        xp = self.xp
        if not self.need_s and self.qrcp_gelsy:
            from mpqr.lstsq import gelsy

            x, rank = gelsy.solve(self.backend, self.a, self.b, self.cond, prec, self.wprec)
            return x, rank, None, None
        u_f = max(UNIT[prec], self.u)
        q, r = self._factor(prec, "reduced")
        s = self._svdvals(r)
        k = s.shape[0]
        rank_cond, rank, s1 = self._ranks(s, u_f)
        if s1 == 0.0:
            rank = 0
        if rank < rank_cond:
            record_event("rank", f"lstsq: rank {rank} (not {rank_cond}): singular values "
                         f"below {RESOLUTION:g} sqrt(n) u_f ||A|| are not resolved by a "
                         f"{prec} factorization", rank=rank, rank_cond=rank_cond)
        b = self.b
        # R near either end of the range solved at unit scale, its right side times the same
        # power of two (x unchanged): a complex triangular solve's 1/|d|^2 (and 1/s) would
        # overflow with a subnormal diagonal
        e = unit_shift(self.backend, r)
        r = times_pow2(self.backend, r, e)
        if rank == k and solvable(s, self.cond, u_f):
            record_event("method", f"lstsq: direct QR solve at precision {prec!r}",
                         path="direct", precision=prec)
            if self.under:  # A = R^H Q^H: x = Q R^-H b
                y = self.backend.solve_triangular(xp.asarray(ct(xp, r), copy=True),
                                                  times_pow2(self.backend, b, e), lower=True)
                x = self._gemm(q, y, "Qy")
            else:
                x = self.backend.solve_triangular(
                    r, times_pow2(self.backend, self._qh_b(q), e))
        else:
            what = (f"rank {rank} < {k}: minimum-norm solution" if rank < k else
                    f"rank {k}, but R is too close to singular for a triangular solve (its "
                    f"smallest singular value lies within {RESOLUTION:g} sqrt(n) u_f ||A|| "
                    "of the cutoff): the solution")
            record_event("method", f"lstsq: {what} from the SVD of R", path="svd", rank=rank,
                         precision=prec)
            x = self._svd_solve(q, r, rank, e)
        rsq = self._resid_sq(x) if (self.m > self.n and rank == k and self.need_s) else None
        return x, rank, s, rsq

    def _svd_solve(self, q: Any, r: Any, rank: int, e: int = 0) -> Any:
        """The truncated-SVD solution for ``R 2^-e`` (``r`` times ``2^e``)."""
        xp = self.xp
        u, sv, vh = self.backend.svd(r, full_matrices=False)
        b = self.b
        if rank == 0:
            return xp.zeros((self.n, b.shape[1]), dtype=b.dtype, device=device(r))
        inv = xp.astype(1.0 / sv[:rank], b.dtype)[:, None]
        if self.under:  # A = V S U^H Q^H  (R = U S V^H): x = Q U_k S_k^-1 V_k^H b
            y = inv * self._gemm(vh[:rank, :], times_pow2(self.backend, b, e), "svd-Vhb")
            return self._gemm(q, self._gemm(u[:, :rank], y, "svd-Uy"), "svd-Qy")
        c = times_pow2(self.backend, self._qh_b(q), e)
        y = inv * self._gemm(ct(xp, u[:, :rank]), c, "svd-UHc")
        return self._gemm(ct(xp, vh[:rank, :]), y, "svd-Vy")
