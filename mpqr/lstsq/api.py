"""``mpqr.lstsq``: SciPy's ``lstsq`` contract on a (mixed-precision) QR factorization.

Route for one ``M x N`` problem (``M >= N``; ``M < N`` works on ``A^H``):

0. With refinement, at the working precision, and for a tall factored matrix
   (``M >= 16 N``): the Gram route (:mod:`mpqr.lstsq.gram`) — ``R = chol(A^H A)``
   and ``s = sqrt(eig(A^H A))`` from one pass over ``A``, taken only when
   ``cond(A) <= 4`` (then ``s`` is within 2x of the QR route's error bound; gelsy,
   which returns no ``s``: ``cond(A) <= 1e4``) and the rank is certainly full;
   step 3 follows. Otherwise (its ``G`` then starts step 1's CholQR2):
1. ``R`` from :func:`mpqr.qr` at the requested precision; with refinement
   ``mode="r"`` (Q is never formed), without it ``mode="reduced"``. Where ``qr``
   would factor an ``fp16``/``fp32-emulated`` request in the input's own precision
   (a tall-skinny factored matrix: :func:`mpqr.qr.api.factor_precision`), lstsq takes
   that precision from the start, so the Gram route (step 0), the rank resolution and
   the trace all refer to the R that is really computed.
2. The singular values of ``R`` are those of ``A`` (the QR-SVD route); they
   give ``s`` and the rank for the cutoff ``cond * s[0]``. A factorization
   below the working precision resolves singular values only to about
   ``sqrt(N) u_f ||A||``: when a singular value falls in that uncertainty
   band the rank is not decided from ``R`` (see below).
3. Full rank: ``refine`` runs preconditioned CGLS or iterative refinement
   (:mod:`mpqr.lstsq.refine`) with residuals in working precision, or, with
   ``refine=None``, the direct ``x = R^-1 Q^H b``.
4. Rank deficient: the minimum-norm solution of the truncated problem,
   ``x = V_k S_k^-1 U_k^H Q^H b`` from the SVD ``R = U S V^H``.

``refine="auto"`` never returns an answer less accurate than SciPy's: when the
rank is uncertain at the factorization precision, or the refinement does not
converge, it refactors at the working precision (``precision="auto"``) and
solves directly; every path is recorded in the explain trace.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from typing import Any

from mpqr._array_api import device
from mpqr._errors import LinAlgError, RefinementWarning
from mpqr._gpu_errors import device_errors
from mpqr._validation import check_finite as _check_finite
from mpqr._validation import namespace_of
from mpqr.backends import get_backend
from mpqr.lstsq import _scipy_rules as rules
from mpqr.lstsq.gram import (
    GRAM_COND_MAX,
    GRAM_MIN_ASPECT,
    GramFactor,
    certified_cholesky,
    gram_factor,
    norm2_estimate,
)
from mpqr.lstsq.refine import cgls, iterative_refinement
from mpqr.policy import gemm, record_event, resolve_precision, validate_precision
from mpqr.qr import qr
from mpqr.qr._kernels import ct, pow2_scale
from mpqr.qr.api import factor_precision
from mpqr.qr.cholqr import reuse_first_gram

__all__ = ["REFINE", "lstsq"]

#: Accepted values of ``refine``.
REFINE = ("auto", "cgls", "ir", None)

#: Unit roundoff of the factorization for each precision setting ("auto": working).
_UNIT = {"fp16": 2.0**-11, "fp32": 2.0**-24, "fp32-emulated": 2.0**-24, "fp64": 2.0**-53,
         "fp64-emulated": 2.0**-53, "auto": 0.0}

#: Singular values of a factorization in precision u_f are trusted down to
#: ``RESOLUTION * sqrt(N) * u_f * s[0]`` (backward error of Householder QR).
RESOLUTION = 10.0

_LOW_COMPLEX = ("fp16", "fp32-emulated", "fp64-emulated")


def lstsq(a: Any, b: Any, cond: float | None = None, overwrite_a: bool = False,
          overwrite_b: bool = False, check_finite: bool = True,
          lapack_driver: str | None = None, *, precision: str | None = None,
          refine: str | None = "auto", tol: float | None = None,
          maxiter: int | None = None) -> tuple[Any, Any, Any, Any]:
    """Least-squares solution of ``a @ x = b`` with SciPy's signature and results.

    Parameters
    ----------
    a : array, shape (M, N) or (..., M, N)
        Array of any Array API library (NumPy, CuPy, ...). Dtypes are cast as
        SciPy's LAPACK wrappers do (int32+ to float64; bool, small ints and
        float16 to float32; float64 with complex64 to complex128).
    b : array, shape (M,) or (M, K) (or batched, as in SciPy)
    cond : float, optional
        Singular values ``<= cond * s[0]`` count as zero (default and
        negative values: the machine epsilon of the computation dtype).
    overwrite_a, overwrite_b : bool
        Accepted for compatibility; the inputs are never modified (the
        refinement and the residues need them).
    check_finite : bool
        Raise ``ValueError("array must not contain infs or NaNs ...")`` for
        NaN/Inf input. With False, NaN/Inf in ``b`` give NaN in ``x``; NaN/Inf
        in ``a`` raise :class:`mpqr.LinAlgError`.
    lapack_driver : {"gelsd", "gelsy", "gelss"}, optional
        Validated as SciPy does. ``"gelsy"`` gives ``s = None`` and empty
        ``residues`` (as in SciPy); the computation is the same for all three.
    precision : str, optional
        Precision of the QR factorization's matrix products (``"auto"``,
        ``"fp16"``, ``"fp32"``, ``"fp32-emulated"``, ``"fp64"``,
        ``"fp64-emulated"``); ``None`` uses the ``mpqr.precision`` context.
        Residuals and refinement products always run in the working precision.
        Complex input supports ``"auto"``, ``"fp32"`` and ``"fp64"``.
    refine : {"auto", "cgls", "ir", None}
        ``"cgls"``: CGLS preconditioned by ``R``; ``"ir"``: iterative
        refinement on the semi-normal equations; ``"auto"``: CGLS, with a
        working-precision refactorization when the rank is uncertain at the
        factorization precision or CGLS stalls; ``None``: the direct solution
        at the factorization precision (the fast answer; with a low
        ``precision`` the rank cutoff cannot go below that precision's
        resolution, ``10 sqrt(N) u_f``, which is recorded in the trace).
    tol : float, optional
        Refinement tolerance on the normal-equation backward error
        ``||A^H r|| / (||A|| (||A|| ||x|| + ||r||))`` (underdetermined:
        ``||R^-H r|| / ||x||``). Default: the unit roundoff ``u`` of the
        working precision, where a refinement that stalls below
        ``sqrt(max(M, N)) u`` (the rounding floor of the products with ``A``)
        also counts as converged; an explicit ``tol`` is strict.
    maxiter : int, optional
        Iteration cap of the refinement (default 50).

    Returns
    -------
    x : array, shape (N,) or (N, K)
        Least-squares solution (minimum norm when rank deficient or M < N).
    residues : array, shape (K,), () or (0,)
        Squared 2-norm of each column of ``b - a @ x`` when ``M > N`` and
        ``rank == N`` (0-D for 1-D ``b``); otherwise empty with the dtype of
        ``x``; always empty for ``"gelsy"``. With SciPy >= 1.18 installed, a rank
        deficient ``M > N`` problem gets NaN residues of the full-rank shape
        instead, as ``scipy.linalg.lstsq`` does there.
    rank : int
        Effective rank of ``a`` (an integer array for batched input).
    s : array, shape (min(M, N),) or None
        Singular values of ``a`` (descending), ``None`` for ``"gelsy"``.

    Raises
    ------
    ValueError
        SciPy's errors: ``a`` not 2-D, row-count mismatch, unknown driver,
        NaN/Inf with ``check_finite``; also an unknown ``refine``/``precision``.
    TypeError
        ``a`` or ``b`` not an array, or arrays of different libraries.
    NotImplementedError
        Complex input with an emulated precision.
    mpqr.LinAlgError
        ``a`` holds NaN/Inf with ``check_finite=False``.

    Warns
    -----
    mpqr.RefinementWarning
        ``refine="cgls"`` or ``"ir"`` stopped before meeting ``tol``; the best
        iterate is returned.

    Examples
    --------
    >>> import numpy as np, mpqr
    >>> a = np.array([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]])
    >>> x, res, rank, s = mpqr.lstsq(a, np.array([1.0, 2.0, 2.0]))
    >>> np.round(x, 6).tolist(), rank
    ([0.666667, 0.5], 2)
    """
    xp = namespace_of(a, b, names=("a", "b"))
    if refine not in REFINE:
        raise ValueError(f"`refine` must be one of 'auto', 'cgls', 'ir' or None; got {refine!r}")
    if precision is not None:
        validate_precision(precision)
    prec_name, _ = resolve_precision(precision)
    if tol is not None and not (isinstance(tol, (int, float)) and tol > 0):
        raise ValueError(f"`tol` must be a positive number, got {tol!r}")
    if maxiter is not None and not (isinstance(maxiter, int) and maxiter >= 1):
        raise ValueError(f"`maxiter` must be a positive integer, got {maxiter!r}")
    if cond is not None and (isinstance(cond, bool) or (not isinstance(cond, (int, float))
                             and not hasattr(cond, "__float__"))):
        raise TypeError(f"`cond` must be a real number or None, got {type(cond).__name__} "
                        f"{cond!r}")
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
        return _lstsq_2d(backend, a2, b2, cond, lapack_driver, prec_name, refine, tol,
                         maxiter)

    if a.ndim < 2:
        raise ValueError("Input array a should be 2D")
    with device_errors(backend, "mpqr.lstsq"):
        return rules.apply_over_batch(xp, a, b, one)


def _lstsq_2d(backend: Any, a: Any, b: Any, cond: Any, driver: Any, prec: str,
              refine: str | None, tol: float | None, maxiter: int | None
              ) -> tuple[Any, Any, int, Any]:
    xp = backend.xp
    m, n = a.shape
    if m == 0 or n == 0:  # SciPy answers before validating the driver
        return rules.empty_result(xp, a, b)
    driver = rules.check_driver(driver)
    wdt = rules.lapack_dtype(xp, a.dtype, b.dtype)
    is_c = xp.isdtype(wdt, "complex floating")
    if is_c and prec in _LOW_COMPLEX:
        raise NotImplementedError(
            f"`precision`={prec!r} is not supported for complex input ({wdt}): the emulated "
            "engines are real-only; use precision 'auto', 'fp32' or 'fp64'")
    aw = a if a.dtype == wdt else xp.astype(a, wdt)
    bw = b if b.dtype == wdt else xp.astype(b, wdt)
    vec = bw.ndim == 1
    b2 = xp.reshape(bw, (m, 1)) if vec else bw
    eps = float(xp.finfo(wdt).eps)
    if cond is None or cond < 0:
        cond = eps
    solver = _Solver(backend, aw, b2, float(cond), prec, refine, eps, tol, maxiter,
                     need_s=driver != "gelsy")
    x, rank, s, rsq = solver.run()
    dev = device(x)
    if m > n and rank == n and driver != "gelsy" and rsq is not None:
        if rsq.dtype != x.dtype:  # SciPy's residues have x's dtype (complex stays complex)
            rsq = xp.astype(rsq, x.dtype)
        res = xp.reshape(rsq, ()) if vec else rsq  # 0-D array for 1-D b
    elif m > n and rank < n and driver != "gelsy" and rules.nan_residues_when_rank_deficient():
        # SciPy >= 1.18 gives a rank-deficient M > N problem NaN residues, full-rank shape
        res = xp.full(() if vec else (b2.shape[1],), float("nan"), dtype=x.dtype, device=dev)
    else:
        res = rules.residues_empty(xp, x.dtype, dev)
    if vec:
        x = x[:, 0]
    return x, res, rank, (None if driver == "gelsy" else s)


class _Solver:
    """One 2-D problem in the working dtype; ``b`` is 2-D."""

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
        self.u_f = max(_UNIT[prec], self.u)
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
        """(rank by cond, rank certain at the factorization precision, s[0])."""
        xp = self.xp
        s1 = float(s[0])
        cut = self.cond * s1
        delta = RESOLUTION * math.sqrt(s.shape[0]) * u_f * s1 if u_f > self.u else 0.0
        return int(xp.sum(xp.astype(s > cut, xp.int32))), \
            int(xp.sum(xp.astype(s > cut + delta, xp.int32))), s1

    def _factor(self, prec: str, mode: str) -> Any:
        return qr(self.f, mode=mode, precision=prec)

    def _resid_sq(self, x: Any) -> Any:
        r = self.b - self._gemm(self.a, x, "residual-Ax")
        return self.backend.column_norms(r) ** 2

    # --- paths ---------------------------------------------------------------
    def run(self) -> tuple[Any, int, Any, Any]:
        xp = self.xp
        if not bool(xp.all(xp.isfinite(self.b))):
            # NaN/Inf in b (check_finite=False): x is NaN, never a finite-looking answer
            r = self._factor(self.prec, "r")
            s = self._svdvals(r)
            rank_cond, _, s1 = self._ranks(s, self.u)
            nan = xp.full((self.n, self.b.shape[1]), float("nan"), dtype=self.a.dtype,
                          device=device(self.a))
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
            else:
                rank_cond = rank_sure = k
        if s1 == 0.0 or rank_sure < k:
            low = self.u_f > self.u
            why = (f"rank uncertain at precision {self.prec!r}: a singular value of R lies "
                   f"within {RESOLUTION:g} sqrt(n) u_f ||A|| of the cutoff"
                   if low and rank_cond > rank_sure else "rank deficient")
            record_event("fallback", f"lstsq: {why}; minimum-norm solution from the QR-SVD at "
                         "the working precision" + (" (refactoring)" if low else ""),
                         rank=rank_cond, path="svd")
            if low and self.refine != "auto":  # the caller asked for refinement by name
                warnings.warn(
                    f"lstsq: refine={self.refine!r} was not run: {why}, so the problem was "
                    "refactored at the working precision and solved directly (the answer "
                    "is as accurate as SciPy's; the time is not that of the requested "
                    "path). Use a higher `precision` for ill-conditioned problems.",
                    RefinementWarning, stacklevel=4)
            return self.direct("auto" if low else self.prec)
        side = "left" if self.under else "right"
        method = "ir" if self.refine == "ir" else "cgls"
        run = iterative_refinement if method == "ir" else cgls
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
        if not out.converged and not out.nonfinite:
            if self.refine == "auto":
                record_event("fallback", "lstsq: refinement did not converge; refactoring at "
                             "the working precision and solving directly", path="direct")
                return self.direct("auto")
            warnings.warn(
                f"lstsq: {method} did not reach tol={self.tol:.2e} in {out.iterations} "
                f"iterations (normal-equation residual {out.ratio * self.tol:.2e}); returning "
                "the best iterate. Use refine='auto' or a higher `precision`.",
                RefinementWarning, stacklevel=4)
        rsq = None
        if out.residual is not None and self.need_s:  # gelsy returns no residues either
            rsq = self.backend.column_norms(out.residual) ** 2
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
        eb = math.frexp(float(self.xp.max(self.xp.abs(self.b))))[1]
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
        return self.wprec if self.prec == "auto" or _UNIT[self.prec] < self.u else self.prec

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

    def direct(self, prec: str) -> tuple[Any, int, Any, Any]:
        """QR (with Q) at ``prec``, then ``R^-1 Q^H b`` or the truncated SVD solution."""
        xp = self.xp
        u_f = max(_UNIT[prec], self.u)
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
        if rank == k:
            record_event("method", f"lstsq: direct QR solve at precision {prec!r}",
                         path="direct", precision=prec)
            if self.under:  # A = R^H Q^H: x = Q R^-H b
                y = self.backend.solve_triangular(xp.asarray(ct(xp, r), copy=True), b,
                                                  lower=True)
                x = self._gemm(q, y, "Qy")
            else:
                x = self.backend.solve_triangular(r, self._gemm(ct(xp, q), b, "QHb"))
        else:
            record_event("method", f"lstsq: rank {rank} < {k}: minimum-norm solution from "
                         "the SVD of R", path="svd", rank=rank, precision=prec)
            x = self._svd_solve(q, r, rank)
        rsq = self._resid_sq(x) if (self.m > self.n and rank == k and self.need_s) else None
        return x, rank, s, rsq

    def _svd_solve(self, q: Any, r: Any, rank: int) -> Any:
        xp = self.xp
        u, sv, vh = self.backend.svd(r, full_matrices=False)
        b = self.b
        if rank == 0:
            return xp.zeros((self.n, b.shape[1]), dtype=b.dtype, device=device(b))
        inv = xp.astype(1.0 / sv[:rank], b.dtype)[:, None]
        if self.under:  # A = V S U^H Q^H  (R = U S V^H): x = Q U_k S_k^-1 V_k^H b
            y = inv * self._gemm(vh[:rank, :], b, "svd-Vhb")
            return self._gemm(q, self._gemm(u[:, :rank], y, "svd-Uy"), "svd-Qy")
        c = self._gemm(ct(xp, q), b, "QHb")
        y = inv * self._gemm(ct(xp, u[:, :rank]), c, "svd-UHc")
        return self._gemm(ct(xp, vh[:rank, :]), y, "svd-Vy")
