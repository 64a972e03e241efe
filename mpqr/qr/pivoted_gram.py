"""QR with column pivoting in the greedy order from pivoted Cholesky of the Gram matrix,
recursing on the part of the order the Gram matrix cannot resolve.

Step ``k`` of QR with column pivoting (``geqp3``) takes the remaining column of largest
residual norm ``r_j`` (its norm after projection off the columns already taken); step
``k`` of pivoted Cholesky of ``G = A^H A`` (LAPACK ``?pstrf``) takes the largest diagonal
entry ``s_j`` of the Schur complement, and ``s_j = r_j^2``. In exact arithmetic the two
orders are the same. The Gram matrix's rounding (and the Cholesky's) perturbs each
``s_j`` by about ``c u g`` (``g`` the largest ``|a_j|^2``, ``c`` the products' length
in units of roundoff ``u``), so the order is trusted only while the pivot's ``s`` stays
above :func:`resolve_threshold` (``RESOLVE c u g``): there the computed ``s`` carry
relative errors below ``1 / RESOLVE`` and two pivots can be taken in the wrong order only
when their residual norms agree to about that much (a near-tie; an increase of
``|R_kk|`` there is repaired by one column exchange).

:func:`gram_qrcp`:

1. the order: ``G`` through the precision policy (float64 or complex128 whatever the
   input: float32 data is ordered to float64's resolution; a power-of-two scale of the
   whole matrix keeps its entries in range, which changes no order), then
   ``backend.pivoted_cholesky`` stopped at the threshold: the first ``k1`` columns of
   ``P`` are resolved;
2. the unpivoted QR of ``A P`` (the caller's ``factor``, any method and precision);
3. the columns after ``k1`` hold a Householder QR in an unresolved order: their trailing
   block ``T = R[k1:, k1:]`` carries the same absolute errors (``~ u |A|``) as any
   backward-stable QR, and its own Gram matrix resolves it relative to ``|T|``; ``T P2
   = Q2 R2`` by the library QR, ``Q[:, k1:] <- Q[:, k1:] Q2`` (a product through the
   policy), ``R[:k1, k1:]`` permuted, ``R[k1:, k1:] <- R2``; again until every column is
   resolved, ``T`` is exactly zero (nothing left to order) or narrow enough for the exact
   column-norm steps (:func:`~mpqr.qr.pivoted.deterministic_pivots`). Each level gains
   about half the working digits of the remaining range; a level resolves at least its
   first column.
4. :func:`~mpqr.qr.pivoted_repair.repair_diagonal`: adjacent exchanges where a near-tie
   left ``|R_{k+1,k+1}| > |R_kk|`` beyond rounding, the clamp of what is within it.

So ``|R_{k+1,k+1}| <= |R_kk|`` exactly, and ``P`` is the greedy order except at
near-ties (squared residual norms within ``1 / RESOLVE`` relative: the order rounding
decides) and below the noise of the factorization's own rounding.
"""

from __future__ import annotations

import math
from typing import Any

from mpqr._array_api import ct, is_complex
from mpqr.policy import gemm, gram
from mpqr.qr._kernels import column_exponents, normalize_signs, pow2_scale, safe_exponent

__all__ = ["HOUSEHOLDER_LEVELS", "NARROW", "RESOLVE", "gram_order", "gram_qrcp",
           "householder_levels", "resolve_threshold", "take_columns"]

#: Pivots are trusted while their Schur-complement diagonal is above ``RESOLVE`` times
#: its rounding error (:func:`resolve_threshold`): near-ties closer than ``1 / RESOLVE``
#: relative in the squared residual norms may come out in either order.
RESOLVE = 1e3
#: A trailing block of at most this many columns is ordered by the exact column-norm
#: steps (vectorized, one pass a column) instead of another Gram level.
NARROW = 16
#: Where the factor is the library's Householder QR and the backend resumes its steps:
#: one factorization with the levels ordered between its blocks
#: (:func:`householder_levels`) rather than a QR of each level's trailing block
HOUSEHOLDER_LEVELS = True


