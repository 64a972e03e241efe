"""The Ozaki engine's INT8 GEMMs through cuBLASLt, with the algorithm chosen by timing.

Why: for the engine's strided-batched "TN" int8 products (both operands k-major,
int32 out) ``cublasGemmStridedBatchedEx`` and cuBLASLt's first heuristic choice run
a kernel that another of the heuristic's candidates beats by 1.2-1.4x on an H100
(15 planes of 16384^3: 113 -> 92 ms; of 8192^3: 15.5 -> 11.1 ms; ``python -m mpqr bench
gemm --shapes 16384x16384x16384``). Which candidate wins changes with the shape and the
number of planes, so it is measured, not guessed.

CuPy binds cuBLAS but not cuBLASLt, so the handful of entry points used here are
declared with ctypes against the ``libcublasLt`` that CuPy's cuBLAS loads.

Integer products are exact, so every algorithm gives the same bits: the choice
changes speed only, and results stay bitwise reproducible run to run.

Plans (descriptors and the heuristic's candidates) are cached per device and
shape. The first product of a shape with at least ``AUTOTUNE_MIN_OPS`` operations
runs up to ``MAX_CANDIDATES`` algorithms once each on its own operands and keeps the
fastest, so that one call costs a few times its usual time, once per process; the
explain trace records the choice. Smaller products keep the gemmEx path
(``int8_gemms`` returns False), as does any shape cuBLASLt declines.
"""

from __future__ import annotations

import ctypes
import math
import threading
from typing import Any

import cupy as cp

__all__ = ["AUTOTUNE_MIN_OPS", "ENABLED", "MAX_CANDIDATES", "WORKSPACE_BYTES", "int8_gemms",
           "plan_info"]

#: set False to send every int8 product through cublasGemmStridedBatchedEx
ENABLED = True
#: products (2 * planes * m * n * k) from which cuBLASLt with a timed choice is used;
#: below, one product takes < 4 ms and a trial of every candidate would not pay back
AUTOTUNE_MIN_OPS = 4e12
#: candidates asked of the heuristic and timed (its best 6 held the winner in every
#: shape probed: 15x16384^3, 15x8192^3, 1x16384^3)
MAX_CANDIDATES = 6
#: cuBLASLt's recommended workspace on Hopper
WORKSPACE_BYTES = 32 << 20

_CUDA_R_8I, _CUDA_R_32I, _COMPUTE_32I = 3, 10, 72
_OP_N, _OP_T = 0, 1
_DESC_TRANSA, _DESC_TRANSB = 3, 4
_LAYOUT_BATCH_COUNT, _LAYOUT_BATCH_STRIDE = 5, 6
_PREF_MAX_WORKSPACE = 1

_lock = threading.Lock()
_state: dict[str, Any] = {}
_handles: dict[int, ctypes.c_void_p] = {}
_plans: dict[tuple, Any] = {}


