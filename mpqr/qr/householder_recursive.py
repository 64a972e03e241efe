"""Recursive Householder QR in compact WY form (Leng et al., Algorithm 1).

``qr(A) -> (W, Y, R)`` with ``A = (I - W Y^H) [R; 0]``: split the columns in
halves, factor the left half, apply ``(I - W1 Y1^H)^H`` to the right half,
factor it, and merge ``W = [W1 | W2 - W1 (Y1^H W2)]``. At the leaf width the
panel is factored by :func:`~mpqr.qr._kernels.householder_panel` (``geqrf`` in
compact WY form, or TSQR for very tall-skinny panels) at the working
precision. The update and merge GEMMs have inner dimension ``m`` and outer
dimensions of half the current width — large and square where the tiled
variant's are ``nb`` thin — which is what tensor-core engines need. The
product with the triangular top of ``Y`` uses a shallow TRMM split (a few
large GEMMs rather than many small ones).

The leaf width grows with ``n`` (:func:`leaf_width`) so that the tree has at
most :data:`MAX_LEAVES` leaves: each leaf costs a fixed number of launches,
and a large matrix would otherwise spend its time launching small kernels.
W's merge is skipped where no later step reads it (``mode="r"``).
W, Y and the R/work matrix are allocated once and filled in place.
"""

from __future__ import annotations

from typing import Any

from mpqr._array_api import device
from mpqr.policy import gemm
from mpqr.qr._kernels import (
    TRMM_CUTOFF,
    ct,
    householder_panel,
    panel_precision,
    trmm_lower,
)

__all__ = ["MAX_LEAF_WIDTH", "MAX_LEAVES", "RECURSION_CUTOFF", "householder_recursive",
           "leaf_width"]

#: Narrowest leaf (Leng et al. use 32-wide tiles).
RECURSION_CUTOFF = 32
#: Widest leaf: one ``geqrf`` of an ``m x 256`` panel still runs at a fraction of
#: GEMM speed, so wider leaves would move too much work off the fast engines.
MAX_LEAF_WIDTH = 256
#: The leaf width doubles (up to :data:`MAX_LEAF_WIDTH`) until ``n / nb <= MAX_LEAVES``.
MAX_LEAVES = 128
#: The TRMM split stops at a quarter of the triangle: 7 GEMMs instead of ``2 k / 64``,
#: for 12.5 % more flops on the triangular part.
TRMM_DEPTH_FRACTION = 4
#: ``Y1 C`` is one GEMM over all rows (the zeros above Y1's diagonal included)
#: when Y1 has at least this many rows per column: at most 1/16 of its flops wasted.
TRIANGLE_AS_GEMM = 8


def leaf_width(n: int) -> int:
    """Leaf width for ``n`` columns: a power of two times :data:`RECURSION_CUTOFF`,
    the smallest with at most :data:`MAX_LEAVES` leaves, capped at :data:`MAX_LEAF_WIDTH`."""
    nb = RECURSION_CUTOFF
    while nb < MAX_LEAF_WIDTH and n > MAX_LEAVES * nb:
        nb *= 2
    return nb


def _trmm(l: Any, b: Any, *, precision: Any, label: str, backend: Any) -> Any:
    cutoff = max(TRMM_CUTOFF, l.shape[-1] // TRMM_DEPTH_FRACTION)
    return trmm_lower(l, b, precision=precision, label=label, backend=backend, cutoff=cutoff)


def householder_recursive(backend: Any, a: Any, *, precision: Any, prec_name: str,
                          want_q: bool = True, complete: bool = False,
                          nb: int | None = None, overwrite: bool = False
                          ) -> tuple[Any | None, Any]:
    """Householder QR of ``(..., m, n)`` with ``m >= n``; see the module docstring.

    ``nb`` is the leaf width (default :func:`leaf_width`). Returns ``(Q, R)``
    before sign normalisation (Q is None unless ``want_q``).
    """
    xp = backend.xp
    *batch, m, n = a.shape
    dev = device(a)
    pp = panel_precision(prec_name, a.dtype, xp)
    if nb is None:
        nb = leaf_width(n)
    work = a if overwrite else xp.asarray(a, copy=True)
    w_all = xp.zeros((*batch, m, n), dtype=a.dtype, device=dev)
    y_all = xp.zeros((*batch, m, n), dtype=a.dtype, device=dev)

    def rec(c0: int, c1: int, need_w: bool) -> None:
        # need_w: a later step reads this block's W (an update of the right
        # sibling, a parent's merge, or Q)
        k = c1 - c0
        if k <= nb:
            w, y, r = householder_panel(backend, work[..., c0:, c0:c1], precision=pp,
                                        need_w=need_w)
            work[..., c0:c1, c0:c1] = r
            y_all[..., c0:, c0:c1] = y
            if need_w:
                w_all[..., c0:, c0:c1] = w
            return
        panels = -(-k // nb)
        k1 = nb * ((panels + 1) // 2)  # half the panels, rounded up
        cm = c0 + k1
        rec(c0, cm, True)
        # right half <- (I - W1 Y1^H)^H right half = B - Y1 (W1^H B)
        b = work[..., c0:, cm:c1]
        c = gemm(ct(xp, w_all[..., c0:, c0:cm]), b, precision=precision,
                 label="rec-update-WhB", backend=backend)
        y1 = y_all[..., c0:, c0:cm]
        if TRIANGLE_AS_GEMM * k1 <= m - c0:
            # Y1's triangular top is a small share of its rows: one GEMM beats a split
            work[..., c0:, cm:c1] = b - gemm(y1, c, precision=precision, label="rec-update-YC",
                                             backend=backend)
        else:
            work[..., c0:cm, cm:c1] = b[..., :k1, :] - _trmm(
                y1[..., :k1, :], c, precision=precision, label="rec-update-trmm",
                backend=backend)
            work[..., cm:, cm:c1] = b[..., k1:, :] - gemm(
                y1[..., k1:, :], c, precision=precision, label="rec-update-YC", backend=backend)
        rec(cm, c1, need_w)
        if not need_w:
            return
        # merge: W2 <- W2 - W1 (Y1^H W2); Y1 is zero above row cm - c0 of W2's support
        d = gemm(ct(xp, y_all[..., cm:, c0:cm]), w_all[..., cm:, cm:c1], precision=precision,
                 label="rec-merge-YhW", backend=backend)
        w_all[..., c0:, cm:c1] = w_all[..., c0:, cm:c1] - gemm(
            w_all[..., c0:, c0:cm], d, precision=precision, label="rec-merge-WD",
            backend=backend)

    rec(0, n, want_q)
    r = xp.triu(work[..., :n, :])
    if not want_q:
        return None, r
    if complete:
        # Q = I - W Y^H (m x m)
        q = xp.eye(m, dtype=a.dtype, device=dev) - gemm(
            w_all, ct(xp, y_all), precision=precision, label="rec-formq-WYh", backend=backend)
        return q, r
    # Q = E - W Y1^H with Y1 = Y[:n, :n] unit lower: W Y1^H = (Y1 W^H)^H, a TRMM
    wy = ct(xp, _trmm(y_all[..., :n, :], ct(xp, w_all), precision=precision,
                      label="rec-formq-trmm", backend=backend))
    q = -wy
    q[..., :n, :] = q[..., :n, :] + xp.eye(n, dtype=a.dtype, device=dev)
    return q, r
