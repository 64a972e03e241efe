"""Leaf panels factored in narrow sub-panels: blocked Householder QR, right-looking or by
halves.

On a GPU, LAPACK-style ``geqrf`` spends a fixed latency on every column (cuSOLVER: about
11 us per column at any panel width, H100), which bounds the
recursive QR of square matrices. Here an ``m x k`` leaf is factored in sub-panels of
a few columns, left to right, each giving the Householder reflectors of its columns
(compact WY form); the leaf's remaining columns are then updated,
``B <- (I - W Y^H)^H B = B - Y (W^H B)``, by two products at the panel's working
precision, the second accumulated into ``B`` in place where the backend can
(:func:`~mpqr.policy.gemm_sub`). Two kinds of sub-panel:

* :func:`certified_leaf` — 32-column panels by CholQR2 with float64 Gram matrices and the
  reconstruction of the reflectors from the explicit Q (``backend.certified_panel``; on
  CuPy one kernel launch per panel and a loop of its own, ``backend.certified_leaf``),
  in place in LAPACK's layout; the checks are counted on the device and read once per
  factorization by the caller.
* :func:`blocked_householder_panel` — an explicit QR of each sub-panel and the
  reflectors that reproduce it (``backend.reconstruct_panel``, Ballard et al. 2014, LAPACK
  ``orhr_col``; on CuPy the TSQR tile kernels and one reconstruction kernel).

``T`` of the whole leaf comes from ``Y`` and the sub-panels' ``tau`` by the UT transform
(:func:`~mpqr.backends._base.compact_wy_t`), as for ``geqrf``.
"""

from __future__ import annotations

from typing import Any

from mpqr._array_api import ct, device
from mpqr.backends import panel_cholqr as _panel_cholqr
from mpqr.backends._base import compact_wy_t
from mpqr.backends.panel_cholqr import CERTIFIED_PANEL_MAX_N
from mpqr.policy import gemm, gemm_sub

__all__ = ["blocked_householder_panel", "certified_leaf", "leaf_combines_w", "leaf_lookahead",
           "leaf_recursive", "leaf_sub", "left_half"]


