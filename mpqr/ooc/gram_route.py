"""Gram routes out of core: one streamed pass forms ``G = A^H A`` (and, for least
squares, ``A^H b``), and the ``n x n`` work on ``G`` replaces a factorization by pieces.

* :func:`gram_pass` — the pass: ``G = sum A_i^H A_i`` through the precision policy, and
  with a right-hand side ``H = sum A_i^H b_i`` (working precision) and ``max |b|``.
* :func:`two_read_qr` — ``mode="reduced"`` in two reads of ``A`` where the Gram matrix
  certifies a well-conditioned ``A``: ``R = chol(G)`` from the first read, then one read
  that writes ``Q_i = A_i R^-1`` and forms ``Q^H Q`` on the way, the check of the result.
  A failed check costs one pass over the written ``Q`` (CholQR2's second step on it);
  an uncertified ``A`` continues as streaming CholQR2 from the same ``G`` (no read lost).

The certificate is the one of the in-core Gram route (:mod:`mpqr.lstsq.gram`): the
eigenvalues of ``G`` give ``cond(A)``, and the route is taken only at
``cond(A) <= GRAM_COND_MAX``. One CholQR pass then leaves ``||Q^H Q - I||`` of the order
of ``u cond(A)^2``; the second read measures it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from mpqr.lstsq.gram import GRAM_COND_MAX
from mpqr.policy import gemm, record_event
from mpqr.qr._kernels import ct
from mpqr.qr.cholqr import SAFE_GRAM_MIN, _rr
from mpqr.qr.gram_blocked import gram

__all__ = ["ORTH_TOL_N", "GramPass", "applies", "check_piece", "gram_pass", "two_read_qr"]

#: the two-read QR accepts its ``Q`` when ``||Q^H Q - I||_F <= ORTH_TOL_N * n * u``: within
#: the ``8 n u`` the documentation promises for CholQR2, and about what CholQR2 reaches in
#: core (NumPy, m <= 5e4 rows: 0.3-0.6 n u; the one-pass check measured 0.3-0.8 n u)
ORTH_TOL_N = 2.0


@dataclass
class GramPass:
    """What one pass over ``A`` (and ``b``) left on the device."""

    #: ``A^H A`` (``n x n``)
    g: Any
    #: ``A^H b`` (``n x k``), or None without a right-hand side
    h: Any = None
    #: ``max |b|`` (NaN or Inf where ``b`` holds them), or None without a right-hand side
    bmax: float | None = None


def check_piece(backend: Any, blk: Any, check: str | None) -> None:
    """Raise ``ValueError(check)`` where ``blk`` holds NaN/Inf (``check`` None: no check)."""
    if check is not None and not backend.all_finite(blk):
        raise ValueError(check)


def gram_pass(run: Any, src: Any, plan: Any, *, precision: Any, label: str,
              check: str | None, rhs: Any = None, wprec: str = "fp64",
              name: str = "x") -> GramPass:
    """One pass over ``src`` (and ``rhs``, a host array of ``src``'s height, row piece by
    row piece beside it): ``G``, and with ``rhs`` ``A^H b`` in ``wprec`` and ``max |b|``.
    ``check``: the message of the ``ValueError`` raised on NaN/Inf (None: no check)."""
    backend = run.backend
    xp = backend.xp
    n = src.shape[1]
    g = h = bmax = None
    if rhs is None:
        for _region, blk in run.over(src, plan.regions, name):
            check_piece(backend, blk, check)
            gi = gram(backend, blk, precision, label)
            g = gi if g is None else g + gi
        return GramPass(g)
    kb = rhs.shape[1]
    items = [[(src, (r0, r1, 0, n)), (rhs, (r0, r1, 0, kb))] for r0, r1, _, _ in plan.regions]
    with backend.ignore_fp_warnings():  # NaN/Inf in b are reported through max |b|
        for ai, bi in run.over_multi(items, name):
            check_piece(backend, ai, check)
            check_piece(backend, bi, check)
            gi = gram(backend, ai, precision, label)
            hi = gemm(ct(xp, ai), bi, precision=wprec, label=f"{label}-AHb", backend=backend)
            mi = xp.max(xp.abs(bi)) if bi.shape[1] else xp.zeros((), dtype=xp.abs(bi).dtype)
            g = gi if g is None else g + gi
            h = hi if h is None else h + hi
            # NaN must survive the running maximum (a comparison would drop it)
            bmax = mi if bmax is None else xp.where(xp.isnan(mi) | xp.isnan(bmax),
                                                     mi + bmax, xp.maximum(mi, bmax))
    return GramPass(g, h, float(bmax))


def applies(backend: Any, dtype: Any, prec_name: str) -> bool:
    """Whether the Gram matrix at ``prec_name`` is accurate to ``dtype``'s working
    precision (a lower-precision request keeps CholQR2's second pass)."""
    from mpqr.qr.cholqr import gram_roundoff, unit_roundoff

    xp = backend.xp
    dt = getattr(xp, str(dtype))
    return gram_roundoff(xp, dt, prec_name) <= unit_roundoff(xp, dt)


def _certified_cond(sb: Any, g: Any, cond_max: float) -> tuple[Any, float] | None:
    """``(R, cond(A))`` from the Gram matrix ``g`` (small backend ``sb``) when
    ``cond(A) <= cond_max`` by its eigenvalues and the Cholesky factor is valid."""
    from mpqr.lstsq.gram import cholesky_flagged

    xs = sb.xp
    if not bool(xs.all(xs.isfinite(g))):
        return None
    single = g.dtype in (xs.float32, xs.complex64)
    if float(xs.min(xs.real(xs.linalg.diagonal(g)))) < \
            SAFE_GRAM_MIN["float32" if single else "float64"]:
        return None
    lam = xs.linalg.eigvalsh(g)
    lo, hi = float(lam[0]), float(lam[-1])
    if not (lo > 0 and hi / lo <= cond_max * cond_max):
        return None
    r, ok = cholesky_flagged(sb, g)
    if r is None or not bool(ok):
        return None
    return r, math.sqrt(hi / lo)


def two_read_qr(run: Any, src: Any, plan: Any, *, gram_prec: Any, prec_name: str,
                q_out: Any, check: str | None, fallback: Any) -> tuple[Any, str]:
    """``mode="reduced"`` by the Gram route: ``(R on the device, the method that ran)``,
    ``Q`` in ``q_out``. ``fallback(first_gram)``: the streaming CholQR2 that continues
    from the first pass's Gram matrix where ``cond(A)`` is not certified (None: from the
    start)."""
    from mpqr.lstsq.gram import cholesky_flagged
    from mpqr.ooc.tall import _inverse

    backend = run.backend
    n = src.shape[1]
    gp = gram_pass(run, src, plan, precision=gram_prec, label="ooc-gram-qr", check=check)
    with backend.ignore_fp_warnings():
        sb, g = backend.small(gp.g)
        cert = _certified_cond(sb, g, GRAM_COND_MAX)
    if cert is None:
        record_event("method", "qr: out-of-core Gram route declined (cond(x) above "
                     f"{GRAM_COND_MAX:g} or not certified by the eigenvalues of x^H x); "
                     "streaming CholQR2 continues from the same Gram matrix", path="cholqr2")
        return fallback(gp.g), "cholqr2"
    r1, cond = cert
    record_event("method", f"qr: out-of-core Gram route: R = chol(x^H x) from one read "
                 f"(cond(x) = {cond:.3g} <= {GRAM_COND_MAX:g}), then Q = x R^-1 written "
                 "in a second read that forms Q^H Q, its check", path="gram", cond=cond)
    solve = _inverse(backend, backend.from_small(r1, gp.g), "gram-qr", prec_name)
    g2 = None
    for region, blk in run.over(src, plan.regions, "x"):
        qi = solve(blk)
        run.store(q_out, region, qi)
        gi = gram(backend, qi, gram_prec, "ooc-gram-qr-check")
        g2 = gi if g2 is None else g2 + gi
    sb2, g2s = backend.small(g2)
    xs = sb2.xp
    u = float(xs.finfo(g2s.dtype).eps) / 2
    eye = xs.eye(n, dtype=g2s.dtype)
    dist = float(xs.linalg.matrix_norm(g2s - eye, ord="fro"))
    tol = ORTH_TOL_N * n * u
    if dist <= tol:
        record_event("check", f"qr: ||Q^H Q - I||_F = {dist:.2e} <= {tol:.2e} "
                     f"({ORTH_TOL_N:g} n u): Q "
                     "accepted after two reads of x", orthogonality=dist, tol=tol)
        return backend.from_small(r1, gp.g), "gram"
    # the check failed: CholQR2's second step on the written Q (one pass over Q)
    r2, ok = cholesky_flagged(sb2, g2s)
    if r2 is None or not bool(ok) or not dist <= 0.5:
        record_event("fallback", f"qr: ||Q^H Q - I||_F = {dist:.2e} after two reads of x "
                     "despite the certificate; factoring again by streaming CholQR2",
                     orthogonality=dist, fallback="cholqr2")
        return fallback(None), "cholqr2"
    record_event("fallback", f"qr: ||Q^H Q - I||_F = {dist:.2e} > {tol:.2e} after two reads "
                 "of x: Q is multiplied by R2^-1 (R2 = chol(Q^H Q)) in one pass over the "
                 "written Q", orthogonality=dist, tol=tol, fallback="cholqr2-step")
    run.st.flush()  # the pass reads what the previous one wrote
    solve2 = _inverse(backend, backend.from_small(r2, gp.g), "gram-qr", prec_name)
    for region, qi in run.over(q_out, plan.regions, "Q"):
        run.store(q_out, region, solve2(qi))
    return _rr(backend, backend.from_small(r2, gp.g), backend.from_small(r1, gp.g),
               prec_name), "gram+cholqr2-step"
