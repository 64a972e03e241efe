"""The Gram route of :func:`mpqr.lstsq` for well-conditioned tall problems.

CGLS needs from the factorization only a preconditioner ``R`` with
``cond(A R^-1)`` close to 1, and SciPy's ``s``. For a tall ``A`` with a small
condition number both come from one pass over ``A``: ``G = A^H A`` through the
precision policy, ``R = chol(G)`` (one CholQR pass, no ``Q``), and
``s = sqrt(eig(G))``. CholQR2's ``Q1 = A R1^-1`` and second Gram matrix (two of
its three GEMMs over ``A``) are not needed when nothing uses ``Q``.

Accuracy. The computed ``G`` is within ``c u ||A||^2`` of ``A^H A`` (``c``:
the GEMM's and the eigensolver's error constants), so each ``sigma_i`` is
within ``c u ||A||^2 / (2 sigma_i) <= (cond(A) / 2) c u ||A||``: at most
``cond(A) / 2`` times the ``c u ||A||`` of the Householder route. The route is
taken only when ``cond(A) <= GRAM_COND_MAX`` (4), i.e. within 2x of the
Householder route's bound; ``cond(A R^-1) = 1 + O(u cond(A)^2)`` makes CGLS
converge in one or two steps. Otherwise (or if ``G`` is not finite, or a column
is so small that its Gram entries underflow) the caller takes the QR route.

Without ``s`` (``lapack_driver="gelsy"``) the condition number only sets how fast
CGLS converges: ``cond(A R^-1) = 1 + O(u cond(A)^2)`` with ``R`` from the rounded
``G``, a few steps up to ``cond(A) = GRAM_COND_MAX_NO_S`` (1e4). The rank must
still be certain through the rounding of ``G`` (at most ``(M + N) u ||A||^2``), so
``sigma_min(A)`` must also exceed ``sqrt(2 (M + N) u) ||A||``. For ``N > 512`` the
eigenvalues are replaced by tests of ``sigma_min(A) > tau``, with ``tau`` the
largest of ``est / cond_max`` (``est``: a power-iteration estimate of ``||A||``),
the rank cutoff and that rounding floor times an upper bound of ``||A||``: first
``1 / ||R^-1||_F > tau`` from the explicit inverse of ``R = chol(G)`` (cheap, loose
by up to ``sqrt(N)``), else ``G - tau^2 I`` positive definite (a second Cholesky
factorization).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from mpqr._array_api import device
from mpqr._errors import LinAlgError
from mpqr.lstsq._scipy_rules import real_dtype
from mpqr.policy import gemm, record_event
from mpqr.qr.cholqr import SAFE_GRAM_MIN
from mpqr.qr.gram_blocked import gram

__all__ = [
    "GRAM_COND_MAX",
    "GRAM_COND_MAX_NO_S",
    "GRAM_EIG_MAX_N",
    "GRAM_MIN_ASPECT",
    "INVERSE_MARGIN",
    "GramFactor",
    "certified_cholesky",
    "cholesky_flagged",
    "factor_from_gram",
    "gram_factor",
    "inverse_certificate",
    "norm2_estimate",
]

#: largest cond_2(A) the Gram route takes (its singular values are then within
#: cond/2 = 2x of the Householder route's error bound)
GRAM_COND_MAX = 4.0

#: the same without singular values to return (``lapack_driver="gelsy"``): CGLS on
#: ``A R^-1``, ``cond = 1 + O(u cond(A)^2)``, then takes a few steps more than at
#: ``cond(A) <= 4`` (CPU, 50000x200: 72 ms against 297 ms for the QR route at cond 100)
GRAM_COND_MAX_NO_S = 1e4

#: the route is for tall-skinny A (M >= 16 N), where qr(method="auto") takes CholQR2
GRAM_MIN_ASPECT = 16

#: up to this N, ``lapack_driver="gelsy"`` also decides by the eigenvalues (H100, N = 256:
#: eigvalsh 2.1 ms vs 4 ms for the power iteration's syncs and two Cholesky tests)
GRAM_EIG_MAX_N = 512

@dataclass
class GramFactor:
    """Outcome of the Gram route: taken (``r`` set), or declined with a Gram matrix the
    QR route's CholQR2 can start from (``r`` None, ``gram`` set)."""

    #: upper-triangular ``R`` with ``R^H R = fl(A^H A)``, on ``A``'s device; None: declined
    r: Any
    #: singular values of A, descending, on A's device (None when not asked for)
    s: Any
    #: ``||A||_2`` (gelsy: a power-iteration estimate)
    s1: float
    #: ``(small backend, G)``: the Gram matrix, in ``backend.small``'s namespace
    gram: Any = None