def resolve_threshold(m: int, n: int, u: float) -> float:
    """``theta``: the pivoted Cholesky of ``G = A^H A`` (``A`` ``m x n``) stops at the
    first pivot below ``theta max_j G_jj``.

    The computed Schur complement is that of ``G + E`` with ``|E_ij|`` within
    ``(gamma_m + gamma_k) |a_i| |a_j|`` (the inner products, then the Cholesky's own
    ``k`` steps); rounding errors of independent signs grow like the square root of the
    length, so each diagonal entry ``s_j`` is perturbed by about
    ``(sqrt(m) + sqrt(n)) u max_j |a_j|^2``. Above ``RESOLVE`` times that, ``s_j`` is
    accurate to ``1 / RESOLVE`` relative (and the residual norm ``sqrt(s_j)`` to half of
    it)."""
    return RESOLVE * (math.sqrt(m) + math.sqrt(n)) * u


def gram_order(backend: Any, x: Any, *, prec_name: str) -> tuple[Any, int, Any]:
    """``(P, k, gmax)`` for a 2-D finite ``x``: ``P`` (int32 ``(n,)`` on ``x``'s device)
    the column order of pivoted Cholesky of ``x^H x`` stopped at
    :func:`resolve_threshold`; its first ``k`` entries are resolved (``k >= 1`` unless
    ``x`` is zero: ``k = 0``, ``P`` the identity). ``gmax``: the largest diagonal entry
    of the (scaled) Gram matrix, a float."""
    xp = backend.xp
    m, n = x.shape
    wide = xp.complex128 if is_complex(xp, x) else xp.float64
    if x.dtype != wide:
        x = xp.astype(x, wide)
    # one power of two for the whole matrix (the order is scale-invariant): the largest
    # entry's squares times m stay finite, the small columns at most underflow (they are
    # then ordered at a later level, relative to their own size)
    e = xp.max(column_exponents(backend, x))
    _sb, he = backend.small(xp.reshape(e, (1,)))
    emax = int(he[0])
    if abs(emax) > safe_exponent(xp, x):
        x = pow2_scale(backend, x, xp.astype(xp.reshape(e, (1, 1)), xp.int32) * -1)
    prec = "auto" if prec_name == "auto" else "fp64"
    g = gram(x, precision=prec, label="qrcp-gram", backend=backend)
    if g is None:  # the product's two triangles may differ by rounding: their mean
        g = gemm(ct(xp, x), x, precision=prec, label="qrcp-gram", backend=backend)
        g = (g + ct(xp, g)) * 0.5
    u = float(xp.finfo(xp.float64).eps) / 2
    return backend.pivoted_cholesky(g, resolve_threshold(m, n, u))