def left_half(k: int, nb: int) -> int:
    """The left half's width where a recursion splits ``k`` columns of blocks of ``nb``:
    half the blocks, rounded up (the recursive QR's split, and its leaves' by halves)."""
    return nb * ((-(-k // nb) + 1) // 2)


def blocked_householder_panel(backend: Any, a: Any, *, block: int, precision: str
                              ) -> tuple[Any, Any, Any]:
    """Householder QR of a 2-D panel ``a`` (``m x k``, ``m >= k``) in sub-panels of
    ``block`` columns, as ``(Y, T, R)`` with ``a = (I - Y T Y^H)[:, :k] R`` (the
    contract of ``backend.householder_panel``). ``a`` is not modified."""
    xp = backend.xp
    m, k = a.shape
    work = xp.asarray(a, copy=True)
    y = xp.zeros((m, k), dtype=a.dtype, device=device(a))
    taus = []
    for c in range(0, k, block):
        e = min(c + block, k)
        yj, wj, tau, rj = backend.reconstruct_panel(work[c:, c:e])
        y[c:, c:e] = yj
        taus.append(tau)
        work[c:e, c:e] = rj
        if e < k:
            z = gemm(ct(xp, wj), work[c:, e:], precision=precision, label="panel-update-WhB",
                     backend=backend)
            gemm_sub(work[c:, e:], yj, z, precision=precision, label="panel-update-YZ",
                     backend=backend)
    return y, compact_wy_t(backend, y, xp.concat(taus)), xp.triu(work[:k, :])


def certified_leaf(backend: Any, work: Any, w_all: Any, c0: int, c1: int, *, cert: Any,
                   precision: str, woff: int = 0, combine: bool = False) -> Any:
    """Factor the leaf ``work[c0:, c0:c1]`` (2-D, LAPACK's layout) in place in certified
    panels of :data:`~mpqr.qr._kernels.CERTIFIED_PANEL_MAX_N` columns, left to right
    (``backend.certified_panel``: CholQR2 + reconstruction, the check counted into
    ``cert``). Each panel's ``W`` goes to ``w_all[c:, c:e]`` for the update of the leaf's
    later columns, ``B <- B - Y (W^H B)``, by products at ``precision`` (the second in
    place, in two parts: ``Y``'s explicit unit-lower top and the rows below it). With
    :data:`~mpqr.backends.panel_cholqr.CERTIFIED_LEAF_LOOKAHEAD` set (and no sub-blocks),
    each panel's update goes in two parts: the next panel's columns, then the rest. With
    :data:`~mpqr.backends.panel_cholqr.CERTIFIED_LEAF_SUB` set, the leaf goes in sub-blocks
    of that many columns: each panel updates the rest of its sub-block, its ``W`` joins the
    sub-block's (``W_j <- W_j - W_<j (Y_<j^H W_j)``; ``w_all`` then holds the sub-blocks'
    combined ``W``), and each sub-block updates the leaf's later columns at once.
    With ``combine`` and :func:`leaf_combines_w` (whole-leaf updates), each panel's ``W``
    joins the leaf's the same way after its updates, so that ``w_all`` holds the leaf's
    ``W = Y T`` at the end; and with :func:`leaf_recursive`, the leaf goes by halves
    instead (:func:`_recursive_leaf`), with the same result.
    Returns the leaf's ``tau`` (for its ``T``: :func:`~mpqr.backends._base.compact_wy_t`).
    W's entry ``(i, j)`` lives at ``w_all[..., i - woff, j - woff]`` (a W narrower than
    ``work``: the lean plan of docs/memory.md).
    """
    combine = combine and leaf_combines_w(c1 - c0, work.shape[-2] - c0)
    tau = backend.certified_leaf(work, w_all, c0, c1, cert, woff, combine)
    if tau is not None:  # the backend's own loop (the same steps)
        return tau
    xp = backend.xp
    m = work.shape[-2]
    if combine and leaf_recursive(c1 - c0, m - c0):
        return _recursive_leaf(backend, work, w_all, c0, c1, cert=cert, precision=precision,
                               woff=woff)
    nb = CERTIFIED_PANEL_MAX_N
    sub = leaf_sub(c1 - c0)
    ahead = leaf_lookahead(c1 - c0, m - c0)
    taus = []

    def w(r0: int, r1: int, j0: int, j1: int) -> Any:  # W's rows r0:r1, columns j0:j1
        return w_all[r0 - woff:r1 - woff, j0 - woff:j1 - woff]

    for c in range(c0, c1, nb):
        e = min(c + nb, c1)
        s0 = c0 + (c - c0) // sub * sub  # this panel's sub-block: columns s0:se
        se = min(s0 + sub, c1)
        l, tau = backend.certified_panel(work[c:, c:e], w(c, m, c, e), cert)
        taus.append(tau)
        # lookahead: the next panel's columns first, then the rest (the same products on
        # column slices)
        parts = ((e, min(e + nb, se)), (min(e + nb, se), se)) if ahead else ((e, se),)
        for j0, j1 in parts:
            if j0 < j1:
                _update(backend, work, w, l, c, e, j0, j1, precision)
        whole = se == c1  # the last sub-block (the leaf where it has none): no update after
        if whole and not combine:
            continue
        if c > s0:  # the sub-block's W so far
            _join(backend, work, w_all, w, woff, s0, c, e, precision)
        if e < se or whole:
            continue
        # the sub-block is factored: the leaf's later columns B <- B - Y (W^H B)
        _update(backend, work, w, _unit_lower(xp, work, s0, se), s0, se, se, c1, precision)
    return xp.concat(taus)


def _unit_lower(xp: Any, work: Any, c: int, h: int) -> Any:
    """Y's top block of the columns ``c:h``, explicit: unit lower (R above it in place)."""
    return xp.tril(work[c:h, c:h], k=-1) + xp.eye(h - c, dtype=work.dtype, device=device(work))


def _update(backend: Any, work: Any, w: Any, l: Any, c: int, h: int, j0: int, j1: int,
            precision: str) -> None:
    """``work``'s columns ``j0:j1`` (rows ``c:``) ``<- B - Y (W^H B)``, ``Y`` and ``W`` of
    the columns ``c:h`` (``w(r0, r1, j0, j1)``: W's block), ``l`` Y's top block explicit;
    the rows below it in place."""
    xp = backend.xp
    m = work.shape[-2]
    z = gemm(ct(xp, w(c, m, c, h)), work[c:, j0:j1], precision=precision,
             label="panel-update-WhB", backend=backend)
    gemm_sub(work[c:h, j0:j1], l, z, precision=precision, label="panel-update-YZ",
             backend=backend)
    if h < m:
        gemm_sub(work[h:, j0:j1], work[h:, c:h], z, precision=precision,
                 label="panel-update-YZ", backend=backend)


def _join(backend: Any, work: Any, w_all: Any, w: Any, woff: int, s0: int, c: int, e: int,
          precision: str) -> None:
    """W's columns ``c:e`` joined to those of ``s0:c``: ``W_j <- W_j - W[:, s0:c]
    (Y[:, s0:c]^H W_j)``, W_j's rows ``s0:c`` (zero before) written."""
    m = work.shape[-2]
    w_all[s0 - woff:c - woff, c - woff:e - woff] = 0
    g = gemm(ct(backend.xp, work[c:, s0:c]), w(c, m, c, e), precision=precision,
             label="panel-combine-YhW", backend=backend)
    gemm_sub(w(s0, m, c, e), w(s0, m, s0, c), g, precision=precision,
             label="panel-combine-WG", backend=backend)


def _recursive_leaf(backend: Any, work: Any, w_all: Any, c0: int, c1: int, *, cert: Any,
                    precision: str, woff: int = 0) -> Any:
    """The leaf ``work[c0:, c0:c1]`` by halves down to single certified panels (Elmroth and
    Gustavson's recursion, W kept as the recursive QR above keeps it): the left half, the
    right half's update ``B <- B - Y1 (W1^H B)``, the right half, then the right half's W
    joined, ``W2 <- W2 - W1 (Y1^H W2)``. ``w_all`` holds the leaf's ``W = Y T`` at the
    end, as :func:`certified_leaf` with ``combine``; returns the leaf's ``tau``. (No
    lookahead: the right half's first panel factored beside the rest of its update was no
    faster on the GPU, bench/NOTES.md 2026-11-29.)"""
    xp = backend.xp
    m = work.shape[-2]
    nb = CERTIFIED_PANEL_MAX_N
    taus = []

    def w(r0: int, r1: int, j0: int, j1: int) -> Any:  # W's rows r0:r1, columns j0:j1
        return w_all[r0 - woff:r1 - woff, j0 - woff:j1 - woff]

    def rec(c: int, e: int) -> Any:
        # factor columns c:e; returns Y's top block (explicit unit lower) of a single panel
        if e - c <= nb:
            l, tau = backend.certified_panel(work[c:, c:e], w(c, m, c, e), cert)
            taus.append(tau)
            return l
        h = c + left_half(e - c, nb)
        l1 = rec(c, h)
        _update(backend, work, w, l1 if h - c <= nb else _unit_lower(xp, work, c, h),
                c, h, h, e, precision)
        rec(h, e)
        _join(backend, work, w_all, w, woff, c, h, e, precision)
        return None

    rec(c0, c1)
    return xp.concat(taus)


def leaf_sub(k: int) -> int:
    """The sub-block width of a certified leaf of ``k`` columns
    (:data:`~mpqr.backends.panel_cholqr.CERTIFIED_LEAF_SUB`, whole-leaf when None)."""
    sub = _panel_cholqr.CERTIFIED_LEAF_SUB
    if sub is None:
        return k
    return max(CERTIFIED_PANEL_MAX_N, sub // CERTIFIED_PANEL_MAX_N * CERTIFIED_PANEL_MAX_N)


def _scheduled(rows: int | None) -> bool:
    return rows is None or rows >= _panel_cholqr.CERTIFIED_LEAF_SCHEDULE_MIN_ROWS


def leaf_combines_w(k: int, rows: int | None = None) -> bool:
    """Whether a certified leaf of ``k`` columns (and ``rows`` rows) asked to combine its
    panels' ``W`` does (:data:`~mpqr.backends.panel_cholqr.CERTIFIED_LEAF_COMBINED_W`;
    whole-leaf updates; :data:`~mpqr.backends.panel_cholqr.CERTIFIED_LEAF_SCHEDULE_MIN_ROWS`
    rows or more)."""
    return (bool(_panel_cholqr.CERTIFIED_LEAF_COMBINED_W) and leaf_sub(k) >= k
            and _scheduled(rows))


def leaf_recursive(k: int, rows: int | None = None) -> bool:
    """Whether a certified leaf of ``k`` columns (and ``rows`` rows) that combines its
    ``W`` (:func:`leaf_combines_w`) goes by halves
    (:data:`~mpqr.backends.panel_cholqr.CERTIFIED_LEAF_RECURSIVE`)."""
    return bool(_panel_cholqr.CERTIFIED_LEAF_RECURSIVE) and leaf_combines_w(k, rows)


def leaf_lookahead(k: int, rows: int | None = None) -> bool:
    """Whether a certified leaf of ``k`` columns (and ``rows`` rows) updates the next
    panel's columns apart from the rest
    (:data:`~mpqr.backends.panel_cholqr.CERTIFIED_LEAF_LOOKAHEAD`; whole-leaf updates only;
    :data:`~mpqr.backends.panel_cholqr.CERTIFIED_LEAF_SCHEDULE_MIN_ROWS` rows or more)."""
    return (bool(_panel_cholqr.CERTIFIED_LEAF_LOOKAHEAD) and leaf_sub(k) >= k
            and _scheduled(rows))
