"""Small device QR and least squares straight through cuSOLVER, with mpqr's conventions.

The CuPy counterpart of :mod:`mpqr.backends.numpy.small`: the small-input fast path of
:func:`mpqr.qr` and :func:`mpqr.lstsq` (``mpqr/_fast.py``) calls these for exact
``cupy.ndarray`` inputs below the backend's ``small_max``. Each call is a handful of
launches; what costs time at this size is the host side of every CuPy call (H200: ~1 ms
of array creations, reductions and wrapper calls around ~0.3 ms of GPU work at
1000 x 20), so the steps are few and fused:

* QR: one kernel copies ``a`` into cuSOLVER's column-major buffer and gathers its
  column maxima (the range and NaN/Inf check), ``geqrf`` and ``orgqr``/``ungqr`` share
  one workspace allocation, one kernel writes R (rows by the conjugate phase of their
  diagonal entry, the diagonal exactly ``|d|``) and scales Q's columns. The host waits
  only for the maxima's download, which overlaps the factorization, and returns without
  a synchronisation (past :data:`EARLY_CHECK_MAX` the maxima take a pass of their own,
  queued first). With :data:`EARLY_CHECK` off the check reads R afterwards
  (``r_in_range`` of :mod:`mpqr.backends.numpy.small`: R's column norms are A's, so its
  column maxima bound A's, and non-finite input gives a non-finite R).
* Least squares: ``geqrf`` of the augmented ``[A | b]`` (no ``ormqr``): ``Q^H b`` is
  ``R_aug[:n, n:]`` and the squared residual norms the column sums of
  ``|R_aug[n:, n:]|^2``; cuBLAS ``trsm`` solves for ``x`` in place. One device-to-host
  copy of the small ``R_aug``; on the host the checks, the singular values of ``R``
  (SciPy's ``s``) and the rank by SciPy's cutoff; ``x``, the residues and ``s`` go back
  in one upload. With :data:`GRAM_SVD`, ``A^H A`` goes to the host first and its
  Cholesky factor's singular values are taken while cuSOLVER factors, kept where that
  factor matches R.

What the checks reject (NaN/Inf, columns the general route would rescale, a rank below
``n`` or too close to it for a triangular solve) returns None: the general route decides.
"""

from __future__ import annotations

import math
import threading
from typing import Any

import cupy as cp
import numpy as np
from cupy.cuda import runtime
from cupy_backends.cuda.libs import cublas, cusolver
from mpqr.backends.numpy import small as host_small
from mpqr.backends.numpy.small import aug_solve, cmax_in_range, gram_svd, r_in_range

__all__ = ["EARLY_CHECK", "EARLY_CHECK_MAX", "GRAM_SVD", "GRAM_SVD_MIN_N", "HOST_MAX",
           "PACK_ON_DEVICE", "PINNED", "R_HOST_MAX_N", "SOLVE_ON_DEVICE", "SVD_HOST_MAX_N",
           "TILED_COPY_MIN", "host_lstsq", "host_qr", "small_lstsq", "small_qr"]

