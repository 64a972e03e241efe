"""Certified Householder panels of at most 32 columns in one launch
(``kernels/panel_fused.cu``, :data:`ONE_LAUNCH`) or three (``kernels/panel_cholqr.cu``):
CholQR2 with the Gram matrices in float64 and the reconstruction of the reflectors, written
in LAPACK's layout in place.

cuSOLVER's ``geqrf`` spends a fixed latency on every column of a panel (about 11 us per
column, H100); these kernels take the panel's rows in two reads and one write, with the
``n x n`` steps in the last thread block of each pass. The portable version, with the
same steps in the same order, is :meth:`mpqr.backends._base.ArrayAPIBackend.certified_panel`.
"""

from __future__ import annotations

import functools

import cupy as cp
import numpy as np
from mpqr.backends.cupy import blas, leaf_update
from mpqr.backends.cupy.modules import ctype, functions

__all__ = ["LEAF_Z_LAYOUT", "LOOKAHEAD_STREAM", "MAX_N", "ONE_LAUNCH", "certified_leaf",
           "certified_panel", "supports", "supports_leaf"]

#: widest panel (one column per lane of a warp)
MAX_N = 32
_THREADS = 256
_WARPS = _THREADS // 32
#: rows per tile (one tile in shared memory at a time per block)
_TILE = 32
#: most blocks of a pass: the last block sums one partial Gram per block
_MAX_BLOCKS = 96
_WS_FIXED = 6 * MAX_N * MAX_N

#: The panel in one launch (``kernels/panel_fused.cu``: the three launches' phases in one
#: persistent grid with grid barriers, the partial Grams summed by the whole grid): None
#: keeps the three launches; ``"warp"`` takes their one-warp Cholesky and LU steps,
#: ``"block"`` the whole block's (a barrier a step; the LU's a pair of steps). Same
#: factors to the last bit.
#: ``"block"``: 16384 x 32 float32 120 against 119 us a panel, float64 109 against 122;
#: the QR at 16384² fp16 145 against 155 ms, fp64-emulated 409 against 415, 8192² fp16
#: 58 against 62 (H200, one process, bench/NOTES.md 2026-11-28). Alone, a 32 x 32
#: Cholesky / signed LU: the block's 5.0 / 5.7 us (the Cholesky by LDL^T's steps; 6.6 with
#: a square root a step), one warp's loops 14.3 / 12.4, one warp in registers 10.2 / 7.2
#: (the square root's steps; that form removed since; H200, bench/probes/panel_floors.py).
ONE_LAUNCH: str | None = "block"
#: the one launch's kernel for each way of doing the n x n steps
_STEPS = {"warp": 0, "block": 1}
#: the one launch's grid: None takes the three launches' (the same partial Grams, the same
#: bits); a number of blocks up to one per SM (more tiles in flight; other partial sums)
FUSED_BLOCKS: int | None = None
#: whether the one launch also writes the rows below the panel's top (Y and W); False:
#: it stops after the n x n steps and ``panel_apply`` writes them on up to 528 blocks
#: (the one launch's rows phase, on at most one block per SM, took 20 us at 16384 x 32
#: against ~9 for the separate launch, H200)
ONE_LAUNCH_ROWS: bool = True
#: the one launch's ``stop`` that ends it before the rows (past its four grid barriers)
_STOP_BEFORE_ROWS = 5
#: most of a block's tiles the one launch keeps in shared memory from pass 1 to the rows
#: (float64, 9216 bytes a tile beside the kernel's 45 KiB of its own; 0: every pass reads
#: A); further tiles are read from A in every pass. Same factors to the last bit. 20, the
#: most a block may take: a 65536 x 32 panel 96.8 against 100.8 us at 16, the QR at
#: 65536 x 8192 fp16 157.1 against 158.4 ms (H200, bench/probes/flag_ab.py)
FUSED_CACHE_TILES = 20
#: doubles in a row of a shared tile (the kernels' PANEL_LD) and the bytes of a cached tile
_LD = 36
_TILE_BYTES = _TILE * _LD * 8


def supports(a) -> bool:
    """A 2-D real float32/float64 view with contiguous rows, ``m >= n``, ``n <= 32``."""
    if a.ndim != 2 or a.dtype not in (cp.float32, cp.float64):
        return False
    m, n = a.shape
    return 0 < n <= MAX_N and m >= n and a.strides[1] == a.itemsize and \
        a.strides[0] % a.itemsize == 0


