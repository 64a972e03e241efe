"""The library's QR (cuSOLVER ``geqrf`` + ``orgqr``) with mpqr's layout steps fused.

``cupy.linalg.qr`` copies a row-major input into cuSOLVER's column-major layout and R back
out of it with element-wise kernels whose reads or writes are strided, and mpqr then made
``diag(R) >= 0`` in two more passes. Here the input's copy and R's extraction are tiled
transposes (``kernels/qr_layout.cu``), R's rows take their signs in the same pass, ``geqrf``
and ``orgqr`` work in one buffer (no copy of the factored matrix into Q's), and Q's columns
take their signs in one pass over its memory order. Same cuSOLVER calls, same numbers
(the signs are exact); Q comes back in cuSOLVER's column-major order, as from CuPy.

Real float32/float64 2-D inputs with ``m >= n`` (the driver's only kind); anything else
takes ``cupy.linalg.qr`` (:func:`supports`). Stacks (:func:`qr_stack`) take the same calls
per member with the stack's layout copy, sign passes and workspace shared: one Python
call into cuSOLVER per member and step, no per-member allocation or ``info`` check.
"""

from __future__ import annotations

import cupy as cp
import numpy as np
from mpqr.backends.cupy.modules import ctype, functions

__all__ = ["cholesky_stack", "form_q", "qr", "qr_stack", "raw", "raw_stack", "steps", "supports",
           "supports_cholesky_stack", "supports_stack"]

_TILE = 32


def supports(a) -> bool:
    """A real float32/float64 2-D array with ``m >= n > 0``."""
    return (a.ndim == 2 and a.dtype in (cp.float32, cp.float64)
            and a.shape[0] >= a.shape[1] > 0)


def _kernel(dtype_name: str):
    return functions("qr_layout.cu", (f"transpose_tile<{ctype(dtype_name)}>",))[0]


