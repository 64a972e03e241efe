"""Double-double arithmetic on arrays, for least squares from one pass over the data.

A double-double value is an unevaluated sum ``hi + lo`` of two float64 numbers with
``|lo| <= ulp(hi) / 2``: about 106 significant bits. Products are split exactly
(Dekker's algorithm, no fused multiply-add needed) and sums are compensated (Knuth's
TwoSum), so a sum of ``m`` products carries a relative error of about ``m 2^-104``
against float64's ``m 2^-53``: the Gram matrix ``A^T A`` and ``A^T b`` of a tall ``A``
come out accurate far beyond float64, and the normal equations then give the least
squares solution, its residual and the residual's norm to float64 accuracy from
``n x n`` quantities alone (:mod:`mpqr.ooc.lstsq`).

Every function takes the array namespace ``xp`` and works elementwise on float64 arrays
(real only); ``split`` needs ``|a| < 2^996`` (callers decline larger entries).
"""

from __future__ import annotations

from typing import Any

__all__ = ["UNIT_DD", "add", "dot_rows", "gram", "matvec", "split", "sum_axis0", "two_prod",
           "two_sum"]

#: unit roundoff of double-double arithmetic (``2^-104``)
UNIT_DD = 2.0**-104

_SPLITTER = 134217729.0  # 2^27 + 1


def two_sum(xp: Any, a: Any, b: Any) -> tuple[Any, Any]:
    """``(s, e)`` with ``s = fl(a + b)`` and ``s + e = a + b`` exactly (Knuth)."""
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def _fast_two_sum(a: Any, b: Any) -> tuple[Any, Any]:
    # exact for |a| >= |b| (or a = 0)
    s = a + b
    return s, b - (s - a)


def split(xp: Any, a: Any) -> tuple[Any, Any]:
    """``(hi, lo)``, ``a = hi + lo`` exactly, each with at most 26 significant bits."""
    c = _SPLITTER * a
    hi = c - (c - a)
    return hi, a - hi


def two_prod(xp: Any, a: Any, b: Any) -> tuple[Any, Any]:
    """``(p, e)`` with ``p = fl(a b)`` and ``p + e = a b`` exactly (Dekker)."""
    p = a * b
    ah, al = split(xp, a)
    bh, bl = split(xp, b)
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


def add(xp: Any, a: tuple[Any, Any], b: tuple[Any, Any]) -> tuple[Any, Any]:
    """``a + b`` of two double-double arrays (the accurate variant: relative error
    ``~2 UNIT_DD`` also under cancellation)."""
    s, e = two_sum(xp, a[0], b[0])
    t, f = two_sum(xp, a[1], b[1])
    s, e = _fast_two_sum(s, e + t)
    return _fast_two_sum(s, e + f)


def sum_axis0(xp: Any, hi: Any, lo: Any) -> tuple[Any, Any]:
    """The double-double sum over axis 0 (a pairwise tree: the error grows with the
    logarithm of the length)."""
    while hi.shape[0] > 1:
        k = hi.shape[0] // 2
        h, l_ = add(xp, (hi[:k, ...], lo[:k, ...]), (hi[k:2 * k, ...], lo[k:2 * k, ...]))
        if hi.shape[0] % 2:
            h = xp.concat([h, hi[2 * k:, ...]], axis=0)
            l_ = xp.concat([l_, lo[2 * k:, ...]], axis=0)
        hi, lo = h, l_
    return hi[0, ...], lo[0, ...]


def gram(xp: Any, w: Any, chunk: int = 256) -> tuple[Any, Any]:
    """``W^T W`` of a float64 ``h x N`` array in double-double: ``(hi, lo)``, each
    ``N x N`` and symmetric (rows taken ``chunk`` at a time: ``chunk N^2`` temporaries)."""
    n = w.shape[1]
    dev = getattr(w, "device", None)
    acc = (xp.zeros((n, n), dtype=w.dtype, device=dev),
           xp.zeros((n, n), dtype=w.dtype, device=dev))
    for r0 in range(0, w.shape[0], chunk):
        blk = w[r0:min(r0 + chunk, w.shape[0]), :]
        p, e = two_prod(xp, blk[:, :, None], blk[:, None, :])
        # the exact products p + e, summed: p in a compensated tree, e (at most half an
        # ulp of p each) into the low part of the same tree
        acc = add(xp, acc, sum_axis0(xp, p, e))
    return acc


def matvec(xp: Any, g: tuple[Any, Any], x: Any) -> tuple[Any, Any]:
    """``G x`` for a double-double ``N x N`` ``g`` and a float64 ``N x k`` ``x``, in
    double-double (every product exact, the sums over ``j`` compensated)."""
    hi, lo = g
    # (N, N, k): the products G_ij x_jk; the low parts' products need no exactness
    p, e = two_prod(xp, hi[:, :, None], x[None, :, :])
    e = e + lo[:, :, None] * x[None, :, :]
    h, l_ = sum_axis0(xp, xp.permute_dims(p, (1, 0, 2)), xp.permute_dims(e, (1, 0, 2)))
    return h, l_


def dot_rows(xp: Any, a: Any, b: tuple[Any, Any]) -> tuple[Any, Any]:
    """``sum_i a_ik b_ik`` for float64 ``a`` and double-double ``b`` (``N x k`` each),
    in double-double: one value per column."""
    p, e = two_prod(xp, a, b[0])
    return sum_axis0(xp, p, e + a * b[1])
