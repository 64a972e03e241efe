"""Leaf panels factored in narrow sub-panels: right-looking blocked Householder QR.

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
  CuPy three kernel launches per panel and a loop of its own, ``backend.certified_leaf``),
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
from mpqr.backends._base import compact_wy_t
from mpqr.backends.panel_cholqr import CERTIFIED_PANEL_MAX_N
from mpqr.policy import gemm, gemm_sub

__all__ = ["blocked_householder_panel", "certified_leaf"]


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
                   precision: str, woff: int = 0) -> Any:
    """Factor the leaf ``work[c0:, c0:c1]`` (2-D, LAPACK's layout) in place in certified
    panels of :data:`~mpqr.qr._kernels.CERTIFIED_PANEL_MAX_N` columns, left to right
    (``backend.certified_panel``: CholQR2 + reconstruction, the check counted into
    ``cert``). Each panel's ``W`` goes to ``w_all[c:, c:e]`` for the update of the leaf's
    later columns, ``B <- B - Y (W^H B)``, by products at ``precision`` (the second in
    place, in two parts: ``Y``'s explicit unit-lower top and the rows below it).
    Returns the leaf's ``tau`` (for its ``T``: :func:`~mpqr.backends._base.compact_wy_t`).
    W's entry ``(i, j)`` lives at ``w_all[..., i - woff, j - woff]`` (a W narrower than
    ``work``: the lean plan of docs/memory.md).
    """
    tau = backend.certified_leaf(work, w_all, c0, c1, cert, woff)
    if tau is not None:  # the backend's own loop (the same steps)
        return tau
    xp = backend.xp
    m = work.shape[-2]
    taus = []
    for c in range(c0, c1, CERTIFIED_PANEL_MAX_N):
        e = min(c + CERTIFIED_PANEL_MAX_N, c1)
        wp = w_all[c - woff:m - woff, c - woff:e - woff]
        l, tau = backend.certified_panel(work[c:, c:e], wp, cert)
        taus.append(tau)
        if e == c1:
            break
        z = gemm(ct(xp, wp), work[c:, e:c1], precision=precision,
                 label="panel-update-WhB", backend=backend)
        gemm_sub(work[c:e, e:c1], l, z, precision=precision, label="panel-update-YZ",
                 backend=backend)
        if e < m:
            gemm_sub(work[e:, e:c1], work[e:, c:e], z, precision=precision,
                     label="panel-update-YZ", backend=backend)
    return xp.concat(taus)