class _Heuristic(ctypes.Structure):
    # cublasLtMatmulHeuristicResult_t
    _fields_ = [("algo", ctypes.c_uint64 * 8), ("workspace", ctypes.c_size_t),
                ("state", ctypes.c_int), ("waves", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


def _load() -> Any:
    """The cuBLASLt library CuPy's cuBLAS uses, or None (then gemmEx is used)."""
    with _lock:
        if "lib" in _state:
            return _state["lib"]
        lib = None
        try:
            cp.cuda.device.get_cublas_handle()  # loads libcublas, and with it libcublasLt
            for name in ("libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"):
                try:
                    lib = ctypes.CDLL(name)
                    break
                except OSError:
                    pass
            if lib is None:
                with open("/proc/self/maps") as maps:
                    paths = [ln.split()[-1] for ln in maps if "libcublasLt" in ln]
                lib = ctypes.CDLL(paths[0]) if paths else None
        except Exception:  # no library: the gemmEx path stays
            lib = None
        _state["lib"] = lib
        return lib


def _check(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"cuBLASLt {what} failed with status {status}")


def _handle(lib: Any) -> ctypes.c_void_p:
    dev = cp.cuda.Device().id
    with _lock:
        h = _handles.get(dev)
        if h is None:
            h = ctypes.c_void_p()
            _check(lib.cublasLtCreate(ctypes.byref(h)), "cublasLtCreate")
            _handles[dev] = h
        return h


class _Plan:
    """Descriptors and candidates of ``C^T (n x m) = op(B') (n x k) op(A') (k x m)`` per plane,
    column-major: the row-major ``C = A' B'^T`` with A' (m x k) and B' (n x k) k-major."""

    def __init__(self, lib: Any, planes: int, m: int, n: int, kc: int, lda: int, ldb: int,
                 sa: int, sb: int):
        self.lib = lib
        self.desc = ctypes.c_void_p()
        _check(lib.cublasLtMatmulDescCreate(ctypes.byref(self.desc), _COMPUTE_32I, _CUDA_R_32I),
               "cublasLtMatmulDescCreate")
        for attr, op in ((_DESC_TRANSA, _OP_T), (_DESC_TRANSB, _OP_N)):
            v = ctypes.c_int32(op)
            _check(lib.cublasLtMatmulDescSetAttribute(self.desc, attr, ctypes.byref(v), 4),
                   "cublasLtMatmulDescSetAttribute")
        self.la = self._layout(_CUDA_R_8I, kc, n, ldb, planes, sb)
        self.lb = self._layout(_CUDA_R_8I, kc, m, lda, planes, sa)
        self.lc = self._layout(_CUDA_R_32I, n, m, n, planes, m * n)
        pref = ctypes.c_void_p()
        _check(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)),
               "cublasLtMatmulPreferenceCreate")
        ws = ctypes.c_uint64(WORKSPACE_BYTES)
        _check(lib.cublasLtMatmulPreferenceSetAttribute(pref, _PREF_MAX_WORKSPACE,
                                                        ctypes.byref(ws), 8),
               "cublasLtMatmulPreferenceSetAttribute")
        found = (_Heuristic * MAX_CANDIDATES)()
        count = ctypes.c_int(0)
        _check(lib.cublasLtMatmulAlgoGetHeuristic(
            _handle(lib), self.desc, self.la, self.lb, self.lc, self.lc, pref, MAX_CANDIDATES,
            found, ctypes.byref(count)), "cublasLtMatmulAlgoGetHeuristic")
        lib.cublasLtMatmulPreferenceDestroy(pref)
        self.algos = [found[i] for i in range(count.value) if found[i].state == 0]
        self.choice: int | None = None
        self.times_ms: list[float] = []

    def _layout(self, dtype: int, rows: int, cols: int, ld: int, batch: int,
                stride: int) -> ctypes.c_void_p:
        lay = ctypes.c_void_p()
        _check(self.lib.cublasLtMatrixLayoutCreate(ctypes.byref(lay), dtype, ctypes.c_uint64(rows),
                                                   ctypes.c_uint64(cols), ctypes.c_int64(ld)),
               "cublasLtMatrixLayoutCreate")
        b, s = ctypes.c_int32(batch), ctypes.c_int64(stride)
        _check(self.lib.cublasLtMatrixLayoutSetAttribute(lay, _LAYOUT_BATCH_COUNT,
                                                         ctypes.byref(b), 4), "batch count")
        _check(self.lib.cublasLtMatrixLayoutSetAttribute(lay, _LAYOUT_BATCH_STRIDE,
                                                         ctypes.byref(s), 8), "batch stride")
        return lay

    def run(self, i: int, a_ptr: int, b_ptr: int, c_ptr: int, ws_ptr: int, stream: int) -> int:
        one, zero = ctypes.c_int32(1), ctypes.c_int32(0)
        return self.lib.cublasLtMatmul(
            _handle(self.lib), self.desc, ctypes.byref(one), ctypes.c_void_p(b_ptr), self.la,
            ctypes.c_void_p(a_ptr), self.lb, ctypes.byref(zero), ctypes.c_void_p(c_ptr), self.lc,
            ctypes.c_void_p(c_ptr), self.lc, ctypes.byref(self.algos[i].algo),
            ctypes.c_void_p(ws_ptr), ctypes.c_size_t(WORKSPACE_BYTES), ctypes.c_void_p(stream))

    def tune(self, args: tuple) -> None:
        """Run each candidate once (each writes the same exact product) and keep the fastest."""
        stream = cp.cuda.get_current_stream()
        times = []
        for i in range(len(self.algos)):
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record(stream)
            status = self.run(i, *args)
            end.record(stream)
            end.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, end) if status == 0 else math.inf)
        self.times_ms = times
        best = min(range(len(times)), key=times.__getitem__)
        self.choice = best if math.isfinite(times[best]) else None


