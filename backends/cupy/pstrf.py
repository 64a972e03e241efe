"""Pivoted Cholesky on the GPU in LAPACK ``?pstrf``'s order (the column order of QR with
column pivoting from a Gram matrix, :mod:`mpqr.qr.pivoted_gram`): ``kernels/pstrf.cu``
takes ``PANEL`` steps in one launch (one thread block: the pivot search, the exchanges,
the column of ``L``), the trailing update between panels is a product through the
precision policy; the end (a pivot below the threshold) is read every ``CHECK_EVERY``
panels, so at most that many panels' updates are spent after it.

``VARIANT``: "rows" defers the panel's row exchanges (a strided access an element in
the serial loop) to one launch over all columns (``pstrf_panel_rows``, ``pstrf_rows``);
"swap" exchanges rows and columns at each step (``pstrf_panel``).
"""

from __future__ import annotations

import cupy as cp
from mpqr.backends.cupy.modules import ctype, functions

from mpqr.policy import gemm_sub

__all__ = ["CHECK_EVERY", "PANEL", "VARIANT", "pivoted_cholesky", "supports"]

#: Steps a launch (at most 64: the kernel's shared row of L)
PANEL = 32
#: Panels between reads of whether the factorization has ended
CHECK_EVERY = 4
#: "rows" or "swap" (module docstring)
VARIANT = "rows"
_THREADS = 1024


def supports(g) -> bool:
    return g.ndim == 2 and g.dtype in (cp.float32, cp.float64)


def pivoted_cholesky(g, tol: float, panel: int | None = None, variant: str | None = None):
    """``(P, k, gmax)`` of :meth:`mpqr.backends._base.ArrayAPIBackend.pivoted_cholesky`
    for a real symmetric ``g``; ``g`` is not modified."""
    nb = PANEL if panel is None else panel
    variant = VARIANT if variant is None else variant
    if not 1 <= nb <= 64:
        raise ValueError(f"panel must be within 1..64; got {nb}")
    if variant not in ("rows", "swap"):
        raise ValueError(f"variant must be 'rows' or 'swap'; got {variant!r}")
    n = g.shape[0]
    dt = g.dtype
    perm = cp.arange(n, dtype=cp.int32)
    gmax = float(cp.max(cp.diagonal(g))) if n else 0.0
    if not gmax > 0:
        return perm, 0, max(gmax, 0.0)
    t = ctype(cp.dtype(dt).name)
    swap, rows, moves = functions("pstrf.cu", (f"pstrf_panel<{t}>", f"pstrf_panel_rows<{t}>",
                                               f"pstrf_rows<{t}>"))
    # C order: the kernel's column-major view of a symmetric matrix is the matrix itself,
    # and its columns of L are this array's rows (the update's operands without copies)
    w = cp.array(g, order="C", copy=True)
    d = cp.empty(n, dtype=dt)
    state = cp.zeros(2, dtype=cp.int32)
    rho = cp.empty(n, dtype=cp.int32)
    sk, sp = cp.empty(nb, dtype=cp.int32), cp.empty(nb, dtype=cp.int32)
    stop = dt.type(tol * gmax)
    prec = "fp64" if dt == cp.float64 else "fp32"
    for i, j0 in enumerate(range(0, n, nb)):
        head = (w, cp.int64(n), cp.int32(n), cp.int32(j0), cp.int32(nb))
        if variant == "swap":
            swap((1,), (_THREADS,), (*head, d, perm, stop, state))
        else:
            rows((1,), (_THREADS,), (*head, d, perm, rho, sk, sp, stop, state))
            moves((n - j0,), (128,), (*head, rho, sk, sp))
        j2 = j0 + nb
        if j2 >= n or (i % CHECK_EVERY == CHECK_EVERY - 1 and int(state[1])):
            break
        lt = w[j0:j2, j2:]  # the panel's columns of L below it, as rows
        gemm_sub(w[j2:, j2:], lt.T, lt, precision=prec, label="qrcp-pstrf-update")
    h = state.get()
    return perm, (int(h[0]) if h[1] else n), gmax
