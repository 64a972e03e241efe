"""Operands prepared once for the fp16 tensor-core engines.

The ``tc-fp16`` and ``tc-sgemm`` engines scale each operand by exact powers of two and
round it to fp16 parts before their GEMMs (:mod:`mpqr.engines.tc_fp16`,
:mod:`mpqr.engines.tc_sgemm`): a range scan, a conversion pass and fp16 copies per
operand and product. An operand that several products read (a Householder block's ``W``
in the trailing update and in the merge of the next level) can carry those parts:
:class:`Prepared` holds them, and the engines take it in place of the array.

The shifts lie along one axis of the operand:

* the operand's *own* axis (rows of a left operand, columns of a right one): the parts are
  the engine's own, so the product has the bits it has from the array;
* the product's *inner* axis (``X 2^S`` with ``S = diag(2^s)`` on ``k``; e.g. the
  transpose :attr:`Prepared.T` of a prepared operand): the engine moves ``2^-S`` to the
  other operand before splitting it (exact: powers of two) and splits it as usual. Each
  entry of the prepared one keeps its bits relative to the largest of its line along
  ``k`` instead of along its own axis: the same engine bound
  (``|C - AB| <= c u |A||B|`` elementwise for entries within ``2^-28`` of that maximum,
  and normwise for all), not the same bits.

A product the policy gives to another engine (or tiles) reads :attr:`Prepared.source`,
the array itself. :func:`prepare` makes one; :func:`operand` unwraps.

Within :func:`shared_hi` a ``tc-sgemm`` operand's ``hi`` is written once, into the
correction buffer where ``hf`` would be (``hf`` is ``hi``): 4 bytes an element instead of
6, one write fewer. For finite operands ``hf`` equals ``hi``, so every product has the
same bits; an Inf in an operand then reaches the correction product too, where an Inf
times a zero residual gives NaN: outputs the engine would make Inf may come out NaN (never
finite). For callers whose contract asks non-finite results only (the QR's).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Any

__all__ = ["PREPARED_ENGINES", "Prepared", "operand", "prepare", "shared_hi"]

#: the engines whose operands :func:`prepare` makes parts for
PREPARED_ENGINES = ("tc-sgemm", "tc-fp16")
_SHARED_HI: ContextVar[bool] = ContextVar("mpqr_shared_hi", default=False)


@contextlib.contextmanager
def shared_hi(on: bool = True) -> Iterator[None]:
    """Within: ``tc-sgemm``'s parts keep one fp16 copy of ``hi`` (``hf`` is ``hi``; the
    module docstring says what changes for non-finite operands)."""
    token = _SHARED_HI.set(on)
    try:
        yield
    finally:
        _SHARED_HI.reset(token)


@dataclass(frozen=True)
class Prepared:
    """An operand of products with its fp16 parts (see the module docstring).

    ``axis``: the axis its shifts were taken along (``-1``: one per row, as for a left
    operand; ``-2``: one per column, as for a right one); ``shift`` is int32 with keepdims.
    ``hi`` is ``fp16(X 2^s)``; for ``tc-sgemm`` ``hf`` (``hi`` with non-finite entries 0)
    and ``lo`` (the rounding residual times ``2^11``), and ``cat``, the buffer they are
    views of where it serves one GEMM over ``2k``: ``[hf | lo]`` for a left operand
    (``cat_side="left"``), ``[lo ; hf]`` for a right one.
    """

    source: Any
    engine: str
    axis: int
    shift: Any
    hi: Any
    hf: Any = None
    lo: Any = None
    cat: Any = None
    cat_side: str | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.source.shape)

    @property
    def dtype(self) -> Any:
        return self.source.dtype

    @property
    def ndim(self) -> int:
        return self.source.ndim

    @property
    def T(self) -> Prepared:
        """The transposed operand: the same parts, its shifts along the other axis."""
        def t(x: Any) -> Any:
            return None if x is None else x.T

        return replace(self, source=self.source.T, axis=-1 if self.axis == -2 else -2,
                       shift=self.shift.T, hi=self.hi.T, hf=t(self.hf), lo=t(self.lo),
                       cat=None, cat_side=None)

    def inner(self, side: str) -> bool:
        """Whether, as the ``side`` operand of a product, its shifts lie along the
        product's inner axis (the engine's own axis is rows on the left, columns on the
        right)."""
        return self.axis == (-2 if side == "left" else -1)

    def cat_for(self, side: str) -> Any:
        """The concatenated parts for one correction GEMM on ``side``, or None."""
        return self.cat if self.cat_side == side else None


def operand(x: Any) -> Any:
    """The array of a prepared operand, or ``x`` itself."""
    return x.source if isinstance(x, Prepared) else x


def prepare(backend: Any, x: Any, *, side: str, engine: str) -> Prepared:
    """``x`` (real float, a matrix or a stack of them) with the ``engine``'s fp16 parts as
    the ``side`` operand of products: the very scaling and rounding the engine applies
    to it there (the engines split their plain operands by this function too)."""
    from mpqr.engines.scaling import FP16_TARGET_EXP, LO_SHIFT, pow2_shift

    if engine not in PREPARED_ENGINES or side not in ("left", "right") or x.ndim < 2:
        raise ValueError(f"prepare: an operand of {PREPARED_ENGINES} (at least 2-D) on side "
                         f"'left' or 'right' was expected, got engine={engine!r}, "
                         f"side={side!r}, ndim={x.ndim}")
    xp = backend.xp
    axis = -1 if side == "left" else -2
    s = pow2_shift(backend, x, axis=axis, target=FP16_TARGET_EXP)
    if engine == "tc-fp16":
        hi = backend.empty_for(x, x.shape, xp.float16)
        backend.split_fp16(x, s, hi)
        return Prepared(x, engine, axis, s, hi)
    *batch, m, n = x.shape
    if side == "left":
        cat = backend.empty_for(x, (*batch, m, 2 * n), xp.float16)  # [hf | lo]
        hf, lo = cat[..., :n], cat[..., n:]
    else:
        cat = backend.empty_for(x, (*batch, 2 * m, n), xp.float16)  # [lo ; hf]
        hf, lo = cat[..., m:, :], cat[..., :m, :]
    if _SHARED_HI.get():  # hi written where hf would be (:func:`shared_hi`)
        backend.split_fp16(x, s, hf, lo=lo, lo_shift=LO_SHIFT)
        return Prepared(x, engine, axis, s, hf, hf, lo, cat, side)
    hi = backend.empty_for(x, x.shape, xp.float16)
    backend.split_fp16(x, s, hi, hf=hf, lo=lo, lo_shift=LO_SHIFT)
    return Prepared(x, engine, axis, s, hi, hf, lo, cat, side)
