"""QR with column pivoting in LAPACK ``geqp3``'s order, with ``|diag(R)|`` non-increasing.

SciPy documents that ``P`` is chosen so that the diagonal of ``R`` is non-increasing,
and code reads the rank as the first ``k`` with ``|R_kk|`` below a tolerance. Two pieces
keep that promise exactly, on every backend and precision:

* :func:`blocked_qrcp` — the greedy order of QR with column pivoting (each pivot the
  remaining column of largest norm, as ``geqp3``), computed a block at a time with the
  flops of blocked Householder QR. A Gaussian sketch (as in
  :func:`~mpqr.qr.pivoted.hqrrp`) proposes each block's columns; with the remaining
  columns of largest exact norm they form ``2 b`` candidates, whose exact greedy order
  is that of QR with column pivoting of their small ``R`` (``backend.qrcp_order``: LAPACK
  ``geqp3`` on NumPy, a device kernel on CuPy). The first ``b`` are factored, and their
  block reflector's first product ``C = W^H A_2`` gives the block's rows ``R_12`` of
  every trailing column, hence each trailing column's norm after each of the block's
  steps (exact norms, downdated with LAPACK's recomputation rule). The block keeps its
  steps up to the first at which some trailing column would have been the larger pivot
  (beyond rounding); the trailing update is the second product with the kept
  reflectors only, and the others' columns return to the trailing matrix. Every kept
  step is therefore a greedy step: ``|R_kk|`` is non-increasing up to rounding.
* :func:`monotone_diagonal` — the stored ``|R_kk|`` come from freshly computed norms, so
  rounding (and near-ties decided on downdated norms) can leave an increase of a few
  units in the last place of ``|R_00|``. A final pass reads the diagonal (one transfer)
  and repairs each increase: one larger than :func:`repair_tolerance` by exchanging the
  two columns and restoring the triangle with a Givens rotation of ``R``'s two rows and
  ``Q``'s two columns (an exact orthogonal change, the product kept); those within it
  by lowering ``|R_{k+1,k+1}|`` to ``|R_kk|``, a change of ``R`` no larger than the
  factorization's own backward error. Afterwards ``|R_{k+1,k+1}| <= |R_kk|`` holds
  exactly in the returned floating-point numbers.
"""

from __future__ import annotations

import math
from typing import Any

from mpqr._array_api import device
from mpqr.backends._base import phase as phase_of
from mpqr.backends._base import swap_order
from mpqr.policy import gemm, gemm_sub, record_event
from mpqr.qr._kernels import (
    ct,
    eye_like,
    householder_panel,
    is_complex,
    normalize_signs,
    panel_precision,
)

__all__ = [
    "CANDIDATES",
    "MIN_BLOCK",
    "TIE",
    "blocked_qrcp",
    "clamp_diagonal",
    "front_moves",
    "givens_swap",
    "monotone_diagonal",
    "repair_tolerance",
    "unit_roundoff",
]

#: Candidates per block: this many times the block width (the sketch's picks, then the
#: remaining columns of largest exact norm).
CANDIDATES = 2
#: Narrowest block after a shortened one.
MIN_BLOCK = 8
#: Two norms closer than ``TIE sqrt(m) u`` (relative; ``u`` the products' unit
#: roundoff) are a tie: the block goes on (rounding decides no pivot; the final pass
#: repairs what that leaves).
TIE = 16.0


def unit_roundoff(prec_name: str, dtype: Any, xp: Any) -> float:
    """Unit roundoff of the products at ``prec_name`` on data of ``dtype``: the larger of
    the working dtype's and the engine's (fp16 inputs: ``2^-11``; fp32: ``2^-24``)."""
    single = dtype in (xp.float32, xp.complex64)
    u = 2.0**-24 if single else 2.0**-53
    if prec_name == "fp16":
        u = max(u, 2.0**-11)
    elif prec_name in ("fp32", "fp32-emulated"):
        u = max(u, 2.0**-24)
    return u


def repair_tolerance(m: int, n: int, u: float) -> float:
    """Largest increase ``|R_{k+1,k+1}| - |R_kk|``, relative to ``|R_00|``, that
    :func:`monotone_diagonal` removes by lowering the later entry: ``(m + n) u``, below
    the backward error bound of Householder QR."""
    return (m + n) * u