_PREFIX = {"f": "s", "d": "d", "F": "c", "D": "z"}
#: (dtype char, routine, sizes...) -> workspace elements
_LWORK: dict[tuple[Any, ...], int] = {}
_ONE = {c: np.ones((), dtype=c) for c in "fdFD"}
#: syrk's scalars per dtype character
_ONE_REAL = {c: np.ones((), dtype=c) for c in "fd"}
_ZERO_REAL = {c: np.zeros((), dtype=c) for c in "fd"}
#: least squares with more columns take the general route: R's singular values are taken
#: on the host, where n = 256 was already slower than on the GPU (``host_steps_max``)
SVD_HOST_MAX_N = 128
#: QR's range check copies R to the host up to this many columns (a few kB: cheaper than
#: a reduction launch); beyond, R's column maxima are reduced on the device
R_HOST_MAX_N = 64
#: least squares: the triangular solve by cuBLAS ``trsm`` queued before R_aug's copy
#: (the host then reads x with it) instead of LAPACK's ``trtrs`` on the host (H200,
#: float64 1000 x 20: 336 against 372 us; float32 326 against 355; complex128 408
#: against 438; ``python bench/probes/smallgpu_gpu.py``)
SOLVE_ON_DEVICE = True
#: least squares: R_aug packed by a device-to-device copy before its download (else one
#: strided copy to the host)
PACK_ON_DEVICE = True
#: inputs of at most this many elements (least squares: of ``a`` and ``b``) take the
#: host: one download, LAPACK there (the NumPy fast path, ``mpqr/backends/numpy/
#: small.py``, SciPy's driver for least squares), one upload; cuSOLVER's launches and
#: CuPy's wrappers cost more than that at this size (0: never)
HOST_MAX = 2048
#: least squares past this many elements of a real row-major ``a`` copy it into the
#: column-major buffer by the tiled transpose of ``geqrf.py``
TILED_COPY_MIN = 1 << 18
#: real least squares from this many columns: ``A^T A`` by cuBLAS ``syrk`` from the
#: copy before ``geqrf``, downloaded first, so the host takes its Cholesky factor's
#: singular values while cuSOLVER factors (R's host SVD grows as n^3: ~0.2 ms at
#: n = 50); ``aug_solve`` keeps them where the factor matches R
#: (:data:`~mpqr.backends.numpy.small.GRAM_SVD_TOL`), else takes R's own. Off: mixed
#: on the GPU host (H200, `python bench/probes/smallgpu_gpu.py`, float64 4000 x 50 657
#: against 730 us, 10000 x 50 915 against 966, but 4000 x 128 5.3 against 2.9 ms and
#: float32 10000 x 50 1.6 against 0.88 ms)
GRAM_SVD_MIN_N = 32
GRAM_SVD = False
#: QR checks ``a``'s column maxima (NaN/Inf, the range), downloaded while cuSOLVER
#: works: the host waits for that copy only and returns without waiting for the
#: factorization (the check of R after it cost ~57 us of 1000 x 20's 266, H200); up to
#: this many elements the copy kernel gathers them, beyond a pass of their own (off:
#: R read afterwards)
EARLY_CHECK_MAX = 1 << 18
EARLY_CHECK = True
#: the downloads (QR's R for its check, least squares' R_aug) land in a page-locked
#: buffer kept per thread (a copy to pageable memory is staged by the driver)
PINNED = True

_local = threading.local()


