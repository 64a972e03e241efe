"""Gram matrices ``X^H X`` on the emulated engines, one triangle computed (SYRK/HERK).

A Gram matrix is symmetric (Hermitian), so a GEMM computes every off-diagonal
entry twice. The engines' Gram calls split the columns recursively into halves
down to leaves of at least :data:`MIN_LEAF` columns (at most :data:`LEVELS`
levels), compute the off-diagonal block ``X1^T X2`` of every split and the
leaves' diagonal blocks, and mirror: for ``n >= 8 MIN_LEAF`` columns that is
``1/2 + 1/16`` of the GEMM's products (``LEVELS = 3``), ``3/4`` at ``n = 512``; below
``2 MIN_LEAF`` columns the Gram call is one product that shares the operand's
preparation (one residue pass on ``ozaki-int8`` instead of two).
Smaller leaves would save few more products but read the operands once more
per level, and for tall ``X`` the engines are bound by memory traffic as much
as by the products. Each engine prepares ``X`` once (one scaling and
splitting pass; one residue pass for ``ozaki-int8``, where the full product
makes two) and the lower triangle is the mirror of the upper, so the result
is bitwise symmetric. Every entry is the same dot product as in the engine's
full product, with the same error bound.

Complex ``X = Xr + i Xi``: with ``Y = [Xr; Xi]`` and ``Z = [Xi; -Xr]`` (``2m``
rows), ``Re G = Y^T Y`` (symmetric: one triangle) and ``Im G = Y^T Z``
(antisymmetric: one triangle, mirrored negated, zero diagonal), so the
Hermitian Gram costs two real triangles of length ``2m``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mpqr._array_api import device
from mpqr.engines.scaling import pow2_shift, unscale
from mpqr.engines.tc_fp16 import FP16_TARGET_EXP

__all__ = ["LEVELS", "MIN_LEAF", "gram_blocks", "gram_tc_fp16", "gram_tc_sgemm", "mirror",
           "product_fraction", "run_gram"]

#: recursion depth of the column split (3: 9/16 of the products for n >= 8 MIN_LEAF)
LEVELS = 3
#: leaves narrower than this are not split further: smaller blocks lose more to their extra
#: passes than they save (H100, `python -m mpqr bench gemm --kinds gram`: 2^20 x 256 on
#: ozaki-int8 7.8 ms unsplit against 10.8 / 16.0 ms at one / two levels; 2^18 x 1024 best
#: at two levels on both engines)
MIN_LEAF = 256
_ALIGN = 16  # block edges on multiples of 16 (the int8 residues' padding)


def gram_blocks(n: int) -> list[tuple[int, int, int, int]]:
    """``(i0, i1, j0, j1)`` blocks covering the upper triangle of an ``n x n`` Gram:
    the recursive splits' off-diagonal blocks and the leaves' diagonal blocks."""
    out: list[tuple[int, int, int, int]] = []

    def split(lo: int, hi: int, depth: int) -> None:
        w = hi - lo
        if depth == LEVELS or w < 2 * MIN_LEAF:
            out.append((lo, hi, lo, hi))
            return
        h = lo + -(-(w // 2) // _ALIGN) * _ALIGN
        split(lo, h, depth + 1)
        split(h, hi, depth + 1)
        out.append((lo, h, h, hi))

    split(0, n, 0)
    return out


def product_fraction(n: int) -> float:
    """Share of the full GEMM's products the blocks of :func:`gram_blocks` compute."""
    if n == 0:
        return 0.0
    return sum((i1 - i0) * (j1 - j0) for i0, i1, j0, j1 in gram_blocks(n)) / float(n * n)


def mirror(backend: Any, c: Any, sign: int) -> Any:
    """The upper triangle of ``c`` and its mirror (``sign = -1``: negated, and a zero
    diagonal where finite): exactly symmetric or antisymmetric."""
    xp = backend.xp
    n = c.shape[-1]
    i = xp.arange(n, device=device(c))
    upper = i[:, None] <= i[None, :]
    t = xp.matrix_transpose(c)
    out = xp.where(upper, c, t if sign > 0 else -t)
    if sign < 0:
        diag = i[:, None] == i[None, :]
        out = xp.where(diag & xp.isfinite(out), xp.zeros_like(out), out)
    return out


def run_gram(backend: Any, gram_fn: Callable[..., Any], x: Any, *, out_dtype: Any,
             complex_gram: Callable[..., Any] | None = None, **params: Any) -> Any:
    """``X^H X`` (2-D ``x``) from the engine's triangular product ``gram_fn(backend, a, b,
    out_dtype=, sign=, **params)`` (``a^T b`` for ``k x n`` operands, upper blocks), or
    for complex ``x`` from the engine's ``complex_gram`` where it has one and takes it."""
    xp = backend.xp
    if not xp.isdtype(x.dtype, "complex floating"):
        return gram_fn(backend, x, x, out_dtype=out_dtype, sign=1, **params)
    if complex_gram is not None:
        g = complex_gram(backend, x, out_dtype=out_dtype, **params)
        if g is not None:
            return g
    from mpqr.engines.complex_product import real_dtype

    rdt = real_dtype(xp, out_dtype)
    xr, xi = xp.real(x), xp.imag(x)
    y = xp.concat([xr, xi], axis=0)
    z = xp.concat([xi, -xr], axis=0)
    re = gram_fn(backend, y, y, out_dtype=rdt, sign=1, **params)
    im = gram_fn(backend, y, z, out_dtype=rdt, sign=-1, **params)
    return backend.complex_from_parts(re, im)


