"""How much device memory a QR call needs, checked before the work starts.

A call takes one of three plans (:data:`PLANS`, :func:`choose_plan`): on a device the
fastest whose estimate fits the free memory (the driver's free bytes plus what the array
library's pool holds unused, within a pool limit) — ``"fast"`` (whole products, no caps),
``"tiled"`` (the engines' scratch capped) or ``"lean"`` (the square/wide Householder
route's lean footprint: W a block column, Q formed over the working copy; docs/memory.md).
Where even the lean plan would not fit, :class:`mpqr.DeviceMemoryError` is raised up
front, saying how much it needs, how much is free and which precision or out-of-core
budget would fit, instead of an out-of-memory error from deep inside the factorization.
Host arrays (free memory unknown: ``None``) are never refused here and take the tiled
plan.

The estimate (:func:`estimate_bytes`) is the plan's budget beyond the input itself: for
the square/wide Householder route on the fast and tiled plans its working copy (where R
is left for a square input) and W (where Q is formed), R where it is not square, the fp16
vectors at ``fp16``, the engines' scratch and the top level's half-size products; on the
lean plan the larger of its factoring and its formation of Q; tall methods and the
library's QR a measured multiple of the input's bytes.

The tiled and lean plans bound the engines' scratch memory during the call
(:func:`workspace_scope`): the fp16 engines' operand splits and products (``fp16``,
``fp32-emulated``) stay within ``SPLIT_FRACTION`` (lean: ``LEAN_SPLIT_FRACTION``) of the
input's bytes (at least ``SPLIT_FLOOR``), the policy running a larger product in output
tiles; the Ozaki engine's residues and int32 products (whose default cap is half the free
device memory) within ``OZAKI_FRACTION`` (lean: ``LEAN_OZAKI_FRACTION``) of the input's
bytes (at least ``OZAKI_FLOOR``), the engine blocking its products, which changes no bit
of the result.

``MPQR_MEMORY_PLAN=0`` turns the check and the caps off (A/B measurements); ``lean`` or
``fast`` forces that plan.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from types import MappingProxyType
from typing import Any

from mpqr._errors import DeviceMemoryError
from mpqr.engines.ozaki import workspace_bytes
from mpqr.engines.tc_sgemm import partials_limit
from mpqr.policy import active_gemm_options, gemm_options, record_event
from mpqr.qr import householder_recursive as _recursive
from mpqr.qr.householder_recursive import (
    LEAN_PARTS,
    LEAN_Q_BLOCK,
    MAX_CERTIFIED_LEAF_WIDTH,
    formq_block,
    leaf_width,
    lean_plan,
    lean_q_width,
    lean_q_workspace,
    lean_width,
    spine_block,
    spine_reserve,
)

__all__ = ["LEAN_FIRST_MIN_N", "LEAN_OZAKI_FRACTION", "LEAN_SPLIT_FRACTION", "OZAKI_FLOOR",
           "OZAKI_FRACTION", "PLANS", "SPLIT_FLOOR", "SPLIT_FRACTION", "TALL_METHODS",
           "check_fits", "choose_plan", "element_bytes", "enabled", "estimate_bytes",
           "lean_first", "lean_ozaki_cap", "lean_split_cap", "least_bytes", "memory_error",
           "out_of_memory", "ozaki_cap", "plan_setting", "split_cap", "workspace_scope"]

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
#: the caps on the lean plan (docs/memory.md), fractions of the input's bytes. The
#: Ozaki cap: 16384^2 float64 fp64-emulated on the lean plan 1.8% slower than the fast
#: plan at 0.6 (2.45x the input in the pool), 6.1% at 0.35 (2.11x), 3.5% at 1.0 (3.65x)
#: (H200, ``PLAN_CAPS_LEAN=1 python bench/probes/plan_caps.py``)
LEAN_SPLIT_FRACTION = 0.2
LEAN_OZAKI_FRACTION = 0.6
#: the plans a device call may take, fastest first
PLANS = ("fast", "tiled", "lean")
#: precisions whose square/wide Householder QR takes the lean plan, not the fast one,
#: from this many columns of ``min(m, n)`` up: fp64-emulated on the lean plan (Q in blocks
#: of 1024 columns) against the fast plan, float64: 16384^2 366-367 ms in 2.45x the input's
#: bytes against 378 ms in 12.97x; 65536 x 8192 483.9 against 487.3 ms (1.92x against
#: 9.89x), 12288^2 187.4 against 195.9, 8192^2 81.8 against 82.4 (H200,
#: ``python bench/probes/ktiles.py``, the lean and fast plans alternated)
LEAN_FIRST_MIN_N = MappingProxyType({"fp64-emulated": 8192})

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
#: ... plus, on the ``"fast"`` plan at ``fp32-emulated`` (float32 CholQR2's products over
#: ``x`` on tc-sgemm, whose Gram call splits ``x`` whole: two fp16 copies of 0.5 and 1.5
#: times its bytes beside ``Q1``); on the other plans those products stay native
_TALL_SPLIT = 1.5
_LIBRARY = 2.07
#: ``geqrf-wy``: the reflectors' copy, Y^T, the product Y W and Q (reduced members)
_WY = 4.0
#: moduli and CRT limbs of a float64-accurate Ozaki product (typical: 16-17 moduli)
_OZAKI_TERMS, _OZAKI_LIMBS = 17, 4


def enabled() -> bool:
    """Whether calls are checked against free device memory (``MPQR_MEMORY_PLAN``)."""
    return plan_setting() != "off"


def estimate_bytes(method: str, prec_name: str, shape: tuple[int, ...], itemsize: int,
                   plan: str = "tiled", complete: bool = False) -> int:
    """Device bytes a QR of ``shape`` (``(..., m, n)``) by ``method`` at ``prec_name``
    needs at its high-water mark beyond the input (its factors included) on ``plan``
    (:data:`PLANS`): ``"fast"`` the engines' products whole, ``"tiled"`` the fp16
    engines' products in tiles within :func:`split_cap`, ``"lean"`` the lean route of
    the square/wide Householder QR (docs/memory.md) with the lean caps. ``complete``:
    ``mode="complete"`` (Q of ``m x m`` where ``m > n``)."""
    *batch, m, n = shape
    if complete and m > n:
        return _complete_bytes(method, prec_name, shape, itemsize, plan)
    nbytes = math.prod(shape) * itemsize
    if m < n and method not in TALL_METHODS:
        return _wide_bytes(method, prec_name, shape, itemsize, plan)
    if method in TALL_METHODS:
        split = plan == "fast" and prec_name == "fp32-emulated" and itemsize == 4
        return math.ceil((_TALL + (_TALL_SPLIT if split else 0.0)) * nbytes)
    if method == "geqrf":
        return math.ceil(_LIBRARY * nbytes)
    if method in ("geqrf-wy", "cholqr2-batched"):  # geqrf-wy: its copy, Y^T, Y W and Q;
        # cholqr2-batched: Q1, its transposed solve, Q (each the input's size)
        return math.ceil(_WY * nbytes)
    *batch, m, n = shape
    k = min(m, n)
    stack = math.prod(batch)
    if plan == "lean" and method == "householder-recursive":
        return _lean_bytes(prec_name, m, n, stack, itemsize)
    spine = _spine_bytes(method, prec_name, m, n, stack, itemsize) if plan == "fast" else None
    if spine is not None:
        return spine
    # the working copy (R in its storage where square) and W (Q in its storage)
    need = 2 * nbytes + (stack * k * k * itemsize if m != n else 0)
    nb = leaf_width(k, MAX_CERTIFIED_LEAF_WIDTH, rows=m)
    if prec_name == "fp16":  # the rounded vectors as float16 (a block's where the spine
        # goes in blocks)
        sb = spine_block(m, n, nb) if _recursive.SPINE_FP16 else None
        need += stack * m * (k if sb is None else sb) * 2
    if prec_name in ("fp16", "fp32-emulated"):
        # the top level's update W1^H A2 (operands m x k/2) unsplit, or tiles within the cap
        per = 2 if prec_name == "fp16" else 6
        whole = stack * (per * m * k + 8 * (k // 2) ** 2)
        if prec_name == "fp32-emulated":
            # then its B -= Y1 C: W1's parts (kept for Q's formation) beside those of Y1's
            # rows below its triangle and their whole product, subtracted after (the
            # larger of the two on tall inputs: 65536 x 8192 float32, live peak 4.33x the
            # input against 4.05x before this term, H200, bench/results/probes/alloc_log_*)
            h = k // 2
            whole = max(whole, stack * (3 * m * k + 10 * (m - h) * h))
        need += whole if plan == "fast" else min(split_cap(nbytes), whole)
    elif prec_name == "fp64-emulated":  # the top level's trailing product, within the cap
        h = -(-k // 2)
        whole = workspace_bytes(m, h, h, _OZAKI_TERMS, _OZAKI_LIMBS)
        need += whole if plan == "fast" else min(ozaki_cap(nbytes), whole)
    # factoring: the top level's C = W1^H A2 (k/2 x k/2), its triangular update and a
    # converted copy, or a leaf's panel copies; forming Q: a diagonal block of W Y1^H
    # (m x formq_block(k)), or where the right spine's merges are folded into it (not at
    # fp16), the root's D and its product with Y22 (k/2 x k/2 each) beside the next node's D
    factoring = max(_HALF_PRODUCTS * (k // 2) ** 2, _LEAF_COPIES * m * min(nb, k))
    forming_q = m * formq_block(k)
    if prec_name != "fp16":
        forming_q = max(forming_q, 2 * (k // 2) ** 2) + (k // 4) ** 2
    need += stack * max(factoring, forming_q) * itemsize
    return math.ceil(need + _SLACK * nbytes)


def _spine_bytes(method: str, prec_name: str, m: int, n: int, stack: int,
                 itemsize: int) -> int | None:
    """The fast plan's bytes where the recursion's spine goes in blocks with its
    temporaries in one reserved block of the pool (``householder_recursive.SPINE_RESERVE``:
    one float32 matrix, ``m >= n``), or None: the working copy and W (Q), that block (at
    least a taller input's R), a leaf's panel copies beside it (the pool may not fit them
    into the block's free part) and the slack."""
    if method != "householder-recursive" or stack != 1 or itemsize != 4 or m < n:
        return None
    if prec_name == "fp16" and not _recursive.SPINE_FP16:
        return None
    nb = leaf_width(n, MAX_CERTIFIED_LEAF_WIDTH, rows=m)
    sb = spine_block(m, n, nb)
    block = spine_reserve(m, n, sb, prec_name) if sb else 0
    if not block:
        return None
    nbytes = m * n * itemsize
    leaf = _LEAF_COPIES * m * nb * itemsize
    return math.ceil(2 * nbytes + block + leaf + _SLACK * nbytes)


def _wide_bytes(method: str, prec_name: str, shape: tuple[int, ...], itemsize: int,
                plan: str) -> int:
    """A wide ``m x n`` input (``m < n``): the QR of its leading ``m x m`` block (the
    engines' caps those of the whole input), then R (``m x n``) beside Q and R1 with
    ``R2 = Q^H A2`` written into it."""
    *batch, m, n = shape
    stack = math.prod(batch)
    nbytes = stack * m * n * itemsize
    sq_shape = (*batch, m, m)
    square = estimate_bytes(method, prec_name, sq_shape, itemsize, plan)
    sq_bytes = stack * m * m * itemsize
    if plan != "fast" and prec_name in ("fp16", "fp32-emulated", "fp64-emulated", "auto"):
        # the caps follow the whole input's bytes (workspace_scope)
        lean = plan == "lean"
        if prec_name == "fp64-emulated":
            cap = lean_ozaki_cap if lean else ozaki_cap
        else:
            cap = lean_split_cap if lean else split_cap
        square += max(0, cap(nbytes) - cap(sq_bytes))
    # R2's product: operands m x m and m x (n - m), whole or within the cap
    c = n - m
    if prec_name in ("fp16", "fp32-emulated"):
        per = 2 if prec_name == "fp16" else 6
        whole = stack * (per * m * (m + c) + 8 * m * c)
        cap = None if plan == "fast" else (lean_split_cap if plan == "lean" else split_cap)
    elif prec_name == "fp64-emulated":
        whole = stack * workspace_bytes(m, c, m, _OZAKI_TERMS, _OZAKI_LIMBS)
        cap = None if plan == "fast" else (lean_ozaki_cap if plan == "lean" else ozaki_cap)
    else:
        whole, cap = 0, None
    scratch = whole if cap is None else min(whole, cap(nbytes))
    r_phase = 2 * sq_bytes + nbytes + scratch + _SLACK * nbytes  # Q, R1 and R
    return math.ceil(max(square, r_phase))


def _complete_bytes(method: str, prec_name: str, shape: tuple[int, ...], itemsize: int,
                    plan: str) -> int:
    """``mode="complete"`` of a tall ``m x n`` input: the reduced route's factoring, and
    Q (``m x m``) beside R and the working copy. On the lean plan Q is formed over an
    ``m x m`` copy of the vectors (the working copy goes once copied): the reduced
    route's budget and ``m² + 512 m`` more; elsewhere ``I - W Y^H`` is formed from the
    product ``W Y^H`` (``m x m``), the identity and their difference: ``3 m²`` more."""
    *batch, m, _ = shape
    stack = math.prod(batch)
    reduced = estimate_bytes(method, prec_name, shape, itemsize, plan)
    if plan == "lean" and method == "householder-recursive":
        # Q (m x m) beside the working copy and R, and the blocks of Q's formation over m
        # columns; at the end Q, the working copy and R with its zero rows (m x n)
        n = shape[-1]
        return max(reduced + stack * (m * m + LEAN_Q_BLOCK * m) * itemsize,
                   math.ceil(stack * (m * m + 2 * m * n) * itemsize
                             + _SLACK * stack * m * n * itemsize))
    # W Y^H (m x m), I and their difference, beside W and a unit-lower copy of Y
    return reduced + stack * 3 * m * m * itemsize


def least_bytes(method: str, prec_name: str, shape: tuple[int, ...], itemsize: int,
                complete: bool = False) -> int:
    """The smallest of :func:`estimate_bytes` over the plans (the lean plan's where
    ``method`` has one): what a call needs beyond its input at the least."""
    return min(estimate_bytes(method, prec_name, shape, itemsize, p, complete)
               for p in PLANS)


def _lean_bytes(prec_name: str, m: int, n: int, stack: int, itemsize: int) -> int:
    """The lean route's high-water mark beyond the input (docs/memory.md): the larger of
    factoring (the working copy, W of ``wk`` columns, the products of the update of the
    columns right of W's block or a leaf's panel copies, the engines' scratch) and
    forming Q (the working copy where Q is formed, R, ``W_j`` and the ``kb x n`` products
    of a block, the engines' scratch)."""
    k = min(m, n)
    nbytes = m * n * itemsize
    nb = leaf_width(k, MAX_CERTIFIED_LEAF_WIDTH, rows=m)
    wk = min(k, lean_width(k, nb))
    qb = lean_q_width(k, nb)
    chunk = -(-n // LEAN_PARTS)
    # the largest products (out rows, out columns, inner): the update right of W's block;
    # a chunk of Q's trailing update
    prods = ((wk, min(wk, k - wk), m), (m, chunk, qb))
    q_work = None
    if prec_name in ("fp16", "fp32-emulated", "auto"):
        per = 2 if prec_name == "fp16" else 6
        whole = max(per * kk * (r + c) + 8 * r * c for r, c, kk in prods)
        scratch = min(lean_split_cap(nbytes), whole)
        if prec_name != "auto":
            # Q's formation (tc-sgemm, or tc-fp16-splitb at fp16: 6 bytes an element of
            # an operand): the workspace the route holds for it in one block
            cap = lean_split_cap(nbytes)
            q_work = lean_q_workspace(m, qb, chunk, itemsize, cap,
                                      0 if prec_name == "fp16" else partials_limit(cap))
    elif prec_name == "fp64-emulated":
        whole = max(workspace_bytes(r, c, kk, _OZAKI_TERMS, _OZAKI_LIMBS) for r, c, kk in prods)
        scratch = min(lean_ozaki_cap(nbytes), whole)
    else:
        scratch = 0
    # the leaves' T (k x nb in all), kept for Q's formation; the spine's update in column
    # chunks of wk: C, its triangular update and a converted copy are wk x wk
    factoring = (m * n + k * min(nb, k) + m * wk
                 + max(_HALF_PRODUCTS * wk * min(wk, k - wk),
                       _LEAF_COPIES * m * min(nb, k))) * itemsize
    if prec_name == "fp16":  # W's block column rounded to fp16 once for its two products
        factoring += m * wk * 2
    # Q over the working copy, R, the T's, a copy of a block's vectors, the chunks' products
    forming_q = (m * n + k * n + k * min(nb, k) + m * qb + 2 * qb * chunk) * itemsize
    need = max(factoring, forming_q) + scratch
    if q_work is not None:  # Q, R and the T's beside the block held for the rest
        need = max(need, (m * n + k * n + k * min(nb, k)) * itemsize + q_work)
    return math.ceil(stack * need + _SLACK * nbytes)


def lean_split_cap(nbytes: int) -> int:
    """The fp16 engines' scratch cap on the lean plan."""
    return max(SPLIT_FLOOR, int(LEAN_SPLIT_FRACTION * nbytes))


def lean_ozaki_cap(nbytes: int) -> int:
    """The Ozaki engine's scratch cap on the lean plan."""
    return max(OZAKI_FLOOR, int(LEAN_OZAKI_FRACTION * nbytes))


def ozaki_cap(nbytes: int) -> int:
    """The Ozaki engine's scratch cap during QR of an input of ``nbytes`` bytes."""
    return max(OZAKI_FLOOR, int(OZAKI_FRACTION * nbytes))


def split_cap(nbytes: int) -> int:
    """The fp16 engines' scratch cap (operand splits and products of one product tile)
    during QR of an input of ``nbytes`` bytes."""
    return max(SPLIT_FLOOR, int(SPLIT_FRACTION * nbytes))


def plan_setting() -> str:
    """``MPQR_MEMORY_PLAN``: ``"off"`` (``0``, ``off``, ``false``, ``no``), ``"lean"`` or
    ``"fast"`` (forced), else ``"auto"``."""
    v = os.environ.get("MPQR_MEMORY_PLAN", "1").strip().lower()
    if v in ("0", "off", "false", "no"):
        return "off"
    return v if v in ("lean", "fast") else "auto"


def choose_plan(backend: Any, a: Any, method: str, prec_name: str,
                complete: bool = False, want_q: bool = True) -> str:
    """The plan of a QR call of ``a`` (:data:`PLANS`); raise
    :class:`~mpqr.DeviceMemoryError` where even the lean plan would not fit the device.

    On a device: ``"fast"`` where its estimate fits the free memory (whole products:
    the speed of a call with the plan off), else ``"tiled"`` where that fits, else
    ``"lean"``; the lean plan alone where it is about as fast as the fast one
    (:data:`LEAN_FIRST_MIN_N`, where Q is formed). On the host (free memory unknown)
    ``"tiled"``.
    ``MPQR_MEMORY_PLAN=lean`` or ``fast`` forces a plan (checked against the free memory
    all the same)."""
    setting = plan_setting()
    if setting == "off":
        return "off"
    free = backend.device_memory_free()
    shape = tuple(a.shape)
    itemsize = element_bytes(backend, a)
    if free is None:  # host memory: no estimate of what is free
        return "tiled" if setting == "auto" else setting
    plans = PLANS if setting == "auto" else (setting,)
    if setting == "auto" and lean_first(method, prec_name, shape, want_q):
        plans = ("lean",)
    # the input already lives on the device: what the call adds must fit what is free
    for plan in plans:
        need = estimate_bytes(method, prec_name, shape, itemsize, plan, complete)
        if need <= free:
            record_event("memory", f"qr: {plan} plan, {need:,} bytes beyond the input, "
                         f"{free:,} free", needed=need, free=free, method=method,
                         precision=prec_name, plan=plan)
            return plan
    raise memory_error(a, method, prec_name, need, free, itemsize, complete)


def lean_first(method: str, prec_name: str, shape: tuple[int, ...],
               want_q: bool = True) -> bool:
    """Whether a device call takes the lean plan before the fast one
    (:data:`LEAN_FIRST_MIN_N`): one matrix, the square/wide Householder route, Q formed
    (``mode="r"`` keeps the fast plan: fp64-emulated 8192^2 74 against 81 ms lean, 16384^2
    241 against 249, H200)."""
    least = LEAN_FIRST_MIN_N.get(prec_name)
    return (least is not None and want_q and method == "householder-recursive"
            and len(shape) == 2 and min(shape) >= least)


def memory_error(a: Any, method: str, prec_name: str, need: int, free: int, itemsize: int,
                 complete: bool = False) -> DeviceMemoryError:
    """The :class:`~mpqr.DeviceMemoryError` of a QR call of ``a`` that needs ``need``
    bytes beyond the input where ``free`` are free: what would fit, and the out-of-core
    call that would."""
    shape = tuple(a.shape)
    fits = [p for p in ("fp16", "fp32-emulated", "fp64-emulated")
            if p != prec_name
            and estimate_bytes(method, p, shape, itemsize, "lean", complete) <= free]
    hint = (f"precision={fits[0]!r} would fit" if fits else
            "no precision of this route fits")
    return DeviceMemoryError(
        f"mpqr.qr of a {' x '.join(map(str, shape))} {a.dtype} array at "
        f"precision={prec_name!r} ({method}) needs about {need:,} bytes of device memory "
        f"beyond the input and {free:,} are free; {hint}, or factor it out of core from "
        f"host memory: mpqr.qr(host_copy, memory_budget={free // 2:,}) (the budget in "
        "bytes of device memory the out-of-core route may use)",
        needed=need, free=free)


def out_of_memory(backend: Any, a: Any, method: str, prec_name: str, plan: str,
                  complete: bool = False) -> DeviceMemoryError:
    """A device's out-of-memory error inside a QR call whose plan's estimate fit, as a
    :class:`~mpqr.DeviceMemoryError` (the estimate, the memory free now)."""
    itemsize = element_bytes(backend, a)
    need = estimate_bytes(method, prec_name, tuple(a.shape), itemsize,
                          plan if plan in PLANS else "fast", complete)
    free = backend.device_memory_free() or 0
    return memory_error(a, method, prec_name, max(need, free + 1), free, itemsize, complete)


def check_fits(backend: Any, a: Any, method: str, prec_name: str,
               complete: bool = False, want_q: bool = True) -> str:
    """Raise :class:`~mpqr.DeviceMemoryError` if QR of ``a`` would not fit the device;
    else return its plan (:func:`choose_plan`)."""
    return choose_plan(backend, a, method, prec_name, complete, want_q)


@contextlib.contextmanager
def workspace_scope(backend: Any, a: Any, prec_name: str, method: str = "householder-recursive",
                    plan: str | None = None, complete: bool = False) -> Iterator[None]:
    """The engines' scratch caps of ``plan`` for QR of ``a`` (default
    :func:`choose_plan`): none on ``"fast"``, where the caller set ``workspace_limit`` or
    the plan is off; :func:`split_cap` and :func:`ozaki_cap` on ``"tiled"``; the lean
    caps and the lean route on ``"lean"``. The tiles re-split an operand each (16384^2
    float32 fp32-emulated: 8.9% slower with them, H200,
    ``python bench/probes/memory_gpu.py``), so a call that fits keeps whole products.
    The lean plan hands the pool's cached blocks back between its phases where the device
    is short of memory beside its estimate, or always where ``MPQR_MEMORY_PLAN=lean``
    forces it (:func:`~mpqr.qr.householder_recursive.lean_plan`)."""
    if plan is None:
        plan = choose_plan(backend, a, method, prec_name)
    opts = active_gemm_options()
    lean: Any = contextlib.nullcontext()
    if plan == "lean":
        need = None if plan_setting() == "lean" else estimate_bytes(
            method, prec_name, tuple(a.shape), element_bytes(backend, a), "lean", complete)
        lean = lean_plan(need)
    if plan in ("off", "fast") or (opts is not None and opts.workspace_limit is not None) \
            or prec_name not in ("fp64-emulated", "auto", "fp16", "fp32-emulated"):
        with lean:
            yield
        return
    itemsize = element_bytes(backend, a)
    nbytes = math.prod(a.shape) * itemsize
    if prec_name in ("fp16", "fp32-emulated"):
        cap = lean_split_cap(nbytes) if plan == "lean" else split_cap(nbytes)
    else:
        cap = min(lean_ozaki_cap(nbytes) if plan == "lean" else ozaki_cap(nbytes),
                  backend.ozaki_workspace_limit())
    with gemm_options(opts, workspace_limit=cap), lean:
        yield


def element_bytes(backend: Any, a: Any) -> int:
    """Bytes of one element of ``a`` (any array API namespace's dtype)."""
    size = getattr(a.dtype, "itemsize", None)
    if size:
        return int(size)
    xp = backend.xp
    info = xp.finfo(a.dtype)
    return int(info.bits) // 8 * (2 if xp.isdtype(a.dtype, "complex floating") else 1)
