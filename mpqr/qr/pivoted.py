"""QR with column pivoting: ``x[:, P] = Q R`` with ``|diag(R)|`` revealing the rank.

:func:`mpqr.qr.pivoted_route.qr_pivoted` picks the route. ``pivoting=True`` (every
SciPy-compatible call):
``abs(diag(R))`` non-increasing exactly, ``P`` the greedy order of LAPACK ``geqp3`` up to
rounding — from ``geqp3`` itself where the backend has it (``backend.qrcp_library``,
NumPy), from :func:`deterministic_pivots` for stacks and small matrices, else from
pivoted Cholesky of the Gram matrix (:func:`mpqr.qr.pivoted_gram.gram_qrcp`, up to
near-ties) or :func:`mpqr.qr.pivoted_exact.blocked_qrcp` (or, where a backend chooses it,
:func:`hqrrp`'s order repaired by adjacent column exchanges,
:mod:`mpqr.qr.pivoted_repair`: then ``P`` need not be ``geqp3``'s); then
:func:`mpqr.qr.pivoted_exact.monotone_diagonal`. ``pivoting="randomized"`` (mpqr's own
API): :func:`hqrrp` as it comes, faster, rank-revealing, the diagonal not monotone.

The two pivot rules of this module:

* :func:`hqrrp` — blocked randomized QRCP for one large matrix (HQRRP: Martinsson,
  Quintana-Ortí, Heavner & van de Geijn 2017; Duersch & Gu 2017). A Gaussian sketch
  ``Y = Ω A`` of ``b + p`` rows (``b`` the block width, ``p`` the oversampling) stands
  in for the matrix when pivots are chosen: for each block of ``b`` columns,

  1. choose ``b`` pivots by QR with column pivoting of the small sketch's remaining
     columns (``backend.qrcp_order``: LAPACK ``geqp3`` on NumPy; elsewhere
     :func:`deterministic_pivots`, whose steps need no host synchronization);
  2. swap them to the front (LAPACK's swaps, as index arrays on the device) and
     factor that block column with Householder reflectors in compact WY form
     (:func:`~mpqr.qr._kernels.householder_panel`);
  3. apply the block reflector to the trailing columns (two products through the
     precision policy, as in :mod:`mpqr.qr.householder_tiled`), which gives ``R12``;
  4. downdate the sketch to one of the trailing matrix,
     ``Y2 <- Y2 - (Y1 R11^-1) R12`` (Martinsson et al., eq. 9: exactly
     ``Ω (I - Q1 Q1^H) A2``), and the trailing column norms,
     ``nu_j^2 <- nu_j^2 - |R12[:, j]|^2`` (recomputed when the difference has lost
     half the digits, LAPACK's rule).

  The sketch's choice is checked against the exact column norms at every block (one
  transfer of three numbers; without ``rtol``, the block's only wait for the device): when
  the downdated sketch no longer represents them (an ill-conditioned ``R11`` at a
  rank deficiency amplifies its rounding, or a non-finite downdate), the trailing
  matrix is sketched again with a fresh ``Ω``; when every remaining column is exactly
  zero the remaining order is kept (no choice is left to make). The flops are those
  of unpivoted blocked Householder QR plus ``2 (b + p) m n`` for the sketch.

* :func:`deterministic_pivots` — classic column-norm pivoting (Businger & Golub,
  LAPACK ``geqp2``'s rule: largest remaining column norm, the first of equals),
  vectorized over a stack; the permuted matrix is then factored by the unpivoted QR
  (any method, every precision). For stacks and for matrices of at most
  :data:`DETERMINISTIC_MAX_SIZE` entries, where its ``O(m n^2)`` vector operations
  are cheap.

Both give ``R`` with ``diag(R)`` real and ``>= 0`` (the unpivoted convention), so
``Q`` and ``R`` agree with ``mpqr.qr(x[..., P])``. A truncated factorization stops
after ``max_rank`` columns or at the first ``|R_kk| <= rtol |R_00|``.
"""

