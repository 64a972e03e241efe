"""The ``n x n`` steps of a CholQR pass in one launch (``kernels/chol_steps.cu``).

:func:`chol_steps` returns ``R = chol(G)``, ``X = R^-1`` and the eight numbers the
checks of :mod:`mpqr.qr.cholqr` read, all on the device and without a host sync, so
that a pass reads them back once instead of moving ``G`` to the host, factoring it there
and moving ``X`` back (about 0.5 ms of GPU idle time per pass at 2^22 x 64, H100,
``python -m mpqr bench qr --shapes 4194304x64 --precisions fp64``). Compiled on first use
for the device's architecture and cached by CuPy.
"""

from __future__ import annotations

import cupy as cp
from mpqr.backends.cupy.modules import ctype, functions

__all__ = ["MAX_N", "chol_steps", "supports"]

#: widest Gram matrix of the one-block kernel (shared memory: 64 x 65 doubles)
MAX_N = 64
_THREADS = 256


def supports(g) -> bool:
    # real 2-D Gram matrices only: complex ones keep the host path
    return (g.ndim == 2 and g.shape[0] == g.shape[1] and 0 < g.shape[0] <= MAX_N
            and g.dtype in (cp.float32, cp.float64))


def _kernel(dtype_name: str):
    return functions("chol_steps.cu", (f"chol_steps<{ctype(dtype_name)}, {MAX_N}, {_THREADS}>",))[0]


def chol_steps(g):
    """``(R, X, st)`` for a symmetric ``g`` accepted by :func:`supports`; ``st`` is the
    float64 vector described in the kernel source."""
    n = g.shape[0]
    g = cp.ascontiguousarray(g)
    r = cp.empty((n, n), dtype=g.dtype)
    x = cp.empty((n, n), dtype=g.dtype)
    st = cp.empty(8, dtype=cp.float64)
    _kernel(cp.dtype(g.dtype).name)((1,), (_THREADS,), (g, cp.int32(n), r, x, st))
    return r, x, st
