"""Out-of-core QR of a square or wide-ish host matrix (``m >= n``) by column panels.

Both variants are block Gram-Schmidt with reorthogonalisation ("twice is enough"):
every leaf panel is projected against each earlier column twice, the second time
against all of them at once, right before it is factored in core (:func:`mpqr.qr` at the
requested precision). The second projection is what makes ``||I - Q^H Q||`` independent
of how much a projection shrinks the panel; Gram-Schmidt's loss still grows with
``cond(A) u`` (Householder's does not), so where that is not small the in-core QR keeps
a more orthogonal ``Q``.

* ``"ooc-recursive"`` (Zhang & Wu, ICPP'21): split the columns in halves, factor the
  left half recursively, project it out of the right half with the two large
  products ``R12 = Q1^H A2`` and ``A2 -= Q1 R12`` streamed by row blocks through the
  device, recurse on the right half. Those first projections are large near the top
  of the recursion, so their copies hide behind them; each leaf then takes its second
  projection against every earlier column while it is on the device for its in-core
  QR. (A second projection against the left half alone, at each node, is not enough:
  the columns before it were removed relative to the right half's norm before the
  node, and projecting out the left half can shrink it by up to ``cond(A)``, which
  leaves ``||I - Q^H Q||`` near ``cond(A) u``.)
* ``"ooc-blocked"``: the conventional left-looking variant with panels of the same
  width: each panel is loaded, every earlier ``Q`` column is streamed past it twice
  (``R = Q^H P``, ``P -= Q R``), and it is factored in core. Its traffic grows like
  ``m n^2 / w`` for panel width ``w``.

``Q`` is built in the output array (or a host workspace for ``mode="r"``), which also
holds the updated columns.
"""

from __future__ import annotations

import math
from typing import Any

from mpqr.ooc.budget import DOWNLOADS, RING, BudgetTooSmall, format_bytes
from mpqr.ooc.run import Run, collapsed, progress_bar
from mpqr.policy import gemm, gemm_sub
from mpqr.qr._kernels import ct

__all__ = ["PANEL_FACTOR", "square_qr"]

#: device bytes of an in-core panel QR per byte of the panel (panel, Q, workspace)
PANEL_FACTOR = 4


