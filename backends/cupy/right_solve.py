"""``Q = A R^{-1}`` (upper-triangular ``R``) for tall ``A`` on the GPU: one thread per row.

cuBLAS ``trsm`` on a ``2^24 x 32`` right-hand side ran at ~110 GB/s (72 ms, H100);
this kernel reads ``A`` once and writes ``Q`` once. Two fused kernels serve
CholQR2 on narrow float64 matrices: the Gram matrix of ``A R1^{-1}`` without
writing it (:func:`right_solve_gram`), and ``(A R1^{-1}) R2^{-1}`` from ``A``
(:func:`right_solve_twice`), the same rounded intermediate rows in both; they
solve a tile by 8-column blocks, the off-diagonal updates on the fp64 MMA; the Gram
kernel and the row-per-thread one also solve ``A - T`` for a blocked solve's leaf
(``sub``: the update ``T`` subtracted in the pass). Kernel sources:
``kernels/right_solve.cu`` (and ``right_solve_sub.cu``, ``right_solve_rows_sub.cu``
appended to it); one instantiation per ``(dtype, n, kernel)``, compiled on first use
and cached by CuPy.
"""

from __future__ import annotations

import functools

import cupy as cp
import numpy as np
from mpqr.backends.cupy.modules import functions

__all__ = ["GRAM_MAX_N", "MAX_N", "right_solve_gram", "right_solve_twice", "right_solve_upper",
           "supports", "supports_gram"]

#: widest R the kernel takes (a thread keeps its row in registers)
MAX_N = 64
#: widest float64 A of the fused kernels (a warp holds its share of G's upper 8 x 8 tiles:
#: 72 doubles at 64 columns, one block per SM)
GRAM_MAX_N = 64
_GRAM_ROWS = 128
# blocks per SM asked of the register allocator (H100, 2^24 x 32, ``python -m mpqr bench qr
# --shapes 16777216x32 --precisions fp64``: the Gram kernel 2.54 ms at 3, 2.70 at 1; the
# two-solve kernel 4.6 ms at 1 or 2); the double-buffered tiles leave room for at most 3 and 2
_TWICE_MINB = 1


def _gram_minb(n: int) -> int:
    # past 32 columns one block per SM (H200, 2^22 x 64: 2.77 ms at 1 or 2, the same)
    return 3 if n <= 32 else 1


def _rows(n: int, dtype) -> int:
    # static shared memory (48 KiB) holds ROWS x (n + 1) elements
    return 128 if (n + 1) * np.dtype(dtype).itemsize * 128 <= 48 * 1024 else 64


def supports(a, r) -> bool:
    return (a.ndim == 2 and r.ndim == 2 and a.dtype in (cp.float32, cp.float64)
            and r.dtype == a.dtype and 0 < a.shape[1] <= MAX_N
            and r.shape == (a.shape[1], a.shape[1]))


def supports_gram(a) -> bool:
    return a.ndim == 2 and a.dtype == cp.float64 and 0 < a.shape[1] <= GRAM_MAX_N


@functools.cache
def _kernel(dtype_name: str, n: int, rows: int, variant: str):
    """One instantiation, compiled on first use (a route pays only for the kernels it
    runs, and a parallel warm-up compiles each one apart)."""
    t, minb = ("double", 3) if dtype_name == "float64" else ("float", 1)
    name = {"one": f"right_solve_upper_rows<{t}, {n}, {rows}, {minb}, false>",
            "twice": f"right_solve_upper_rows<{t}, {n}, {rows}, {minb}, true>",
            "one_sub": f"right_solve_upper_sub_rows<{t}, {n}, {rows}, {minb}>",
            "gram": f"right_solve_gram_rows<{n}, {_GRAM_ROWS}, {_gram_minb(n)}, false>",
            "gram_store": f"right_solve_gram_rows<{n}, {_GRAM_ROWS}, {_gram_minb(n)}, true>",
            "gram_sub": f"right_solve_gram_sub_rows<{n}, {_GRAM_ROWS}, {_gram_minb(n)}, false>",
            "gram_store_sub": f"right_solve_gram_sub_rows<{n}, {_GRAM_ROWS}, {_gram_minb(n)}, "
                              "true>",
            "twice_tiles": f"right_solve_twice_tiles<{n}, {_GRAM_ROWS}, {_TWICE_MINB}>",
            }[variant]
    after = (("right_solve_rows_sub.cu",) if variant == "one_sub" else
             ("right_solve_sub.cu",) if variant.endswith("_sub") else ())
    fn = functions("right_solve.cu", (name,), after)[0]
    if variant.startswith("gram") or variant == "twice_tiles":  # past 48 KiB: dynamic smem
        fn.max_dynamic_shared_size_bytes = _fused_smem(n, 2 if variant == "twice_tiles" else 1)
    return fn


