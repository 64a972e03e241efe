"""Blocked (tiled) Householder QR with a fixed panel width.

The classic LAPACK ``geqrf`` structure (Kerr et al. 2009 on GPUs): factor a
panel of ``nb`` columns, apply its block reflector ``I - W Y^H`` to the
trailing columns with two GEMMs, move on. The trailing-update GEMMs are tall
and ``nb`` wide — fine for engines whose speed does not depend on shape
(native FP64 on GPUs without FP64 tensor cores, CPUs), which is where
Leng et al.'s Algorithm 1 picks this variant. Q is formed by applying the
block reflectors to ``eye(m, n)`` from the last to the first (``orgqr``
order), which exploits its zero structure.

At ``precision="fp16"`` the panel's vectors are rounded to fp16 once and ``T``
rebuilt from them (:func:`~mpqr.qr.householder_recursive.round_reflectors_fp16`),
and each block reflector is applied as ``X - Ŷ (T̂^T (Ŷ^T X))``: the two large
products run on the scheme's engine (:func:`~mpqr.qr.householder_recursive.fp16_products`:
one FP16 GEMM each, ``X`` rounded once), the small ``nb x nb`` product with ``T̂`` at
working precision. No W is formed. Backward error 1.0-1.3 ``u16`` and orthogonality
``<= 4 u16 / sqrt(n)`` (docs/precision.md).
"""

from __future__ import annotations

from typing import Any

from mpqr._array_api import device
from mpqr.policy import gemm, gemm_sub
from mpqr.qr._kernels import ct, eye_like, householder_panel, panel_precision

__all__ = ["PANEL_WIDTH", "block_reflector_ops", "householder_tiled"]

#: Narrowest panel: LAPACK's default block size for geqrf on CPUs. Large
#: matrices use wider panels (:func:`~mpqr.qr.householder_recursive.leaf_width`:
#: at most 128 panels, up to 256 wide) so the panel count, and with it the
#: launch count, stays bounded; the updates then have inner dimension ``nb``.
PANEL_WIDTH = 32


def householder_tiled(backend: Any, a: Any, *, precision: Any, prec_name: str,
                      want_q: bool = True, complete: bool = False, nb: int | None = None,
                      overwrite: bool = False) -> tuple[Any | None, Any]:
    """Householder QR of ``(..., m, n)`` with ``m >= n``.

    Returns ``(Q, R)`` before the sign normalisation: ``R`` is ``(..., n, n)``,
    Q ``(..., m, n)`` (``(..., m, m)`` if ``complete``) or None.
    """
    from mpqr.qr.householder_recursive import leaf_width

    xp = backend.xp
    m, n = a.shape[-2:]
    if nb is None:
        nb = max(PANEL_WIDTH, leaf_width(n))
    if n <= nb and m >= n and not complete:
        # one panel: the backend's panel QR (LAPACK, cuSOLVER or the CuPy TSQR
        # kernel, at working precision) already gives the explicit reduced Q,
        # so no reflectors are rebuilt and Q is not formed again from them
        q, r = backend.qr_panel(a)
        return (q if want_q else None), xp.triu(r)
    pp = panel_precision(prec_name, a.dtype, xp)
    work = a if overwrite else xp.asarray(a, copy=True)
    reflector, apply, _ = block_reflector_ops(backend, a, precision=precision,
                                              prec_name=prec_name, label="tiled")

    # look-ahead: the columns past the next panel are updated on the backend's lane while
    # the next panel is factored (its columns are updated first, on the main queue)
    lane = backend.update_lane(a)
    with lane.main_stream():
        return _factor(backend, work, a, lane, nb, pp, reflector, apply, want_q=want_q,
                       complete=complete)