class _Square:
    def __init__(self, run: Any, src: Any, w: Any, r_dst: Any, *, precision: Any,
                 check: str | None, leaf: int, slot: int, chunk_bytes: int):
        self.run, self.be, self.xp = run, run.backend, run.backend.xp
        self.src, self.w, self.r_dst = src, w, r_dst
        self.precision, self.check = precision, check
        self.m, self.n = src.shape
        self.leaf, self.slot, self.chunk_bytes = leaf, slot, chunk_bytes
        self.fresh = [True] * self.n  # column still only in the input
        self.isz = src.itemsize

    # --- helpers --------------------------------------------------------------------
    def _cur(self, c0: int, c1: int) -> Any:
        """Where columns [c0, c1) live now: the input (never updated) or the workspace."""
        return self.src if self.fresh[c0] else self.w

    def _rows(self, cols: int) -> list[tuple[int, int]]:
        b = max(1, self.slot // max(1, cols))
        return [(r, min(r + b, self.m)) for r in range(0, self.m, b)]

    def _load_panel(self, c0: int, c1: int) -> Any:
        xp = self.xp
        src = self._cur(c0, c1)
        p = xp.empty((self.m, c1 - c0), dtype=getattr(xp, self.src.dtype.name))
        regions = [(r0, r1, c0, c1) for r0, r1 in self._rows(c1 - c0)]
        for (r0, r1, _a, _b), blk in self.run.over(src, regions, src.name):
            if self.check is not None and src is self.src and not self.be.all_finite(blk):
                raise ValueError(self.check)
            p[r0:r1] = blk
        return p

    def _factor_panel(self, panel: list[Any], c0: int, c1: int) -> None:
        """Factor the device panel in ``panel`` (taken out of the list, so that its
        memory goes as soon as the in-core QR is done with it) and store ``Q`` and
        ``R``."""
        from mpqr.qr.in_memory import qr

        p = panel.pop()
        with collapsed("out-of-core panels"):
            q, r = qr(p, mode="reduced", precision=self.precision)
        del p
        for r0, r1 in self._rows(c1 - c0):
            self.run.store(self.w, (r0, r1, c0, c1), q[r0:r1])
        self.run.store(self.r_dst, (c0, c1, c0, c1), r)
        for j in range(c0, c1):
            self.fresh[j] = False

    def _project(self, j0: int, h: int, c0: int, c1: int) -> None:
        """``R[j0:h, c0:c1] = Q1^H A2``, ``A2 -= Q1 R12`` with ``Q1 = W[:, j0:h]``, by
        column chunks of ``A2`` and row blocks streamed through the device."""
        k, n2, m = h - j0, c1 - c0, self.m
        # column chunks of A2: streamed twice (read, then read and written) with only
        # R12's chunk on the device, or kept on the device with it (read once, narrower
        # chunks, each re-reading Q1): the fewer bytes
        c_s = max(1, min(n2, self.chunk_bytes // (k * self.isz)))
        c_r = min(n2, self.chunk_bytes // ((m + k) * self.isz))
        vol_s = -(-n2 // c_s) * 2 * k + 3 * n2
        vol_r = -(-n2 // c_r) * 2 * k + 2 * n2 if c_r >= 1 else math.inf
        resident = vol_r < vol_s
        c = c_r if resident else c_s
        for a0 in range(c0, c1, c):
            self._chunk(j0, h, a0, min(c1, a0 + c), resident)

    def _chunk(self, j0: int, h: int, a0: int, a1: int, resident: bool) -> None:
        """Project ``Q1 = W[:, j0:h]`` out of columns ``[a0, a1)`` once; ``resident``:
        the chunk stays on the device between the product and the update (read once,
        written once)."""
        xp, run = self.xp, self.run
        rows = self._rows(h - j0 + (a1 - a0))
        q_items = [[(self.w, (r0, r1, j0, h))] for r0, r1 in rows]
        keep = xp.empty((self.m, a1 - a0), dtype=getattr(xp, self.src.dtype.name)) \
            if resident else None
        src = self._cur(a0, a1)
        run.st.flush()  # the workspace columns read here may still be on their way
        items = [[(self.w, (r0, r1, j0, h)), (src, (r0, r1, a0, a1))] for r0, r1 in rows]
        s = None
        for blks, (r0, r1) in zip(run.over_multi(items, "workspace"), rows):
            ab = blks[1]
            if self.check is not None and src is self.src and not self.be.all_finite(ab):
                raise ValueError(self.check)
            t = gemm(ct(xp, blks[0]), ab, precision=self.precision,
                     label="ooc-R12=Q1^H A2", backend=self.be)
            s = t if s is None else s + t
            if keep is not None:
                keep[r0:r1] = ab
        for blks, (r0, r1) in zip(run.over_multi(q_items if keep is not None else items,
                                                 "workspace"), rows):
            # the staged block is reused by the ring: update a copy (or the kept chunk)
            ab = keep[r0:r1] if keep is not None else xp.asarray(blks[1], copy=True)
            gemm_sub(ab, blks[0], s, precision=self.precision, label="ooc-A2-=Q1 R12",
                     backend=self.be)
            run.store(self.w, (r0, r1, a0, a1), ab)
        for j in range(a0, a1):
            self.fresh[j] = False
        run.store(self.r_dst, (j0, h, a0, a1), s)

    def _reproject(self, p: Any, j0: int, c0: int, c1: int) -> None:
        """Project every earlier column ``W[:, :j0]`` out of the device panel ``p``
        (columns ``[c0, c1)``): ``S = W^H p`` streamed, ``p -= W S`` streamed again,
        ``R[:j0, c0:c1] += S``."""
        xp, run = self.xp, self.run
        rows = self._rows(j0)
        items = [[(self.w, (r0, r1, 0, j0))] for r0, r1 in rows]
        run.st.flush()  # the earlier Q columns may still be on their way
        s = None
        for (blk,), (r0, r1) in zip(run.over_multi(items, "workspace"), rows):
            t = gemm(ct(xp, blk), p[r0:r1], precision=self.precision,
                     label="ooc-R12=Q1^H A2", backend=self.be)
            s = t if s is None else s + t
        for (blk,), (r0, r1) in zip(run.over_multi(items, "workspace"), rows):
            gemm_sub(p[r0:r1], blk, s, precision=self.precision, label="ooc-A2-=Q1 R12",
                     backend=self.be)
        run.store(self.r_dst, (0, j0, c0, c1), s, add=True)

    def _leaf(self, j0: int, j1: int, projections: int) -> None:
        """Load panel ``[j0, j1)``, project every earlier column out of it
        ``projections`` times on the device, factor it in core."""
        self.run.st.flush()
        p = self._load_panel(j0, j1)
        for _ in range(projections if j0 else 0):
            self._reproject(p, j0, j0, j1)
        panel = [p]
        del p
        self._factor_panel(panel, j0, j1)

    # --- the two variants -----------------------------------------------------------
    def recursive(self, j0: int, j1: int) -> None:
        if j1 - j0 <= self.leaf:
            self._leaf(j0, j1, 1)  # the second projection; the first came from above
            return
        h = j0 + (j1 - j0) // 2
        self.recursive(j0, h)
        self._project(j0, h, h, j1)
        self.recursive(h, j1)

    def blocked(self) -> None:
        for p0 in range(0, self.n, self.leaf):
            self._leaf(p0, min(self.n, p0 + self.leaf), 2)


#: shares of the budget: the staging slots (all of them), then either an in-core panel
#: or a chunk of ``R12`` (never both at once); the rest is the products' temporaries
STAGING_SHARE, PANEL_SHARE, CHUNK_SHARE = 1 / 8, 5 / 8, 1 / 2


def square_plan(m: int, n: int, isz: int, budget: int) -> tuple[int, int, int]:
    """``(leaf panel width, staging slot elements, R12 chunk bytes)`` for ``budget``.
    Raises :class:`BudgetTooSmall` naming the smallest budget that works."""
    slots = RING + DOWNLOADS
    slot = int(budget * STAGING_SHARE) // slots // isz
    leaf = int(budget * PANEL_SHARE) // (PANEL_FACTOR * m * isz)
    kmax = max(1, n // 2)
    needed = int(max(PANEL_FACTOR * m * isz / PANEL_SHARE,
                     slots * 2 * (kmax + 2) * isz / STAGING_SHARE,
                     kmax * isz / CHUNK_SHARE)) + 1
    if leaf < 1 or slot < 2 * (kmax + 2) or budget < needed:
        raise BudgetTooSmall(
            f"`memory_budget` of {format_bytes(budget)} cannot hold a one-column panel of "
            f"a {m} x {n} matrix with its staging buffers; the smallest budget that works is "
            f"{needed} bytes ({format_bytes(needed)})", needed)
    return min(leaf, n), slot, int(budget * CHUNK_SHARE)


def square_qr(backend: Any, src: Any, *, method: str, precision: Any, prec_name: str,
              want_q: bool, q_dst: Any, check: str | None, budget: int, source: str,
              progress: Any, overwrite_a: bool) -> Any:
    """R (host) and Q in ``q_dst`` by ``method`` ("ooc-recursive" or "ooc-blocked")."""
    from mpqr.backends.host import arrays as host

    m, n = src.shape
    isz = src.itemsize
    leaf, slot, chunk = square_plan(m, n, isz, budget)
    if q_dst is not None:
        w = q_dst
    elif overwrite_a and host.in_memory(src.x) and src.x.dtype == src.dtype and \
            src.x.flags.writeable:
        w = src  # the caller allowed the input as workspace
    else:
        w = host.HostArray(host.empty((m, n), src.dtype), "workspace")
    r_host = host.empty((n, n), src.dtype)
    r_host[...] = 0
    r_dst = host.HostArray(r_host, "R")
    levels = max(1, (n // leaf).bit_length())
    total = (3 * levels + 2) * m * n * isz
    bar = progress_bar(progress, total, total / 25e9, "mpqr.qr")
    run = Run(backend, backend.host_staging(src.dtype, slot), bar, "qr")
    try:
        sq = _Square(run, src, w, r_dst, precision=precision, check=check, leaf=leaf,
                     slot=slot, chunk_bytes=chunk)
        if method == "ooc-blocked":
            sq.blocked()
        else:
            sq.recursive(0, n)
        run.finish(f"out of core ({method}, in-core panels of {m} x {leaf}, row blocks of "
                   f"{format_bytes(slot * isz)} at most; budget {format_bytes(budget)} from "
                   f"{source})", unit="streamed column ranges", route="out-of-core",
                   method=method, panel_cols=leaf,
                   budget=budget)
    finally:
        run.close()
    return r_host
