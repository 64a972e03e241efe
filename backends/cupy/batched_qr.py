"""Batched QR of small matrices on the GPU: one thread block per matrix, one launch.

Each block loads one ``m x n`` matrix of the stack (``m >= n``) into registers, runs
the whole Householder QR there (``kernels/batched_qr.cu``; the tile kernel of
:mod:`~mpqr.backends.cupy.tsqr` with the whole matrix as its tile), writes R and then
forms Q (reduced or complete) or ``Q^T b`` from the reflectors kept in shared memory:
the input is read once and each output written once, in a single launch for the whole
stack. ``diag(R) >= 0`` on the way out (the public convention), so no sign pass follows.

Limits (:func:`fits`): ``m <= MAX_ROWS``, ``n <= MAX_N``, and the register tile, ``CPW *
RPL`` values per thread (columns per warp times rows per lane), at most
:data:`MAX_REGS_VALUES` of the dtype (beyond it the compiler spills). That is
up to ``128 x 128`` and ``256 x 128`` in float32, ``128 x 128`` and ``256 x 64`` in
float64. Larger matrices take the library's other routes.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["MAX_N", "MAX_REGS_VALUES", "MAX_ROWS", "fits", "layout", "qr", "qr_apply"]

#: most rows: 8 rows per lane of a warp
MAX_ROWS = 256
#: most columns: 16 warps of 8 columns
MAX_N = 128
#: most register-tile values per thread (CPW * RPL) per dtype: 128 registers a thread
#: at 512 threads is the launch bound; beyond these the tile spills
MAX_REGS_VALUES = {"float32": 64, "float64": 32}

#: dynamic shared memory a block may opt in to (sm_80 and sm_90: 227 KiB)
MAX_SHARED = 227 * 1024

_MODES = {"r": 0, "reduced": 1, "complete": 2, "apply": 3}


def layout(m: int, n: int) -> tuple[int, int, int]:
    """``(CPW, RPL, warps)``: columns per warp, rows per lane, warps of the block.

    About four columns a warp (fewer warps for narrow matrices: more resident blocks
    and cheaper barriers), at most 16 warps; ``ceil(m / 32)`` rows a lane."""
    nw = min(16, max(1, -(-n // 4)))
    return -(-n // nw), max(1, -(-m // 32)), nw


def _smem(m: int, n: int, itemsize: int) -> int:
    rpl = layout(m, n)[1]
    return (32 * rpl * ((n | 1) + 2) + 2 * n) * itemsize


def fits(dtype: Any, m: int, n: int) -> bool:
    """Whether an ``m x n`` matrix of ``dtype`` (float32/float64) takes the kernel."""
    name = np.dtype(dtype).name
    if name not in MAX_REGS_VALUES or not (1 <= n <= m <= MAX_ROWS and n <= MAX_N):
        return False
    cpw, rpl, _ = layout(m, n)
    return (cpw * rpl <= MAX_REGS_VALUES[name]
            and _smem(m, n, np.dtype(dtype).itemsize) <= MAX_SHARED)


def _kernel(dtype, m: int, n: int, mode: int):
    from mpqr.backends.cupy.modules import ctype, functions

    cpw, rpl, _ = layout(m, n)
    t = ctype(np.dtype(dtype).name)
    (kern,) = functions("batched_qr.cu", (f"batched_qr<{t},{cpw},{rpl},{mode}>",))
    smem = _smem(m, n, np.dtype(dtype).itemsize)
    if smem > 48 * 1024 and kern.max_dynamic_shared_size_bytes < smem:
        # beyond 48 KiB a kernel has to opt in to dynamic shared memory
        kern.max_dynamic_shared_size_bytes = smem
    return kern, smem


def _check(cp, a, name="a"):
    if not isinstance(a, cp.ndarray):
        raise TypeError(f"batched_qr: expected a CuPy array for {name}, got {type(a).__name__}")
    if a.dtype not in (cp.float32, cp.float64):
        raise TypeError(f"batched_qr: expected {name} of dtype float32 or float64, got {a.dtype}")
    if a.ndim < 2:
        raise ValueError(f"batched_qr: expected {name} with at least 2 dimensions, "
                         f"got shape {a.shape}")
    m, n = a.shape[-2:]
    if not fits(a.dtype, m, n):
        raise ValueError(f"batched_qr: expected {name} of m x n with 1 <= n <= m <= {MAX_ROWS}, "
                         f"n <= {MAX_N} and a register tile that fits (fits()), got shape "
                         f"{a.shape} of {a.dtype}")


def _launch(cp, a, mode: str, b=None):
    *batch, m, n = a.shape
    nb = math.prod(batch)
    md = _MODES[mode]
    p = {0: 0, 1: n, 2: m, 3: 0 if b is None else b.shape[-1]}[md]
    r = cp.empty((*batch, n, n), dtype=a.dtype)
    out = None if md == 0 else cp.empty((*batch, m, p), dtype=a.dtype)
    if nb == 0:
        return out, r
    a3 = cp.ascontiguousarray(a)
    b3 = cp.ascontiguousarray(b) if b is not None else None
    kern, smem = _kernel(a.dtype, m, n, md)
    nw = layout(m, n)[2]
    # r stands in for the pointers a mode does not use (never dereferenced)
    kern((nb,), (32 * nw,),
         (a3, r, out if out is not None else r, b3 if b3 is not None else r,
          np.int32(m), np.int32(n), np.int32(p)), shared_mem=smem)
    return out, r


def qr(a: Any, mode: str = "reduced") -> tuple[Any | None, Any]:
    """QR of every matrix of a CuPy stack in one launch.

    Parameters
    ----------
    a : cupy.ndarray
        ``(..., m, n)``, float32 or float64, with :func:`fits` true. Not modified.
    mode : {"reduced", "complete", "r"}

    Returns
    -------
    q : cupy.ndarray or None
        ``(..., m, n)`` (reduced), ``(..., m, m)`` (complete), None for ``"r"``.
    r : cupy.ndarray
        ``(..., n, n)`` upper triangular with ``diag(r) >= 0``; ``a = q[..., :n] @ r``.

    Raises
    ------
    TypeError
        If ``a`` is not a float32/float64 CuPy array.
    ValueError
        If ``a`` has fewer than 2 dimensions or a shape the kernel does not take, or
        ``mode`` is unknown.

    Examples
    --------
    >>> import cupy as cp  # doctest: +SKIP
    >>> q, r = qr(cp.random.standard_normal((8192, 64, 64)))  # doctest: +SKIP
    """
    import cupy as cp

    if mode not in ("reduced", "complete", "r"):
        raise ValueError(f"batched_qr: expected mode 'reduced', 'complete' or 'r', got {mode!r}")
    _check(cp, a)
    return _launch(cp, a, mode)


def qr_apply(a: Any, b: Any) -> tuple[Any, Any]:
    """``(R, Q^T b)`` of every matrix of a CuPy stack in one launch (least squares).

    Parameters
    ----------
    a : cupy.ndarray
        ``(..., m, n)`` as for :func:`qr`. Not modified.
    b : cupy.ndarray
        ``(..., m, k)`` of ``a``'s dtype and batch shape. Not modified.

    Returns
    -------
    r : cupy.ndarray
        ``(..., n, n)``, ``diag(r) >= 0``.
    c : cupy.ndarray
        ``(..., m, k)``: ``Q^T b`` with the complete Q whose first ``n`` columns go with
        ``r``; ``c[..., :n, :]`` is the right-hand side of ``r x = Q_1^T b`` and
        ``c[..., n:, :]`` holds the residual's coordinates.

    Raises
    ------
    TypeError, ValueError
        As :func:`qr`; ValueError also if ``b`` does not match ``a``.
    """
    import cupy as cp

    _check(cp, a)
    if not isinstance(b, cp.ndarray) or b.dtype != a.dtype or b.ndim != a.ndim \
            or b.shape[:-1] != a.shape[:-1]:
        raise ValueError(f"batched_qr: expected b of shape {(*a.shape[:-1], 'k')} and dtype "
                         f"{a.dtype}, got {getattr(b, 'shape', None)} of "
                         f"{getattr(b, 'dtype', type(b).__name__)}")
    c, r = _launch(cp, a, "apply", b)
    return r, c