from __future__ import annotations

import math
from typing import Any

from mpqr._array_api import device
from mpqr.backends._base import swap_order
from mpqr.policy import gemm, record_event
from mpqr.qr._kernels import (
    eye_like,
    householder_panel,
    is_complex,
    normalize_signs,
    panel_precision,
)

__all__ = [
    "BLOCK",
    "DETERMINISTIC_MAX_SIZE",
    "OVERSAMPLE",
    "SEED",
    "deterministic_pivots",
    "gaussian",
    "hqrrp",
    "truncation_rank",
]

#: Block width ``b`` of the randomized QRCP (the panel width of the trailing updates) where
#: the backend sets none of its own (``backend.qrcp_block``).
#: 2-core CPU, 2000^2 float64 (NumPy backend, `python -m mpqr bench qr --pivoting`): 64 ->
#: 128 took the time from 2.9 to 1.7 s (192: 1.6 s, a sketch 1.5x taller).
BLOCK = 128
#: Oversampling ``p``: the sketch has ``b + p`` rows (Martinsson et al. use 5-10; Duersch
#: & Gu 8).
OVERSAMPLE = 8
#: Matrices of at most this many entries (and every stack) take the deterministic
#: route, whose ``min(m, n)`` vectorized steps each pass over the whole matrix.
DETERMINISTIC_MAX_SIZE = 2**16
#: Seed of the sketch's Gaussian matrix: the same input gives the same pivots, on every
#: backend.
SEED = 0x6D707172
#: A downdated sketch is sketched again when some column's estimate
#: ``||Y[:, j]|| / sqrt(b + p)`` is further than this fraction of the largest remaining
#: column norm from the column's norm (a Gaussian sketch of 72 rows estimates each norm
#: within a factor 0.6 ... 1.4 with overwhelming probability).
SKETCH_TOLERANCE = 0.5


def gaussian(xp: Any, shape: tuple[int, int], dtype: Any, dev: Any, seed: int) -> Any:
    """Standard normal numbers from a counter-based generator (SplitMix64 of the
    entries' indices, Box-Muller), the same on every Array API backend."""
    r, c = shape
    n = r * c
    half = (n + 1) // 2
    def u64(v: int) -> Any:  # constants as arrays: no library casts a Python int > 2**63
        return xp.asarray(v % 2**64, dtype=xp.uint64, device=dev)

    idx = xp.arange(2 * half, dtype=xp.uint64, device=dev)
    z = idx * u64(0x9E3779B97F4A7C15) + u64(seed * 0xD1B54A32D192ED03)
    z = (z ^ (z >> u64(30))) * u64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> u64(27))) * u64(0x94D049BB133111EB)
    z = z ^ (z >> u64(31))
    u = (xp.astype(z >> u64(11), xp.float64) + 0.5) * 2.0**-53  # in (0, 1)
    u1, u2 = u[:half], u[half:]
    rad = xp.sqrt(-2.0 * xp.log(u1))
    g = xp.concat([rad * xp.cos(2 * math.pi * u2), rad * xp.sin(2 * math.pi * u2)])
    return xp.astype(xp.reshape(g[:n], (r, c)), dtype)


def truncation_rank(xp: Any, r: Any, k: int, rtol: float | None) -> int:
    """How many leading columns a truncated factorization keeps: ``k``, or fewer with
    ``rtol``: the number before the first ``|R_ii| <= rtol |R_00|`` (2-D ``r``)."""
    if rtol is None or k == 0:
        return k
    d = xp.abs(xp.linalg.diagonal(r[:k, :k]))
    small = d <= rtol * d[0]
    if not bool(xp.any(small)):
        return k
    return int(xp.argmax(xp.astype(small, xp.int32)))


