"""Pivoted Cholesky on the GPU in LAPACK ``?pstrf``'s order (the column order of QR with
column pivoting from a Gram matrix, :mod:`mpqr.qr.pivoted_gram`): ``kernels/pstrf.cu``'s
``pstrf_panel`` takes ``PANEL`` steps in one launch (one thread block: the pivot search,
the exchanges, the column of ``L``), the trailing update between panels is a product
through the precision policy; the end (a pivot below the threshold) is read every
``CHECK_EVERY`` panels, so at most that many panels' updates are spent after it.
"""

from __future__ import annotations

import cupy as cp
from mpqr.backends.cupy.modules import ctype, functions

from mpqr.policy import gemm_sub

__all__ = ["CHECK_EVERY", "PANEL", "pivoted_cholesky", "supports"]

#: Steps a launch (at most 64: the kernel's shared row of L)
PANEL = 32
#: Panels between reads of whether the factorization has ended
CHECK_EVERY = 4
_THREADS = 1024


def supports(g) -> bool:
    return g.ndim == 2 and g.dtype in (cp.float32, cp.float64)


def pivoted_cholesky(g, tol: float, panel: int | None = None):
    """``(P, k, gmax)`` of :meth:`mpqr.backends._base.ArrayAPIBackend.pivoted_cholesky`
    for a real symmetric ``g``; ``g`` is not modified."""
    nb = PANEL if panel is None else panel
    if not 1 <= nb <= 64:
        raise ValueError(f"panel must be within 1..64; got {nb}")
    n = g.shape[0]
    dt = g.dtype
    perm = cp.arange(n, dtype=cp.int32)
    gmax = float(cp.max(cp.diagonal(g))) if n else 0.0
    if not gmax > 0:
        return perm, 0, max(gmax, 0.0)
    (kern,) = functions("pstrf.cu", (f"pstrf_panel<{ctype(cp.dtype(dt).name)}>",))
    # C order: the kernel's column-major view of a symmetric matrix is the matrix itself,
    # and its columns of L are this array's rows (the update's operands without copies)
    w = cp.array(g, order="C", copy=True)
    d = cp.empty(n, dtype=dt)
    state = cp.zeros(2, dtype=cp.int32)
    stop = dt.type(tol * gmax)
    prec = "fp64" if dt == cp.float64 else "fp32"
    for i, j0 in enumerate(range(0, n, nb)):
        kern((1,), (_THREADS,), (w, cp.int64(n), cp.int32(n), cp.int32(j0), cp.int32(nb), d,
                                 perm, stop, state))
        j2 = j0 + nb
        if j2 >= n or (i % CHECK_EVERY == CHECK_EVERY - 1 and int(state[1])):
            break
        lt = w[j0:j2, j2:]  # the panel's columns of L below it, as rows
        gemm_sub(w[j2:, j2:], lt.T, lt, precision=prec, label="qrcp-pstrf-update")
    h = state.get()
    return perm, (int(h[0]) if h[1] else n), gmax