def front_moves(xp: Any, cand: Any, cb: int, offset: int) -> tuple[Any, Any]:
    """``(dst, src)`` index arrays (``2 cb`` each, on ``cand``'s device) that bring the
    ``cb`` distinct positions ``cand`` to positions ``0 .. cb-1`` (candidate ``i`` to
    ``i``), the columns they displace going to the positions the candidates left;
    shifted by ``offset``. No host synchronization: unused slots repeat the first
    move (the same value written twice)."""
    dev = device(cand)
    front = xp.arange(cb, dtype=cand.dtype, device=dev)
    sc = xp.sort(cand)
    at = xp.clip(xp.searchsorted(sc, front), 0, cb - 1)
    held = xp.take(sc, at) == front  # front position i holds a candidate
    free = xp.take(front, xp.argsort(xp.astype(held, xp.int8), stable=True))
    out = xp.take(cand, xp.argsort(xp.astype(cand < cb, xp.int8), stable=True))
    nfree = cb - xp.sum(xp.astype(held, cand.dtype))
    valid = front < nfree
    zero = xp.zeros_like(front)
    dst = xp.concat([front, xp.where(valid, out, zero)])
    src = xp.concat([cand, xp.where(valid, free, xp.zeros_like(front) + cand[0])])
    return dst + offset, src + offset