def _transpose(src, out, *, upper=False, sgn=None) -> None:
    """``out[c, r] = src[r, c]`` (2-D views with unit column stride), the lower triangle of
    ``out`` (``r < c``) zeroed where ``upper``, row ``c`` of ``out`` times ``sgn[c]``."""
    rows, cols = src.shape
    it = src.itemsize
    grid = (-(-rows // _TILE), -(-cols // _TILE), 1)
    _kernel(src.dtype.name)(grid, (_TILE, 8, 1), (
        src, np.int64(src.strides[0] // it), out, np.int64(out.strides[0] // it),
        np.int64(rows), np.int64(cols), np.int32(bool(upper)),
        sgn if sgn is not None else np.uint64(0)))


def _solver(dtype):
    from cupy.cuda import cusolver

    p = "d" if dtype == cp.float64 else "s"
    return (getattr(cusolver, f"{p}geqrf_bufferSize"), getattr(cusolver, f"{p}geqrf"),
            getattr(cusolver, f"{p}orgqr_bufferSize"), getattr(cusolver, f"{p}orgqr"))


def qr(a, mode: str):
    """``(Q or None, R)`` of ``a`` (``m x n``, :func:`supports`) with ``diag(R) >= 0``;
    ``mode`` ``"reduced"``, ``"complete"`` or ``"r"`` (Q None)."""
    from cupy.cuda import device

    m, n = a.shape
    cols = m if mode == "complete" else n
    # buf is Q's column-major (m x cols) storage: C-order (cols x m); A goes into its top
    buf = cp.empty((cols, m), dtype=a.dtype)
    if a.flags.f_contiguous and not a.flags.c_contiguous:
        buf[:n] = a.T  # a's memory is column-major already: a plain copy
    else:
        _transpose(a if a.strides[1] == a.itemsize else cp.ascontiguousarray(a), buf[:n])
    handle = device.get_cusolver_handle()
    geqrf_size, geqrf, orgqr_size, orgqr = _solver(a.dtype)
    info = cp.empty((), dtype=cp.int32)
    tau = cp.empty(n, dtype=a.dtype)
    lwork = geqrf_size(handle, m, n, buf.data.ptr, m)
    if mode != "r":
        lwork = max(lwork, orgqr_size(handle, m, cols, n, buf.data.ptr, m, tau.data.ptr))
    work = cp.empty(max(lwork, 1), dtype=a.dtype)
    geqrf(handle, m, n, buf.data.ptr, m, tau.data.ptr, work.data.ptr, lwork, info.data.ptr)
    # diag(R) >= 0: R's row i and Q's column i times sign(r_ii) (+1 for 0 or NaN)
    sgn = cp.where(cp.diagonal(buf[:n, :n]) < 0, -1.0, 1.0).astype(a.dtype)
    r = cp.empty((n, n), dtype=a.dtype)
    _transpose(buf[:n, :n], r, upper=True, sgn=sgn)
    if mode == "r":
        return None, r
    orgqr(handle, m, cols, n, buf.data.ptr, m, tau.data.ptr, work.data.ptr, lwork,
          info.data.ptr)
    buf[:n] *= sgn[:, None]  # Q's first n columns: rows of its column-major storage
    return buf.T, r


def raw(a):
    """``(h, tau)`` as ``cupy.linalg.qr(a, mode="raw")`` gives them (``h`` the transpose of
    geqrf's column-major array, ``(n, m)``) for a real float32/float64 2-D ``a``, without
    its wait for geqrf's ``info`` (which reports only invalid arguments)."""
    from cupy.cuda import device

    m, n = a.shape
    h = cp.empty((n, m), dtype=a.dtype)
    h[...] = a.T
    tau = cp.empty(min(m, n), dtype=a.dtype)
    if min(m, n) == 0:
        return h, tau
    handle = device.get_cusolver_handle()
    geqrf_size, geqrf, _, _ = _solver(a.dtype)
    lwork = geqrf_size(handle, m, n, h.data.ptr, m)
    work = cp.empty(max(lwork, 1), dtype=a.dtype)
    info = cp.empty((), dtype=cp.int32)
    geqrf(handle, m, n, h.data.ptr, m, tau.data.ptr, work.data.ptr, lwork, info.data.ptr)
    return h, tau


def steps(w, j0: int, j1: int):
    """cuSOLVER ``geqrf`` of ``w[j0:, j0:j1]`` in place, then ``ormqr`` applying its
    ``Q^T`` to ``w[j0:, j1:]`` in place; returns ``tau`` (``j1 - j0``). ``w``: a real
    float32/float64 Fortran-order ``m x n`` array with ``m - j0 >= j1 - j0``. No wait for
    either call's ``info`` (it reports only invalid arguments)."""
    from cupy.cuda import cublas, cusolver, device

    m, n = w.shape
    rows, cols = m - j0, j1 - j0
    p = "d" if w.dtype == cp.float64 else "s"
    geqrf_size, geqrf = getattr(cusolver, f"{p}geqrf_bufferSize"), getattr(cusolver, f"{p}geqrf")
    ormqr_size, ormqr = getattr(cusolver, f"{p}ormqr_bufferSize"), getattr(cusolver, f"{p}ormqr")
    it = w.itemsize
    a = w.data.ptr + (j0 + j0 * m) * it
    c = w.data.ptr + (j0 + j1 * m) * it
    tau = cp.empty(cols, dtype=w.dtype)
    handle = device.get_cusolver_handle()
    lwork = geqrf_size(handle, rows, cols, a, m)
    side, trans = cublas.CUBLAS_SIDE_LEFT, cublas.CUBLAS_OP_T
    if j1 < n:
        lwork = max(lwork, ormqr_size(handle, side, trans, rows, n - j1, cols, a, m,
                                      tau.data.ptr, c, m))
    work = cp.empty(max(lwork, 1), dtype=w.dtype)
    info = cp.empty((), dtype=cp.int32)
    geqrf(handle, rows, cols, a, m, tau.data.ptr, work.data.ptr, lwork, info.data.ptr)
    if j1 < n:
        ormqr(handle, side, trans, rows, n - j1, cols, a, m, tau.data.ptr, c, m,
              work.data.ptr, lwork, info.data.ptr)
    return tau


def form_q(w, tau):
    """``Q`` (``m x k``, Fortran order, ``k = len(tau)``) by cuSOLVER ``orgqr`` over the
    reflectors in ``w[:, :k]`` (a Fortran-order array from :func:`steps`; overwritten)."""
    from cupy.cuda import device

    m = w.shape[0]
    k = tau.shape[0]
    _gs, _g, orgqr_size, orgqr = _solver(w.dtype)
    handle = device.get_cusolver_handle()
    lwork = orgqr_size(handle, m, k, k, w.data.ptr, m, tau.data.ptr)
    work = cp.empty(max(lwork, 1), dtype=w.dtype)
    info = cp.empty((), dtype=cp.int32)
    orgqr(handle, m, k, k, w.data.ptr, m, tau.data.ptr, work.data.ptr, lwork, info.data.ptr)
    return w[:, :k]


#: side streams a stack's members are dealt to (cuSOLVER's geqrf/orgqr of a small matrix
#: is a chain of latency-bound launches that leaves most of the GPU idle; members on
#: several streams overlap). 1: every call on the current stream. H200, 16 MB stacks,
#: `python bench/probes/batched2_gpu.py`: geqrf-wy on 16 lanes 2.0-6.6x cupy.linalg.qr
#: with 8 or more members (4 lanes 1.9-3.9x, 8 lanes 1.9-5.5x)
STREAMS = 16

_side: dict = {}

#: whether each side stream's members are issued by a host thread of its own (where a
#: library call waits on the host, the lanes' waits overlap); False: one thread issues all
THREADS = False


class _Lanes:
    """Host threads issuing the side streams' calls, one per lane, on one device."""

    def __init__(self, k: int, dev: int):
        from concurrent.futures import ThreadPoolExecutor

        self.dev = dev
        self.ex = ThreadPoolExecutor(max_workers=k, thread_name_prefix="mpqr-lane")

    def map_lanes(self, lane, k, call=None, args=()) -> None:
        def run(j):
            with cp.cuda.Device(self.dev):
                lane(j, call, args)

        for f in [self.ex.submit(run, j) for j in range(k)]:
            f.result()


_pools: dict = {}


def _pool(k: int, dev: int) -> _Lanes:
    key = (k, dev)
    if key not in _pools:
        _pools[key] = _Lanes(k, dev)
    return _pools[key]


def _side_streams(k: int):
    """``k`` (stream, cuSOLVER handle on it) pairs of the current device, made once."""
    from cupy.cuda import cusolver

    dev = cp.cuda.Device().id
    got = _side.setdefault(dev, [])
    while len(got) < k:
        st = cp.cuda.Stream(non_blocking=True)
        h = cusolver.create()
        cusolver.setStream(h, st.ptr)
        got.append((st, h))
    return got[:k]


def _deal(nb: int, lanes, cur, dev: int, issue) -> None:
    """``issue(j, i)`` for every member ``i`` on lane ``j = i % len(lanes)``: each lane's
    calls on its stream, after the current stream's work so far; the current stream then
    waits for every lane."""
    k = len(lanes)

    def lane(j, *_):
        # CuPy's cuSOLVER wrappers set the handle's stream to the current one before each
        # call: the lane's stream is made current around its calls
        with lanes[j][0]:
            for i in range(j, nb, k):
                issue(j, i)

    if k > 1:  # side streams start after the current stream's copy, it waits for them
        ev = cur.record()
        for st, _ in lanes:
            st.wait_event(ev)
    if k > 1 and THREADS:
        _pool(k, dev).map_lanes(lane, k, None, ())
    else:
        for j in range(k):
            lane(j)
    if k > 1:
        for st, _ in lanes:
            cur.wait_event(st.record())


def _lanes(nb: int, streams: int | None):
    """``(lanes, current stream, device id)`` for a stack of ``nb`` members."""
    from cupy.cuda import device

    cur = cp.cuda.get_current_stream()
    k = max(1, min(nb, STREAMS if streams is None else streams))
    lanes = [(cur, device.get_cusolver_handle())] if k == 1 else _side_streams(k)
    return lanes, cur, cp.cuda.Device().id


def supports_cholesky_stack(g) -> bool:
    """A real float32/float64 stack of square matrices with members."""
    return (g.ndim > 2 and g.dtype in (cp.float32, cp.float64)
            and g.shape[-1] == g.shape[-2] > 0 and g.size > 0)


def cholesky_stack(g, *, streams: int | None = None):
    """Upper Cholesky factors ``R`` (``g = R^T R``) of every member of a symmetric stack
    (:func:`supports_cholesky_stack`; the lower triangle is read): cuSOLVER ``potrf`` per
    member dealt to ``streams`` side streams as :func:`qr_stack` deals ``geqrf``, instead
    of ``potrfBatched`` (built for small matrices). Failure shows only in ``info``, which
    is not read: a member that did not factor has a factor whose column norms do not
    reproduce ``diag(g)``."""
    from cupy.cuda import cublas, cusolver

    *_, n = g.shape
    nb = g.size // (n * n)
    buf = cp.array(g, order="C", copy=True)
    lanes, cur, dev = _lanes(nb, streams)
    p = "d" if g.dtype == cp.float64 else "s"
    size, potrf = getattr(cusolver, f"{p}potrf_bufferSize"), getattr(cusolver, f"{p}potrf")
    # row-major storage read column-major is the same symmetric matrix; column-major L
    # (lower) is row-major R = L^T (upper)
    lo = cublas.CUBLAS_FILL_MODE_LOWER
    lwork = max(1, size(lanes[0][1], lo, n, buf.data.ptr, n))
    k = len(lanes)
    work = cp.empty((k, lwork), dtype=g.dtype)
    info = cp.empty(k, dtype=cp.int32)
    step, p0 = n * n * g.itemsize, buf.data.ptr
    w = [work[j].data.ptr for j in range(k)]
    ip = [info.data.ptr + 4 * j for j in range(k)]
    _deal(nb, lanes, cur, dev, lambda j, i: potrf(lanes[j][1], lo, n, p0 + i * step, n,
                                                   w[j], lwork, ip[j]))
    r = cp.triu(buf)
    del work, info  # the current stream waited for the lanes: reuse is ordered after
    return r


def supports_stack(a) -> bool:
    """A real float32/float64 stack ``(..., m, n)`` with ``m >= n > 0`` and members."""
    return (a.ndim > 2 and a.dtype in (cp.float32, cp.float64)
            and a.shape[-2] >= a.shape[-1] > 0 and a.size > 0)


def _stack_geqrf(a, mode: str, streams: int | None):
    """geqrf of every member of a stack (:func:`supports_stack`) in one buffer: ``(buf,
    tau, orgqr_call)``, ``buf`` ``(..., cols, m)`` whose member ``i`` is the column-major
    ``m x cols`` storage with geqrf's result in its top ``n`` rows (``cols`` = ``m`` for
    ``mode`` "complete", else ``n``), ``orgqr_call()`` forming every Q in it."""
    *batch, m, n = a.shape
    nb = a.size // (m * n)
    cols = m if mode == "complete" else n
    buf = cp.empty((*batch, cols, m), dtype=a.dtype)
    buf[..., :n, :] = cp.swapaxes(a, -1, -2)
    lanes, cur, dev = _lanes(nb, streams)
    k = len(lanes)
    geqrf_size, geqrf, orgqr_size, orgqr = _solver(a.dtype)
    info = cp.empty(k, dtype=cp.int32)
    tau = cp.empty((*batch, n), dtype=a.dtype)
    h0 = lanes[0][1]
    lwork = geqrf_size(h0, m, n, buf.data.ptr, m)
    if mode not in ("r", "raw"):
        lwork = max(lwork, orgqr_size(h0, m, cols, n, buf.data.ptr, m, tau.data.ptr))
    lwork = max(lwork, 1)
    work = cp.empty((k, lwork), dtype=a.dtype)  # one workspace a lane: calls in stream order
    step, tstep = cols * m * a.itemsize, n * a.itemsize
    p0, t0 = buf.data.ptr, tau.data.ptr
    w = [work[j].data.ptr for j in range(k)]
    ip = [info.data.ptr + 4 * j for j in range(k)]

    def deal(call, *args):
        _deal(nb, lanes, cur, dev, lambda j, i: call(
            lanes[j][1], m, *args, p0 + i * step, m, t0 + i * tstep, w[j], lwork, ip[j]))

    deal(geqrf, n)
    held = (tau, work, info)  # orgqr reads them by pointer: alive until it is queued

    def orgqr_call():
        deal(orgqr, cols, n)
        return held

    return buf, tau, orgqr_call


def raw_stack(a, *, streams: int | None = None):
    """``(h, tau)`` of every member of a stack (:func:`supports_stack`) as
    ``numpy.linalg.qr(a, mode="raw")`` gives them (``h`` ``(..., n, m)``, the transpose of
    each member's geqrf array), geqrf per member dealt to ``streams`` side streams as in
    :func:`qr_stack`, without orgqr and without waiting for any ``info``."""
    buf, tau, _ = _stack_geqrf(a, "raw", streams)
    return buf, tau


def qr_stack(a, mode: str, *, streams: int | None = None):
    """``(Q or None, R)`` of every member of a stack (``(..., m, n)``, :func:`supports_stack`)
    with ``diag(R) >= 0``: cuSOLVER ``geqrf`` (+ ``orgqr``) per member in one shared buffer,
    members dealt round-robin to ``streams`` side streams (default :data:`STREAMS`; 1:
    the current stream), one workspace per stream; layout copies and signs once for the
    whole stack on the current stream."""
    n = a.shape[-1]
    buf, _, orgqr = _stack_geqrf(a, mode, streams)  # orgqr holds tau and the workspace
    top = buf[..., :n, :n]  # column-major R: top[..., j, i] = R[..., i, j]
    sgn = cp.where(cp.diagonal(top, axis1=-2, axis2=-1) < 0, -1, 1).astype(a.dtype)
    r = cp.triu(cp.swapaxes(top, -1, -2)) * sgn[..., :, None]
    if mode == "r":
        return None, r
    orgqr()
    buf[..., :n, :] *= sgn[..., :, None]  # Q's first n columns: rows of the storage
    return cp.swapaxes(buf, -1, -2), r