def block_reflector_ops(backend: Any, a: Any, *, precision: Any, prec_name: str,
                        label: str) -> tuple[Any, Any, Any]:
    """``(reflector, apply, apply_into)`` for a right-looking blocked Householder QR of
    ``a``.

    ``reflector(W, Y)`` turns a panel's compact WY factors (:func:`householder_panel`)
    into what ``apply(blk, X, step)`` takes: ``step="update"`` applies the block
    reflector's conjugate transpose to trailing columns ``X``, ``"formq"`` the
    reflector itself (forming Q). At ``precision="fp16"`` the fp16 scheme of the module
    docstring; otherwise ``X - Y (W^H X)`` and ``X - W (Y^H X)``, both products at
    ``precision``. ``apply_into(blk, X, step)`` does the same in place in a 2-D view
    ``X`` (the second product accumulated into it where the backend can:
    :func:`~mpqr.policy.gemm_sub`). ``label`` prefixes the products' trace labels.
    """
    from mpqr.qr.householder_recursive import (
        fp16_products,
        fp16_scheme,
        round_reflectors_fp16,
    )

    xp = backend.xp
    pp = panel_precision(prec_name, a.dtype, xp)
    if fp16_scheme(prec_name, a, xp):
        opt_y = fp16_products()[0]
        def reflector(w: Any, y: Any) -> tuple[Any, Any]:
            return round_reflectors_fp16(backend, w, y, precision=pp)  # (Ŷ, T̂)

        def apply(blk: tuple[Any, Any], x: Any, step: str) -> Any:
            # X - Ŷ T̂ Ŷ^H X ("formq") or its transpose ("update"); no W is formed
            y, t = blk
            c = gemm(ct(xp, y), x, precision=precision, label=f"{label}-{step}-YhX",
                     options=opt_y, backend=backend)
            c = gemm(ct(xp, t) if step == "update" else t, c, precision=pp,
                     label=f"{label}-{step}-TC", backend=backend)
            return x - gemm(y, c, precision=precision, label=f"{label}-{step}-YC",
                            options=opt_y, backend=backend)

        def apply_into(blk: tuple[Any, Any], x: Any, step: str) -> None:
            x[...] = apply(blk, x, step)

        return reflector, apply, apply_into

    def reflector_wy(w: Any, y: Any) -> tuple[Any, Any]:
        return w, y

    def apply_wy(blk: tuple[Any, Any], x: Any, step: str) -> Any:
        w, y = blk
        if step == "update":  # (I - W Y^H)^H X = X - Y (W^H X)
            c = gemm(ct(xp, w), x, precision=precision, label=f"{label}-update-WhB",
                     backend=backend)
            return x - gemm(y, c, precision=precision, label=f"{label}-update-YC",
                            backend=backend)
        c = gemm(ct(xp, y), x, precision=precision, label=f"{label}-formq-YhQ",  # X - W (Y^H X)
                 backend=backend)
        return x - gemm(w, c, precision=precision, label=f"{label}-formq-WC", backend=backend)

    def apply_wy_into(blk: tuple[Any, Any], x: Any, step: str) -> None:
        w, y = blk
        first, second = (w, y) if step == "update" else (y, w)
        c = gemm(ct(xp, first), x, precision=precision, label=f"{label}-{step}-1",
                 backend=backend)
        gemm_sub(x, second, c, precision=precision, label=f"{label}-{step}-2",
                 backend=backend)

    return reflector_wy, apply_wy, apply_wy_into


def _factor(backend: Any, work: Any, a: Any, lane: Any, nb: int, pp: str, reflector: Any,
            apply: Any, *, want_q: bool, complete: bool) -> tuple[Any | None, Any]:
    xp = backend.xp
    *batch, m, n = a.shape
    blocks = []  # (j, reflector); also keeps what the lane reads referenced until it is done
    j, k = 0, min(nb, n)
    w, y, rp = householder_panel(backend, work[..., :, :k], precision=pp)
    while True:
        work[..., j:j + k, j:j + k] = rp
        j2 = j + k
        if j2 >= n and not want_q:
            break
        blk = reflector(w, y)
        blocks.append((j, blk))
        if j2 >= n:
            break
        k2 = min(nb, n - j2)
        lane.main_waits()  # the lane's update of these columns is done
        work[..., j:, j2:j2 + k2] = apply(blk, work[..., j:, j2:j2 + k2], "update")
        mark = lane.mark()
        w, y, rp = householder_panel(backend, work[..., j2:, j2:j2 + k2], precision=pp)
        if j2 + k2 < n:
            with lane.run_after(mark):
                work[..., j:, j2 + k2:] = apply(blk, work[..., j:, j2 + k2:], "update")
        j, k = j2, k2
    lane.main_waits()
    r = xp.triu(work[..., :n, :])
    if not want_q:
        return None, r
    q = eye_like(xp, tuple(batch), m, m if complete else n, a.dtype, device(a))
    for j, blk in reversed(blocks):
        q[..., j:, j:] = apply(blk, q[..., j:, j:], "formq")
    return q, r