def blocked_qrcp(backend: Any, a: Any, *, precision: Any, prec_name: str, want_q: bool,
                 complete: bool, max_rank: int | None = None, rtol: float | None = None,
                 block: int | None = None) -> tuple[Any | None, Any, Any]:
    """Blocked QR with column pivoting of a 2-D ``a`` in the greedy (``geqp3``) order
    (module docstring); ``diag(R)`` real ``>= 0`` and non-increasing up to rounding
    (:func:`monotone_diagonal` makes it exact).

    Returns ``(Q or None, R, P)``, ``P`` int32; shapes as
    :func:`~mpqr.qr.pivoted.hqrrp` (``max_rank``/``rtol`` truncate). ``a`` is not
    modified.
    """
    from mpqr.qr import pivoted

    xp = backend.xp
    m, n = a.shape
    dev = device(a)
    block = (backend.qrcp_block or pivoted.BLOCK) if block is None else block
    kmax = min(m, n) if max_rank is None else min(m, n, max_rank)
    pp = panel_precision(prec_name, a.dtype, xp)
    rdt = xp.float64 if a.dtype in (xp.float64, xp.complex128) else xp.float32
    sqrt_u = math.sqrt(float(xp.finfo(rdt).eps))
    tie = TIE * math.sqrt(m) * unit_roundoff(prec_name, a.dtype, xp)
    rows = block + pivoted.OVERSAMPLE
    work = backend.permutable_copy(a)
    n_sketch = 0

    def sketch(j: int) -> Any:
        nonlocal n_sketch
        omega = pivoted.gaussian(xp, (rows, m - j), a.dtype, dev, pivoted.SEED + n_sketch)
        n_sketch += 1
        return gemm(omega, work[j:, j:], precision=precision, label="qrcp-sketch",
                    backend=backend)

    def order_of(z: Any, k: int) -> Any:
        """Column order of ``z`` after ``k`` greedy QRCP steps (swap order, on device)."""
        order = backend.qrcp_order(z, k)
        if order is None:
            _sb, ph = backend.small(pivoted.deterministic_pivots(backend, z, k)[:k])
            order = xp.asarray(swap_order([int(v) for v in ph], z.shape[1]),
                               dtype=xp.int32, device=dev)
        return order

    def permute(dst: Any, src: Any) -> None:
        for x in (work, y, nu, nu_ref, perm):
            backend.permute_columns(x, dst, src)

    y = xp.empty((rows, n), dtype=a.dtype, device=dev)
    y[...] = sketch(0)
    nu = backend.column_norms(work)
    nu_ref = xp.asarray(nu, copy=True)
    perm = xp.arange(n, dtype=xp.int32, device=dev)
    blocks = []
    r00 = None
    j = k = 0
    short = 0
    width = block  # the next block's width: halved towards what the last one kept
    while j < kmax:
        nt = n - j
        bk = min(width, kmax - j)
        cb = min(int(CANDIDATES * bk), nt)
        # 1. candidates: the sketch's picks, then the other columns by exact norm
        # (the largest among them: the first step's pivot is the largest column)
        if cb > bk:
            sk = order_of(y[:, j:], bk)
            rest = sk[bk:]
            rest = xp.take(rest, xp.argsort(-xp.take(nu[j:], rest), stable=True))
            cand = xp.astype(xp.concat([sk[:bk], rest[:cb - bk]]), xp.int32)
            permute(*front_moves(xp, cand, cb, j))
        # 2. their greedy order: QRCP of their R (the same norms at every step)
        _q, rc = backend.library_qr(work[j:, j:j + cb], "r")
        permute(*pivoted.move_lists(xp, order_of(rc, bk), bk, j))
        # 3. factor the block; C = W^H A2 gives its rows R12 of every trailing column
        j2 = j + bk
        orig = xp.asarray(work[j:, j:j2], copy=True)
        w, yv, r11 = householder_panel(backend, work[j:, j:j2], precision=pp)
        d = xp.abs(xp.linalg.diagonal(r11))
        c = r12 = None
        if j2 < n:
            c = gemm(ct(xp, w), work[j:, j2:], precision=precision, label="qrcp-update-WhA",
                     backend=backend)
            r12 = work[j:j2, j2:] - gemm(yv[:bk, :], c, precision=pp,
                                          label="qrcp-update-R12", backend=backend)
        # 4. the steps a greedy QRCP takes too: up to the first at which a trailing
        # column's norm (exact, minus the rows already eliminated) beats the pivot's
        checks = [xp.zeros((bk,), dtype=xp.bool, device=dev)]
        if r12 is not None:
            sq = xp.real(r12 * xp.conj(r12)) if is_complex(xp, r12) else r12 * r12
            done = xp.cumulative_sum(sq, axis=0) - sq  # rows before step t
            left = xp.expand_dims(nu[j2:] ** 2, axis=0) - done
            lim = xp.expand_dims(d ** 2 * (1 + tie), axis=1) + \
                tie * xp.expand_dims(nu_ref[j2:] ** 2, axis=0)
            checks = [xp.any(left > lim, axis=1)]
        if rtol is not None:
            checks.append(d <= rtol * (d[0] if r00 is None else r00))
        _sb, hc = backend.small(xp.stack([xp.astype(v, xp.int8) for v in checks]))
        flags = [[bool(hc[i, t]) for t in range(bk)] for i in range(len(checks))]
        ts = next((t for t in range(1, bk) if flags[0][t]), bk)
        if r00 is None:
            r00 = float(d[0])
        if ts < bk:  # the later columns go back to the trailing matrix
            short += 1
            w, yv, c = w[:, :ts], yv[:, :ts], (None if c is None else c[:ts, :])
            rej = orig[:, ts:]
            work[j:, j + ts:j2] = rej - gemm(
                yv, gemm(ct(xp, w), rej, precision=pp, label="qrcp-return", backend=backend),
                precision=pp, label="qrcp-return", backend=backend)
        # near-equal norms (the greedy path unpredictable) shrink the blocks: the wasted
        # rows of C stay within twice the kept ones; predictable stretches widen them
        width = min(block, 2 * width) if ts == bk else max(MIN_BLOCK, 2 * ts)
        jn = j + ts
        work[j:jn, j:jn] = xp.triu(r11[:ts, :ts])
        if c is not None:
            gemm_sub(work[j:, j2:], yv, c, precision=precision, label="qrcp-update-YC",
                     backend=backend)
        blocks.append((j, w, yv))
        k = jn
        if rtol is not None and any(flags[-1][:ts]):
            k = j + flags[-1].index(True)
            break
        if jn >= n or jn >= kmax:
            break
        # 5. downdate the norms (LAPACK's recomputation rule) and the sketch
        r12 = work[j:jn, jn:]
        nu2 = nu[jn:] ** 2 - backend.column_norms(r12) ** 2
        low = nu2 <= sqrt_u * nu_ref[jn:] ** 2
        nu[jn:] = xp.sqrt(xp.where(low, xp.zeros_like(nu2), nu2))
        r11k = work[j:jn, j:jn]
        r11k = r11k + xp.where(r11k == 0, eye_like(xp, (), ts, ts, r11k.dtype, dev),
                               xp.zeros_like(r11k))
        y1r = backend.right_solve_upper(y[:, j:jn], r11k)
        y_new = y[:, jn:] - gemm(y1r, r12, precision=pp, label="qrcp-sketch-downdate",
                                 backend=backend)
        est = backend.column_norms(y_new) / math.sqrt(rows)
        _sb, hc = backend.small(xp.stack([xp.astype(xp.any(low), rdt), xp.max(nu[jn:])]))
        if bool(hc[0]):
            nu[jn:] = backend.column_norms(work[jn:, jn:])
            nu_ref[jn:] = nu[jn:]
        _sb, hc = backend.small(xp.stack([xp.max(nu[jn:]), xp.max(xp.abs(est - nu[jn:]))]))
        nu_max, dev_max = float(hc[0]), float(hc[1])
        if not math.isfinite(nu_max) or nu_max == 0:
            y[:, jn:] = xp.zeros_like(y_new)  # nothing to choose: exact norms decide
        elif dev_max <= pivoted.SKETCH_TOLERANCE * nu_max:
            y[:, jn:] = y_new
        else:
            y[:, jn:] = sketch(jn)
        j = jn
    if short:
        record_event("pivot", f"qr(pivoting=True): {short} block(s) shortened where a "
                     "trailing column overtook the block's candidates", blocks=short)
    r = xp.triu(work if complete else work[:k, :])
    q = None
    if want_q:
        q = eye_like(xp, (), m, m if complete else k, a.dtype, dev)
        for jb, w, yv in reversed(blocks):
            if jb < q.shape[-1]:
                qs = q[jb:, jb:]
                gemm_sub(qs, w, gemm(ct(xp, yv), qs, precision=precision,
                                     label="qrcp-formq-YhQ", backend=backend),
                         precision=precision, label="qrcp-formq-WC", backend=backend)
    q, r = normalize_signs(xp, q, r, check=False)
    return q, r, perm


