"""Gram matrices ``A^H A`` from the products of their upper-triangular blocks.

A Gram matrix is Hermitian, so one GEMM computes every off-diagonal entry twice.
Splitting the columns in halves, ``G11 = A1^H A1`` and ``G22 = A2^H A2``
(recursively) and ``G12 = A1^H A2``, with ``G21 = G12^H``, takes ``3/4`` of the
flops at one level and tends to ``1/2``; for tall ``A`` (``k = M`` in every
product) the halves are still large GEMMs. Each block is one product through
the precision policy on column views of ``A`` (no copies where the backend's
GEMM takes strided operands), and every entry is the same dot product as in
the full GEMM, so the accuracy is the full GEMM's; the result is exactly
Hermitian. cuBLAS's syrk, which also halves the flops, is not built for
``k >> n`` (H100: 3x slower than the GEMM at 2^20 x 256).
"""

from __future__ import annotations

from typing import Any

from mpqr.policy import gemm
from mpqr.policy import gram as policy_gram
from mpqr.qr._kernels import ct

__all__ = ["gram"]


def gram(backend: Any, a: Any, precision: Any, label: str) -> Any:
    """``A^H A`` (exactly Hermitian) for 2-D or stacked ``a``.

    Where the policy's engine has a Gram call (the emulated engines: one triangle,
    :func:`mpqr.policy.gram`) it runs that. Otherwise 2-D ``a`` wider than
    ``2 * backend.gram_block`` columns is split recursively (see the module
    docstring); stacks and narrow ``a`` take one GEMM, symmetrised (the engines
    need not return an exactly Hermitian product).
    """
    g = policy_gram(a, precision=precision, label=label, backend=backend)
    if g is not None:
        return g
    blk = backend.gram_block
    if a.ndim != 2 or blk is None:
        return _full(backend, a, precision, label)
    return _blocked(backend, a, precision, label, blk)


def _full(backend: Any, a: Any, precision: Any, label: str) -> Any:
    xp = backend.xp
    g = gemm(ct(xp, a), a, precision=precision, label=label, backend=backend)
    return (g + ct(xp, g)) / 2


def _blocked(backend: Any, a: Any, precision: Any, label: str, blk: int) -> Any:
    xp = backend.xp
    n = a.shape[-1]
    if n < 2 * blk:
        return _full(backend, a, precision, label)
    h = (n // 2 + 7) // 8 * 8  # a multiple of 8 keeps the column views aligned
    a1, a2 = a[:, :h], a[:, h:]
    g11 = _blocked(backend, a1, precision, label, blk)
    g22 = _blocked(backend, a2, precision, label, blk)
    g12 = gemm(ct(xp, a1), a2, precision=precision, label=label, backend=backend)
    return xp.concat([xp.concat([g11, g12], axis=1),
                      xp.concat([ct(xp, g12), g22], axis=1)], axis=0)