def deterministic_pivots(backend: Any, a: Any, kmax: int) -> Any:
    """Column order of QR with column pivoting of a stack ``a`` (``(..., m, n)``): int32
    ``(..., n)``. ``kmax`` steps of Householder QR choosing the column of largest
    remaining norm (exact norms each step; the first of equals, as LAPACK), the rest in
    their original order. ``a`` is not modified."""
    xp = backend.xp
    *batch, m, n = a.shape
    dev = device(a)
    cplx = is_complex(xp, a)
    w = xp.asarray(a, copy=True)
    cols = xp.arange(n, dtype=xp.int64, device=dev)
    key = xp.broadcast_to(cols + n, (*batch, n))  # sort key of the final order
    done = xp.zeros((*batch, n), dtype=xp.bool, device=dev)
    zero = xp.zeros((), dtype=w.dtype, device=dev)
    for i in range(min(kmax, m, n)):
        nu = xp.linalg.vector_norm(w[..., i:, :], axis=-2)
        nu = xp.where(done, -xp.ones_like(nu), xp.where(xp.isnan(nu), xp.zeros_like(nu), nu))
        p = xp.argmax(nu, axis=-1, keepdims=True)
        hot = cols == p
        done = done | hot
        key = xp.where(hot, xp.asarray(i, dtype=xp.int64, device=dev), key)
        x = xp.sum(xp.where(xp.expand_dims(hot, axis=-2), w[..., i:, :], zero), axis=-1)
        if i + 1 == m:
            continue
        # Householder vector of x (beta = -phase(x0) ||x||); tau = 0 for a zero column
        xn = xp.linalg.vector_norm(x, axis=-1)
        alpha = x[..., 0]
        ph = _phase(xp, alpha)
        beta = -ph * xp.astype(xn, w.dtype)
        ok = xn > 0
        denom = xp.where(ok, alpha - beta, xp.ones_like(alpha))
        v = x / xp.expand_dims(denom, axis=-1)
        v = xp.concat([xp.ones_like(v[..., :1]), v[..., 1:]], axis=-1)
        tau = xp.where(ok, (beta - alpha) / xp.where(ok, beta, xp.ones_like(beta)),
                       xp.zeros_like(beta))
        tc = xp.conj(tau) if cplx else tau
        vh = xp.conj(v) if cplx else v
        z = xp.sum(xp.expand_dims(vh, axis=-1) * w[..., i:, :], axis=-2)
        w[..., i:, :] = w[..., i:, :] - xp.expand_dims(xp.expand_dims(tc, axis=-1), axis=-1) \
            * xp.expand_dims(v, axis=-1) * xp.expand_dims(z, axis=-2)
    return xp.astype(xp.argsort(key, axis=-1, stable=True), xp.int32)


def _phase(xp: Any, d: Any) -> Any:
    from mpqr.backends._base import phase

    return phase(xp, d)