def _host(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """A C-order host array for a download: a view of this thread's page-locked buffer
    (grown by doubling; valid until the thread's next call) or, with :data:`PINNED`
    off, a new pageable array. Only read after the stream's synchronisation."""
    dt = np.dtype(dtype)
    nbytes = dt.itemsize * math.prod(shape)
    if not PINNED:
        return np.empty(shape, dtype=dt)
    buf = getattr(_local, "buf", None)
    if buf is None or buf.nbytes < nbytes:
        import cupyx

        buf = _local.buf = cupyx.empty_pinned(max(nbytes, 2 * (0 if buf is None
                                                              else buf.nbytes), 4096),
                                              dtype=np.uint8)
    return buf[:nbytes].view(dt).reshape(shape)

# [A | b] (or A alone: b is a) into cuSOLVER's column-major buffer; ``xt`` is its
# transpose (C order, shape (columns, m)), ``a`` and ``b`` any 2-D strides
_AUG = cp.ElementwiseKernel(
    "raw T a, raw T b, int64 m, int64 n", "T xt",
    """
    const ptrdiff_t col = i / m, row = i % m;
    if (col < n) { const ptrdiff_t ia[] = {row, col}; xt = a[ia]; }
    else { const ptrdiff_t ib[] = {row, col - n}; xt = b[ib]; }
    """, "mpqr_small_aug", reduce_dims=False)

# A into cuSOLVER's column-major buffer (as _AUG) while each column's max |a_ij| is
# gathered: ``cm`` holds the maxima's bit patterns with the sign bit cleared, whose
# unsigned order is the values' order (NaN's patterns above Inf's), so one integer
# atomicMax per entry keeps the column maximum and any NaN
_BITS = r"""
__device__ inline unsigned long long mpqr_abs_bits(double x) {
    return (unsigned long long)__double_as_longlong(x) & 0x7FFFFFFFFFFFFFFFull;
}
__device__ inline unsigned int mpqr_abs_bits(float x) {
    return __float_as_uint(x) & 0x7FFFFFFFu;
}
"""
_COPY_MAX_REAL = cp.ElementwiseKernel(
    "raw T a, int64 m", "T xt, raw U cm",
    """
    const ptrdiff_t col = i / m, row = i % m;
    const ptrdiff_t ia[] = {row, col};
    const T v = a[ia];
    xt = v;
    atomicMax(&cm[col], mpqr_abs_bits(v));
    """, "mpqr_small_copy_max_real", preamble=_BITS, reduce_dims=False)
_COPY_MAX_COMPLEX = cp.ElementwiseKernel(
    "raw T a, int64 m", "T xt, raw U cm",
    """
    const ptrdiff_t col = i / m, row = i % m;
    const ptrdiff_t ia[] = {row, col};
    const T v = a[ia];
    xt = v;
    atomicMax(&cm[col], mpqr_abs_bits(abs(v)));
    """, "mpqr_small_copy_max_complex", preamble=_BITS, reduce_dims=False)

# the same maxima without the copy (``i`` runs over ``a`` in C order: column ``i % n``)
_MAX_BITS_REAL = cp.ElementwiseKernel(
    "T x, int64 n", "raw U cm", "atomicMax(&cm[i % n], mpqr_abs_bits(x));",
    "mpqr_small_max_bits_real", preamble=_BITS, reduce_dims=False)
_MAX_BITS_COMPLEX = cp.ElementwiseKernel(
    "T x, int64 n", "raw U cm", "atomicMax(&cm[i % n], mpqr_abs_bits(abs(x)));",
    "mpqr_small_max_bits_complex", preamble=_BITS, reduce_dims=False)

# R (n x n, C order) from a column-major buffer ``f`` of leading dimension ``ld``: the
# upper triangle, row ``row`` by the conjugate phase of its diagonal entry, the diagonal
# exactly |d| (``i`` runs over R in C order)
_R_BODY_REAL = """
    const ptrdiff_t row = i / n, col = i % n;
    const T d = f[row * ld + row];
    const T s = d < T(0) ? T(-1) : T(1);
    r = col < row ? T(0) : f[col * ld + row] * s;
"""
_R_BODY_COMPLEX = """
    const ptrdiff_t row = i / n, col = i % n;
    const T d = f[row * ld + row];
    const auto ad = abs(d);
    const T s = ad != 0 ? d / ad : T(1);
    r = col < row ? T(0) : (col == row ? T(ad) : f[col * ld + row] * conj(s));
"""
_R_REAL = cp.ElementwiseKernel("raw T f, int64 ld, int64 n", "T r", _R_BODY_REAL,
                               "mpqr_small_r_real", reduce_dims=False)
_R_COMPLEX = cp.ElementwiseKernel("raw T f, int64 ld, int64 n", "T r", _R_BODY_COMPLEX,
                                  "mpqr_small_r_complex", reduce_dims=False)
# Q and R in one pass after orgqr: ``q`` is Q's column-major storage seen as C order
# (n, m) (``i`` over it), its columns by the phases of the diagonal of the copy ``f``
# of geqrf's R (column-major, leading dimension n); the first n*n threads write R
_QR_REAL = cp.ElementwiseKernel(
    "raw T f, int64 m, int64 n", "T q, raw T rr",
    """
    const ptrdiff_t qc = i / m;
    q = q * (f[qc * n + qc] < T(0) ? T(-1) : T(1));
    if (i < n * n) {
        const ptrdiff_t row = i / n, col = i % n;
        const T s = f[row * n + row] < T(0) ? T(-1) : T(1);
        rr[i] = col < row ? T(0) : f[col * n + row] * s;
    }
    """, "mpqr_small_qr_real", reduce_dims=False)
_QR_COMPLEX = cp.ElementwiseKernel(
    "raw T f, int64 m, int64 n", "T q, raw T rr",
    """
    const ptrdiff_t qc = i / m;
    const T dq = f[qc * n + qc];
    const auto adq = abs(dq);
    q = q * (adq != 0 ? dq / adq : T(1));
    if (i < n * n) {
        const ptrdiff_t row = i / n, col = i % n;
        const T d = f[row * n + row];
        const auto ad = abs(d);
        const T s = ad != 0 ? d / ad : T(1);
        rr[i] = col < row ? T(0) : (col == row ? T(ad) : f[col * n + row] * conj(s));
    }
    """, "mpqr_small_qr_complex", reduce_dims=False)


def _funcs(char: str, *names: str) -> list[Any]:
    p = _PREFIX[char]
    unitary = char in "FD"
    out = []
    for name in names:
        if unitary:
            name = name.replace("orgqr", "ungqr").replace("ormqr", "unmqr")
        out.append(getattr(cusolver, p + name))
    return out


def _lwork(key: tuple[Any, ...], size: Any, *args: Any) -> int:
    lw = _LWORK.get(key)
    if lw is None:
        lw = _LWORK[key] = max(1, int(size(*args)))
    return lw


def small_qr(a: Any, mode: str, single: bool = False) -> tuple[Any, Any] | None:
    """``(Q or None, R)`` of a 2-D tall (``m >= n``) ``a`` with ``diag(R)`` real and
    ``>= 0`` (``mode``: reduced or r; complete returns None), as ``qr(method="geqrf")``
    gives it; None where ``a`` holds NaN/Inf or a column outside the range the general
    route leaves unscaled (:func:`~mpqr.backends.numpy.small.cmax_in_range`; with
    :data:`EARLY_CHECK` off read from R: :func:`~mpqr.backends.numpy.small.r_in_range`).
    ``a`` is never modified (cuSOLVER gets a copy). Q comes back in cuSOLVER's
    column-major order, as from CuPy."""
    m, n = a.shape
    if mode == "complete" or m < n:
        return None
    dt = a.dtype
    single = single or dt.char in "fF"
    if EARLY_CHECK and m * n <= EARLY_CHECK_MAX:
        q, r, event, cmax = _qr(a, mode, check=True)
        event.synchronize()  # the copy kernel's maxima are on the host; cuSOLVER works on
        if not cmax_in_range(cmax, single):
            return None
        return (None, r) if mode == "r" else (q, r)
    if EARLY_CHECK:  # larger: the maxima by their own pass over a, queued first
        event, cmax = _colmax(a)
        if dt.kind == "f":
            from mpqr.backends.cupy import geqrf as cupy_geqrf

            q, r = cupy_geqrf.qr(a, mode)
        else:
            q, r = _qr(a, mode)[:2]
        event.synchronize()
        if not cmax_in_range(cmax, single):
            return None
        return (None, r) if mode == "r" else (q, r)
    if m * n > (1 << 18) and dt.kind == "f":
        # large real inputs: the general route's library call (tiled layout copies)
        from mpqr.backends.cupy import geqrf as cupy_geqrf

        q, r = cupy_geqrf.qr(a, mode)
    else:
        q, r = _qr(a, mode)[:2]
    if n <= R_HOST_MAX_N:
        # the one wait, once everything is queued (a plain copy: ``get``'s checks and
        # allocation cost more than the few kB)
        rh = _host((n, n), dt)
        stream = cp.cuda.get_current_stream()
        runtime.memcpyAsync(rh.ctypes.data, r.data.ptr, rh.nbytes,
                            runtime.memcpyDeviceToHost, stream.ptr)
        stream.synchronize()
        cmax = np.abs(rh).max(axis=0)
    else:
        cmax = cp.abs(r).max(axis=0).get()
    if not r_in_range(cmax, m, n, single):
        return None
    return (None, r) if mode == "r" else (q, r)


def _upload(arrays: list[np.ndarray]) -> list[Any]:
    """Device copies of host arrays (their C or Fortran layout kept) in one transfer:
    views of one device buffer. The host buffer is pageable, so the copy has read it
    when the call returns."""
    offs, total = [], 0
    for x in arrays:
        offs.append(total)
        total += -(-x.nbytes // 16) * 16
    hb = np.empty(max(total, 16), dtype=np.uint8)
    fortran = []
    for x, off in zip(arrays, offs):
        f = x.ndim > 1 and not x.flags.c_contiguous and x.flags.f_contiguous
        fortran.append(f)
        view = hb[off:off + x.nbytes].view(x.dtype)
        view.reshape(x.shape[::-1] if f else x.shape)[...] = x.T if f else x
    db = cp.empty(hb.size, dtype=np.uint8)
    runtime.memcpyAsync(db.data.ptr, hb.ctypes.data, total, runtime.memcpyHostToDevice,
                        cp.cuda.get_current_stream().ptr)
    out = []
    for x, off, f in zip(arrays, offs, fortran):
        d = db[off:off + x.nbytes].view(x.dtype)
        out.append(d.reshape(x.shape[::-1]).T if f else d.reshape(x.shape))
    return out


def host_qr(a: Any, mode: str, single: bool = False) -> tuple[Any, Any] | None:
    """:func:`small_qr` through the host's LAPACK (:data:`HOST_MAX`): ``a`` downloaded,
    :func:`mpqr.backends.numpy.small.small_qr` (its range check; None where it declines
    or for ``mode="complete"``), Q (Fortran order, as cuSOLVER's) and R uploaded."""
    if mode == "complete" or a.shape[0] < a.shape[1]:
        return None
    res = host_small.small_qr(a.get(), mode, single)
    if res is None:
        return None
    q, r = res
    if q is None:
        return None, _upload([r])[0]
    q, r = _upload([np.asfortranarray(q), r])
    return q, r


def host_lstsq(a: Any, b: Any, cond: Any, driver: str | None
               ) -> tuple[Any, Any, Any, Any] | None:
    """SciPy's ``lstsq`` results through the host's LAPACK (:data:`HOST_MAX`): ``a`` and
    ``b`` downloaded, :func:`mpqr.backends.numpy.small.small_lstsq` (SciPy's driver
    call; None for NaN/Inf), ``x``, the squared residual norms and ``s`` uploaded
    together (``s`` None for gelsy)."""
    res = host_small.small_lstsq(a.get(), b.get(), cond, driver)
    if res is None:
        return None
    x, rsq, rank, s = res
    ups = _upload([np.asarray(v) for v in (x, rsq, s) if v is not None])
    x_d = ups.pop(0)
    rsq_d = ups.pop(0) if rsq is not None else None
    s_d = ups.pop(0) if s is not None else None
    return x_d, rsq_d, rank, s_d


def _colmax(a: Any) -> tuple[Any, np.ndarray]:
    """``(event, cmax)``: ``a``'s column maxima of ``|a_ij|`` (NaN where a column holds
    one) queued for a host view ``cmax``, valid once ``event`` has completed."""
    n = a.shape[1]
    bits = np.uint32 if a.dtype.char in "fF" else np.uint64
    cm = cp.empty(n, dtype=bits)
    stream = cp.cuda.get_current_stream()
    runtime.memsetAsync(cm.data.ptr, 0, cm.nbytes, stream.ptr)
    (_MAX_BITS_COMPLEX if a.dtype.kind == "c" else _MAX_BITS_REAL)(a, n, cm)
    host = _host((n,), bits)
    runtime.memcpyAsync(host.ctypes.data, cm.data.ptr, cm.nbytes,
                        runtime.memcpyDeviceToHost, stream.ptr)
    event = _event()
    event.record(stream)
    return event, host.view(np.float32 if a.dtype.char in "fF" else np.float64)


def _event() -> Any:
    """This thread's event on the current device for the early check's wait."""
    events = getattr(_local, "events", None)
    if events is None:
        events = _local.events = {}
    dev = runtime.getDevice()
    ev = events.get(dev)
    if ev is None:
        ev = events[dev] = cp.cuda.Event(block=False, disable_timing=True)
    return ev


def _qr(a: Any, mode: str, check: bool = False) -> tuple[Any, Any, Any, Any]:
    """cuSOLVER's QR of the tall ``a`` with ``diag(R) >= 0``: ``(Q or None, R, event,
    cmax)``; with ``check``, ``cmax`` (a host view, valid once ``event`` has completed)
    receives ``a``'s column maxima of ``|a_ij|`` (NaN where a column holds one), queued
    before the factorization; else both are None."""
    m, n = a.shape
    dt = a.dtype
    char, item = dt.char, dt.itemsize
    xt = cp.empty((n, m), dtype=dt)  # Q's column-major storage, A copied in
    xp = xt.data.ptr
    handle = cp.cuda.device.get_cusolver_handle()
    geqrf, gsize = _funcs(char, "geqrf", "geqrf_bufferSize")
    lw = _lwork((char, "geqrf", m, n), gsize, handle, m, n, xp, m)
    want_q = mode != "r"
    if want_q:
        orgqr, osize = _funcs(char, "orgqr", "orgqr_bufferSize")
        lw = max(lw, _lwork((char, "orgqr", m, n), osize, handle, m, n, n, xp, m, xp))
    # one allocation: workspace, geqrf's R (Q's pass reads it after orgqr), tau, info,
    # the column maxima's bit patterns
    nr = n * n if want_q else 0
    cm_off = -(-((lw + nr + n) * item + 8) // 8) * 8
    bits = np.uint32 if char in "fF" else np.uint64
    cm_bytes = n * np.dtype(bits).itemsize if check else 0
    buf = cp.empty(cm_off + cm_bytes, dtype=np.uint8)
    work = buf.data.ptr
    rcopy = work + lw * item
    tau = rcopy + nr * item
    info = tau + n * item
    event = cmax = None
    stream = cp.cuda.get_current_stream()
    if check:
        cm = buf[cm_off:].view(bits)
        runtime.memsetAsync(cm.data.ptr, 0, cm_bytes, stream.ptr)
        (_COPY_MAX_COMPLEX if dt.kind == "c" else _COPY_MAX_REAL)(a, m, xt, cm)
        host = _host((n,), bits)
        runtime.memcpyAsync(host.ctypes.data, cm.data.ptr, cm_bytes,
                            runtime.memcpyDeviceToHost, stream.ptr)
        event = _event()
        event.record(stream)
        cmax = host.view(np.float32 if char in "fF" else np.float64)
    else:
        _AUG(a, a, m, n, xt)
    geqrf(handle, m, n, xp, m, tau, work, lw, info)
    r = cp.empty((n, n), dtype=dt)
    if not want_q:
        (_R_COMPLEX if dt.kind == "c" else _R_REAL)(xt, m, n, r)
        return None, r, event, cmax
    if n:
        runtime.memcpy2DAsync(rcopy, n * item, xp, m * item, n * item, n,
                              runtime.memcpyDeviceToDevice, stream.ptr)
    orgqr(handle, m, n, n, xp, m, tau, work, lw, info)
    cbuf = cp.ndarray((nr,), dtype=dt, memptr=buf.data + lw * item)
    (_QR_COMPLEX if dt.kind == "c" else _QR_REAL)(cbuf, m, n, xt, r)
    return xt.T, r, event, cmax


def small_lstsq(a: Any, b: Any, cut: float, u: float) -> tuple[Any, Any, Any, Any] | None:
    """Least squares of a tall (``m >= n``) full-rank ``a`` with 1-D/2-D ``b`` of its
    dtype by the QR of ``[a | b]``: ``(x, rsq, rank, s)`` with ``x`` of shape ``(n, k)``,
    ``rsq`` the squared residual norms ``(k,)`` in the real dtype (None for ``m == n``),
    ``rank == n`` and ``s`` the singular values of ``R`` (those of ``a``), descending,
    on the device. ``cut``: the relative rank cutoff; ``u``: the unit roundoff. None (the
    general route decides) where ``a`` or ``b`` holds NaN/Inf, ``a`` a column out of
    range, or where the rank by ``cut`` is below ``n`` or ``R`` is too close to it for a
    triangular solve (:func:`~mpqr.backends.numpy.small.aug_solve`). The inputs are never
    modified."""
    m, n = a.shape
    if m < n or not 0 < n <= SVD_HOST_MAX_N:
        return None
    b2 = b[:, None] if b.ndim == 1 else b
    k = b2.shape[1]
    w = n + k
    p = min(m, w)  # rows of R_aug
    dt = a.dtype
    char, item = dt.char, dt.itemsize
    xt = cp.empty((w, m), dtype=dt)  # [A | b], column-major
    if (dt.kind == "f" and m * n > TILED_COPY_MIN and a.strides[1] == item
            and a.strides[0] >= n * item):
        # a large row-major A: the tiled transpose reads and writes whole lines (the
        # element-wise copy reads a column's entries a row apart)
        from mpqr.backends.cupy import geqrf as cupy_geqrf

        cupy_geqrf._transpose(a, xt[:n])
        xt[n:] = b2.T
    else:
        _AUG(a, b2, m, n, xt)
    xp = xt.data.ptr
    handle = cp.cuda.device.get_cusolver_handle()
    geqrf, gsize = _funcs(char, "geqrf", "geqrf_bufferSize")
    lw = _lwork((char, "geqrf", m, w), gsize, handle, m, w, xp, m)
    # one allocation: workspace, tau, info, then R_aug's packed copy and A^H A (256-byte
    # aligned); on the host one buffer for both downloads
    gram = GRAM_SVD and n >= GRAM_SVD_MIN_N and dt.kind == "f"  # syrk (no herk in CuPy)
    off = -(-((lw + p) * item + 8) // 256) * 256
    rbytes = p * w * item
    goff = -(-rbytes // 256) * 256
    gbytes = n * n * item if gram else 0
    buf = cp.empty(off + goff + gbytes, dtype=np.uint8)
    work = buf.data.ptr
    packed = work + off
    hostbuf = _host((goff + gbytes,), np.uint8)
    host = hostbuf[:rbytes].view(dt).reshape(w, p)
    stream = cp.cuda.get_current_stream()
    event = None
    if gram:  # A^H A's upper triangle (column-major), downloaded before geqrf runs
        gdev = packed + goff
        syrk = getattr(cublas, _PREFIX[char] + "syrk")
        syrk(cp.cuda.device.get_cublas_handle(), cublas.CUBLAS_FILL_MODE_UPPER,
             cublas.CUBLAS_OP_T, n, m, _ONE_REAL[char].ctypes.data, xp, m,
             _ZERO_REAL[char].ctypes.data, gdev, n)
        runtime.memcpyAsync(hostbuf.ctypes.data + goff, gdev, gbytes,
                            runtime.memcpyDeviceToHost, stream.ptr)
        event = _event()
        event.record(stream)
    geqrf(handle, m, w, xp, m, work + lw * item, work, lw, work + (lw + p) * item)
    if SOLVE_ON_DEVICE:  # x over Q^H b in R_aug's rows :n (R stays as it is)
        trsm = getattr(cublas, _PREFIX[char] + "trsm")
        trsm(cp.cuda.device.get_cublas_handle(), cublas.CUBLAS_SIDE_LEFT,
             cublas.CUBLAS_FILL_MODE_UPPER, cublas.CUBLAS_OP_N,
             cublas.CUBLAS_DIAG_NON_UNIT, n, k, _ONE[char].ctypes.data, xp, m,
             xp + n * m * item, m)
    # R_aug's p rows of every column packed on the device, then one contiguous download
    # (the strided copy straight to pageable host memory grew with m: H200, lstsq
    # 10000 x 50 4.2 ms against gels' 0.6, 4000 x 50 0.8 against 0.4, 1000 x 20 on a
    # par); aug_solve drops the reflectors below the diagonal
    if PACK_ON_DEVICE:
        runtime.memcpy2DAsync(packed, p * item, xp, m * item, p * item, w,
                              runtime.memcpyDeviceToDevice, stream.ptr)
        runtime.memcpyAsync(host.ctypes.data, packed, p * w * item,
                            runtime.memcpyDeviceToHost, stream.ptr)
    else:
        runtime.memcpy2DAsync(host.ctypes.data, p * item, xp, m * item, p * item, w,
                              runtime.memcpyDeviceToHost, stream.ptr)
    pre = None
    if event is not None:  # the Gram matrix's SVD while cuSOLVER factors [A | b]
        event.synchronize()
        pre = gram_svd(hostbuf[goff:goff + gbytes].view(dt).reshape(n, n).T)
    stream.synchronize()
    res = aug_solve(host.T, m, n, cut, u, solved=SOLVE_ON_DEVICE, gram=pre)
    if res is None:
        return None
    sol, rsq, rank, s = res
    real = s.dtype
    # x, the residues and s in one upload: views of one device buffer
    xb, rb, sb = n * k * item, (k if rsq is not None else 0) * real.itemsize, \
        n * real.itemsize
    hb = np.empty(xb + rb + sb, dtype=np.uint8)
    hb[:xb].view(dt).reshape(n, k)[...] = sol
    if rsq is not None:
        hb[xb:xb + rb].view(real)[...] = rsq
    hb[xb + rb:].view(real)[...] = s
    db = cp.empty(hb.size, dtype=np.uint8)
    runtime.memcpyAsync(db.data.ptr, hb.ctypes.data, hb.size, runtime.memcpyHostToDevice,
                        stream.ptr)
    x = db[:xb].view(dt).reshape(n, k)
    rsq_d = db[xb:xb + rb].view(real) if rsq is not None else None
    return x, rsq_d, rank, db[xb + rb:].view(real)
