"""Recursive Householder QR in compact WY form (Leng et al., Algorithm 1).

``qr(A) -> (W, Y, R)`` with ``A = (I - W Y^H) [R; 0]``: split the columns in
halves, factor the left half, apply ``(I - W1 Y1^H)^H`` to the right half,
factor it, and merge ``W = [W1 | W2 - W1 (Y1^H W2)]``. At the cutoff the panel
is a tall-skinny QR (:func:`~mpqr.qr._kernels.tsqr`) whose explicit Q is turned
back into reflectors (:func:`~mpqr.qr._kernels.householder_from_q`). The
update and merge GEMMs have inner dimension ``m`` and outer dimensions of
half the current width — large and square where the tiled variant's are
``nb`` thin — which is what tensor-core engines need. The product with the
triangular top of ``Y`` uses the recursive TRMM split.

W, Y and the R/work matrix are allocated once and filled in place.
"""

from __future__ import annotations

from typing import Any

from mpqr._array_api import device
from mpqr.policy import gemm
from mpqr.qr._kernels import (
    ct,
    householder_from_q,
    panel_precision,
    trmm_lower,
    tsqr,
)

__all__ = ["RECURSION_CUTOFF", "householder_recursive"]

#: Panel width at which the recursion stops (Leng et al. use 32-wide tiles).
RECURSION_CUTOFF = 32


def householder_recursive(backend: Any, a: Any, *, precision: Any, prec_name: str,
                          want_q: bool = True, complete: bool = False,
                          nb: int = RECURSION_CUTOFF, overwrite: bool = False
                          ) -> tuple[Any | None, Any]:
    """Householder QR of ``(..., m, n)`` with ``m >= n``; see the module docstring.

    Returns ``(Q, R)`` before sign normalisation (Q is None unless ``want_q``).
    """
    xp = backend.xp
    *batch, m, n = a.shape
    dev = device(a)
    pp = panel_precision(prec_name, a.dtype, xp)
    work = a if overwrite else xp.asarray(a, copy=True)
    w_all = xp.zeros((*batch, m, n), dtype=a.dtype, device=dev)
    y_all = xp.zeros((*batch, m, n), dtype=a.dtype, device=dev)

    def rec(c0: int, c1: int) -> None:
        k = c1 - c0
        if k <= nb:
            qp, rp = tsqr(backend, work[..., c0:, c0:c1], precision=pp)
            w, y, s = householder_from_q(backend, qp, precision=pp)
            work[..., c0:c1, c0:c1] = xp.expand_dims(s, axis=-1) * rp
            w_all[..., c0:, c0:c1] = w
            y_all[..., c0:, c0:c1] = y
            return
        panels = -(-k // nb)
        k1 = nb * ((panels + 1) // 2)  # half the panels, rounded up
        cm = c0 + k1
        rec(c0, cm)
        # right half <- (I - W1 Y1^H)^H right half = B - Y1 (W1^H B)
        b = work[..., c0:, cm:c1]
        c = gemm(ct(xp, w_all[..., c0:, c0:cm]), b, precision=precision,
                 label="rec-update-WhB", backend=backend)
        y1 = y_all[..., c0:, c0:cm]
        top = b[..., :k1, :] - trmm_lower(y1[..., :k1, :], c, precision=precision,
                                          label="rec-update-trmm", backend=backend)
        low = b[..., k1:, :] - gemm(y1[..., k1:, :], c, precision=precision,
                                    label="rec-update-YC", backend=backend)
        work[..., c0:cm, cm:c1] = top
        work[..., cm:, cm:c1] = low
        rec(cm, c1)
        # merge: W2 <- W2 - W1 (Y1^H W2); Y1 is zero above row cm - c0 of W2's support
        d = gemm(ct(xp, y_all[..., cm:, c0:cm]), w_all[..., cm:, cm:c1], precision=precision,
                 label="rec-merge-YhW", backend=backend)
        w_all[..., c0:, cm:c1] = w_all[..., c0:, cm:c1] - gemm(
            w_all[..., c0:, c0:cm], d, precision=precision, label="rec-merge-WD",
            backend=backend)

    rec(0, n)
    r = xp.triu(work[..., :n, :])
    if not want_q:
        return None, r
    if complete:
        # Q = I - W Y^H (m x m)
        q = xp.eye(m, dtype=a.dtype, device=dev) - gemm(
            w_all, ct(xp, y_all), precision=precision, label="rec-formq-WYh", backend=backend)
        return q, r
    # Q = E - W Y1^H with Y1 = Y[:n, :n] unit lower: W Y1^H = (Y1 W^H)^H, a TRMM
    wy = ct(xp, trmm_lower(y_all[..., :n, :], ct(xp, w_all), precision=precision,
                           label="rec-formq-trmm", backend=backend))
    q = -wy
    q[..., :n, :] = q[..., :n, :] + xp.eye(n, dtype=a.dtype, device=dev)
    return q, r
