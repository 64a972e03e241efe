"""Leaf panels factored in narrow sub-panels: right-looking blocked Householder QR.

On a GPU, LAPACK-style ``geqrf`` spends a fixed latency on every column (cuSOLVER: about
11 us per column at any panel width, H100), which bounds the
recursive QR of square matrices. Here an ``m x k`` leaf is factored in sub-panels of
``block`` columns, left to right. Each sub-panel goes to the backend's
:meth:`~mpqr.backends._base.ArrayAPIBackend.reconstruct_panel`: an explicit QR of the
sub-panel and the Householder reflectors that reproduce it (Ballard et al. 2014, LAPACK
``orhr_col``); on CuPy that is the TSQR tile kernels and one reconstruction kernel, a
handful of launches per sub-panel whatever its height. The leaf's remaining columns are
then updated, ``B <- (I - W Y^H)^H B = B - Y (W^H B)``, by two products at the panel's
working precision, the second accumulated into ``B`` in place where the backend can
(:func:`~mpqr.policy.gemm_sub`). ``T`` of the whole leaf comes from ``Y`` and the
sub-panels' ``tau`` by the UT transform (:func:`~mpqr.backends._base.compact_wy_t`), as
for ``geqrf``.
"""

from __future__ import annotations

from typing import Any

from mpqr._array_api import device
from mpqr.backends._base import compact_wy_t
from mpqr.policy import gemm, gemm_sub
from mpqr.qr._kernels import ct

__all__ = ["blocked_householder_panel"]


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