def _shifts(backend: Any, a: Any, b: Any) -> tuple[Any, Any]:
    """Row shifts of ``a^T`` (``(n, 1)``) and column shifts of ``b`` (``(1, n)``)."""
    xp = backend.xp
    sa = pow2_shift(backend, a, axis=-2, target=FP16_TARGET_EXP)
    sb = sa if b is a else pow2_shift(backend, b, axis=-2, target=FP16_TARGET_EXP)
    return xp.reshape(sa, (-1, 1)), sb


def gram_tc_fp16(backend: Any, a: Any, b: Any, *, out_dtype: Any, sign: int) -> Any:
    """``tc-fp16``: the upper blocks of ``a^T b`` from one fp16 rounding of each operand."""
    xp = backend.xp
    n = a.shape[-1]
    sa, sb = _shifts(backend, a, b)
    a16 = backend.empty_for(a, a.shape, xp.float16)
    backend.split_fp16(a, xp.reshape(sa, (1, -1)), a16)
    b16 = a16
    if b is not a:
        b16 = backend.empty_for(b, b.shape, xp.float16)
        backend.split_fp16(b, sb, b16)
    c = xp.zeros((n, n), dtype=xp.float32, device=device(a))  # the lower blocks stay 0
    for i0, i1, j0, j1 in gram_blocks(n):
        backend.gemm_fp16(xp.matrix_transpose(a16[:, i0:i1]), b16[:, j0:j1],
                          out=c[i0:i1, j0:j1], alpha=1.0, beta=0.0)
    return mirror(backend, unscale(backend, c, sa, sb, out_dtype), sign)


def gram_tc_sgemm(backend: Any, a: Any, b: Any, *, out_dtype: Any, sign: int,
                  slice_k: int, partials_bytes: int | None = None) -> Any:
    """``tc-sgemm``: the upper blocks of ``a^T b``, each operand split once.

    ``a^T``'s concatenated operand ``[hi_f | lo]`` is the transpose of ``[hi_f; lo]``
    and ``b``'s is ``[lo; hi_f]``: for ``a is b`` both are views of one ``3k x n``
    buffer ``[lo; hi_f; lo]``.
    """
    from mpqr.engines import tc_sgemm
    from mpqr.engines.tc_sgemm import BATCHED_PARTIALS_BYTES, LO_SHIFT, split_product

    xp = backend.xp
    k, n = a.shape
    sa, sb = _shifts(backend, a, b)
    a_hi = backend.empty_for(a, (k, n), xp.float16)
    if b is a:
        buf = backend.empty_for(a, (3 * k, n), xp.float16)  # [lo; hi_f; lo]
        backend.split_fp16(a, sb, a_hi, hf=buf[k:2 * k, :], lo=buf[:k, :], lo_shift=LO_SHIFT)
        buf[2 * k:, :] = buf[:k, :]
        a_cat, b_hi, b_cat = buf[k:, :], a_hi, buf[:2 * k, :]
    else:
        a_cat = backend.empty_for(a, (2 * k, n), xp.float16)  # [hi_f; lo]
        backend.split_fp16(a, xp.reshape(sa, (1, -1)), a_hi, hf=a_cat[:k, :], lo=a_cat[k:, :],
                           lo_shift=LO_SHIFT)
        b_hi = backend.empty_for(b, (k, n), xp.float16)
        b_cat = backend.empty_for(b, (2 * k, n), xp.float16)  # [lo; hi_f]
        backend.split_fp16(b, sb, b_hi, hf=b_cat[k:, :], lo=b_cat[:k, :], lo_shift=LO_SHIFT)
    c = xp.zeros((n, n), dtype=xp.float32, device=device(a))  # the lower blocks stay 0
    zero = xp.zeros((n, 1), dtype=xp.int32, device=device(a))  # unscaled after the blocks
    t = xp.matrix_transpose
    for i0, i1, j0, j1 in gram_blocks(n):
        if tc_sgemm.FUSED_KERNEL and backend.fused_sgemm_kernel(i1 - i0, j1 - j0, k, slice_k) \
                and backend.fused_sgemm(
                    t(a_hi[:, i0:i1]), t(a_cat[:k, i0:i1]), t(a_cat[k:, i0:i1]),
                    b_hi[:, j0:j1], b_cat[k:, j0:j1], b_cat[:k, j0:j1], zero[i0:i1],
                    t(zero[j0:j1]), c[i0:i1, j0:j1], slice_k=slice_k, accumulate=False,
                    subtract=False):
            continue  # the block in one kernel: the same sums in the same order
        split_product(backend, xp.matrix_transpose(a_hi[:, i0:i1]),
                      xp.matrix_transpose(a_cat[:, i0:i1]), b_hi[:, j0:j1], b_cat[:, j0:j1],
                      slice_k=slice_k, out=c[i0:i1, j0:j1],
                      partials_bytes=partials_bytes or BATCHED_PARTIALS_BYTES)
    return mirror(backend, unscale(backend, c, sa, sb, out_dtype), sign)