def gram_qrcp(backend: Any, a: Any, *, factor: Any, prec_name: str, precision: Any,
              want_q: bool, householder: bool = False) -> tuple[Any | None, Any, Any, dict]:
    """``(Q or None, R, P, info)``: the QR of ``a[:, P]`` by ``factor`` (the unpivoted QR,
    sign-normalised ``(Q or None, R)``, any mode) in the Gram-resolved greedy order
    (module docstring, steps 1-3; the caller runs the exchange repair). ``a``: 2-D,
    non-empty, finite; not modified. ``info``: ``levels`` (Gram levels),
    ``resolved`` (columns resolved a level), ``narrow`` (columns ordered by the exact
    steps at the end). ``householder`` (the factor is the library's Householder QR,
    reduced or mode "r"): where the backend resumes Householder steps
    (:meth:`~mpqr.backends._base.ArrayAPIBackend.householder_levels`) and
    ``HOUSEHOLDER_LEVELS``, the levels are ordered between blocks of one factorization
    (:func:`householder_levels`) instead."""
    from mpqr.qr import pivoted

    xp = backend.xp
    m, n = a.shape
    kk = min(m, n)
    p, k1, _g = gram_order(backend, a, prec_name=prec_name)
    if householder and HOUSEHOLDER_LEVELS and backend.householder_levels(a):
        return householder_levels(backend, a, p, k1, prec_name=prec_name, want_q=want_q)
    q, r = factor(take_columns(xp, a, p))
    info = {"levels": 1, "resolved": [k1], "narrow": 0}
    j = max(k1, 1)
    while j < kk and j < n - 1:
        t = r[j:kk, j:]
        nt = n - j
        if nt <= NARROW:
            pt = pivoted.deterministic_pivots(backend, t, min(t.shape))
            info["narrow"] = nt
            step = nt
        else:
            pt, step, _g = gram_order(backend, t, prec_name=prec_name)
            if step == 0:  # T is exactly zero: nothing left to order
                break
            info["levels"] += 1
            info["resolved"].append(step)
        q2, r2 = backend.library_qr(take_columns(xp, t, pt), "r" if q is None else "reduced")
        q2, r2 = normalize_signs(xp, q2, r2, check=False)
        r[:j, j:] = xp.take(r[:j, j:], pt, axis=1)
        r[j:kk, j:] = r2
        if q is not None:
            q[:, j:kk] = gemm(q[:, j:kk], q2, precision=precision, label="qrcp-gram-level",
                              backend=backend)
        p = xp.concat([p[:j], xp.take(p[j:], pt)])
        j += step
    return q, r, p, info


def householder_levels(backend: Any, a: Any, p: Any, k1: int, *, prec_name: str,
                       want_q: bool) -> tuple[Any | None, Any, Any, dict]:
    """:func:`gram_qrcp` as one Householder factorization of ``a[:, P]``: ``geqrf`` of the
    ``k1`` resolved columns, their reflectors applied to the rest (``ormqr``); the rest's
    rows below them, ``B`` (``(m - j) x (n - j)``, the same Gram matrix as the trailing
    block ``T`` of the full factorization: ``B = Q_B T``), ordered from its own Gram
    matrix and its columns (with the rows of ``R`` above) permuted; the next resolved
    columns factored, and so on; ``Q`` formed once at the end (``orgqr``). The same
    orders and rounding as the level-by-level route, without its QR of each ``T P2`` and
    the product ``Q[:, j:] Q2``."""
    from mpqr.qr import pivoted

    xp = backend.xp
    m, n = a.shape
    kk = min(m, n)
    w = backend.householder_workspace(a, p)
    info = {"levels": 1, "resolved": [k1], "narrow": 0}
    taus = []
    j, step = 0, max(k1, 1)
    while j < kk:
        j1 = min(j + step, kk)
        taus.append(backend.householder_steps(w, j, j1))
        j = j1
        if j >= kk:
            break
        b = w[j:, j:]
        nt = n - j
        if nt <= NARROW:
            pt = pivoted.deterministic_pivots(backend, b, min(b.shape))
            info["narrow"] = nt
            step = nt
        else:
            pt, step, _g = gram_order(backend, b, prec_name=prec_name)
            if step == 0:  # B is exactly zero: nothing left to order
                step = kk - j
                continue
            info["levels"] += 1
            info["resolved"].append(step)
        w[:, j:] = take_columns(xp, w[:, j:], pt)
        p = xp.concat([p[:j], xp.take(p[j:], pt)])
    tau = xp.concat(taus)
    r = xp.triu(w[:kk, :])
    q = backend.householder_q(w, tau) if want_q else None
    q, r = normalize_signs(xp, q, r, check=False, in_place=True)
    return q, r, p, info


def take_columns(xp: Any, a: Any, p: Any) -> Any:
    """``a[..., :, p]`` for a stack of index vectors ``p`` (``(..., n)``)."""
    if a.ndim == 2:
        return xp.take(a, p, axis=-1)
    idx = xp.broadcast_to(xp.expand_dims(p, axis=-2), a.shape)
    return xp.take_along_axis(a, xp.astype(idx, xp.int64), axis=-1)