def _plan(planes: int, m: int, n: int, kc: int, lda: int, ldb: int, sa: int | None = None,
          sb: int | None = None) -> Any:
    lib = _load()
    if lib is None:
        return None
    sa = m * lda if sa is None else sa
    sb = n * ldb if sb is None else sb
    key = (cp.cuda.Device().id, planes, m, n, kc, lda, ldb, sa, sb)
    with _lock:
        if key in _plans:
            return _plans[key]
    try:
        plan = _Plan(lib, planes, m, n, kc, lda, ldb, sa, sb)
        plan = plan if plan.algos else None
    except RuntimeError:  # cuBLASLt declines this shape: gemmEx takes it
        plan = None
    with _lock:
        _plans[key] = plan
    return plan


def plan_info(planes: int, m: int, n: int, kc: int, lda: int, ldb: int, sa: int | None = None,
              sb: int | None = None) -> dict | None:
    """The cached plan of a shape: candidates, their trial times (ms) and the choice
    (``sa``, ``sb``: the planes' strides, contiguous planes by default)."""
    sa = m * lda if sa is None else sa
    sb = n * ldb if sb is None else sb
    p = _plans.get((cp.cuda.Device().id, planes, m, n, kc, lda, ldb, sa, sb))
    if p is None:
        return None
    return {"candidates": len(p.algos), "times_ms": list(p.times_ms), "choice": p.choice}


def int8_gemms(ar: Any, brt: Any, k0: int, k1: int, out: Any) -> bool:
    """``out[l] = ar[l, :, k0:k1] @ brt[l, :, k0:k1].T`` (int8 in, int32 out) for every
    plane ``l``; False (``out`` untouched) where the gemmEx path should run instead."""
    planes, m, lda = ar.shape
    n, ldb = brt.shape[1], brt.shape[2]
    kc = k1 - k0
    if (not ENABLED or 2.0 * planes * m * n * kc < AUTOTUNE_MIN_OPS
            or not (_row_planes(ar) and _row_planes(brt) and out.flags.c_contiguous)
            or k0 % 16 or kc % 16):
        return False
    # planes may be row blocks of larger residue arrays (the Gram's blocks): their
    # rows are contiguous, the planes a uniform stride apart
    plan = _plan(planes, m, n, kc, lda, ldb, ar.strides[0], brt.strides[0])
    if plan is None:
        return False
    ws = cp.empty(WORKSPACE_BYTES, dtype=cp.uint8)
    args = (ar.data.ptr + k0, brt.data.ptr + k0, out.data.ptr, ws.data.ptr,
            cp.cuda.get_current_stream().ptr)
    tuned_now = plan.choice is None and not plan.times_ms
    if tuned_now:
        plan.tune(args)  # the winner's product is already in out
        if plan.choice is None:
            return False
    else:
        if plan.choice is None:
            return False
        _check(plan.run(plan.choice, *args), "cublasLtMatmul")
    _trace(plan, planes, m, n, kc, tuned_now)
    return True


def _row_planes(x: Any) -> bool:
    """int8 ``(planes, rows, k)`` with unit-stride, densely packed rows in each plane and
    non-overlapping planes (a C-contiguous array or a row block of one)."""
    s0, s1, s2 = x.strides
    return (x.dtype == cp.int8 and (s2 == 1 or x.shape[2] == 1)
            and (s1 == x.shape[2] or x.shape[1] == 1)
            and (s0 >= x.shape[1] * x.shape[2] or x.shape[0] == 1))


def _trace(plan: _Plan, planes: int, m: int, n: int, kc: int, tuned_now: bool) -> None:
    from mpqr.policy.trace import record_event, tracing

    if not tracing():
        return
    t = plan.times_ms
    how = "timed now" if tuned_now else "timed earlier"
    record_event("int8-gemm",
                 f"int8 GEMMs {planes}x({m}x{n}x{kc}): cuBLASLt candidate {plan.choice + 1} of "
                 f"{len(plan.algos)} ({how}: {t[plan.choice]:.2f} ms; the heuristic's first "
                 f"{t[0]:.2f} ms)", candidates=len(plan.algos), choice=plan.choice,
                 times_ms=list(t))
