"""How much device memory a QR call needs, checked before the work starts.

A call on a device array whose workspace estimate exceeds the device's free memory (the
driver's free bytes plus what the array library's pool holds unused) raises
:class:`mpqr.DeviceMemoryError` up front, saying how much it needs, how much is free and
which precision or out-of-core budget would fit, instead of an out-of-memory error from
deep inside the factorization. Host arrays (free memory unknown: ``None``) are never
refused here.

The estimate (:func:`estimate_bytes`) is the route's budget beyond the input itself: for
the square/wide Householder route its working copy (where R is left for a square input)
and W (where Q is formed), R where it is not square, the fp16 vectors at ``fp16``, the
engines' scratch cap of the plan and the top level's half-size products; tall methods and
the library's QR a measured multiple of the input's bytes.

The plan also bounds the engines' scratch memory during the call
(:func:`workspace_scope`): the fp16 engines' operand splits and products (``fp16``,
``fp32-emulated``) stay within ``SPLIT_FRACTION`` of the input's bytes (at least
``SPLIT_FLOOR``), the policy running a larger product in output tiles (on a device only
where the untiled call would not fit the free memory); the Ozaki engine's
residues and int32 products (whose default cap is half the free device memory, so a call
used to take as much as it found) within ``OZAKI_FRACTION`` of the input's bytes (at least
``OZAKI_FLOOR``), the engine blocking its products, which changes no bit of the result.

``MPQR_MEMORY_PLAN=0`` turns the check and the caps off (A/B measurements).
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from typing import Any

from mpqr._errors import DeviceMemoryError
from mpqr.engines.ozaki import workspace_bytes
from mpqr.policy import active_gemm_options, gemm_options, record_event
from mpqr.qr._kernels import TRMM_CUTOFF
from mpqr.qr.householder_recursive import MAX_CERTIFIED_LEAF_WIDTH, leaf_width

__all__ = ["OZAKI_FLOOR", "OZAKI_FRACTION", "SPLIT_FLOOR", "SPLIT_FRACTION",
           "TALL_METHODS", "check_fits", "enabled", "estimate_bytes", "ozaki_cap", "split_cap",
           "workspace_scope"]

#: the Ozaki engine's scratch cap during a QR call: this fraction of the input's bytes,
#: and at least OZAKI_FLOOR bytes (small inputs keep unblocked products); at 0.5 a
#: 8192^2 float64 fp64-emulated QR ran 12% slower, at 1.0 4% (H200,
#: bench/probes/memory_gpu.py)
OZAKI_FRACTION = 1.0
OZAKI_FLOOR = 256 << 20

#: the fp16 engines' (tc-fp16, tc-sgemm, tc-fp16-splitb) scratch cap during a QR call:
#: this fraction of the input's bytes, at least SPLIT_FLOOR; the policy tiles a product's
#: output so that each tile's operand splits and product fit (no bit changes: rows of A and
#: columns of B are split independently)
SPLIT_FRACTION = 0.5
SPLIT_FLOOR = 64 << 20

#: methods that factor tall-skinny inputs (their workspace is a few n x n blocks)
TALL_METHODS = frozenset({"cholqr", "cholqr2", "shifted-cholqr3", "preconditioned-cholqr",
                          "svqr", "gram-schmidt-recursive", "householder-batched"})

#: k/2 x k/2 products of the top level alive at once (C, its TRMM update, a converted copy)
_HALF_PRODUCTS = 3
#: m x leaf-width copies of a leaf's panels alive at once (the panel, its Q and W)
_LEAF_COPIES = 4
#: the memory pool's rounding and blocks it cannot reuse, a fraction of the input's bytes
_SLACK = 0.1
#: tall methods (2^24 x 64 float64, H200) and the array library's own QR (cuSOLVER)
_TALL = 2.0
_LIBRARY = 2.07
#: ``geqrf-wy``: the reflectors' copy, Y^T, the product Y W and Q (reduced members)
_WY = 4.0
#: moduli and CRT limbs of a float64-accurate Ozaki product (typical: 16-17 moduli)
_OZAKI_TERMS, _OZAKI_LIMBS = 17, 4


def enabled() -> bool:
    """Whether calls are checked against free device memory (``MPQR_MEMORY_PLAN``)."""
    return os.environ.get("MPQR_MEMORY_PLAN", "1").strip().lower() not in ("0", "off",
                                                                          "false", "no")


def estimate_bytes(method: str, prec_name: str, shape: tuple[int, ...], itemsize: int,
                   tiles: bool = True) -> int:
    """Device bytes a QR of ``shape`` (``(..., m, n)``) by ``method`` at ``prec_name``
    needs at its high-water mark beyond the input (its factors included); ``tiles``:
    with the fp16 engines' products in tiles within :func:`split_cap` (else whole)."""
    nbytes = math.prod(shape) * itemsize
    if method in TALL_METHODS:
        return math.ceil(_TALL * nbytes)
    if method == "geqrf":
        return math.ceil(_LIBRARY * nbytes)
    if method in ("geqrf-wy", "cholqr2-batched"):  # geqrf-wy: its copy, Y^T, Y W and Q;
        # cholqr2-batched: Q1, its transposed solve, Q (each the input's size)
        return math.ceil(_WY * nbytes)
    *batch, m, n = shape
    k = min(m, n)
    stack = math.prod(batch)
    # the working copy (R in its storage where square) and W (Q in its storage)
    need = 2 * nbytes + (stack * k * k * itemsize if m != n else 0)
    if prec_name == "fp16":  # the rounded vectors as float16
        need += stack * m * k * 2
    if prec_name in ("fp16", "fp32-emulated"):
        # the top level's update W1^H A2 (operands m x k/2) unsplit, or tiles within the cap
        per = 2 if prec_name == "fp16" else 6
        whole = stack * (per * m * k + 8 * (k // 2) ** 2)
        need += min(split_cap(nbytes), whole) if tiles else whole
    elif prec_name == "fp64-emulated":  # the top level's trailing product, within the cap
        h = -(-k // 2)
        need += min(ozaki_cap(nbytes), workspace_bytes(m, h, h, _OZAKI_TERMS, _OZAKI_LIMBS))
    # factoring: the top level's C = W1^H A2 (k/2 x k/2), its triangular update and a
    # converted copy, or a leaf's panel copies; forming Q: a diagonal block of W Y1^H
    # (m x k/4)
    nb = leaf_width(k, MAX_CERTIFIED_LEAF_WIDTH)
    factoring = max(_HALF_PRODUCTS * (k // 2) ** 2, _LEAF_COPIES * m * min(nb, k))
    forming_q = m * max(TRMM_CUTOFF, k // 4)
    need += stack * max(factoring, forming_q) * itemsize
    return math.ceil(need + _SLACK * nbytes)


def ozaki_cap(nbytes: int) -> int:
    """The Ozaki engine's scratch cap during QR of an input of ``nbytes`` bytes."""
    return max(OZAKI_FLOOR, int(OZAKI_FRACTION * nbytes))


def split_cap(nbytes: int) -> int:
    """The fp16 engines' scratch cap (operand splits and products of one product tile)
    during QR of an input of ``nbytes`` bytes."""
    return max(SPLIT_FLOOR, int(SPLIT_FRACTION * nbytes))


def check_fits(backend: Any, a: Any, method: str, prec_name: str) -> None:
    """Raise :class:`~mpqr.DeviceMemoryError` if QR of ``a`` would not fit the device."""
    if not enabled():
        return
    free = backend.device_memory_free()
    if free is None:  # host memory: no estimate of what is free
        return
    shape = tuple(a.shape)
    itemsize = int(getattr(a.dtype, "itemsize", 0)) or _itemsize(backend, a)
    # the input already lives on the device: what the call adds must fit what is free
    need = estimate_bytes(method, prec_name, shape, itemsize)
    record_event("memory", f"qr: plan {need:,} bytes beyond the input, {free:,} free",
                 needed=need, free=free, method=method, precision=prec_name)
    if need <= free:
        return
    fits = [p for p in ("fp16", "fp32-emulated", "fp64-emulated")
            if p != prec_name and estimate_bytes(method, p, shape, itemsize) <= free]
    hint = (f"precision={fits[0]!r} would fit" if fits else
            "no precision of this route fits")
    raise DeviceMemoryError(
        f"mpqr.qr of a {' x '.join(map(str, shape))} {a.dtype} array at "
        f"precision={prec_name!r} ({method}) needs about {need:,} bytes of device memory "
        f"beyond the input and {free:,} are free; {hint}, or factor it out of core from "
        f"host memory: mpqr.qr(host_copy, memory_budget={free // 2:,}) (the budget in "
        "bytes of device memory the out-of-core route may use)",
        needed=need, free=free)


@contextlib.contextmanager
def workspace_scope(backend: Any, a: Any, prec_name: str, method: str = "householder-recursive"
                    ) -> Iterator[None]:
    """The engines' scratch caps of the plan for QR of ``a`` (none where the caller set
    ``workspace_limit`` or the plan is off). On a device the fp16 engines' products go in
    tiles only where the untiled call would not fit the free memory: the tiles re-split
    an operand each (16384^2 float32 fp32-emulated: 8.9% slower with them, H200,
    ``python bench/probes/memory_gpu.py``)."""
    opts = active_gemm_options()
    if not enabled() or (opts is not None and opts.workspace_limit is not None) \
            or prec_name not in ("fp64-emulated", "auto", "fp16", "fp32-emulated"):
        yield
        return
    itemsize = int(getattr(a.dtype, "itemsize", 0)) or _itemsize(backend, a)
    nbytes = math.prod(a.shape) * itemsize
    if prec_name in ("fp16", "fp32-emulated"):
        free = backend.device_memory_free()
        if free is not None and estimate_bytes(method, prec_name, tuple(a.shape), itemsize,
                                               tiles=False) <= free:
            yield
            return
        cap = split_cap(nbytes)
    else:
        cap = min(ozaki_cap(nbytes), backend.ozaki_workspace_limit())
    with gemm_options(opts, workspace_limit=cap):
        yield


def _itemsize(backend: Any, a: Any) -> int:
    xp = backend.xp
    info = xp.finfo(a.dtype)
    return int(info.bits) // 8 * (2 if xp.isdtype(a.dtype, "complex floating") else 1)