def hqrrp(backend: Any, a: Any, *, precision: Any, prec_name: str, want_q: bool,
          complete: bool, max_rank: int | None = None, rtol: float | None = None,
          block: int | None = None, oversample: int = OVERSAMPLE, seed: int = SEED
          ) -> tuple[Any | None, Any, Any]:
    """Blocked randomized QR with column pivoting of a 2-D ``a`` (module docstring).

    Returns ``(Q or None, R, P)``, signs normalised (``diag(R)`` real >= 0), ``P`` int32.
    ``Q`` is ``(m, k)`` (``(m, m)`` if ``complete``), ``R`` ``(k, n)`` (``(m, n)`` if
    ``complete``), ``k = min(m, n)``; truncated at ``max_rank`` columns or the first
    ``|R_kk| <= rtol |R_00|`` (``complete`` not allowed then). ``a`` is not modified.
    """
    from mpqr.qr.householder_tiled import block_reflector_ops

    xp = backend.xp
    m, n = a.shape
    dev = device(a)
    block = (backend.qrcp_block or BLOCK) if block is None else block
    kmax = min(m, n) if max_rank is None else min(m, n, max_rank)
    pp = panel_precision(prec_name, a.dtype, xp)
    reflector, _, apply_into = block_reflector_ops(backend, a, precision=precision,
                                                   prec_name=prec_name, label="qrcp")
    rdt = xp.float64 if a.dtype in (xp.float64, xp.complex128) else xp.float32
    sqrt_u = math.sqrt(float(xp.finfo(rdt).eps))
    rows = block + oversample
    work = backend.permutable_copy(a)
    n_sketch = 0

    def sketch(j: int) -> Any:
        """A fresh sketch of the trailing matrix ``work[j:, j:]``."""
        nonlocal n_sketch
        omega = gaussian(xp, (rows, m - j), a.dtype, dev, seed + n_sketch)
        n_sketch += 1
        return gemm(omega, work[j:, j:], precision=precision, label="qrcp-sketch",
                    backend=backend)

    def pivots(j: int) -> Any:
        """The column order of the trailing sketch after the next block's QRCP steps."""
        bk = min(block, kmax - j)
        order = backend.qrcp_order(y[:, j:], bk)
        if order is None:  # no library QRCP: the vectorized loop, one transfer of bk ints
            _sb, ph = backend.small(deterministic_pivots(backend, y[:, j:], bk)[:bk])
            order = xp.asarray(swap_order([int(v) for v in ph], n - j), dtype=xp.int32,
                               device=dev)
        return order

    y = xp.empty((rows, n), dtype=a.dtype, device=dev)
    y[...] = sketch(0)
    nu = backend.column_norms(work)  # exact norms of the trailing columns (from j on)
    nu_ref = xp.asarray(nu, copy=True)  # at their last exact computation
    perm = xp.arange(n, dtype=xp.int32, device=dev)
    blocks = []  # (j, block reflector) for forming Q
    r00 = None
    j = k = 0
    order = pivots(0) if kmax > 0 else None
    while j < kmax:
        bk = min(block, kmax - j)
        # 1. the block's pivots (chosen from the sketch at the end of the previous step),
        # swapped to the front of the trailing columns by index arrays on the device
        dst, src = move_lists(xp, order, bk, j)
        for x in (work, y, nu, nu_ref, perm):
            backend.permute_columns(x, dst, src)
        # 2. factor the block column
        w, yv, r11 = householder_panel(backend, work[j:, j:j + bk], precision=pp)
        work[j:j + bk, j:j + bk] = xp.triu(r11)
        blk = reflector(w, yv)
        blocks.append((j, blk))
        j2 = j + bk
        k = j2
        if rtol is not None:
            d11 = xp.abs(xp.linalg.diagonal(r11))
            if r00 is None:
                r00 = float(d11[0])
            small = d11 <= rtol * r00
            if bool(xp.any(small)):
                k = j + int(xp.argmax(xp.astype(small, xp.int32)))
        if j2 >= n:
            break
        # 3. the trailing update gives R12 (on all trailing columns, also when truncating:
        # R's kept rows need them)
        apply_into(blk, work[j:, j2:], "update")
        if k < j2 or j2 >= kmax:
            break
        r12 = work[j:j2, j2:]
        # 4. downdate the norms and the sketch, and choose the next block's pivots from
        # it before reading whether either needed more (norms that lost half their
        # digits, a sketch that no longer represents them: rare), so the device never
        # waits for the host's decision
        nu2 = nu[j2:] ** 2 - backend.column_norms(r12) ** 2
        low = nu2 <= sqrt_u * nu_ref[j2:] ** 2
        nu_new = xp.sqrt(xp.where(low, xp.zeros_like(nu2), nu2))
        r11 = work[j:j2, j:j2]
        # an exactly zero pivot (a zero or exactly dependent column) takes 1 in the solve:
        # Y1 R11^-1 stays finite, and the check below decides whether the sketch holds
        r11 = r11 + xp.where(r11 == 0, eye_like(xp, (), bk, bk, r11.dtype, dev),
                             xp.zeros_like(r11))
        y1r = backend.right_solve_upper(y[:, j:j2], r11)
        y_new = y[:, j2:] - gemm(y1r, r12, precision=pp, label="qrcp-sketch-downdate",
                                 backend=backend)
        est = backend.column_norms(y_new) / math.sqrt(rows)
        nu_max_d = xp.max(nu_new)
        checks = backend.read_later(xp.stack([
            xp.astype(xp.any(low), rdt), nu_max_d, xp.max(xp.abs(est - nu_new))]))
        y_old = xp.asarray(y[:, j2:], copy=True)
        _select_sketch(xp, y, j2, y_new, y_old, nu_max_d)
        order = pivots(j2)
        hc = checks()
        if bool(hc[0]):  # rare: recompute the norms, then check the sketch against them
            nu[j2:] = backend.column_norms(work[j2:, j2:])
            nu_ref[j2:] = nu[j2:]
            nu_max_d = xp.max(nu[j2:])
            _sb, hc = backend.small(xp.stack([nu_max_d, xp.max(xp.abs(est - nu[j2:]))]))
            nu_max, dev_max = float(hc[0]), float(hc[1])
            _select_sketch(xp, y, j2, y_new, y_old, nu_max_d)
            order = None
        else:
            nu[j2:] = nu_new
            nu_max, dev_max = float(hc[1]), float(hc[2])
        if nu_max != 0 and math.isfinite(nu_max) and not dev_max <= SKETCH_TOLERANCE * nu_max:
            record_event("pivot", f"qr(pivoting=True): the downdated sketch no longer "
                         f"represents the trailing column norms after column {j2} "
                         f"(deviation {dev_max:.2e} of largest norm {nu_max:.2e}): "
                         "sketched again", column=j2)
            y[:, j2:] = sketch(j2)
            order = None
        if order is None:
            order = pivots(j2)
        j = j2

    # R (rows below min(m, n) of a complete R: zero), Q, signs
    r = xp.triu(work if complete else work[:k, :])
    q = None
    if want_q:
        q = eye_like(xp, (), m, m if complete else k, a.dtype, dev)
        for jb, blk in reversed(blocks):
            if jb < q.shape[-1]:
                apply_into(blk, q[jb:, jb:], "formq")
    q, r = normalize_signs(xp, q, r, check=False)
    return q, r, perm