def _module(dtype_name: str):
    t = ctype(dtype_name)
    return functions("panel_cholqr.cu", (f"panel_pass<{t}>", f"panel_apply<{t}>"))


def _fused_kernel(dtype_name: str, way: str):
    """The one launch for ``way`` (a key of :data:`_STEPS`), each form compiled apart."""
    t = ctype(dtype_name)
    return functions("panel_cholqr.cu", (f"panel_fused<{t}, {_STEPS[way]}>",),
                     after=("panel_fused.cu",))[0]


@functools.cache
def _sm_count(device: int) -> int:
    return int(cp.cuda.Device(device).attributes["MultiProcessorCount"])


@functools.cache
def _tiles_that_fit(device: int, static_bytes: int) -> int:
    """Cached tiles a block of the one launch may hold on ``device`` beside its static
    shared memory (227 KiB a block on an H100/H200, 163 KiB on an A100, 99 KiB on Ada)."""
    optin = int(cp.cuda.Device(device).attributes["MaxSharedMemoryPerBlockOptin"])
    return max(0, (optin - static_bytes) // _TILE_BYTES)


def fused_blocks(m: int) -> int:
    """The one-launch panel's grid: the three launches' Gram-pass grid (same partial sums)
    or :data:`FUSED_BLOCKS`, at most one block per SM, so that every block is resident for
    the grid barriers, and at most one block per 32 rows."""
    cap = _MAX_BLOCKS if FUSED_BLOCKS is None else min(FUSED_BLOCKS, _MAX_PARTIALS)
    return max(1, min(cap, _sm_count(cp.cuda.Device().id), -(-m // _TILE)))


def _launch_fused(kernel, pa, lda, m: int, n: int, ws, cert, pw, ldw, ltop, tau,
                  stop: int = 0, apply_k=None) -> None:
    """The one launch (``stop``: return after that grid barrier, 0 all); with ``apply_k``
    (``panel_apply``) and :data:`ONE_LAUNCH_ROWS` False, the rows in a second launch."""
    apart = apply_k is not None and not ONE_LAUNCH_ROWS and stop == 0
    blocks = fused_blocks(m)
    tiles = -(-m // _TILE)
    smem = min(FUSED_CACHE_TILES, -(-tiles // blocks),  # block 0's tiles
               _tiles_that_fit(cp.cuda.Device().id, kernel.shared_size_bytes)) * _TILE_BYTES
    if smem and kernel.max_dynamic_shared_size_bytes < smem:
        kernel.max_dynamic_shared_size_bytes = smem  # beside its static 45 KiB: opt in
    kernel((blocks,), (_THREADS,),
           (pa, lda, cp.int64(m), cp.int32(n), ws, cert, pw, ldw, ltop, tau,
            cp.int32(_STOP_BEFORE_ROWS if apart else stop)), shared_mem=smem)
    if apart and m > n:
        ab = max(1, min(4 * 132, -(-(m - n) // _TILE)))
        apply_k((ab,), (_THREADS,), (pa, lda, cp.int64(m), cp.int32(n), ws, pw, ldw))


def _launch(a, w, cert, ws, ltop, tau) -> None:
    m, n = a.shape
    if ONE_LAUNCH is not None:
        kernel = _fused_kernel(cp.dtype(a.dtype).name, ONE_LAUNCH)
        lda = cp.int64(a.strides[0] // a.itemsize)
        ldw = cp.int64(w.strides[0] // w.itemsize) if w is not None else cp.int64(0)
        _launch_fused(kernel, a, lda, m, n, ws, cert, w if w is not None else cp.uint64(0),
                      ldw, ltop, tau, apply_k=_module(cp.dtype(a.dtype).name)[1])
        return
    pass_k, apply_k = _module(cp.dtype(a.dtype).name)
    lda = cp.int64(a.strides[0] // a.itemsize)
    ldw = cp.int64(w.strides[0] // w.itemsize) if w is not None else cp.int64(0)
    wp = w if w is not None else cp.uint64(0)
    blocks = max(1, min(_MAX_BLOCKS, -(-m // _TILE)))
    args = (a, lda, cp.int64(m), cp.int32(n))
    for p in (1, 2):
        pass_k((blocks,), (_THREADS,), (*args, cp.int32(p), ws, cert, wp, ldw, ltop, tau))
    if m > n:
        ab = max(1, min(4 * 132, -(-(m - n) // _TILE)))
        apply_k((ab,), (_THREADS,), (*args, ws, wp, ldw))


#: partial Grams the workspace holds (the one launch's largest grid)
_MAX_PARTIALS = 256


def _workspace():
    return cp.empty(_WS_FIXED + _MAX_PARTIALS * MAX_N * MAX_N, dtype=cp.float64)


def certified_panel(a, w, cert):
    """Factor the panel view ``a`` (``m x n``) in place: ``S R`` on and above its diagonal
    and the Householder vectors ``Y`` (unit diagonal implied) below; ``w`` (an ``m x n``
    view, or None) receives ``W = Y T``. Returns ``(L, tau)``: ``Y``'s top ``n x n``
    block (explicit unit lower) and ``diag(T)``. A failed certificate adds one to
    ``cert[0]`` (int32, four elements, :func:`mpqr.backends.panel_cholqr.new_certificate`)
    and leaves ``a``, ``w``, ``L`` and ``tau`` meaningless."""
    n = a.shape[1]
    ltop = cp.empty((n, n), dtype=a.dtype)
    tau = cp.empty(n, dtype=a.dtype)
    _launch(a, w, cert, _workspace(), ltop, tau)
    return ltop, tau


def certified_leaf(backend, work, w_all, c0: int, c1: int, cert, woff: int = 0,
                   combine: bool = False):
    """:func:`mpqr.qr.panel_blocked.certified_leaf` with its buffers allocated once, the
    kernels launched on raw pointers and the update products as direct cuBLAS calls
    (column-major views of the row-major blocks): through array views and the policy's
    calls a leaf of 16 panels took ~4 ms of host time, ~250 us per panel (H100,
    ``python3 bench/probes/square_panels.py OUT leaf``). Entry ``(i, j)`` of W lives at
    ``w_all[i - woff, j - woff]`` (a W narrower than the working matrix)."""
    from cupy.cuda import cublas, runtime

    from mpqr.qr.panel_blocked import leaf_lookahead, leaf_recursive, leaf_sub

    m, ld = work.shape
    it = work.itemsize
    f64 = work.dtype == cp.float64
    dt = np.float64 if f64 else np.float32
    rtype = runtime.CUDA_R_64F if f64 else runtime.CUDA_R_32F
    compute = cublas.CUBLAS_COMPUTE_64F if f64 else cublas.CUBLAS_COMPUTE_32F
    k = c1 - c0
    pass_k, apply_k = _module(cp.dtype(work.dtype).name)
    fused = None if ONE_LAUNCH is None else \
        _fused_kernel(cp.dtype(work.dtype).name, ONE_LAUNCH)
    ws = _workspace()
    tau = cp.empty(k, dtype=work.dtype)
    ltop = cp.empty(2 * MAX_N * MAX_N, dtype=work.dtype)  # two: lookahead's alternate
    zld = max(k - MAX_N, 1)
    z = cp.empty((MAX_N, zld), dtype=work.dtype)  # Z^T as column-major (q x nn, ld zld)
    # the scalars' host addresses read once (numpy's .ctypes costs ~1-3 us a read, and a
    # panel issues up to eight products)
    scalars = np.array([1.0, 0.0, -1.0], dtype=dt)
    one, zero, mone = (scalars.ctypes.data + i * scalars.itemsize for i in range(3))
    handle = backend._cublas_handle()
    cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)  # once for the leaf
    a0, w0 = work.data.ptr, w_all.data.ptr - (woff * w_all.shape[1] + woff) * it
    ldw = w_all.shape[1]
    tau0, l0, z0 = tau.data.ptr, ltop.data.ptr, z.data.ptr
    lda = np.int64(ld)
    op_n, op_t = cublas.CUBLAS_OP_N, cublas.CUBLAS_OP_T

    def gemm(ta, tb, mm, nn, kk, alpha, pa, la, pb, lb, beta, pc, lc):
        blas.gemm_ex(handle, ta, tb, mm, nn, kk, alpha, pa, rtype, la, pb, rtype, lb, beta,
                     pc, rtype, lc, compute, cublas.CUBLAS_GEMM_DEFAULT)

    sub = leaf_sub(k)  # the portable loop's sub-blocks (CERTIFIED_LEAF_SUB)
    combine = combine and sub >= k
    if sub < k:  # the sub-blocks' combined W^T B (kb x q2), G and L's top block
        z2ld = k - sub
        z2 = cp.empty((sub, z2ld), dtype=work.dtype)
        g = cp.empty((sub, MAX_N), dtype=work.dtype)

    def rm_gemm(ta: bool, tb: bool, mm, nn, kk, alpha, pa, la, pb, lb, beta, pc, lc):
        # row-major C (mm x nn) = alpha op(A) op(B) + beta C as column-major C^T
        gemm(op_t if tb else op_n, op_t if ta else op_n, nn, mm, kk, alpha, pb, lb, pa, la,
             beta, pc, lc)

    def at(base, r, col):
        return base + (r * ld + col) * it

    def atw(r, col):  # W's entry (r, col) (W's own leading dimension)
        return w0 + (r * ldw + col) * it

    ldw64 = np.int64(ldw)

    def panel(c: int, e: int, lp: int) -> None:
        # factor columns c:e in place (L's top block to lp)
        nn, mr = e - c, m - c
        pa, pw = np.uint64(a0 + (c * ld + c) * it), np.uint64(w0 + (c * ldw + c) * it)
        if fused is not None:
            _launch_fused(fused, pa, lda, mr, nn, ws, cert, pw, ldw64, np.uint64(lp),
                          np.uint64(tau0 + (c - c0) * it), apply_k=apply_k)
            return
        blocks = max(1, min(_MAX_BLOCKS, -(-mr // _TILE)))
        args = (pa, lda, np.int64(mr), np.int32(nn))
        for p in (1, 2):
            pass_k((blocks,), (_THREADS,), (*args, np.int32(p), ws, cert, pw, np.int64(ldw),
                                            np.uint64(lp), np.uint64(tau0 + (c - c0) * it)))
        if mr > nn:
            ab = max(1, min(4 * 132, -(-(mr - nn) // _TILE)))
            apply_k((ab,), (_THREADS,), (*args, ws, pw, np.int64(ldw)))

    own, own_update, own_join = leaf_update.for_leaf(work.dtype, k)

    def update(c: int, e: int, lp: int, j0: int, j1: int) -> None:
        # columns j0:j1 <- (I - Y W^T) columns j0:j1, Y and W of the panel c:e
        nn, mr, q = e - c, m - c, j1 - j0
        if q <= 0:
            return
        pb, pw = a0 + (c * ld + j0) * it, w0 + (c * ldw + c) * it
        if own_update and own.takes(mr, q):  # kernels of our own (leaf_update.py)
            pz = own.wtb(pb, ld, pw, ldw, mr, nn, q)
            own.apply(pb, ld, lp, a0 + (e * ld + c) * it, ld, pz, mr, nn, q)
            return
        # Z^T (q x nn) = B^T W, B = work[c:, j0:j1], W = w_all[c:, c:e], as one GEMM
        # (split over 512-row chunks and summed, the QR was no faster: 16384^2 fp16
        # 299-320 ms against 296-299, H100, bench/NOTES.md 2026-11-24)
        if LEAF_Z_LAYOUT == "z":  # Z (nn x q, column-major: the short side first)
            gemm(op_n, op_t, nn, q, mr, one, pw, ldw, pb, ld, zero, z0, nn)
            oz, lz = op_t, nn
        else:
            gemm(op_n, op_t, q, nn, mr, one, pb, ld, pw, ldw, zero, z0, zld)
            oz, lz = op_n, zld
        # B's top rows -= L Z, the rows below -= Y2 Z (Y2 = work[e:, c:e])
        gemm(oz, op_n, q, nn, nn, mone, z0, lz, lp, nn, one, pb, ld)
        if e < m:
            gemm(oz, op_n, q, m - e, nn, mone, z0, lz, a0 + (e * ld + c) * it, ld,
                 one, a0 + (e * ld + j0) * it, ld)

    if combine:  # the leaf's W combined panel by panel: G = Y_<j^T W_j (c - c0 x nn)
        g = cp.empty((k, MAX_N), dtype=work.dtype)

    def join(s0: int, c: int, e: int) -> None:
        # W of the (sub-)block so far: W_j <- W_j - W[:, s0:c] (Y[:, s0:c]^T W_j) (Y's rows
        # from c in the columns before c are stored as they are; W_j's rows above c zero)
        if c <= s0:
            return
        nn, mr = e - c, m - c
        if own_join and own.takes(mr, c - s0):  # G^T = W_j^T Y[c:, s0:c] (nn x (c - s0))
            pg, lg, tg = own.wtb(at(a0, c, s0), ld, atw(c, c), ldw, mr, nn, c - s0), c - s0, True
        else:
            rm_gemm(True, False, c - s0, nn, mr, one, at(a0, c, s0), ld, atw(c, c), ldw,
                    zero, g.data.ptr, MAX_N)
            pg, lg, tg = g.data.ptr, MAX_N, False
        # W_j's rows above c are -W[s0:c, s0:c] G (beta 0: no pass that zeroes them first),
        # the rows from c on W_j - W[c:, s0:c] G
        rm_gemm(False, tg, c - s0, nn, c - s0, mone, atw(s0, s0), ldw, pg, lg, zero,
                atw(s0, c), ldw)
        rm_gemm(False, tg, mr, nn, c - s0, mone, atw(c, s0), ldw, pg, lg, one, atw(c, c),
                ldw)

    if combine and leaf_recursive(k, m - c0):
        _by_halves(work, c0, c1, panel, rm_gemm, at, atw, l0, ldw, (one, zero, mone))
        return tau
    if leaf_lookahead(k, m - c0):
        _leaf_lookahead(panel, update, c0, c1, l0, l0 + MAX_N * MAX_N * it,
                        (lambda c, e: join(c0, c, e)) if combine else None)
        return tau
    for c in range(c0, c1, MAX_N):
        e = min(c + MAX_N, c1)
        s0 = c0 + (c - c0) // sub * sub  # this sub-block: columns s0:se
        se = min(s0 + sub, c1)
        panel(c, e, l0)
        update(c, e, l0, e, se)
        whole = se == c1  # the last sub-block (or the leaf): no update after it
        if whole and not combine:
            continue
        join(s0, c, e)
        if e < se or whole:
            continue
        # the sub-block is factored: the leaf's later columns B2 = work[s0:, se:c1] <-
        # B2 - Y (W^T B2), Y's top block explicit (unit lower), the rows below in place
        kb, q2 = se - s0, c1 - se
        lblk = cp.ascontiguousarray(cp.tril(work[s0:se, s0:se], -1))
        lblk.ravel()[::kb + 1] = 1
        rm_gemm(True, False, kb, q2, m - s0, one, atw(s0, s0), ldw, at(a0, s0, se), ld,
                zero, z2.data.ptr, z2ld)
        rm_gemm(False, False, kb, q2, kb, mone, lblk.data.ptr, kb, z2.data.ptr, z2ld, one,
                at(a0, s0, se), ld)
        if se < m:
            rm_gemm(False, False, m - se, q2, kb, mone, at(a0, se, s0), ld, z2.data.ptr, z2ld,
                    one, at(a0, se, se), ld)
    return tau


def _by_halves(work, c0: int, c1: int, panel, rm_gemm, at, atw, l0: int, ldw: int,
               scalars) -> None:
    """:func:`mpqr.qr.panel_blocked._recursive_leaf` on raw pointers: the leaf by halves
    down to single panels, its products as direct cuBLAS calls (row-major, ``rm_gemm``),
    one ``k/2 x k/2`` buffer for each node's ``Z = W1^T B`` and then ``G = Y1^T W2``, one
    for Y1's explicit unit-lower top block."""
    one, zero, mone = scalars
    m, ld = work.shape
    from mpqr.qr.panel_blocked import left_half

    kh = left_half(c1 - c0, MAX_N)  # the widest left half
    zbuf = cp.empty((kh, kh), dtype=work.dtype)
    lbuf = cp.empty(kh * kh, dtype=work.dtype)
    pz, a0 = zbuf.data.ptr, work.data.ptr

    def rec(c: int, e: int) -> None:
        if e - c <= MAX_N:
            panel(c, e, l0)  # Y's top block (explicit unit lower) to l0
            return
        h = c + left_half(e - c, MAX_N)
        k1, k2 = h - c, e - h
        rec(c, h)
        if k1 > MAX_N:  # Y1's top block from the working copy (R above it)
            _unit_lower(cp.uint64(at(a0, c, c)), cp.int64(ld), cp.int32(k1), lbuf[:k1 * k1])
            pl, ll = lbuf.data.ptr, k1
        else:
            pl, ll = l0, MAX_N
        # Z = W1^T B; B's top rows -= L1 Z, the rows below -= Y1 Z
        rm_gemm(True, False, k1, k2, m - c, one, atw(c, c), ldw, at(a0, c, h), ld, zero, pz,
                kh)
        rm_gemm(False, False, k1, k2, k1, mone, pl, ll, pz, kh, one, at(a0, c, h), ld)
        rm_gemm(False, False, m - h, k2, k1, mone, at(a0, h, c), ld, pz, kh, one,
                at(a0, h, h), ld)
        rec(h, e)
        # G = Y1^T W2 (W2 zero above row h); W2 <- W2 - W1 G, its rows c:h written (beta 0)
        rm_gemm(True, False, k1, k2, m - h, one, at(a0, h, c), ld, atw(h, h), ldw, zero, pz,
                kh)
        rm_gemm(False, False, k1, k2, k1, mone, atw(c, c), ldw, pz, kh, zero, atw(c, h), ldw)
        rm_gemm(False, False, m - h, k2, k1, mone, atw(h, c), ldw, pz, kh, one, atw(h, h),
                ldw)

    rec(c0, c1)


#: ``dst`` (n x n, C order) = the unit lower triangle of the row-major block at ``p``
_unit_lower = cp.ElementwiseKernel(
    "uint64 p, int64 ld, int32 n", "T dst",
    "const long long r = i / n, col = i % n;"
    "dst = r > col ? reinterpret_cast<const T*>(p)[r * ld + col] : (r == col ? T(1) : T(0))",
    "mpqr_unit_lower_copy")


#: the layout of the leaf's ``W^T B`` (the rank-32 update's first product, inner dimension
#: the panel's rows): ``"zt"`` its transpose (q x 32, column-major), ``"z"`` itself
#: (32 x q): the same sums, other cuBLAS kernels (the first splits its long inner dimension
#: over a reduction kernel, H200 trace). ``"z"``: a 16384 x 1024 float32 leaf with lookahead
#: 7.4 against 7.7 ms, the QR at 16384² fp16 145.3 against 148.8 (H200, one process)
LEAF_Z_LAYOUT: str = "z"
#: lookahead's panels on a stream of their own (highest priority) while the leaf's update
#: runs on the caller's; False: the same launches in the same order on the caller's stream
#: (the same bits: the test that the streams change nothing)
LOOKAHEAD_STREAM: bool = True


@functools.cache
def _side_stream(device: int):
    # CUDA clamps a priority beyond the device's range to its greatest (-5 on an H200)
    return cp.cuda.Stream(non_blocking=True, priority=-1000)


def _leaf_lookahead(panel, update, c0: int, c1: int, la: int, lb: int, join=None) -> None:
    """The leaf's panels ``panel(c, e, L)`` and updates ``update(c, e, L, j0, j1)`` with
    lookahead: after panel ``p``, the next panel's columns are updated, panel ``p + 1`` is
    launched (on the side stream, after an event of the caller's) and the rest of the leaf
    is updated with panel ``p``'s factors meanwhile; the caller's stream waits for panel
    ``p + 1`` before its next update. L's top block alternates between ``la`` and ``lb``
    (panel ``p + 1`` writes one while panel ``p``'s update reads the other). ``join(c, e)``
    (or None): panel ``p``'s W joins the leaf's, after its update, beside panel ``p + 1``."""
    main = cp.cuda.get_current_stream()
    if not LOOKAHEAD_STREAM:
        side = None
    else:
        side = _side_stream(cp.cuda.Device().id)
        ready, done = cp.cuda.Event(disable_timing=True), cp.cuda.Event(disable_timing=True)

    def launch(c: int, e: int, lp: int) -> None:
        # panel c:e after the caller's stream's work so far; the caller's stream waits for
        # it only at its next update that reads it (wait())
        if side is None:
            panel(c, e, lp)
            return
        main.record(ready)
        side.wait_event(ready)
        with side:
            panel(c, e, lp)
        side.record(done)

    def wait() -> None:
        if side is not None:
            main.wait_event(done)

    launch(c0, min(c0 + MAX_N, c1), la)
    wait()
    lp, lq = la, lb
    for c in range(c0, c1, MAX_N):
        e = min(c + MAX_N, c1)
        if e == c1:
            if join is not None:
                join(c, e)
            break
        e2 = min(e + MAX_N, c1)
        update(c, e, lp, e, e2)  # the next panel's columns
        launch(e, e2, lq)
        update(c, e, lp, e2, c1)  # the rest, beside the next panel
        if join is not None:
            join(c, e)
        wait()
        lp, lq = lq, lp


def supports_leaf(work, w_all) -> bool:
    """A 2-D C-contiguous float32/float64 working matrix and a C-contiguous W of its rows
    and dtype."""
    return (work.ndim == 2 and work.dtype in (cp.float32, cp.float64)
            and work.flags.c_contiguous and w_all.flags.c_contiguous and w_all.ndim == 2
            and w_all.shape[0] == work.shape[0] and w_all.dtype == work.dtype)