def monotone_diagonal(backend: Any, q: Any | None, r: Any, p: Any, *, u: float
                      ) -> tuple[Any | None, Any, Any]:
    """``(Q, R, P)`` of a pivoted QR (``diag(R)`` real ``>= 0``, a matrix or a stack)
    with ``|R_{k+1,k+1}| <= |R_kk|`` for every ``k``, exactly (module docstring).

    ``u``: the unit roundoff of the factorization's products. Returns the inputs when
    the diagonal is already non-increasing (one host synchronization); otherwise new
    arrays. ``x[..., :, P] = Q R`` keeps holding to the factorization's accuracy.
    """
    xp = backend.xp
    kk = min(r.shape[-2], r.shape[-1])
    if kk < 2:
        return q, r, p
    d = xp.real(xp.linalg.diagonal(r[..., :kk, :kk]))
    if not bool(xp.any(d[..., 1:] > d[..., :-1])):
        return q, r, p
    if r.ndim > 2:  # stacks: one matrix at a time (only those that need it)
        parts = [monotone_diagonal(backend, None if q is None else q[i, ...], r[i, ...],
                                   p[i, ...], u=u) for i in range(r.shape[0])]
        qs = None if q is None else xp.stack([t[0] for t in parts])
        return qs, xp.stack([t[1] for t in parts]), xp.stack([t[2] for t in parts])
    m, n = (q.shape[0] if q is not None else r.shape[0]), r.shape[1]
    r = xp.asarray(r, copy=True)
    q = None if q is None else xp.asarray(q, copy=True)
    p = xp.asarray(p, copy=True)
    _sb, hd = backend.small(d)
    dh = [float(v) for v in hd]
    if not all(math.isfinite(v) for v in dh):
        return q, r, p  # NaN/Inf: no finite answer to order
    tol = repair_tolerance(m, n, u) * dh[0]
    swaps = 0
    limit = 4 * kk * kk
    i = 0
    while i + 1 < kk and swaps < limit:
        if not dh[i + 1] > dh[i] + tol:
            i += 1
            continue
        givens_swap(xp, q, r, p, i)
        _sb, hv = backend.small(xp.stack([xp.real(r[i, i]), xp.real(r[i + 1, i + 1])]))
        dh[i], dh[i + 1] = float(hv[0]), float(hv[1])
        swaps += 1
        i = max(i - 1, 0)
    # what is left is within rounding: the running minimum
    lows, low = [], dh[0]
    for v in dh:
        low = min(low, v)
        lows.append(low)
    fix = [lw - v for lw, v in zip(lows, dh)]
    if swaps or any(fix):
        record_event("pivot", f"qr(pivoting=True): |diag(R)| made non-increasing: {swaps} "
                     f"column exchange(s), {sum(1 for f in fix if f)} entries lowered by at "
                     f"most {max((-f for f in fix), default=0.0):.2e}", swaps=swaps)
    if any(fix):
        dev = device(r)
        vals = xp.asarray(lows, dtype=xp.float64, device=dev)
        diag = xp.expand_dims(xp.astype(vals, r.dtype), axis=-1)
        on = eye_like(xp, (), kk, n, xp.float32, dev) != 0
        r[:kk, :] = xp.where(on, diag, r[:kk, :])
    return q, r, p


