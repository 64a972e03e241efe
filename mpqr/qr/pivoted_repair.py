"""``|diag(R)|`` made non-increasing by adjacent column exchanges, for a pivoted QR in an
almost greedy order (HQRRP's, :func:`mpqr.qr.pivoted.hqrrp`).

Wherever ``|R_{k+1,k+1}| > |R_kk| + tol`` (``tol`` = :func:`repair_tolerance` ``|R_00|``),
columns ``k`` and ``k + 1`` of ``R`` (and entries of ``P``) are exchanged and the triangle
is restored by a Givens rotation of rows ``k, k + 1`` (``Q``'s two columns by its
conjugate transpose: an exact orthogonal change, ``x[:, P] = Q R`` kept). The new
``|R_kk|`` is ``hypot(R_{k,k+1}, R_{k+1,k+1}) > `` the old one and the 2 x 2 determinant
is kept, so the vector of diagonal entries grows lexicographically and the exchanges
end; the search resumes at ``k - 1`` (the only place a new increase can start before
``k + 1``). The differences left are within ``tol`` (rounding) and are removed by
lowering each entry to the smallest before it, a change of ``R`` below the
factorization's backward error. Afterwards ``|R_{k+1,k+1}| <= |R_kk|`` holds exactly in
the returned numbers.

The exchanges are bounded (:func:`swap_limit`); past the bound the caller takes another
route (the blocked greedy QRCP). ``R``'s exchanges and their rotations are recorded
first, then the list of rotations is applied to ``Q`` (each acts on two of its columns,
so its rows are independent): the order of a CUDA kernel's work on the GPU
(``backend.diagonal_repair``); :func:`reference_repair` takes the same steps with the
backend's array operations and one host read an exchange (cheap on the host).
"""

from __future__ import annotations

import math
from typing import Any

from mpqr._array_api import device
from mpqr.policy import record_event
from mpqr.qr._kernels import eye_like
from mpqr.qr.pivoted_exact import givens_swap, repair_tolerance

__all__ = ["SWAPS_PER_COLUMN", "reference_repair", "repair_diagonal", "swap_limit"]

#: The exchanges allowed, per diagonal entry. Their number is about that of the
#: inversions of HQRRP's diagonal: with decaying singular values a few per column (2-core
#: CPU, float64, 1500 x 200 / 2000 x 300 / 800^2 geometric 1 .. 1e-8: 94 / 258 / 5182;
#: 1500 x 200 algebraic 1885, clustered 2350), with flat ones (Gaussian) hundreds
#: (800^2: 174157), where the blocked greedy QRCP is the faster route.
SWAPS_PER_COLUMN = 16


def swap_limit(kk: int) -> int:
    """The most exchanges :func:`repair_diagonal` makes for ``kk`` diagonal entries."""
    return SWAPS_PER_COLUMN * kk + 64


def repair_diagonal(backend: Any, q: Any | None, r: Any, p: Any, *, u: float,
                    limit: int | None = None) -> tuple[Any | None, Any, Any, int] | None:
    """``(Q, R, P, exchanges)`` of a 2-D pivoted QR (``diag(R)`` real ``>= 0``) with
    ``|R_{k+1,k+1}| <= |R_kk|`` for every ``k``, exactly (module docstring); None when
    more than ``limit`` exchanges (:func:`swap_limit`) would be needed.

    ``u``: the unit roundoff of the factorization's products. New arrays where anything
    changed; the inputs are not modified. NaN/Inf on the diagonal: returned as they are
    (no finite answer to order). One host synchronization on a GPU.
    """
    kk = min(r.shape[-2], r.shape[-1])
    if kk < 2:
        return q, r, p, 0
    m, n = (q.shape[0] if q is not None else r.shape[0]), r.shape[1]
    limit = swap_limit(kk) if limit is None else limit
    tol = repair_tolerance(m, n, u)
    out = backend.diagonal_repair(q, r, p, tol, limit)
    if out is NotImplemented:
        out = reference_repair(backend, q, r, p, tol, limit)
    if out is None:
        record_event("pivot", f"qr(pivoting=True): more than {limit} column exchanges "
                     "needed to order |diag(R)|", swaps=limit)
        return None
    q, r, p, swaps, lowered, most = out
    if swaps or lowered:
        record_event("pivot", f"qr(pivoting=True): |diag(R)| made non-increasing: {swaps} "
                     f"column exchange(s) restored by Givens rotations, {lowered} entries "
                     f"lowered by at most {most:.2e}", swaps=swaps)
    return q, r, p, swaps


def reference_repair(backend: Any, q: Any | None, r: Any, p: Any, tol: float, limit: int
                     ) -> tuple[Any | None, Any, Any, int, int, float] | None:
    """The steps of :func:`repair_diagonal` with the backend's array operations:
    ``(Q, R, P, exchanges, entries lowered, largest lowering)``, or None past ``limit``
    exchanges. ``tol`` is relative to ``|R_00|``."""
    xp = backend.xp
    kk = min(r.shape)
    d = xp.real(xp.linalg.diagonal(r[:kk, :kk]))
    _sb, hd = backend.small(d)
    dh = [float(v) for v in hd]
    if not all(math.isfinite(v) for v in dh):
        return q, r, p, 0, 0, 0.0
    tol = tol * dh[0]

    def first(i: int) -> int:  # the first increase beyond tol at or after i; -1: none
        return next((j for j in range(i, kk - 1) if dh[j + 1] > dh[j] + tol), -1)

    i = first(0)
    if i < 0 and all(dh[j + 1] <= dh[j] for j in range(kk - 1)):
        return q, r, p, 0, 0, 0.0
    r, p = xp.asarray(r, copy=True), xp.asarray(p, copy=True)
    rots = []
    while i >= 0:
        if len(rots) == limit:
            return None
        rots.append((i, *givens_swap(xp, None, r, p, i)))
        _sb, hv = backend.small(xp.stack([xp.real(r[i, i]), xp.real(r[i + 1, i + 1])]))
        dh[i], dh[i + 1] = float(hv[0]), float(hv[1])
        i = first(max(i - 1, 0))
    if q is not None and rots:
        q = xp.asarray(q, copy=True)
        conj = xp.conj if xp.isdtype(q.dtype, "complex floating") else (lambda v: v)
        for j, cc, ss, phase in rots:  # Q G^H, one rotation after another
            qi, qj = xp.asarray(q[:, j], copy=True), xp.asarray(q[:, j + 1], copy=True)
            q[:, j] = cc * qi + ss * qj
            q[:, j + 1] = (-conj(ss) * qi + conj(cc) * qj) * phase
    lows, low = [], dh[0]
    for v in dh:
        low = min(low, v)
        lows.append(low)
    fix = [v - lw for lw, v in zip(lows, dh)]
    lowered = sum(1 for f in fix if f)
    if lowered:
        dev = device(r)
        vals = xp.astype(xp.asarray(lows, dtype=xp.float64, device=dev), r.dtype)
        on = eye_like(xp, (), kk, r.shape[1], xp.float32, dev) != 0
        r[:kk, :] = xp.where(on, xp.expand_dims(vals, axis=-1), r[:kk, :])
    return q, r, p, len(rots), lowered, max(fix, default=0.0)
