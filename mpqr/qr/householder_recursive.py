"""Recursive Householder QR in compact WY form (Leng et al., Algorithm 1).

``qr(A) -> (W, Y, R)`` with ``A = (I - W Y^H) [R; 0]``: split the columns in
halves, factor the left half, apply ``(I - W1 Y1^H)^H`` to the right half,
factor it, and merge ``W = [W1 | W2 - W1 (Y1^H W2)]``. At the leaf width the
leaf is factored at the working precision: for one real matrix, where the driver can
factor it again (:func:`~mpqr.qr._kernels.certified_route`), in certified 32-column
panels (:func:`~mpqr.qr.panel_blocked.certified_leaf`: CholQR2 with float64 Gram matrices
and the reconstruction of the reflectors, checked once at the end, when a failed check
raises :class:`~mpqr.qr._kernels.UncertifiedPanels`), by halves as here down to single
panels where the leaf's W is read later, else left to right; otherwise by
:func:`~mpqr.qr._kernels.householder_panel` (``geqrf`` in compact WY form, or TSQR for
very tall-skinny panels). The update and merge GEMMs have inner dimension ``m`` and outer
dimensions of half the current width — large and square where the tiled
variant's are ``nb`` thin — which is what tensor-core engines need. The
product with the triangular top of ``Y`` uses a shallow TRMM split (a few
large GEMMs rather than many small ones).

The leaf width grows with ``n`` (:func:`leaf_width`) so that the tree has at
most :data:`MAX_LEAVES` leaves: each leaf costs a fixed number of launches,
and a large matrix would otherwise spend its time launching small kernels. Certified
leaves of few rows widen further (:data:`FEW_LEAVES`), their rank-32 updates being cheap.
W's merge is skipped where no later step reads it (``mode="r"``), and on the right spine
(the root and its right child: their W only Q and their parents' merges read) it is
folded into Q's formation (:data:`FOLD_SPINE`): ``W2 -= W1 D`` never runs; Q's
``W1 U12`` product reads ``U12 - D U22`` instead.
W, Y and the R/work matrix are allocated once and filled in place.

Halves all the way up cost products a QR does not need (each half's W updates every row
below its first, W is merged across the whole width, Q is formed from that W): about
3.7 n^3 for a square matrix against the 2.7 n^3 of LAPACK's ``geqrf`` and ``orgqr``. So
on the fast plan the spine of a near-square input goes in blocks (:data:`SPINE_BLOCK`,
Elmroth and Gustavson's hybrid): each block factored by the halves above, its W applied
to the columns right of it, and Q formed from the blocks' W's backward
(:func:`_form_q_blocked`), no merge across blocks: 2.8-2.9 n^3.

At ``precision="fp16"`` (:func:`fp16_scheme`) rounding every operand of every
product to fp16 costs about ``2.3 u16`` of backward error at ``n = 1024``, most of it
because rounding W makes the applied block reflector non-orthogonal. Instead the
Householder vectors are rounded to fp16 *once*, at the leaf, and ``T`` is rebuilt
from the rounded vectors (:func:`round_reflectors_fp16`), so ``I - Ŷ T̂ Ŷ^T`` is
orthogonal in working precision. ``Ŷ`` is kept as a float16 array of its own (explicit
unit diagonal, zeros above): the products read it as it is (no conversion pass, no swap
of R's triangle out of the way, and no TRMM split: ``C -= Y1 C'`` is one GEMM over the
stored zeros with the subtraction in its epilogue), at a quarter of the working copy's
bytes for float32 input; where the spine goes in blocks, for the current block only, and
rounded again from Y (which the working copy keeps) when Q's formation reads a block's
vectors. The products then run on plain ``tc-fp16`` (one FP16
GEMM each; :data:`FP16_SCHEME`): backward error 1.3-1.7 ``u16`` and orthogonality
``<= 4 u16 / sqrt(n)`` from 1024^2 to 32768^2, inside the TC-QR table's ``1e-3`` and
``2e-4``. Keeping the other operand of every product with ``Ŷ`` to 22 bits
(``tc-fp16-splitb``) and the products of W on ``tc-sgemm`` (scheme ``vectors-exact``)
brings the backward error down to ``0.35 u16`` for 2.4x the tensor-core flops: slower
than ``fp32-emulated``'s QR relative to what it buys, so not the default
(docs/precision.md).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

from mpqr._array_api import device
from mpqr.backends._base import compact_wy_t
from mpqr.engines.prepared import Prepared, prepare, shared_hi
from mpqr.engines.tc_fp16 import fp16_operand
from mpqr.engines.tc_sgemm import BATCHED_PARTIALS_BYTES, partials_limit
from mpqr.policy import (
    active_gemm_options,
    gemm,
    gemm_add,
    gemm_into,
    gemm_options,
    gemm_sub,
    prepare_operand,
    record_event,
)
from mpqr.qr._kernels import (
    CERTIFIED_PANEL_MAX_N,
    TRMM_CUTOFF,
    UncertifiedPanels,
    certificate_failed,
    certified_route,
    ct,
    householder_panel,
    is_complex,
    panel_precision,
    trmm_lower,
    unit_lower,
)
from mpqr.qr.panel_blocked import certified_leaf, leaf_combines_w, left_half

__all__ = [
    "CERTIFIED_LEAF_ELEMENTS",
    "EXACT_FP16",
    "FEW_LEAVES",
    "FOLD_SPINE",
    "FORMQ_MAX_BLOCK",
    "FP16_SCHEME",
    "FP16_SCHEMES",
    "LEAN_CACHED_SHARE",
    "LEAN_PARTS",
    "LEAN_Q_BLOCK",
    "LEAN_RESERVE",
    "LEAN_RESERVE_MIN_ELEMENTS",
    "MAX_CERTIFIED_LEAF_WIDTH",
    "MAX_LEAF_WIDTH",
    "MAX_LEAVES",
    "PREPARED_OPERANDS",
    "RECURSION_CUTOFF",
    "SHARED_HI",
    "SPINE_BLOCK",
    "SPINE_BLOCKS",
    "SPINE_CHUNKS",
    "SPINE_FP16",
    "SPINE_MAX_ASPECT",
    "SPINE_RESERVE",
    "SPINE_STRETCH",
    "SPLIT_FP16",
    "STRETCH_MIN_ROWS",
    "STRETCH_UNIT",
    "WHB_SHIFTS_IN_PRODUCT",
    "formq_block",
    "fp16_products",
    "fp16_scheme",
    "householder_recursive",
    "leaf_width",
    "lean_active",
    "lean_need",
    "lean_plan",
    "lean_q_width",
    "lean_q_workspace",
    "lean_reserves",
    "lean_width",
    "round_reflectors_fp16",
    "rounded_wy",
    "spine_block",
    "spine_reserve",
    "spine_scratch",
    "spine_stretch",
]

#: Narrowest leaf (Leng et al. use 32-wide tiles).
RECURSION_CUTOFF = 32
#: Widest leaf. cuSOLVER's ``geqrf`` costs about the same per column at any panel
#: width (16384^2 on an H100: 177-189 ms for all leaves at widths 128-1024), while
#: every leaf adds ~10 policy GEMMs of fixed host cost: 16384^2 fp16 took 906/527/371 ms
#: at widths 128/256/512, and 361 ms at 1024, where fp64-emulated slowed (509 -> 656 ms).
MAX_LEAF_WIDTH = 512
#: Widest leaf in certified panels (:func:`~mpqr.qr.panel_blocked.certified_leaf`), where a
#: leaf costs its panels' kernels rather than ``geqrf``'s per-column latency. H100, one
#: process, seconds at 16384^2 / 32768^2 for leaves geqrf-512, geqrf-1024, certified-1024,
#: certified-2048: fp16 0.434/0.376/0.331/0.314 and 1.63/1.59/1.33/1.35, fp32-emulated
#: 0.443/0.406/0.404/0.352 and 1.86/1.81/1.58/1.60, fp64-emulated 0.536/0.537/0.461/0.486
#: and 2.86/2.87/2.62/2.69 (``python3 bench/probes/square_panels.py OUT qr 16384 32768``).
MAX_CERTIFIED_LEAF_WIDTH = 1024
#: The leaf width doubles (up to :data:`MAX_LEAF_WIDTH`) until ``n / nb <= MAX_LEAVES``
#: (8192^2 fp16 on an H100: 988/428/140 ms with 128/32/16 leaves).
MAX_LEAVES = 16
#: Certified leaves widen further, to at most :data:`FEW_LEAVES` leaves, while a leaf's
#: block (rows x width) stays within :data:`CERTIFIED_LEAF_ELEMENTS`: a leaf's rank-32
#: updates grow with its rows, its fixed launches and host steps do not. H200, eager
#: calls, 16 against 8 leaves (ms): 8192^2 fp16 63.7 / 39.7, fp32-emulated 125-187 /
#: 80-117, fp64-emulated 103 / 77; 16384 x 8192 fp32-emulated 140 / 96; 65536 x 8192
#: fp16 162 / 173, where the leaves' rows make them dearer
#: (``python bench/probes/flag_ab.py OUT mpqr.qr.householder_recursive.MAX_LEAVES=16,8``)
FEW_LEAVES = 8
CERTIFIED_LEAF_ELEMENTS = 2**24
#: The TRMM split stops at a quarter of the triangle: 7 GEMMs instead of ``2 k / 64``,
#: for 12.5 % more flops on the triangular part.
TRMM_DEPTH_FRACTION = 4
#: Q's formation (``W Y1^H``) splits ``Y1``'s triangle down to ``n / TRMM_DEPTH_FRACTION``
#: columns, at most this many: each diagonal block is one GEMM over its triangle's zeros
#: (half its flops wasted). H200, fp32-emulated, blocks of n/4 / n/8 / n/16 alternated,
#: medians of 12 (ms): 32768^2 1002 / 988 / 985, 16384^2 189.3 / 188.1 / 188.8, 65536 x
#: 8192 234.9 / 237.8 / 243.9 (blocks of 1024 and 512: short products), fp64-emulated
#: 16384^2 340.2 / 341.7 / 346.9 (``python3 bench/probes/flag_ab.py OUT
#: mpqr.qr.householder_recursive.FORMQ_MAX_BLOCK=8192,4096,2048 --cases 32768:fp32-emulated``
#: and the same three widths a shape)
FORMQ_MAX_BLOCK = 4096
#: ``Y1 C`` is one GEMM over all rows (the zeros above Y1's diagonal included)
#: when Y1 has at least this many rows per column: at most 1/16 of its flops wasted.
TRIANGLE_AS_GEMM = 8
#: The lean plan (docs/memory.md) stores W for about ``k / LEAN_PARTS`` columns at a time
#: (the recursion's unmerged spine then takes left blocks of that width)
LEAN_PARTS = 4
#: Q's backward formation in the lean plan: column blocks of at most this width (narrower
#: leaves merged into one block). On the lean plan at 1024 against 512: 16384^2 float32
#: fp32-emulated 333 against 587 ms, float64 fp64-emulated 366 against 397; at 2048 no
#: faster (H200, ``python bench/probes/ktiles.py``)
LEAN_Q_BLOCK = 1024
#: The fast plan's trailing update and merge read one preparation of ``W1`` (its fp16
#: parts, :mod:`mpqr.engines.prepared`): ``W1^H B`` with the engine's own bits and
#: ``W2 -= W1 D`` with ``W1``'s shifts moved onto ``D`` (the same bound), where the policy
#: gives both to an engine that splits its operands (``tc-sgemm``, ``tc-fp16``)
PREPARED_OPERANDS = True
#: The recursion's right spine (the nodes whose ``W`` only Q's formation and their parents'
#: merges read): its first this many nodes keep ``W = [W1 | W2]`` unmerged with their
#: ``D = Y1^H W2``, and Q's formation takes the merge ``W2 -= W1 D`` (an ``m x k1 x k2``
#: product, the root's alone an eighth of a square QR's products) as ``U12 - D U22``
#: (``k1 x k2 x k2``). H200, fp32-emulated, 0 / 1 / 2 / 4 nodes alternated in one
#: process, medians (ms): 32768^2 1121 / 1055 / 1061 / 1056, 65536 x 8192 272 / 260 / 259 /
#: 260, 16384^2 fastest calls 205 / 196 / 197 / 195
#: (``python3 bench/probes/flag_ab.py OUT mpqr.qr.householder_recursive.FOLD_SPINE=0,1,2,4``)
FOLD_SPINE = 2
#: Q's formation in the lean plan hands the memory pool's cached blocks back before a
#: block once they pass this share of Q's bytes
LEAN_CACHED_SHARE = 0.02
#: The fp16 scheme's ``W1^T B``: W1's column shifts (its fp16 copy's, kept for the merge)
#: undone in the product's own unscaling, W1^T given as a prepared operand, rather than
#: in a pass over the product afterwards (the same bits)
WHB_SHIFTS_IN_PRODUCT = True
#: The lean plan with memory to spare (its cached blocks kept) takes its estimate as one
#: block of the pool at its start for inputs of at most 2 rows a column and more than
#: LEAN_RESERVE_MIN_ELEMENTS: their Q formation's temporaries, growing block after block,
#: otherwise leave blocks beside blocks. H200, float64 fp64-emulated, pool growth without /
#: with (times within 0.5%): 10240^2 3.50x / 2.95x, 12288^2 3.15x / 2.91x, 16384^2 3.45x /
#: 2.86x, 20480^2 3.62x / 2.83x; where the plan fragments less than its estimate's
#: headroom the block costs more: 8192^2 2.77x / 3.01x, 65536 x 8192 1.92x / 2.21x
#: (``python3 bench/probes/lean_reserve.py OUT.json``)
LEAN_RESERVE = True
LEAN_RESERVE_MIN_ELEMENTS = 2**26
#: The fast plan's spine in blocks (Elmroth and Gustavson's hybrid; None: halves all the
#: way down) of ``max(SPINE_BLOCK, n / SPINE_BLOCKS)`` columns, for inputs of at most
#: ``SPINE_MAX_ASPECT`` rows a column: the recursion by halves factors each block, whose W
#: updates the columns right of it, and Q is formed from the blocks' W's backward, as
#: LAPACK's ``orgqr`` does. No W is merged across blocks and no update reaches rows above
#: its block: a square QR's products fall from 3.7 n^3 to 2.8-2.9 n^3. H200, float32
#: fp32-emulated, halves / blocks of 1024 / 2048 / 4096 (ms): 32768^2 982 / - / 866 / 842,
#: 16384^2 189 / 177 / 168 / 171, 8192^2 49.7 / 46.7 / 46.1 / -, 65536 x 8192 232 / 246 /
#: 236 / - (``python3 bench/probes/flag_ab.py OUT
#: mpqr.qr.householder_recursive.SPINE_BLOCK=None,1024,2048,4096 --cases ...``)
SPINE_BLOCK: int | None = 2048
SPINE_BLOCKS = 8
#: At 8 rows a column the blocks cost a little time for less memory: 65536 x 8192
#: fp32-emulated 235.1 -> 238.0 ms, the pool's growth 4.69x -> 3.67x the input (live
#: 3.60x -> 2.78x), backward error 1.32e-6 -> 9.2e-7 (H200, ``flag_ab.py OUT
#: mpqr.qr.householder_recursive.SPINE_MAX_ASPECT=2,8``, ``spine_memory.py``)
SPINE_MAX_ASPECT = 8
#: The spine's updates and Q's backward formation run in this many column chunks of the
#: input (each chunk's operand parts are the call's largest temporary). H200, fp32-emulated,
#: 2 / 4 chunks: 16384^2 169.1 / 177.1 ms, pool 2.88x / 3.07x (live 2.77x / 2.46x), 32768^2
#: 863 / 892 ms, pool 3.50x / 2.47x; 8 chunks 188 against 169 ms at 16384^2 in an earlier
#: run (``flag_ab.py OUT mpqr.qr.householder_recursive.SPINE_CHUNKS=2,4,8``,
#: ``spine_memory.py``)
SPINE_CHUNKS = 2
#: The fp16 scheme's spine in blocks too: each block's rounded vectors in an array of the
#: block's size (rounded again for Q's formation) rather than all of them beside W. H200,
#: float32, halves / blocks: 16384^2 110.3 / 101.8 ms, 32768^2 485 / 417, 65536 x 8192
#: 139.8 / 137.3, 8192^2 32.9 / 32.7, backward errors 8.3e-4 / 7.2e-4 at 16384^2; the pool's
#: growth 4.59x -> 2.72x the input at 16384^2 (``python3 bench/probes/flag_ab.py OUT
#: mpqr.qr.householder_recursive.SPINE_FP16=False,True --cases 16384:fp16,...``)
SPINE_FP16 = True
#: The fast plan's spine takes one block of the memory pool for its temporaries first
#: (``backend.reserve_scratch``), this multiple of :func:`spine_scratch` by precision
#: (float32 input; a precision not named: none; at least a taller input's R, which is
#: copied out at the end): they are split from it and merge back, where blocks of each
#: size would otherwise sit beside each other. H200, the pool's growth in one call, none /
#: the multiples: fp16 16384^2 2.66x / 2.44x, 32768^2 2.67 / 2.44, 65536 x 8192 2.83 / 2.52
#: (``python3 bench/probes/live_peak.py OUT CASES --set
#: "mpqr.qr.householder_recursive.SPINE_RESERVE={...}"``); fp32-emulated with its products
#: in stretches (:data:`SPINE_STRETCH`) at 1.0 / 1.25 / 1.5: 16384^2 2.30 / 2.37 / 2.45,
#: 32768^2 2.42 / 2.44 / 2.40, 65536 x 8192 2.38 / 2.59 / 2.56
SPINE_RESERVE: dict[str, float] = {"fp16": 1.0, "fp32-emulated": 1.0}
#: The spine's updates and Q's backward formation at these precisions run each chunk's
#: products in stretches of rows, no stretch's split operands (or float32 product) above
#: this share of the input's elements: ``W^H B`` along B's rows (the stretches' products
#: added into one), ``B -= Y C`` along the rows of B and Y (C's parts prepared once), Q's
#: diagonal blocks along W's rows. The engines' temporaries then no longer scale with the
#: chunk (a chunk's split operands and the update's product were half the input each). A
#: precision not named: whole chunks. H200, fp32-emulated, whole / 0.125 (the reserved
#: block at 1.1 / 1.0 of its estimate): 16384^2 167.6 / 171.5 ms, the pool's growth 2.84x /
#: 2.30x the input; 32768^2 840.9 / 854.0 ms, 2.84x / 2.42x; 65536 x 8192 238.5 / 241.3
#: ms, 2.87x / 2.38x; 8192^2 45.9 / 46.6 ms, backward errors no larger
#: (``python3 bench/probes/flag_ab.py OUT
#: "mpqr.qr.householder_recursive.SPINE_STRETCH=[{}, {'fp32-emulated': 0.125}]"``,
#: ``live_peak.py``); 0.25: 2.43x at 16384^2 and 32768^2, 2.56x at 65536 x 8192
SPINE_STRETCH: dict[str, float] = {"fp32-emulated": 0.125}
#: The QR's ``tc-sgemm`` operands keep one fp16 copy of their high part
#: (:func:`mpqr.engines.prepared.shared_hi`): a third fewer bytes of parts, the same bits
#: for finite data; a non-finite input gives non-finite factors either way. H200,
#: fp32-emulated, off / on: 16384^2 169.1 / 168.5 ms, pool 3.41x / 3.06x the input (live
#: 3.25x / 2.93x), 32768^2 848 / 856 ms, 65536 x 8192 235.5 / 235.8 ms, the same bits
#: (``flag_ab.py OUT mpqr.qr.householder_recursive.SHARED_HI=False,True``)
SHARED_HI = True
_LEAN: ContextVar[tuple[int | None] | None] = ContextVar("mpqr_lean_qr", default=None)


def lean_active() -> bool:
    """Whether the lean plan is in force (:func:`lean_plan`)."""
    return _LEAN.get() is not None


def lean_need() -> int | None:
    """The lean plan's estimate of the call's bytes (:func:`lean_plan`), or None."""
    got = _LEAN.get()
    return None if got is None else got[0]


@contextlib.contextmanager
def lean_plan(need: int | None = None) -> Iterator[None]:
    """Run the Householder QRs of this block on the lean plan: W a block column, Q formed
    over the working copy (docs/memory.md); for a call that would not fit otherwise.

    ``need``: the call's estimated bytes beyond its input. The memory pool's cached blocks
    are handed back between the plan's phases only where the device is short of memory
    beside that many bytes (``backend.release_cached_memory(need=...)``); None (the plan
    forced by ``MPQR_MEMORY_PLAN=lean``): always."""
    token = _LEAN.set((need,))
    try:
        yield
    finally:
        _LEAN.reset(token)


def lean_reserves(m: int, n: int, need: int | None) -> bool:
    """Whether the lean plan of an ``m x n`` input, its estimate ``need`` bytes, takes that
    as one block of the pool at its start (:data:`LEAN_RESERVE`)."""
    return (LEAN_RESERVE and need is not None and m <= 2 * n
            and m * n > LEAN_RESERVE_MIN_ELEMENTS)


def spine_block(m: int, n: int, nb: int) -> int | None:
    """The block width of the fast plan's spine (:data:`SPINE_BLOCK`, a multiple of the
    leaf width ``nb``) for ``m x n`` inputs, or None where the spine goes by halves (two
    blocks or fewer, or more than :data:`SPINE_MAX_ASPECT` rows a column)."""
    if SPINE_BLOCK is None or m > SPINE_MAX_ASPECT * n:
        return None
    b = max(nb, max(SPINE_BLOCK, n // SPINE_BLOCKS) // nb * nb)
    return b if n > 2 * b else None


def spine_scratch(m: int, n: int, sb: int, *, fp16: bool, stretch: int | None = None) -> int:
    """Bytes of the fast plan's spine temporaries at their largest, for a float32 ``m x n``
    input in blocks of ``sb`` columns: the first block's update of a column chunk of
    ``ceil(n / SPINE_CHUNKS)`` (Q's backward formation reads operands of the same sizes).
    ``fp16``: the chunk and the block's W as fp16, the block's rounded vectors and the
    product ``W^T B`` in float32; else (``tc-sgemm``, one fp16 copy of the high part) the
    update's float32 product ``Y C``, the parts of ``Y``, ``C = W^T B`` with its parts and
    R's triangle set aside (or the chunk's parts, W's and the slices' partials before).
    ``stretch`` (:func:`spine_stretch`): the products in stretches of rows, each splitting
    at most that many elements (or :data:`STRETCH_MIN_ROWS` rows): a stretch's parts (and,
    for ``Y C``, its product) beside ``C``, its parts or a stretch's share of it, and the
    larger of the partials and R's triangle; or, where that is more, a block's own first
    update by halves over all its rows (``W1``'s parts, ``Y``'s and their product)."""
    w = -(-n // SPINE_CHUNKS)
    if fp16:
        return 2 * m * w + 4 * m * sb + 4 * sb * w
    if stretch is not None:
        part = min(m * (w + sb), max(stretch, STRETCH_MIN_ROWS * (w + sb)))
        # or a block's own first update (halves of sb / 2 over all the rows): W1's parts,
        # kept for the merge, beside Y's and the product
        return max(4 * part + 8 * sb * w + max(BATCHED_PARTIALS_BYTES, 4 * sb * sb),
                   6 * m * sb)
    return max(4 * m * w + 4 * m * sb + 8 * sb * w + 4 * sb * sb,
               4 * m * w + 4 * m * sb + 4 * sb * w + BATCHED_PARTIALS_BYTES)


#: a stretch's rows in whole multiples of this (``tc-sgemm``'s longest k-slice: a
#: stretch of the inner dimension keeps the engine's slices whole)
STRETCH_UNIT = 1024
#: the fewest rows of a stretch: shorter ones cost more in launches and passes over the
#: product than they save (H200, fp32-emulated 8192^2, stretches of 1024 rows: +3-7 %;
#: ``flag_ab.py OUT "mpqr.qr.householder_recursive.SPINE_STRETCH=[{}, ...]"``)
STRETCH_MIN_ROWS = 4096


def spine_stretch(m: int, n: int, prec_name: str) -> int | None:
    """Elements of the input's ``m x n`` that a stretch of the spine's products may split
    (:data:`SPINE_STRETCH`) at ``prec_name``, or None for whole chunks."""
    share = SPINE_STRETCH.get(prec_name)
    return None if not share else max(1, int(share * m * n))


def _stretch_rows(budget: int | None, width: int, total: int) -> int:
    """Rows of a stretch whose ``width`` elements a row fit ``budget``: a whole multiple
    of :data:`STRETCH_UNIT`, at least :data:`STRETCH_MIN_ROWS`; ``total`` where there is
    no budget or one stretch holds them all."""
    if budget is None:
        return total
    rows = max(STRETCH_MIN_ROWS, budget // max(1, width) // STRETCH_UNIT * STRETCH_UNIT)
    return total if rows >= total else rows


def _product_in_stretches(a: Any, b: Any, rows: int, *, precision: Any, label: str,
                          options: Any, backend: Any) -> Any:
    """``a @ b`` with the inner dimension in stretches of ``rows``: each stretch's product
    added into the first's (the engines split a stretch's operands alone)."""
    k = a.shape[-1]
    c = gemm(a[..., :rows], b[..., :rows, :], precision=precision, label=label,
             options=options, backend=backend)
    for s0 in range(rows, k, rows):
        s1 = min(k, s0 + rows)
        gemm_add(c, a[..., s0:s1], b[..., s0:s1, :], precision=precision, label=label,
                 options=options, backend=backend)
    return c


def _sub_in_stretches(c: Any, a: Any, b: Any, rows: int, *, precision: Any, label: str,
                      options: Any, backend: Any) -> None:
    """``c -= a @ b`` in stretches of ``rows`` rows of ``c`` and ``a``, ``b``'s parts
    prepared once for all of them (each stretch's product as large as its rows only)."""
    m = a.shape[-2]
    if rows >= m:
        gemm_sub(c, a, b, precision=precision, label=label, options=options, backend=backend)
        return
    bp = prepare_operand(b, side="right", m=rows, n=b.shape[-1], k=b.shape[-2],
                         precision=precision, options=options, backend=backend)
    for r0 in range(0, m, rows):
        r1 = min(m, r0 + rows)
        gemm_sub(c[..., r0:r1, :], a[..., r0:r1, :], bp, precision=precision, label=label,
                 options=options, backend=backend)


def spine_reserve(m: int, n: int, sb: int, prec_name: str) -> int:
    """Bytes of the block the fast plan's spine takes from the memory pool first
    (:data:`SPINE_RESERVE`) for a float32 ``m x n`` input in blocks of ``sb`` columns at
    ``prec_name`` (the fp16 scheme at ``fp16``); 0 where it takes none. At least a taller
    input's R: copied out of the working copy at the end, beside Q, it is split from the
    same block rather than given one of its own."""
    factor = SPINE_RESERVE.get(prec_name)
    if not factor or prec_name not in ("fp16", "fp32-emulated"):
        return 0
    scratch = spine_scratch(m, n, sb, fp16=prec_name == "fp16",
                            stretch=spine_stretch(m, n, prec_name))
    return max(int(factor * scratch), 4 * n * n if m > n else 0)


def lean_width(n: int, nb: int) -> int:
    """Columns of W's storage in the lean plan for ``n`` columns and leaf width ``nb``."""
    panels = -(-n // nb)
    return nb * max(1, -(-panels // LEAN_PARTS))


#: The fp16 QR's schemes: name -> (engine of the products with the rounded vectors,
#: ``Ŷ X`` / ``Ŷ^T X``; engine of the products of W with data, ``W^T B`` / ``W D``).
#: ``rounded-vectors``: 1 FP16 GEMM each; ``vectors-exact``: the other operand of the
#: products with ``Ŷ`` kept to ~22 bits (2 FP16 GEMMs), W's on ``tc-sgemm`` (3).
FP16_SCHEMES = {
    "rounded-vectors": ({"engine": "tc-fp16"}, {"engine": "tc-fp16"}),
    "vectors-exact": ({"engine": "tc-fp16-splitb"}, {"engine": "tc-sgemm"}),
}
#: The scheme ``precision="fp16"`` runs: the cheapest that meets the TC-QR table (backward
#: <= 1e-3, orthogonality <= 2e-4). H200, float32 normal 16384^2 / 32768^2: 200 / 787 ms
#: against 252 / 1161 ms for ``vectors-exact``, backward 8.1e-4 / 8.3e-4 against 1.7e-4
#: (``python3 bench/probes/fp16_schemes.py OUT.json 1024 16384 32768``).
FP16_SCHEME = "rounded-vectors"
#: The engines of the leaves' products with the fp16 vectors (float32 working precision):
#: ``Ŷ^T Ŷ`` (exact products, float32 sums) and ``Ŷ T̂`` (:func:`rounded_wy`).
EXACT_FP16 = {"engine": "tc-fp16"}
SPLIT_FP16 = {"engine": "tc-fp16-splitb"}


def fp16_products() -> tuple[dict[str, str], dict[str, str]]:
    """The engine options of the fp16 QR's products with ``Ŷ`` and with ``W``
    (:data:`FP16_SCHEME`)."""
    return FP16_SCHEMES[FP16_SCHEME]


def fp16_scheme(prec_name: str, a: Any, xp: Any) -> bool:
    """Whether a Householder QR runs the fp16 scheme of the module docstring:
    ``precision="fp16"``, real input, and no engine forced by a
    :class:`mpqr.gemm_options` block (a forced engine runs every product as before)."""
    forced = active_gemm_options()
    return (prec_name == "fp16" and not is_complex(xp, a)
            and (forced is None or forced.engine is None))


def round_reflectors_fp16(backend: Any, w: Any, y: Any, *, precision: str,
                          tau: Any = None, out: Any = None) -> tuple[Any, Any]:
    """``(Ŷ, T̂)``: the Householder vectors ``Y`` rounded to fp16 numbers (in ``Y``'s
    dtype) and the upper-triangular ``T̂`` that makes ``I - Ŷ T̂ Ŷ^H`` orthogonal (to
    working precision). ``out`` (float16, ``Y``'s shape) receives ``Ŷ`` as float16 too.

    ``Y`` is read below its diagonal only (R may sit above: LAPACK's layout). Entries are
    rounded to nearest without scaling: Householder vectors in LAPACK's convention have
    ``|y_ij| <= 1`` (``|x_1 - beta| >= ||x||``), so none overflows, and one below fp16's
    normal range (``2^-14``) is off by at most ``2^-25``, far under ``u16`` against the
    vector's norm (at least 1). Scaled up by any power of two that keeps them below
    ``2^15``, fp16 numbers stay fp16 numbers: the engines' row and column scalings take
    ``Ŷ`` without rounding it again. ``T̂`` is the UT transform of ``Ŷ``:
    ``T̂^-1 = diag(1/τ) + striu(Ŷ^H Ŷ)`` with ``τ_i = 2 / ||ŷ_i||^2`` — the
    only ``τ`` for which the block reflector is orthogonal — except where ``τ_i = 0``
    (``H_i = I``: LAPACK's reflector of a column that is already zero below the
    diagonal), recognised by a zero column of ``W = Y T`` (of its top ``k x k``
    block, which is the unit lower top of ``Y`` times ``T``) or, with ``w=None``, by
    the unrounded reflectors' ``tau``. ``Ŷ^H Ŷ`` runs at
    ``precision`` (the panel's working precision; for float32 ``Y`` on the fp16 tensor
    cores, whose float32 sums of exact products are a float32 GEMM's). Returns ``Ŷ`` as
    ``out`` (float16) where given, else in ``Y``'s dtype.
    """
    xp = backend.xp
    y16 = xp.empty(y.shape, dtype=xp.float16, device=device(y)) if out is None else out
    backend.unit_lower_fp16(y, y16)
    yh = xp.astype(y16, y.dtype) if out is None else y16
    k = y.shape[-1]
    if y.dtype == xp.float32:
        # products of fp16 numbers are exact in float32, and the tensor cores sum them in
        # float32: the float32 GEMM's Gram matrix, from the fp16 operands as they are
        g = gemm(ct(xp, y16), y16, precision=precision, label="panel-YhY",
                 options=EXACT_FP16, backend=backend)
    else:
        yw = xp.astype(y16, y.dtype) if out is not None else yh
        g = gemm(ct(xp, yw), yw, precision=precision, label="panel-YhY", backend=backend)
    d = xp.linalg.diagonal(g)
    # W = Y T with Y's top k x k block unit lower (nonsingular): column i of T is
    # zero iff column i of W's top block is (k rows: no reduction over all m rows);
    # or from the reflectors' tau where the caller has them (W is then None)
    nontrivial = tau != 0 if w is None else xp.any(w[..., :k, :] != 0, axis=-2)
    tau = xp.where(nontrivial, 2.0 / xp.where(nontrivial, d, xp.ones_like(d)),
                   xp.zeros_like(d))
    eye = xp.eye(k, dtype=y.dtype, device=device(y))
    lhs = eye + xp.expand_dims(tau, axis=-1) * xp.triu(g, k=1)
    t = backend.solve_triangular(lhs, eye * xp.expand_dims(tau, axis=-2), lower=False,
                                 unit_diagonal=True)
    return yh, t


def rounded_wy(backend: Any, out: Any, y16: Any, t: Any, *, precision: str) -> None:
    """``out[...] = Ŷ T̂`` for the float16 ``Ŷ`` of :func:`round_reflectors_fp16`. For
    float32 ``T̂`` on ``tc-fp16-splitb``: ``Ŷ`` as it is and ``T̂`` to about 22 bits, an
    error ``2^-22 |Ŷ||T̂|`` well inside the float32 GEMM's own ``k u32 |Ŷ||T̂|``, at 2x the
    products of a single FP16 GEMM instead of a float32 GEMM's rate."""
    xp = backend.xp
    if t.dtype == xp.float32:
        gemm_into(out, y16, t, precision=precision, label="panel-wy-rounded",
                  options=SPLIT_FP16, backend=backend)
    else:
        gemm_into(out, xp.astype(y16, t.dtype), t, precision=precision,
                  label="panel-wy-rounded", backend=backend)


def leaf_width(n: int, cap: int | None = None, rows: int | None = None) -> int:
    """Leaf width for ``n`` columns: a power of two times :data:`RECURSION_CUTOFF`,
    the smallest with at most :data:`MAX_LEAVES` leaves, capped at ``cap`` (default
    :data:`MAX_LEAF_WIDTH`; :data:`MAX_CERTIFIED_LEAF_WIDTH` for certified panels).
    With ``rows`` (certified leaves), doubled further towards :data:`FEW_LEAVES` leaves
    while a leaf of ``rows x nb`` stays within :data:`CERTIFIED_LEAF_ELEMENTS`."""
    cap = MAX_LEAF_WIDTH if cap is None else cap
    nb = RECURSION_CUTOFF
    while nb < cap and n > MAX_LEAVES * nb:
        nb *= 2
    if rows is not None:
        while nb < cap and n > FEW_LEAVES * nb and rows * 2 * nb <= CERTIFIED_LEAF_ELEMENTS:
            nb *= 2
    return nb


def formq_block(n: int) -> int:
    """The width of the diagonal blocks of Q's formation for ``n`` columns
    (:data:`FORMQ_MAX_BLOCK`)."""
    return max(TRMM_CUTOFF, min(n // TRMM_DEPTH_FRACTION, FORMQ_MAX_BLOCK))


def _trmm(l: Any, b: Any, *, precision: Any, label: str, backend: Any) -> Any:
    # l: unit lower, stored below R in the working array (diagonal and above not read)
    cutoff = max(TRMM_CUTOFF, l.shape[-1] // TRMM_DEPTH_FRACTION)
    return trmm_lower(l, b, precision=precision, label=label, backend=backend, cutoff=cutoff,
                      unit_implicit=True)


def householder_recursive(backend: Any, a: Any, *, precision: Any, prec_name: str,
                          want_q: bool = True, complete: bool = False,
                          nb: int | None = None, overwrite: bool = False
                          ) -> tuple[Any | None, Any]:
    """Householder QR of ``(..., m, n)`` with ``m >= n``; see the module docstring.

    ``nb`` is the leaf width (default :func:`leaf_width`). Returns ``(Q, R)``
    before sign normalisation (Q is None unless ``want_q``).
    The ``tc-sgemm`` products keep one fp16 copy of each operand's high part
    (:data:`SHARED_HI`).

    Storage is LAPACK's: the working copy holds R on and above its diagonal and the
    Householder vectors Y (unit diagonal implied) below it; W has an array of its own,
    and the reduced Q is formed in W's storage. A square input's R is the working copy
    itself (its lower triangle zeroed in place once no step reads Y), so the reduced
    factors are the only arrays of the input's size left; the other workspace is
    bounded by the memory plan (docs/memory.md).
    """
    with shared_hi(SHARED_HI):
        return _factor(backend, a, precision=precision, prec_name=prec_name, want_q=want_q,
                       complete=complete, nb=nb, overwrite=overwrite)


def _factor(backend: Any, a: Any, *, precision: Any, prec_name: str, want_q: bool,
            complete: bool, nb: int | None, overwrite: bool) -> tuple[Any | None, Any]:
    xp = backend.xp
    *batch, m, n = a.shape
    dev = device(a)
    pp = panel_precision(prec_name, a.dtype, xp)
    f16 = fp16_scheme(prec_name, a, xp)
    # engines of the products with the (rounded) vectors and with W (module docstring)
    opt_y, opt_w = fp16_products() if f16 else (None, None)
    # the products of W on plain tc-fp16: W1's fp16 copy serves two of them
    w16 = f16 and opt_w.get("engine") == "tc-fp16"

    def y_ctx() -> Any:  # for the TRMMs, whose GEMMs take no options argument
        return gemm_options(**opt_y) if f16 else contextlib.nullcontext()

    cert = certified_route(backend, a)
    if nb is None:
        nb = (leaf_width(n, MAX_CERTIFIED_LEAF_WIDTH, rows=m) if cert is not None
              else leaf_width(n))
    if cert is not None:
        record_event("panel", f"householder-recursive: leaves of {nb} columns in "
                     f"{CERTIFIED_PANEL_MAX_N}-column panels by CholQR2 (float64 Gram) and "
                     "the reconstruction of their reflectors, checked once at the end "
                     "(geqrf panels if a check fails)", leaf=nb, panel=CERTIFIED_PANEL_MAX_N)
    # the lean plan (docs/memory.md): W a block column of about k/LEAN_PARTS, the leaves'
    # T kept, Q formed over the working copy after R is taken out
    lean = lean_active()
    need = lean_need()  # the plan's estimate: cached memory goes back only where short
    # fp16 on the fast plan: Ŷ in a float16 array of its own (explicit); on the lean plan
    # Ŷ replaces Y in the working copy (float32 numbers that are fp16 numbers)
    yx = f16 and not lean
    # the fast plan's spine in blocks (:data:`SPINE_BLOCK`): their W's form Q backward
    sb = None if (lean or complete or (f16 and not SPINE_FP16)) else spine_block(m, n, nb)
    qblocks: list[tuple[int, int]] = []  # the spine's blocks, left to right
    # elements a stretch of the spine's products splits (one real matrix), or None
    stretch = (spine_stretch(m, n, prec_name)
               if sb and not batch and not is_complex(xp, a) else None)
    work = a if overwrite else xp.asarray(a, copy=True)
    wk = lean_width(n, nb) if lean else n
    if lean:
        short = backend.release_cached_memory(need=need)
        reserve = short is False and lean_reserves(m, n, need)
        if reserve:
            # the estimate's other bytes as one block of the pool, from which the phases'
            # temporaries are split and into which they merge back (:data:`LEAN_RESERVE`)
            backend.reserve_workspace(need - math.prod(work.shape) * work.itemsize)
        pool = {True: "; the memory pool's cached blocks handed back between its phases "
                      "(the device is short of memory)",
                False: "; the memory pool's cached blocks kept (the device has room "
                       "beside the estimate)"}.get(short, "")
        if reserve:
            pool += f", the estimate ({need} bytes) taken as one block of the pool"
        record_event("memory", f"householder-recursive: lean plan (W {m} x {wk}, Q formed "
                     f"over the working copy){pool}", width=wk, handed_back=short)
    w_all = xp.zeros((*batch, m, wk), dtype=a.dtype, device=dev)
    # fp16: the rounded vectors as float16, explicit (zeros above: a diagonal block of Q's
    # formation may span leaves); the products with Y read these, not the working copy
    # (the spine in blocks: the current block's only, rows and columns from its first;
    # Q's formation rounds each block's vectors again from the working copy)
    yh_all = xp.zeros((*batch, m, n), dtype=xp.float16, device=dev) if yx and not sb else None
    ycur: list[Any] = [yh_all, 0]  # the rounded vectors' array and its first row and column
    # lean: each leaf's T by its first column (Q's formation reads them), stored in one
    # array taken before the factoring's workspace: kept T's carved out of the pool's
    # cached blocks would pin those blocks (a block is handed back only whole)
    ts: dict[int, tuple[int, Any]] = {}
    if (sb and not batch and getattr(a.dtype, "itemsize", 0) == 4
            and not is_complex(xp, a) and (yx or prec_name != "fp16")):
        reserve = spine_reserve(m, n, sb, prec_name)
        if reserve:
            backend.reserve_scratch(reserve)
    # the root's prepared W1, kept for the first product of Q's formation that reads it
    kept: dict[str, tuple[int, Any]] = {}
    t_all = xp.zeros((*batch, n, nb), dtype=a.dtype, device=dev) if lean and want_q else None

    def keep_t(c0: int, c1: int, t: Any) -> None:
        if t_all is None:  # no Q formed (mode "r")
            return
        t_all[..., c0:c1, :c1 - c0] = t
        ts[c0] = (c1, t_all[..., c0:c1, :c1 - c0])

    def wv(off: int, r0: int, c0: int, c1: int) -> Any:
        # W's rows r0: and columns c0:c1, stored from (off, off) on
        return w_all[..., r0 - off:m - off, c0 - off:c1 - off]

    def yv(r0: int, c0: int, c1: int) -> Any:
        # the rounded vectors' rows r0: of columns c0:c1 (float16, explicit)
        arr, b0 = ycur
        return arr[..., r0 - b0:, c0 - b0:c1 - b0]

    def begin_block(c0: int, k: int) -> None:
        # a block of the spine at fp16: its rounded vectors in an array of their own (the
        # previous block's are read by no later step of the factoring)
        if yx and sb:
            ycur[0] = None
            ycur[:] = [xp.zeros((*batch, m - c0, k), dtype=xp.float16, device=dev), c0]

    def lean_fp16(w: Any, y: Any, tau: Any, c0: int, c1: int, need_w: bool,
                  off: int) -> None:
        # the lean plan at fp16: Ŷ rounded (from W or tau) over Y in the working copy,
        # T̂ kept for Q's formation, Ŵ = Ŷ T̂ where the merges need W
        y16, t = round_reflectors_fp16(
            backend, w, y, precision=pp, tau=tau,
            out=xp.empty((*batch, m - c0, c1 - c0), dtype=xp.float16, device=dev))
        _store_vectors(xp, work, y16, c0, c1)
        keep_t(c0, c1, t)
        if need_w:
            rounded_wy(backend, wv(off, c0, c0, c1), y16, t, precision=pp)

    def leaf(c0: int, c1: int, need_w: bool, off: int) -> None:
        k = c1 - c0
        need_t = lean and want_q
        if lean and need_w and c0 > off:
            # W's storage is reused: its rows above the block are read by merges as zeros
            w_all[..., :c0 - off, c0 - off:c1 - off] = 0
        if cert is not None:
            # certified 32-column panels in place at the panel's precision (the
            # certificate is read once, at the end)
            # the leaf's W combined panel by panel where only W is read later (no T, no
            # rounded vectors): no Y^H Y, T and Y T of the whole leaf afterwards
            combine = need_w and not need_t and not f16 and leaf_combines_w(k, work.shape[-2] - c0)
            tau = certified_leaf(backend, work, w_all, c0, c1, cert=cert, precision=pp,
                                 woff=off, combine=combine)
            if not (need_w or need_t) or combine:
                return
            if yx:  # Ŷ into its float16 array; the working copy keeps the unrounded Y
                y16, t = round_reflectors_fp16(backend, None, work[..., c0:, c0:c1],
                                               precision=pp, tau=tau,
                                               out=yv(c0, c0, c1))
                rounded_wy(backend, wv(off, c0, c0, c1), y16, t, precision=pp)
                return
            if f16:  # lean: Ŷ over Y in the working copy
                lean_fp16(None, work[..., c0:, c0:c1], tau, c0, c1, need_w, off)
                return
            y = unit_lower(xp, work[..., c0:, c0:c1])
            t = compact_wy_t(backend, y, tau)
            if need_t:
                keep_t(c0, c1, t)
            if need_w:
                gemm_into(wv(off, c0, c0, c1), y, t, precision=pp, label="panel-wy",
                          backend=backend)
            return
        else:
            w, y, r = householder_panel(backend, work[..., c0:, c0:c1], precision=pp,
                                        need_w=need_w or need_t)
            work[..., c0:c1, c0:c1] = xp.triu(r) + xp.tril(y[..., :k, :], k=-1)
            work[..., c1:, c0:c1] = y[..., k:, :]
            if f16 and lean:  # Ŷ over Y in the working copy, T̂ kept, Ŵ = Ŷ T̂
                lean_fp16(w, y, None, c0, c1, need_w, off)
                return
            if need_t:  # W = Y T with Y's top block unit lower: T from W's top block
                keep_t(c0, c1, backend.solve_triangular(y[..., :k, :], w[..., :k, :],
                                                        lower=True, unit_diagonal=True))
            if f16 and need_w:  # Y and W are read later: round Y once, rebuild T and W
                y16, t = round_reflectors_fp16(backend, w, y, precision=pp,
                                               out=yv(c0, c0, c1))
                rounded_wy(backend, wv(off, c0, c0, c1), y16, t, precision=pp)
            elif need_w:
                wv(off, c0, c0, c1)[...] = w

    # the right spine's merges folded into Q's formation (:data:`FOLD_SPINE`): its first
    # FOLD_SPINE nodes wider than Q's formation's diagonal blocks (a narrower one would be
    # split there for the fold alone)
    fold_at = set()
    if want_q and not (lean or complete or f16 or sb):
        c = 0
        while len(fold_at) < FOLD_SPINE and n - c > max(nb, TRMM_CUTOFF,
                                                         formq_block(n)):
            fold_at.add(c)
            c += left_half(n - c, nb)  # rec's split
    folds: dict[int, tuple[int, Any]] = {}  # node's first column -> (its split, Y1^H W2)

    def _unfold(g: Any, lo: int) -> None:
        # g = X^H W[:, lo:] from W's stored (unmerged) right spine -> from the merged W:
        # the spine's folds from the innermost out, G2 <- G2 - G1 D
        chain = []
        c = lo
        while c in folds:
            chain.append((c, *folds[c]))
            c = folds[c][0]
        for c, cm, d in reversed(chain):
            gemm_sub(g[..., cm - lo:], g[..., c - lo:cm - lo], d, precision=precision,
                     label="rec-merge-fold", backend=backend)

    def rec(c0: int, c1: int, need_w: bool, off: int) -> None:
        # need_w: a later step reads this block's W (an update of the right
        # sibling, a parent's merge, or Q); W's block is stored from (off, off) on
        k = c1 - c0
        if sb and not need_w and k <= sb:
            # the spine's last block: its W forms its columns of Q
            if want_q:
                qblocks.append((c0, c1))
            begin_block(c0, k)
            need_w = want_q
        if k <= nb:
            leaf(c0, c1, need_w, off if need_w or not lean else c0)
            return
        k1 = left_half(k, nb)
        if lean and not need_w:
            k1 = min(k1, wk)  # lean: the left block no wider than W's storage
        spine = sb is not None and not need_w
        if spine:
            k1 = min(k1, sb)  # a block of the spine: its W updates the rest, then Q
            if want_q:
                qblocks.append((c0, c0 + k1))
            begin_block(c0, k1)
        cm = c0 + k1
        if lean and not need_w:
            off = c0  # no W of this block is read later: the left block's from its corner
        rec(c0, cm, True, off)
        # right half <- (I - W1 Y1^H)^H right half = B - Y1 (W1^H B); on the lean plan's
        # spine in column chunks of W's width, so that C and its triangular update stay
        # wk x wk (their k1 x (k - k1) whole were the factoring's largest workspace)
        w1 = wv(off, c0, c0, cm)
        w1h = s1 = None
        # (the spine's blocks: in SPINE_CHUNKS chunks of the input's columns, the engines'
        # scratch no larger than the halves' update's)
        step = wk if lean and not need_w else -(-n // SPINE_CHUNKS) if spine else c1 - cm
        # W1 prepared once for the update and the merge (fast plan; the lean plan keeps no
        # operand across the right half's recursion)
        w1p = None
        # (a folded spine node other than the root reads W1 in the update alone)
        # (fp16: on the spine only, where no merge reads W1's fp16 copy with its own shifts)
        if (PREPARED_OPERANDS and not lean and ((need_w and not f16) or (f16 and spine))
                and not is_complex(xp, a)
                and not (c0 in fold_at and c1 == n and c0 > 0)):
            w1p = prepare_operand(ct(xp, w1), side="left", m=k1, n=c1 - cm, k=m - c0,
                                  precision=precision, options=opt_w, backend=backend)
        # the spine's products in stretches of rows (:data:`SPINE_STRETCH`)
        budget = stretch if spine and w1p is None and not (w16 or yx) else None
        for j0 in range(cm, c1, step):
            j1 = min(c1, j0 + step)
            b = work[..., c0:, j0:j1]
            if need_w and w16 and w1.dtype != xp.float16 and WHB_SHIFTS_IN_PRODUCT:
                # W1 rounded to fp16 once, its columns scaled (the engine's own rounding of
                # W1^T's rows), for both products with it: C = S^-1 ((W1 S)^T B) here, S^-1
                # applied in the product's unscaling (W1^T with those rows' shifts), and
                # W2 -= (W1 S)(S^-1 D) in the merge (S = diag(2^s1): exact)
                w1s = prepare(backend, w1, side="right", engine="tc-fp16")
                s1, w1h = w1s.shift, w1s.hi
                c = gemm(w1s.T, b, precision=precision, label="rec-update-WhB",
                         options=opt_w, backend=backend)
            elif need_w and w16:
                # S^-1 in a pass of its own (a float16 W1 is taken at shift 0: S = I)
                s1, w1h = fp16_operand(backend, w1, -2)
                c = backend.ldexp(gemm(ct(xp, w1h), b, precision=precision,
                                       label="rec-update-WhB", options=opt_w, backend=backend),
                                  -ct(xp, s1))
            elif budget is not None:
                c = _product_in_stretches(
                    ct(xp, w1), b, _stretch_rows(budget, j1 - j0 + k1, m - c0),
                    precision=precision, label="rec-update-WhB", options=opt_w,
                    backend=backend)
            else:
                c = gemm(ct(xp, w1) if w1p is None else w1p, b, precision=precision,
                         label="rec-update-WhB", options=opt_w, backend=backend)
            if yx:
                # one GEMM over all of Y1 from the explicit fp16 vectors, at any share of the
                # triangle's zeros: C -= Y1 C' in the GEMM's epilogue, where the TRMM split
                # below would add half-size products and copies of them
                gemm_sub(work[..., c0:, j0:j1], yv(c0, c0, cm), c, precision=precision,
                         label="rec-update-YC", options=opt_y, backend=backend)
            elif TRIANGLE_AS_GEMM * k1 <= m - c0:
                # Y1's triangular top is a small share of its rows: one GEMM over all of Y1,
                # zeros included. R's triangle steps aside (a k1 x k1 copy) meanwhile, so
                # that C is converted once (two GEMMs would split it twice).
                r1 = xp.triu(work[..., c0:cm, c0:cm])
                work[..., c0:cm, c0:cm] = unit_lower(xp, work[..., c0:cm, c0:cm])
                # in place (one fused pass where the engine has one; a view where the
                # library has them)
                _sub_in_stretches(work[..., c0:, j0:j1], work[..., c0:, c0:cm], c,
                                  _stretch_rows(budget, j1 - j0 + k1, m - c0),
                                  precision=precision, label="rec-update-YC", options=opt_y,
                                  backend=backend)
                work[..., c0:cm, c0:cm] = r1 + xp.tril(work[..., c0:cm, c0:cm], k=-1)
                r1 = None
            else:
                with y_ctx():
                    upd = _trmm(work[..., c0:cm, c0:cm], c, precision=precision,
                                label="rec-update-trmm", backend=backend)
                work[..., c0:cm, j0:j1] -= upd
                upd = None
                _sub_in_stretches(work[..., cm:, j0:j1], work[..., cm:, c0:cm], c,
                                  _stretch_rows(budget, j1 - j0 + k1, m - cm),
                                  precision=precision, label="rec-update-YC", options=opt_y,
                                  backend=backend)
        c = b = w1 = None
        if not need_w:
            w1p = None  # its last product is queued: not held through the right part
        rec(cm, c1, need_w, off)
        if not need_w:
            return
        # merge: W2 <- W2 - W1 (Y1^H W2); rows cm: of Y1 lie below the diagonal
        w2 = wv(off, c0, cm, c1)
        y1 = yv(cm, c0, cm) if yx else work[..., cm:, c0:cm]
        d = gemm(ct(xp, y1), w2[..., cm - c0:, :], precision=precision,
                 label="rec-merge-YhW", options=opt_y, backend=backend)
        if c0 in fold_at and c1 == n:
            # the right spine: W stays [W1 | W2] with D kept; Q's formation takes the merge
            # in a product of D's size (:func:`_times_unit_upper`). W2 is stored unmerged
            # too, so D = Y1^H W2 gets its columns' merges by small products
            _unfold(d, cm)
            folds[c0] = (cm, d)
            if isinstance(w1p, Prepared) and c0 == 0:
                kept["root"] = (cm, w1p)
            w1p = None
            return
        if w1h is not None:
            gemm_sub(w2, w1h, backend.ldexp(d, -ct(xp, s1)),
                     precision=precision, label="rec-merge-WD", options=opt_w,
                     backend=backend)
            w1h = None
        elif isinstance(w1p, Prepared):
            gemm_sub(w2, w1p.T, d, precision=precision, label="rec-merge-WD", options=opt_w,
                     backend=backend)
            if c0 == 0 and c1 == n and off == 0 and not complete:
                kept["root"] = (cm, w1p)  # W[:, :cm] is not written again before Q reads it
        else:
            gemm_sub(w2, wv(off, c0, c0, cm), d, precision=precision,
                     label="rec-merge-WD", options=opt_w, backend=backend)
        w1p = None

    # after a failed certificate the rest runs on meaningless numbers that are thrown
    # away: no floating-point warnings from them (a certified run has none to give)
    with backend.ignore_fp_warnings() if cert is not None else contextlib.nullcontext():
        rec(0, n, want_q and not (lean or sb), 0)
    # rec refers to itself through its closure cell: unless that cycle is cut, the
    # working arrays outlive the return until a garbage collection (device memory too)
    rec = None
    if sb:
        ycur[:] = [None, 0]  # the spine's last block's rounded vectors
    if cert is not None and certificate_failed(backend, cert):
        raise UncertifiedPanels(f"householder-recursive: a {CERTIFIED_PANEL_MAX_N}-column "
                                "panel failed CholQR2's certificate (cond >= ~1e7)")
    if not want_q:
        return None, _take_r(xp, work, nb)
    if lean:
        # the factoring's workspace goes back before R and the formation of Q take theirs
        w_all = None
        backend.release_cached_memory(need=need)
        r = None if complete and m > n else _copy_r(xp, work, nb)
        if complete and m > n:
            # Q (m x m) over a copy of the vectors, the identity in its last m - n columns
            q = xp.zeros((*batch, m, m), dtype=a.dtype, device=dev)
            q[..., :, :n] = work
            # kept for R, taken after Q (the caller's scaled copy holds it in any case)
            work_r, work = work, None
            for c0 in range(n, m, LEAN_Q_BLOCK):  # diagonal blocks: no (m-n)^2 identity
                c1 = min(m, c0 + LEAN_Q_BLOCK)
                backend.add_identity(q[..., c0:c1, c0:c1])
        else:
            q = work
        # the products of Q's formation in chunks of the input's n / LEAN_PARTS columns
        # (also of a complete Q's m columns: the estimate's chunk)
        chunk = -(-n // LEAN_PARTS)
        opts = active_gemm_options()
        limit = None if opts is None else opts.workspace_limit
        reserve = None
        # one matrix (a stack's products are not tiled: their scratch has no such bound)
        if prec_name in ("fp16", "fp32-emulated") and not batch and not is_complex(xp, a):
            reserve = lean_q_workspace(m, lean_q_width(n, nb), chunk,
                                       getattr(a.dtype, "itemsize", 4), limit,
                                       0 if f16 else partials_limit(limit))
        _form_q_lean(backend, q, ts, precision=precision, pp=pp,
                     options=SPLIT_FP16 if f16 else None, chunk=chunk, reserve=reserve,
                     need=need)
        if complete and m > n:
            # R with its zero rows here, after Q's formation (the vectors' copy still
            # holds R): not a concatenation beside Q at the call's end
            backend.release_cached_memory(need=need)
            r = _copy_r(xp, work_r, nb, rows=m)
            work_r = None
        return q, r
    if complete:
        r = xp.triu(work[..., :n, :])
        # Q = I - W Y^H (m x m); fp16: as (Y W^H)^H, the rounded vectors on the left
        y_all = yh_all if f16 else unit_lower(xp, work)
        work = yh_all = ysrc = None
        if f16:
            wy = ct(xp, gemm(y_all, ct(xp, w_all), precision=precision, label="rec-formq-WYh",
                             options=opt_y, backend=backend))
        else:
            wy = gemm(w_all, ct(xp, y_all), precision=precision, label="rec-formq-WYh",
                      backend=backend)
        return xp.eye(m, dtype=a.dtype, device=dev) - wy, r
    if sb:
        # Q from the spine's blocks, backward, in W's storage; R after it (Y read until then)
        _form_q_blocked(backend, w_all, work, qblocks, precision=precision,
                        cutoff=formq_block(n), chunk=-(-n // SPINE_CHUNKS),
                        fp16=(opt_y, opt_w) if yx else None,
                        stretch=None if yx else stretch)
        return w_all, _take_r(xp, work, nb)
    # Q = E - W Y1^H with Y1 = Y[:n, :n] unit lower, formed in W's storage (negated there).
    # R is taken from the working copy when no later step reads its vectors: at once for
    # fp16 (Y1 has an array of its own), after Q otherwise; in place for a square input,
    # so that Q and R are the only arrays of the input's size left
    r = None
    ysrc = yh_all if yx else work
    if yx:
        r = _take_r(xp, work, nb)
        work = None
    # (the kept W1 passed without a name here: the callee drops it after its one product)
    _times_unit_upper(backend, w_all, ysrc[..., :n, :n], 0, n, precision=precision,
                      options=opt_y, cutoff=formq_block(n),
                      explicit=yx, prepared=kept.pop("root", None), folds=folds)
    # Y1 was their last use: free them before the sign normalisation copies Q
    ysrc = yh_all = None
    if r is None:
        r = _take_r(xp, work, nb)
    work = None
    q = w_all  # -W Y1^H already
    backend.add_identity(q)
    return q, r


def _form_q_blocked(backend: Any, w: Any, work: Any, blocks: list[tuple[int, int]], *,
                    precision: Any, cutoff: int, chunk: int,
                    fp16: tuple[Any, Any] | None = None, stretch: int | None = None) -> None:
    """The reduced Q in W's storage from the spine's blocks (:data:`SPINE_BLOCK`), backward
    like LAPACK's ``orgqr``: for the blocks ``c0:c1``, last to first,
    ``Q[c0:, c1:] -= W_j (Y_j^H Q[c0:, c1:])`` (in column chunks of ``chunk``), then the
    block's own columns ``E_j - W_j Y_j[c0:c1]^H`` over ``W_j`` in place
    (:func:`_times_unit_upper`). ``W_j`` is stored from row ``c0`` on (zeros above), and
    Q's rows ``c0:c1`` of the columns right of the block are still zero, so ``Y_j^H Q``
    reads the vectors below the block only (no triangle, no R).

    ``fp16 = (options with Ŷ, options with W)``: the fp16 scheme (module docstring), the
    block's vectors rounded again from the working copy (the same fp16 numbers as the
    factoring's: one rounding of the same Y) into an explicit array of the block's size.

    ``stretch``: the products in stretches of rows splitting at most that many elements
    (:data:`SPINE_STRETCH`), as the factoring's spine."""
    xp = backend.xp
    *batch, m, n = w.shape
    opt_y, opt_w = fp16 if fp16 is not None else (None, None)
    for c0, c1 in reversed(blocks):
        k = c1 - c0
        if fp16 is not None:
            y16 = xp.empty((*batch, m - c0, k), dtype=xp.float16, device=device(w))
            backend.unit_lower_fp16(work[..., c0:, c0:c1], y16)
            below = y16[..., k:, :]
        else:
            below = work[..., c1:, c0:c1]
        for j0 in range(c1, n, chunk):
            j1 = min(n, j0 + chunk)
            width = j1 - j0 + k
            d = _product_in_stretches(
                ct(xp, below), w[..., c1:, j0:j1],
                _stretch_rows(stretch, width, m - c1), precision=precision,
                label="formq-blocked-YhQ", options=opt_y, backend=backend)
            _sub_in_stretches(w[..., c0:, j0:j1], w[..., c0:, c0:c1], d,
                              _stretch_rows(stretch, width, m - c0),
                              precision=precision, label="formq-blocked-WD", options=opt_w,
                              backend=backend)
            d = None
        if fp16 is not None:
            _times_unit_upper(backend, w[..., c0:, c0:c1], y16[..., :k, :], 0, k,
                              precision=precision, options=opt_y, cutoff=cutoff,
                              explicit=True)
        else:
            _times_unit_upper(backend, w[..., c0:, :], work, c0, c1, precision=precision,
                              options=None, cutoff=cutoff, stretch=stretch)
        below = y16 = None
        backend.add_identity(w[..., c0:c1, c0:c1])


def lean_q_width(n: int, nb: int) -> int:
    """The widest column block of Q's lean formation for ``n`` columns and leaves of
    ``nb``: a leaf's blocks of :data:`LEAN_Q_BLOCK`, or narrower leaves merged up to that
    width and at most a chunk of the trailing update (``n / LEAN_PARTS``) wide."""
    return min(LEAN_Q_BLOCK, max(nb, -(-n // LEAN_PARTS)), n)


def lean_q_workspace(m: int, qb: int, chunk: int, itemsize: int, limit: int | None,
                     partials: int = 0, per: int = 6) -> int:
    """Bytes of the temporaries of one column block of Q's lean formation
    (:func:`_form_q_lean`) of ``m`` rows, blocks of ``qb`` and chunks of ``chunk``
    columns on an engine that splits its operands (``per`` bytes an element of each,
    8 of the product: ``tc-sgemm``, ``tc-fp16-splitb``): the products' scratch (whole,
    with ``partials`` bytes at most of ``tc-sgemm``'s partial products of k-slices of 128, or
    within ``limit``), the copy of the block's vectors and two ``qb x chunk`` products."""
    def batched(r: int, c: int, kk: int) -> int:
        # tc-sgemm batches k-slices (of 128 at the least) where two or more fit
        group, slices = partials // max(1, 4 * r * c), kk // 128
        return 4 * r * c * min(group, slices) if group > 1 and slices > 1 else 0

    prods = ((qb, chunk, m), (m, chunk, qb), (m, qb, qb))
    whole = max(per * kk * (r + c) + 8 * r * c + batched(r, c, kk) for r, c, kk in prods)
    scratch = whole if limit is None else min(limit, whole)
    return scratch + (m * qb + 2 * qb * chunk) * itemsize


def _form_q_lean(backend: Any, work: Any, ts: dict[int, tuple[int, Any]], *,
                 precision: Any, pp: Any, options: Any = None, chunk: int | None = None,
                 reserve: int | None = None, need: int | None = None) -> None:
    """The reduced Q over the working copy (R already taken out), backward like LAPACK's
    ``orgqr``: for the column blocks ``j`` of at most :data:`LEAN_Q_BLOCK` (within a leaf,
    whose ``T`` has the block's ``T`` on its diagonal, or narrower leaves merged: their
    ``T``'s joined as LAPACK's ``larft`` joins two blocks), last to first,
    ``Q[:, c1:] <- Q[:, c1:] - Y_j (T_j (Y_j^H Q[:, c1:]))`` in column chunks of
    ``n / LEAN_PARTS``, then ``Q[:, c0:c1] <- E_j - Y_j (T_j Y_j[:kb]^H)``. The vectors are
    the left operand of every product (``options``: the fp16 QR's engine that reads the
    rounded vectors exactly); the small products with ``T_j`` run at ``pp``. The storage
    is a copy of the block's vectors (its columns are written last), ``kb x n/LEAN_PARTS``
    products and, where the engine forms a product before subtracting it, one chunk.
    ``chunk``: the trailing update's columns at a time (default ``n / LEAN_PARTS``).

    The blocks' products and splits grow block after block (Q's trailing rows do), and a
    memory pool gives a request larger than any cached block a new one: with ``reserve``
    (:func:`lean_q_workspace`) one block of that many bytes is held for the temporaries
    (``backend.reserve_workspace``, before each block: taken again only where a request
    did not fit it), else the pool's cached blocks go back once they pass a share of Q;
    either only where the device is short of memory beside the call's ``need`` bytes
    (:func:`lean_plan`)."""
    xp = backend.xp
    n = work.shape[-1]
    chunk = -(-n // LEAN_PARTS) if chunk is None else chunk
    blocks = _q_blocks(ts, min(LEAN_Q_BLOCK, chunk))
    cached = int(LEAN_CACHED_SHARE * math.prod(work.shape)
                 * getattr(work.dtype, "itemsize", 8))
    for c0, c1, parts in reversed(blocks):
        if reserve:
            backend.reserve_workspace(reserve, need=need)
        else:
            backend.release_cached_memory(at_least=cached, need=need)
        kb = c1 - c0
        # the block's vectors as explicit unit lower columns (R above is already out)
        work[..., c0:c1, c0:c1] = unit_lower(xp, work[..., c0:c1, c0:c1])
        y = work[..., c0:, c0:c1]
        tj = _joined_t(backend, y, parts, c0, pp)
        work[..., c0:c1, c1:] = 0  # R's rows there (taken out); Q is zero there yet
        for j0 in range(c1, n, chunk):
            j1 = min(n, j0 + chunk)
            d = gemm(ct(xp, y[..., kb:, :]), work[..., c1:, j0:j1], precision=precision,
                     label="formq-lean-YhQ", options=options, backend=backend)
            d = gemm(tj, d, precision=pp, label="formq-lean-TD", backend=backend)
            gemm_sub(work[..., c0:, j0:j1], y, d, precision=precision,
                     label="formq-lean-YD", options=options, backend=backend)
            d = None
        yc = xp.asarray(y, copy=True)
        y = None
        e = gemm(-tj, ct(xp, yc[..., :kb, :]), precision=pp, label="formq-lean-TYh",
                 backend=backend)
        gemm_into(work[..., c0:, c0:c1], yc, e, precision=precision,
                  label="formq-lean-YE", options=options, backend=backend)
        # no temporary outlives its block: a live one inside the held workspace block
        # would make the next reserve take another
        yc = e = tj = None
        work[..., :c0, c0:c1] = 0
        backend.add_identity(work[..., c0:c1, c0:c1])


def _q_blocks(ts: dict[int, tuple[int, Any]], merged: int
              ) -> list[tuple[int, int, list[tuple[int, Any]]]]:
    """Column blocks ``(c0, c1, parts)`` of Q's lean formation: a leaf wider than
    :data:`LEAN_Q_BLOCK` in blocks of that width (``parts``: the block's first column and
    its ``T``, a diagonal block of the leaf's), narrower consecutive leaves together up to
    ``merged`` columns (``parts``: each leaf's first column and ``T``)."""
    blocks: list[tuple[int, int, list[tuple[int, Any]]]] = []
    for l0, (l1, t) in sorted(ts.items()):
        if l1 - l0 > LEAN_Q_BLOCK:
            blocks += [(c, min(l1, c + LEAN_Q_BLOCK),
                        [(c, t[..., c - l0:min(l1, c + LEAN_Q_BLOCK) - l0,
                               c - l0:min(l1, c + LEAN_Q_BLOCK) - l0])])
                       for c in range(l0, l1, LEAN_Q_BLOCK)]
        elif blocks and blocks[-1][1] == l0 and l1 - blocks[-1][0] <= merged:
            c0, _, parts = blocks[-1]
            blocks[-1] = (c0, l1, [*parts, (l0, t)])
        else:
            blocks.append((l0, l1, [(l0, t)]))
    return blocks


def _joined_t(backend: Any, y: Any, parts: list[tuple[int, Any]], c0: int, pp: Any) -> Any:
    """``T`` of the block whose explicit unit lower vectors are ``y`` (columns from
    ``c0``), from its leaves' ``T``'s (``parts``: first column, ``T``): two blocks join as
    ``[[T1, -T1 (Y1^H Y2) T2], [0, T2]]`` (LAPACK's ``larft``), the products at ``pp``."""
    xp = backend.xp
    t = parts[0][1]
    for l0, t2 in parts[1:]:
        j = l0 - c0
        k2 = t2.shape[-1]
        # Y1's rows above l0 meet Y2's zeros there
        s = gemm(ct(xp, y[..., j:, :j]), y[..., j:, j:j + k2], precision=pp,
                 label="formq-lean-YhY", backend=backend)
        top = gemm(gemm(t, s, precision=pp, label="formq-lean-TS", backend=backend), t2,
                   precision=pp, label="formq-lean-TS", backend=backend)
        joined = xp.zeros((*t.shape[:-2], j + k2, j + k2), dtype=t.dtype, device=device(t))
        joined[..., :j, :j] = t
        joined[..., :j, j:] = -top
        joined[..., j:, j:] = t2
        t = joined
    return t


def _store_vectors(xp: Any, work: Any, y16: Any, c0: int, c1: int) -> None:
    """The rounded vectors ``Ŷ`` (float16, explicit unit lower) over ``Y`` below the
    diagonal of the working copy's columns ``c0:c1`` (R above is kept)."""
    k = c1 - c0
    yw = xp.astype(y16, work.dtype)
    work[..., c0:c1, c0:c1] = xp.triu(work[..., c0:c1, c0:c1]) + xp.tril(yw[..., :k, :], k=-1)
    work[..., c1:, c0:c1] = yw[..., k:, :]


def _take_r(xp: Any, work: Any, nb: int) -> Any:
    """R from the working copy (R on and above its diagonal): the working copy itself with
    its lower triangle zeroed in place where it is square (column blocks of ``nb``: no
    temporary beyond a diagonal block), else a copy of its top rows' upper triangle."""
    *_, m, n = work.shape
    if m != n:
        return _copy_r(xp, work, nb)
    for c0 in range(0, n, nb):
        c1 = min(n, c0 + nb)
        work[..., c0:c1, c0:c1] = xp.triu(work[..., c0:c1, c0:c1])
        work[..., c1:, c0:c1] = 0
    return work


def _copy_r(xp: Any, work: Any, nb: int, rows: int | None = None) -> Any:
    """A copy of R (on and above the diagonal of the working copy's top ``n`` rows), in
    column blocks of ``nb``: no ``n x n`` mask beside it (``triu`` of the whole block
    takes one, a quarter of a float32 R); ``rows`` rows in all (zeros below)."""
    *batch, _, n = work.shape
    r = xp.zeros((*batch, n if rows is None else rows, n), dtype=work.dtype,
                 device=device(work))
    for c0 in range(0, n, nb):
        c1 = min(n, c0 + nb)
        r[..., :c0, c0:c1] = work[..., :c0, c0:c1]
        r[..., c0:c1, c0:c1] = xp.triu(work[..., c0:c1, c0:c1])
    return r


def _times_unit_upper(backend: Any, w: Any, y1: Any, lo: int, hi: int, *, precision: Any,
                      options: Any, cutoff: int, explicit: bool = False,
                      prepared: tuple[int, Any] | None = None,
                      folds: dict[int, tuple[int, Any]] | None = None,
                      stretch: int | None = None) -> None:
    """``W[:, lo:hi] <- -W[:, lo:hi] Y1[lo:hi, lo:hi]^H`` in place, ``Y1`` unit lower
    with its vectors below the diagonal of ``y1`` (R above is not read), or ``y1`` itself
    where ``explicit`` (unit diagonal and zeros stored). Negated, so that the reduced Q is
    ``E - W Y1^H`` with no pass of its own for the sign.

    With ``Y1^H = [U11 U12; 0 U22]``: ``-[W1 W2] Y1^H = [-W1 U11, -W2 U22 - W1 U12]``, so
    ``W2`` is done first and ``W1`` last; ``W1 U12`` is one large GEMM subtracted in
    place (in the GEMM's epilogue where the engine has one). The diagonal blocks take
    their sign from the (small) negated triangle. Products run as ``(Y W^H)^H`` so that
    the vectors are the left operand, as the fp16 scheme's engines expect.
    ``prepared = (mid, W1^H prepared)``: the recursion's root ``W1`` (columns ``lo:mid``)
    with its parts, read by the first product ``W2 -= W1 U12`` where its split is ``mid``.

    ``folds``: the recursion's right spine left unmerged (:data:`FOLD_SPINE`), a node's
    first column -> ``(mid, D)``: its ``W`` is ``[W1, W2 - W1 D]`` with ``[W1 | W2]``
    stored, so ``-W Y1^H = [-W1 U11, -W2 U22 - W1 (U12 - D U22)]``: the merge's
    ``m x k1 x k2`` product becomes ``D U22`` (``k1 x k2 x k2``, triangular), and ``W2 U22``
    recurses with ``W2``'s own fold.

    ``stretch``: the products in stretches of W's rows (each row of the result reads its
    own row of W), splitting at most that many elements (:data:`SPINE_STRETCH`).
    """
    xp = backend.xp
    k = hi - lo
    fold = folds.pop(lo, None) if folds and hi == y1.shape[-1] else None
    if fold is None and k <= cutoff:
        diag = y1[..., lo:hi, lo:hi]
        neg = -(diag if explicit else unit_lower(xp, diag))
        m = w.shape[-2]
        # a stretch's row of W: its split, the product's column and its unscaled copy
        rows = _stretch_rows(stretch, 3 * k, m)
        if rows < m:
            neg = prepare_operand(neg, side="left", m=k, n=rows, k=k, precision=precision,
                                  options=options, backend=backend)
        for r0 in range(0, m, rows):
            r1 = min(m, r0 + rows)
            blk = gemm(neg, ct(xp, w[..., r0:r1, lo:hi]), precision=precision,
                       label="rec-formq-trmm", options=options, backend=backend)
            backend.assign_ct(w[..., r0:r1, lo:hi], blk)
            blk = None
        return
    mid = lo + k // 2 if fold is None else fold[0]
    _times_unit_upper(backend, w, y1, mid, hi, precision=precision, options=options,
                      cutoff=cutoff, explicit=explicit, folds=folds, stretch=stretch)
    if explicit:
        # W2^H -= Y12 W1^H in the GEMM's epilogue, the vectors still the left operand
        gemm_sub(ct(xp, w[..., :, mid:hi]), y1[..., mid:hi, lo:mid], ct(xp, w[..., :, lo:mid]),
                 precision=precision, label="rec-formq-trmm-gemm", options=options,
                 backend=backend)
    else:
        # W2 -= W1 Y12^H into W's rows (the vectors of Y12 lie below the diagonal: no R);
        # a native GEMM accumulates in place, with no temporary of half of W
        y12 = y1[..., mid:hi, lo:mid]
        if fold is not None:
            # folded: Y12 - Y22 D^H = (U12 - D U22)^H in the product's storage; Y22 unit
            # lower below R (not read)
            y12 = _trmm(y1[..., mid:hi, mid:hi], ct(xp, fold[1]), precision=precision,
                        label="rec-formq-fold", backend=backend)
            fold = None  # D's last use
            y12 *= -1
            y12 += y1[..., mid:hi, lo:mid]
        w1 = w[..., :, lo:mid]
        if prepared is not None and prepared[0] == mid and lo == 0:
            w1 = prepared[1].T  # the recursion's parts of W1 (its shifts go onto Y12^H)
        prepared = None
        _sub_in_stretches(w[..., :, mid:hi], w1, ct(xp, y12),
                          _stretch_rows(stretch, hi - lo, w.shape[-2]),
                          precision=precision, label="rec-formq-trmm-gemm", options=options,
                          backend=backend)
        w1 = y12 = None
    _times_unit_upper(backend, w, y1, lo, mid, precision=precision, options=options,
                      cutoff=cutoff, explicit=explicit, stretch=stretch)