def norm2_estimate(gemm2: Any, backend: Any, g: Any, steps: int = 8) -> float:
    """``||A||_2 = sqrt(lambda_max(G))`` from a Hermitian positive semidefinite
    ``G = A^H A`` (or ``R^H R``) by power iteration (a lower bound, close after a few
    steps); ``gemm2(x, y)`` is the caller's policy product. 0.0 for a zero ``G``.

    The iteration runs on ``G^2`` (one GEMM of ``G`` scaled by a power of two so the
    square cannot overflow): ``steps / 2`` steps there make the iterates of ``steps``
    steps on ``G``. At N = 2048 a step is host-bound (0.36 ms on an H100, three launches:
    product, fused column norm, scaling) and the GEMM is 0.35 ms of GPU work. The steps
    stay on ``G``'s device: only the result is read.
    """
    xp = backend.xp
    k = g.shape[-1]
    if k == 0:
        return 0.0
    # for positive semidefinite G, max |g_ij| is on the diagonal
    dmax = float(xp.max(xp.real(xp.linalg.diagonal(g))))
    if not dmax > 0.0:
        return 0.0 if dmax == 0.0 else math.nan
    fi = xp.finfo(real_dtype(xp, g.dtype))
    # |entries| <= 1 after scaling (exact), so those of G^2 are <= N; the exponent is
    # clamped so that 2^-e stays finite in G's dtype (a subnormal dmax)
    e = max(math.frexp(dmax)[1], 2 - math.frexp(float(fi.max))[1])
    gs = g * math.ldexp(1.0, -e)
    g2 = gemm2(gs, gs)
    v = xp.astype(xp.linspace(1.0, 2.0, k, device=device(g)), g.dtype)[:, None]
    # the smallest normal number keeps a zero G's iterates at 0 instead of 0/0
    tiny = fi.smallest_normal
    v = v / xp.astype(backend.column_norms(v) + tiny, v.dtype)
    nw = None
    for _ in range(max(1, (steps + 1) // 2)):
        w = gemm2(g2, v)  # ||w|| = ||G_s^2 v|| with ||v|| = 1 (or v = 0)
        nw = backend.column_norms(w)
        v = w / xp.astype(nw + tiny, w.dtype)
    lam2 = max(float(nw[0]), 0.0)  # lambda_max(G_s)^2
    return math.sqrt(math.ldexp(math.sqrt(lam2), e))


def cholesky_flagged(backend: Any, g: Any) -> tuple[Any, Any]:
    """``(c, ok)``: the upper Cholesky factor of Hermitian ``g`` (None where the library
    raised) and whether it is valid, as a 0-d device boolean the caller reads with
    ``bool()`` once it has queued more work (the check is not a host sync here).

    A factorization that stopped early (cuSOLVER's potrf reports it only through
    devInfo, which CuPy does not check) leaves columns whose squared norms do not
    reproduce ``diag(g)``, or non-finite ones: ``ok`` is False then.
    """
    xp = backend.xp
    try:
        c = backend.cholesky(g, upper=True, check=False)
    except LinAlgError:
        return None, False
    d = xp.real(xp.linalg.diagonal(g))
    cn = xp.sum(xp.real(c * xp.conj(c)), axis=0)
    ok = xp.all(xp.isfinite(cn)) & xp.all(xp.abs(cn - d) <= 1e-6 * xp.max(xp.abs(d)))
    return c, ok


def certified_cholesky(backend: Any, g: Any) -> Any:
    """Upper Cholesky factor of Hermitian ``g``, or None if ``g`` is not (numerically)
    positive definite (see :func:`cholesky_flagged`)."""
    c, ok = cholesky_flagged(backend, g)
    return c if c is not None and bool(ok) else None


#: relative margin on ``1 / ||R^-1||_F``: the computed inverse is within about
#: ``N u cond(R)`` of the exact one (trsm's backward error), below 1e-6 wherever the
#: test can pass (``cond(R) <= sqrt(N) / (sqrt(2 (M + N) u))``)
INVERSE_MARGIN = 1.01


def inverse_certificate(backend: Any, r: Any, tau: float) -> float | None:
    """``||R^-1||_F`` if ``sigma_min(R) >= 1 / ||R^-1||_F > tau`` is proven by the
    explicit inverse of the upper-triangular ``r``, else None.

    One triangular solve with ``N`` right-hand sides (a GEMM-rich trsm) instead of a
    second Cholesky factorization (a latency-bound potrf, 2.3 ms at N = 2048 on an H100).
    ``||R^-1||_2 <= ||R^-1||_F <= sqrt(N) ||R^-1||_2``: the bound is loose by up to
    ``sqrt(N)``, so it certifies well-conditioned ``R`` only; the caller falls back to
    the Cholesky test otherwise.
    """
    xp = backend.xp
    n = r.shape[-1]
    x = backend.solve_triangular(r, xp.eye(n, dtype=r.dtype, device=device(r)), lower=False)
    fro = float(xp.linalg.vector_norm(x))  # NaN/Inf fail the test below
    if math.isfinite(fro) and fro > 0.0 and 1.0 / (INVERSE_MARGIN * fro) > tau:
        return fro
    return None


def _decline(why: str) -> None:
    record_event("method", f"lstsq: Gram route declined ({why}); QR route", path="qr")


def gram_factor(backend: Any, f: Any, *, precision: str, need_s: bool, cutoff: float,
                resolution: float) -> GramFactor | None:
    """The Gram route on the tall ``f`` (``M >= GRAM_MIN_ASPECT * N``). When it does not
    apply (the reason is recorded in the explain trace): a :class:`GramFactor` with
    ``r = None`` carrying the finite Gram matrix for the QR route, or None when ``G`` is
    not finite or a column's entries underflow in it.

    ``cutoff``: the rank cutoff ``cond`` relative to ``s[0]``; ``resolution``: how far
    above it (relative to ``s[0]``) the smallest singular value must lie for the rank
    to be certain. The route returns only full-rank, well-conditioned factors.
    """
    with backend.ignore_fp_warnings():  # an over- or underflowing G is declined below
        sb, g = backend.small(gram(backend, f, precision, "lstsq:gram"))
    return factor_from_gram(backend, sb, g, f.shape, f, precision=precision, need_s=need_s,
                            cutoff=cutoff, resolution=resolution)


def factor_from_gram(backend: Any, sb: Any, g: Any, shape: tuple[int, int], like: Any, *,
                     precision: str, need_s: bool, cutoff: float, resolution: float,
                     use: str = "preconditions CGLS") -> GramFactor | None:
    """:func:`gram_factor`'s decision from a Gram matrix ``g`` of an ``M x N`` matrix
    already formed (in the small backend ``sb``); ``R`` and ``s`` are returned on
    ``like``'s device (``mpqr.backends.dask`` sums ``g`` over row blocks, the
    out-of-core route over row pieces). ``use``: what ``R`` is for, in the trace."""
    m, n = shape
    xs = sb.xp
    if not bool(xs.all(xs.isfinite(g))):
        _decline("A^H A is not finite")
        return None
    single = g.dtype in (xs.float32, xs.complex64)
    if float(xs.min(xs.real(xs.linalg.diagonal(g)))) < \
            SAFE_GRAM_MIN["float32" if single else "float64"]:
        _decline("a column norm of A is small enough for its Gram entries to underflow")
        return None
    declined = GramFactor(None, None, math.nan, (sb, g))
    cond_max = GRAM_COND_MAX if need_s else GRAM_COND_MAX_NO_S
    # without s the bound on cond(A) is CGLS's, and G's rounding must not hide the rank
    rounding = 0.0 if need_s else math.sqrt(2.0 * (m + n) * (2.0**-24 if single else 2.0**-53))
    floor = max(cutoff + resolution, 1.0 / cond_max, rounding)
    s = None
    by_eig = need_s or n <= GRAM_EIG_MAX_N
    if by_eig:
        lam = xs.linalg.eigvalsh(g)  # ascending
        lo, hi = float(lam[0]), float(lam[-1])
        if not (lo > 0 and math.sqrt(lo / hi) > floor):
            cond = math.sqrt(hi / lo) if lo > 0 else math.inf
            _decline(f"cond(A) = {cond:.3g} > {cond_max:g}" if floor * cond_max <= 1.0 else
                     f"sigma_min/sigma_max = {1 / cond:.3g} <= " + (
                         f"the rank cutoff {floor:.3g}" if floor > rounding else
                         f"sqrt(2 (M + N) u) = {floor:.3g}, the rounding of A^H A"))
            return declined
        s = xs.sqrt(xs.flip(lam))
        s1, cond = math.sqrt(hi), math.sqrt(hi / lo)
    # the factor's check is read after the power iteration is queued: the host issues
    # those launches while the GPU factors (one sync for both)
    r, r_ok = cholesky_flagged(sb, g)
    if not by_eig:
        def gemm2(x: Any, y: Any) -> Any:
            return gemm(x, y, precision=precision, label="lstsq:gram-power", backend=sb)

        s1 = norm2_estimate(gemm2, sb, g)  # a lower bound, close after 8 steps
    if r is None or not bool(r_ok):
        _decline("the Cholesky factorization of A^H A failed")
        return declined
    how = "Cholesky test"
    if not by_eig:
        # the rank cutoff needs an upper bound: ||A|| <= 2 est (the margin the QR route's
        # certificate takes), <= ||A||_F exactly
        s1_up = min(2.0 * s1, math.sqrt(float(xs.sum(xs.real(xs.linalg.diagonal(g))))))
        tau = max(s1 / cond_max, (cutoff + resolution) * s1_up, rounding * s1_up)
        # first the explicit inverse (cheaper); where its Frobenius bound is too loose,
        # the Cholesky test of G - tau^2 I decides
        fro = inverse_certificate(sb, r, tau) if s1 > 0.0 else None
        if fro is not None:
            cond, how = INVERSE_MARGIN * s1_up * fro, "||R^-1||_F bound"
        else:
            eye = xs.eye(n, dtype=g.dtype, device=device(g))
            if s1 == 0.0 or certified_cholesky(sb, g - (tau * tau) * eye) is None:
                _decline(f"sigma_min(A) > {tau:.3g} (cond(A) <~ {cond_max:g}, above the "
                         "rank cutoff and the rounding of A^H A) not certified by the "
                         "Cholesky test")
                return declined
            cond = s1 / tau
    record_event("method", f"lstsq: Gram route: R = chol(A^H A) {use}"
                 + ((", s = sqrt(eig(A^H A))" if need_s else "")
                    + f" (cond(A) = {cond:.3g} <= {cond_max:g})"
                    if by_eig else f" (cond(A) <= {cond:.3g}, {how})"),
                 path="gram", cond=cond)
    return GramFactor(backend.from_small(r, like),
                      backend.from_small(s, like) if need_s else None, s1, (sb, g))