def clamp_diagonal(backend: Any, h: Any) -> Any:
    """``h`` (2-D, real ``>= 0`` diagonal) with each diagonal entry lowered to the
    smallest before it: for LAPACK's raw layout, whose reflectors fix ``Q`` whatever the
    diagonal, of a matrix already in a greedy order (:func:`blocked_qrcp`'s or
    ``geqp3``'s ``P``), where the differences are rounding. Returns ``h`` itself when the
    diagonal is already non-increasing."""
    xp = backend.xp
    kk = min(h.shape)
    d = xp.real(xp.linalg.diagonal(h[:kk, :kk]))
    if kk < 2 or not bool(xp.any(d[1:] > d[:-1])):
        return h
    _sb, hd = backend.small(d)
    lows, low = [], float("inf")
    for v in (float(x) for x in hd):
        low = min(low, v) if v == v else v
        lows.append(low)
    dev = device(h)
    vals = xp.astype(xp.asarray(lows, dtype=xp.float64, device=dev), h.dtype)
    on = eye_like(xp, (), kk, h.shape[1], xp.float32, dev) != 0
    out = xp.asarray(h, copy=True)
    out[:kk, :] = xp.where(on, xp.expand_dims(vals, axis=-1), h[:kk, :])
    return out


def givens_swap(xp: Any, q: Any | None, r: Any, p: Any, i: int) -> tuple[Any, Any, Any]:
    """Exchange columns ``i`` and ``i + 1`` of ``R`` (and entries of ``P``) and restore
    the triangle by a rotation of rows ``i, i + 1`` (``Q``'s columns by its conjugate
    transpose); the new diagonal real ``>= 0``. In place. Returns the rotation
    ``(c, s, phase)`` (0-d arrays): ``Q``'s columns ``i, i + 1`` become
    ``c q_i + s q_{i+1}`` and ``(-conj(s) q_i + conj(c) q_{i+1}) phase``."""
    cplx = is_complex(xp, r)
    col = xp.asarray(r[:, i:i + 1], copy=True)
    r[:, i:i + 1] = r[:, i + 1:i + 2]
    r[:, i + 1:i + 2] = col
    pi = xp.asarray(p[i:i + 1], copy=True)
    p[i:i + 1] = p[i + 1:i + 2]
    p[i + 1:i + 2] = pi
    a, b = r[i, i], r[i + 1, i]
    h = xp.sqrt(xp.abs(a) ** 2 + xp.abs(b) ** 2)
    hs = xp.where(h == 0, xp.ones_like(h), h)
    hz = xp.astype(hs, r.dtype)
    # G = [[c*, s*], [-s, c]] with c = a / h, s = b / h: G [a; b] = [h; 0]
    cc, ss = a / hz, b / hz
    cc = xp.where(h == 0, xp.ones_like(cc), cc)
    ss = xp.where(h == 0, xp.zeros_like(ss), ss)
    conj = xp.conj if cplx else (lambda v: v)
    ri, rj = r[i, i:], r[i + 1, i:]
    new_i = conj(cc) * ri + conj(ss) * rj
    new_j = -ss * ri + cc * rj
    # the second diagonal entry real >= 0: scale that row by the conjugate phase
    ph = new_j[1] if new_j.shape[0] > 1 else xp.ones_like(cc)
    ah = xp.abs(ph)
    phase = phase_of(xp, ph)
    new_j = new_j * conj(phase)
    r[i, i:] = new_i
    r[i + 1, i:] = new_j
    r[i, i] = xp.astype(h, r.dtype)
    r[i + 1, i] = xp.zeros_like(h, dtype=r.dtype)
    if new_j.shape[0] > 1:
        r[i + 1, i + 1] = xp.astype(ah, r.dtype)
    if q is not None:
        # Q R = (Q G^H) (G R): columns i, i + 1 of Q by G^H
        qi, qj = xp.asarray(q[:, i], copy=True), xp.asarray(q[:, i + 1], copy=True)
        q[:, i] = cc * qi + ss * qj
        q[:, i + 1] = (-conj(ss) * qi + conj(cc) * qj) * phase
    return cc, ss, phase
