"""``|diag(R)|`` made non-increasing by adjacent column exchanges on the GPU
(:mod:`mpqr.qr.pivoted_repair`): ``kernels/diag_repair.cu``'s ``diag_swaps`` (one thread
block looping over the exchanges of ``R``, recording the rotations) and
``apply_rotations`` (the list applied to ``Q``, a thread a row), then the clamp of what
is left within rounding, with one host read (the exchange count and status).
"""

from __future__ import annotations

import cupy as cp
import numpy as np
from mpqr.backends.cupy.modules import ctype, functions

__all__ = ["diagonal_repair", "supports"]

_THREADS = 1024


def supports(r) -> bool:
    # real R only: a complex rotation needs a phase (the portable steps take those)
    return r.ndim == 2 and r.dtype in (cp.float32, cp.float64)


def _kernels(dtype_name: str):
    t = ctype(dtype_name)
    return functions("diag_repair.cu", (f"diag_swaps<{t}>", f"apply_rotations<{t}>"))


def diagonal_repair(q, r, p, tol: float, limit: int):
    """``(Q, R, P, exchanges, entries lowered, largest lowering)`` or None past ``limit``
    exchanges (:meth:`mpqr.backends._base.ArrayAPIBackend.diagonal_repair`); new arrays,
    the inputs not modified."""
    kk = min(r.shape)
    n = r.shape[1]
    dt = r.dtype
    swaps, apply = _kernels(cp.dtype(dt).name)
    r = cp.array(r, order="C", copy=True)
    p = cp.array(p, dtype=cp.int32, copy=True)
    dg = cp.empty(kk, dtype=dt)
    cap = max(limit, 1)
    rot_i = cp.empty(cap, dtype=cp.int32)
    rot_c, rot_s, rot_g = (cp.empty(cap, dtype=dt) for _ in range(3))
    info = cp.zeros(2, dtype=cp.int32)
    swaps((1,), (_THREADS,), (r, cp.int64(n), cp.int32(kk), cp.int32(n), p, dg,
                              dt.type(tol), cp.int32(limit), rot_i, rot_c, rot_s, rot_g,
                              info))
    if q is not None:
        q = cp.array(q, order="F", copy=True)
        m = q.shape[0]
        apply((-(-m // 256),), (256,), (q, cp.int64(m), cp.int32(m), rot_i, rot_c, rot_s,
                                        rot_g, info))
    # what is left is within rounding: each entry lowered to the smallest before it
    # (a non-finite diagonal: nothing to order, left as it is); CuPy has no
    # minimum.accumulate, and the diagonal comes to the host with the status anyway
    idx = cp.arange(kk)
    h = cp.concatenate([info.astype(cp.float64), r[idx, idx].astype(cp.float64)]).get()
    if h[1] != 0:
        return None
    d = h[2:]
    low = np.minimum.accumulate(d) if np.all(np.isfinite(d)) else d
    fix = d - low
    lowered = int(np.count_nonzero(fix))
    if lowered:
        r[idx, idx] = cp.asarray(low, dtype=dt)
    return q, r, p, int(h[0]), lowered, float(fix.max(initial=0.0))