def _select_sketch(xp: Any, y: Any, j2: int, y_new: Any, y_old: Any, nu_max: Any) -> None:
    """``y[:, j2:]`` after a block, chosen on the device by the largest remaining norm
    ``nu_max`` (a 0-d array): the downdated sketch ``y_new``; zeros when every remaining
    column is zero (nothing left to choose: the order stays); the sketch before the
    downdate ``y_old`` when the norms are not finite."""
    zero = xp.zeros_like(y_old)
    y[:, j2:] = xp.where(nu_max == 0, zero, xp.where(xp.isfinite(nu_max), y_new, y_old))


def move_lists(xp: Any, order: Any, bk: int, offset: int) -> tuple[Any, Any]:
    """``(dst, src)`` index arrays (``2 bk`` each, on ``order``'s device) that apply the
    column order ``order`` of a QRCP's first ``bk`` swap steps (:func:`swap_order`) to
    the columns from ``offset`` on: ``x[..., dst] = x[..., src]``.

    After ``bk`` swaps only the first ``bk`` positions and the positions the pivots
    came from (``order[i] >= bk``) hold other columns; the rest of the ``2 bk`` slots
    repeat the first move (the same value written twice)."""
    head = order[:bk]
    front = xp.arange(bk, dtype=order.dtype, device=device(order))
    dst = xp.concat([front, xp.where(head >= bk, head, xp.zeros_like(head))])
    src = xp.take(order, dst)
    return dst + offset, src + offset