def _fused_smem(n: int, nr: int) -> int:
    """Bytes of the fused kernels' shared memory: two ROWS x N16 tiles and ``nr`` copies
    of R (N8 x RS) with its reciprocal diagonal (``fused_smem`` in the kernel source,
    which traps when given less)."""
    n16, n8 = (n + 15) // 16 * 16, (n + 7) // 8 * 8
    rs_ = n8 + ((20 - (n8 & 15)) & 15)
    return (2 * _GRAM_ROWS * n16 + nr * (n8 * rs_ + n8)) * 8


def _factor(r, dtype):
    """R transposed with an even row stride (the kernel loads aligned pairs), 1 / diag(R)."""
    n = r.shape[0]
    rt = cp.zeros((n, n + (n & 1)), dtype=dtype)
    rt[:, :n] = r.T
    return rt, 1 / cp.ascontiguousarray(cp.diagonal(r))


def _rows_operand(a):
    if not _rows_unit_stride(a):
        a = cp.ascontiguousarray(a)  # the kernels want unit stride along rows
    return a, np.int64(a.strides[0] // a.itemsize if a.shape[0] > 1 else a.shape[1])


def _operands(a, out, who):
    """``(a, lda, out, ldq)``: ``a`` with unit stride along rows and the output (new,
    or the caller's ``out``, checked), with their leading dimensions."""
    m, n = a.shape
    a, lda = _rows_operand(a)
    if out is None:
        out = cp.empty((m, n), dtype=a.dtype)
    elif out.shape != (m, n) or out.dtype != a.dtype or not _rows_unit_stride(out):
        raise ValueError(f"internal: {who} `out` must be (m, n), a's dtype, "
                         "unit stride along rows")
    return a, lda, out, np.int64(out.strides[0] // out.itemsize if m > 1 else n)


def _solve(a, rs, out, variant, sub=None):
    m, n = a.shape
    a, lda, out, ldq = _operands(a, out, "right_solve_upper")
    if m == 0:
        return out
    rows = _rows(n, a.dtype)
    rt, dinv = _factor(rs[0], a.dtype)
    if sub is not None:
        if sub.shape != (m, n) or sub.dtype != a.dtype:
            raise ValueError("internal: right_solve_upper `sub` must be (m, n), a's dtype")
        sub, lds = _rows_operand(sub)
        tail = (sub, lds)
        variant = "one_sub"
    else:
        tail = _factor(rs[1], a.dtype) if len(rs) > 1 else (rt, dinv)  # unused by "one"
    _kernel(np.dtype(a.dtype).name, n, rows, variant)(
        (-(-m // rows),), (rows,), (a, lda, rt, dinv, out, ldq, np.int64(m), *tail))
    return out


def right_solve_upper(a, r, out=None, sub=None):
    """``a @ inv(r)`` for 2-D float32/float64 ``a`` (m x n, n <= 64).

    Written into ``out`` (m x n, unit stride along rows, e.g. a column slice of a
    wider array) when given, else into a new C-ordered array, which is returned.
    ``sub`` (m x n, ``a``'s dtype): ``a - sub`` is solved instead, each difference
    rounded once as the subtraction rounds it, without writing it (one pass fewer
    for a blocked solve's leaf).
    """
    return _solve(a, (r,), out, "one", sub)


def _padded(r):
    """``r`` in the top left of an identity of the next multiple of 8, and 1 / its diagonal
    (the fused kernels' operands: padded columns solve to zero)."""
    n = r.shape[0]
    n8 = (n + 7) // 8 * 8
    rp = cp.eye(n8, dtype=cp.float64)
    rp[:n, :n] = r
    return rp, 1 / cp.ascontiguousarray(cp.diagonal(rp))


def right_solve_twice(a, r1, r2, out=None):
    """``(a @ inv(r1)) @ inv(r2)`` without writing the intermediate (``out`` as in
    :func:`right_solve_upper`). Float64 ``a`` up to GRAM_MAX_N columns is solved by
    8-column blocks, rounding the intermediate exactly as :func:`right_solve_gram`
    does; other inputs by two row-wise substitutions, as two :func:`right_solve_upper`
    calls round it."""
    if not supports_gram(a):
        return _solve(a, (r1, r2), out, "twice")
    m, n = a.shape
    a, lda, out, ldq = _operands(a, out, "right_solve_twice")
    if m == 0:
        return out
    (rp1, dp1), (rp2, dp2) = _padded(r1), _padded(r2)
    kernel, smem = _kernel("float64", n, _rows(n, a.dtype), "twice_tiles"), _fused_smem(n, 2)
    blocks = max(1, min(-(-m // _GRAM_ROWS), _resident_blocks(kernel, _GRAM_ROWS, smem)))
    kernel((blocks,), (_GRAM_ROWS,), (a, lda, rp1, dp1, rp2, dp2, out, ldq, np.int64(m)),
           shared_mem=smem)
    return out


def right_solve_gram(a, r, out=None, sub=None):
    """``Q1^T Q1`` for ``Q1 = a @ inv(r)`` (float64, n <= GRAM_MAX_N) in one read of ``a``:
    ``Q1`` solved by 8-column blocks as :func:`right_solve_twice` solves it, the Gram
    products on the fp64 tensor cores; exactly symmetric. ``out`` (as in
    :func:`right_solve_upper`): ``Q1`` is also written there, in the same pass. ``sub``
    (m x n float64, unit stride along rows): ``a - sub`` is solved instead of ``a``, each
    difference rounded once, without writing it."""
    m, n = a.shape
    null = (np.uint64(0), np.int64(0))  # a null operand: every parameter is passed
    if out is None:
        a, lda = _rows_operand(a)
        extra = null
    else:
        a, lda, out, ldq = _operands(a, out, "right_solve_gram")
        extra = (out, ldq)
    if sub is None:
        tail = null
    else:
        if sub.shape != (m, n) or sub.dtype != a.dtype:
            raise ValueError("internal: right_solve_gram `sub` must be (m, n), a's dtype")
        sub, lds = _rows_operand(sub)
        tail = (sub, lds)
    rp, dp = _padded(r)
    n16 = (n + 15) // 16 * 16
    tiles = -(-m // _GRAM_ROWS)
    variant = ("gram" if out is None else "gram_store") + ("" if sub is None else "_sub")
    kernel, smem = _kernel("float64", n, _rows(n, a.dtype), variant), _fused_smem(n, 1)
    # persistent blocks, one wave of them: few partial Gram matrices, no tail
    blocks = max(1, min(tiles, _resident_blocks(kernel, _GRAM_ROWS, smem)))
    partial = cp.zeros((blocks * (_GRAM_ROWS // 32), n16, n16), dtype=cp.float64)  # per warp
    if m:
        kernel((blocks,), (_GRAM_ROWS,), (a, lda, rp, dp, partial, np.int64(m), *extra, *tail),
               shared_mem=smem)
    g = cp.triu(partial.sum(axis=0)[:n, :n])
    return g + cp.triu(g, 1).T


@functools.cache
def _resident_blocks(kernel, threads: int, smem: int) -> int:
    """Blocks of ``kernel`` (``smem`` bytes of dynamic shared memory each) the whole
    device holds at once (the occupancy query)."""
    from cupy.cuda import driver

    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    fn = getattr(kernel, "kernel", kernel)  # RawKernel wraps a driver Function
    try:
        per_sm = driver.occupancyMaxActiveBlocksPerMultiprocessor(fn.ptr, threads, smem)
    except (AttributeError, driver.CUDADriverError):  # no query: the launch bound's count
        per_sm = 1
    return max(1, int(per_sm)) * sms


def _rows_unit_stride(x) -> bool:
    return (x.shape[1] == 1 or x.strides[1] == x.itemsize) and x.strides[0] > 0 and \
        x.strides[0] % x.itemsize == 0
