"""CuPy backend: cuBLAS through ``cupy.cuda.cublas.gemmEx`` on the current stream.

Row-major ``C = A @ B`` is computed as the column-major ``C^T = B^T A^T``; each
operand is passed without a copy when it is C- or F-ordered (a view with unit
stride in one dimension), with the matching transpose flag and leading
dimension. Anything else is copied to C order first.
"""

from __future__ import annotations

import functools
from types import MappingProxyType
from typing import Any

import numpy as np
from mpqr.backends._base import ArrayAPIBackend, EngineRates
from mpqr.backends.cupy import blas, split_k

from mpqr._errors import DeviceMemoryError, LinAlgError

__all__ = ["COLUMN_VIEW_PARTS", "FAST_TRANSPOSE", "CupyBackend"]

#: ``assign_ct`` of a real 2-D matrix by cuBLAS geam (a tiled transpose) instead of CuPy's
#: copy of the transposed view
FAST_TRANSPOSE = True
#: the engines' fp16 parts of any operand whose unit stride lies along axis 0 (a block of
#: a transposed matrix, not only a whole one) in F order, so that its split runs along
#: that axis (the row-run kernel, ~2.8 TB/s) instead of through transposed tiles (~1.3)
COLUMN_VIEW_PARTS = True

# cudaDataType values; CuPy's runtime module does not export the integer ones.
_CUDA_R_8I = 3
_CUDA_R_32I = 10

# Shipped defaults (H100/H200-class, measured; see bench/results). `mpqr.tune()`
# replaces them with rates measured on the current device.
_HOPPER_RATES = {"native-fp64": 55e12, "native-fp32": 48e12, "tc-fp16": 600e12,
                 "int8": 1400e12, "bandwidth": 3.5e12, "launch_s": 8e-6}
# A100-class (SXM 80 GB; datasheet peaks derated to sustained cuBLAS rates)
_AMPERE_RATES = {"native-fp64": 18e12, "native-fp32": 18e12, "tc-fp16": 250e12,
                 "int8": 500e12, "bandwidth": 1.7e12, "launch_s": 8e-6}


class CupyBackend(ArrayAPIBackend):
    name = "cupy"
    capabilities = frozenset({"fp16", "int8", "tensor-cores"})
    batched_qr_fused = True  # kernels/batched_qr.cu: a stack's whole QR in one launch
    # `precision="auto"` uses no emulated engine: on random data their error on
    # the H200 was at most native's (bench/results/gemm_H200_*), but with
    # per-row/column scaling a product of a matrix graded along k by more than
    # ~2^28 with an inversely graded one loses accuracy native arithmetic keeps.
    auto_engines: frozenset[str] = frozenset()

    def __init__(self, xp: Any):
        super().__init__(xp)
        import cupy

        self._cp = cupy
        self._names: dict[int, str] = {}
        self._rates_memo: tuple[int, EngineRates] | None = None

    @classmethod
    def matches(cls, xp: Any) -> bool:
        from mpqr._array_api import is_cupy_namespace

        return is_cupy_namespace(xp)

    def device_name(self) -> str:
        cp = self._cp
        dev = cp.cuda.Device().id
        name = self._names.get(dev)
        if name is None:  # getDeviceProperties is slow; the name never changes
            raw = cp.cuda.runtime.getDeviceProperties(dev)["name"]
            name = self._names[dev] = raw.decode() if isinstance(raw, bytes) else str(raw)
        return name

    def synchronize(self) -> None:
        self._cp.cuda.get_current_stream().synchronize()

    def rates(self) -> EngineRates:
        # measured by mpqr.tune() on this device when cached, else shipped
        # defaults; memoized: the policy asks for every GEMM it plans
        import importlib

        # the module (``mpqr.tune`` the attribute is the exported function)
        tune = importlib.import_module("mpqr.tune")

        memo = self._rates_memo
        if memo is not None and memo[0] == tune.generation:
            return memo[1]
        cached = tune.load_cached_rates(self)
        rates = EngineRates(cached if cached is not None else
                            _AMPERE_RATES if "A100" in self.device_name() else _HOPPER_RATES)
        self._rates_memo = (tune.generation, rates)
        return rates

    def update_lane(self, a):
        # a stream of its own for the trailing updates (householder_tiled's look-ahead);
        # real 2-D only: complex and stacked products go through cupy.matmul, whose
        # cuBLAS handle (CuPy's) the main stream uses at the same time
        from mpqr.backends._base import SerialLane
        from mpqr.backends.cupy.lane import lane_for_thread

        if a.ndim != 2 or a.dtype not in (self._cp.float32, self._cp.float64):
            return SerialLane()
        return lane_for_thread()

    def _cublas_handle(self):
        # the lane's own handle on the lane's stream (backends/cupy/lane.py), else CuPy's
        from mpqr.backends.cupy.lane import lane_handle

        h = lane_handle()
        return h if h is not None else self._cp.cuda.device.get_cublas_handle()

    def gemm(self, a, b):
        cp = self._cp
        if a.ndim == 2 and b.ndim == 2 and a.dtype == b.dtype and a.shape[1] > 0 and \
                a.dtype in (cp.float32, cp.float64) and (
                    not (a.flags.c_contiguous and b.flags.c_contiguous)
                    or self._on_lane() or blas.is_capturing()) and \
                _blas_operand(cp, a, allow_copy=False) is not None and \
                _blas_operand(cp, b, allow_copy=False) is not None:
            # row-strided views (column blocks of a wider matrix): cuBLAS takes their
            # leading dimension directly, where cupy.matmul first copies them; on the
            # look-ahead lane every GEMM takes the lane's own handle; in a graph capture
            # every GEMM goes through blas.py (cupy.matmul's cuBLAS refuses it)
            from cupy.cuda import cublas, runtime

            f64 = a.dtype == cp.float64
            out = cp.empty((a.shape[0], b.shape[1]), dtype=a.dtype)
            return self._gemm_ex(a, b, out, 1.0, 0.0,
                                 runtime.CUDA_R_64F if f64 else runtime.CUDA_R_32F,
                                 runtime.CUDA_R_64F if f64 else runtime.CUDA_R_32F,
                                 cublas.CUBLAS_COMPUTE_64F if f64 else cublas.CUBLAS_COMPUTE_32F,
                                 np.float64 if f64 else np.float32)
        return cp.matmul(a, b)

    def _on_lane(self):
        from mpqr.backends.cupy.lane import lane_handle

        return lane_handle() is not None

    def gemm_sub_into(self, c, a, b):
        # cuBLAS accumulates into c (beta = 1): no temporary product, one pass over c
        return self._native_into(c, a, b, -1.0, 1.0)

    def gemm_into(self, out, a, b):
        # cuBLAS writes the product into out's rows (beta = 0): no temporary, no copy
        return self._native_into(out, a, b, 1.0, 0.0)

    def _native_into(self, c, a, b, alpha, beta):
        cp = self._cp
        if not (a.ndim == b.ndim == c.ndim == 2 and a.dtype == b.dtype == c.dtype
                and a.dtype in (cp.float32, cp.float64) and a.shape[1] > 0
                and _row_major_out(c)):
            return False
        if _blas_operand(cp, a, allow_copy=False) is None or \
                _blas_operand(cp, b, allow_copy=False) is None:
            return False
        from cupy.cuda import cublas, runtime

        f64 = a.dtype == cp.float64
        self._gemm_ex(a, b, c, alpha, beta, runtime.CUDA_R_64F if f64 else runtime.CUDA_R_32F,
                      runtime.CUDA_R_64F if f64 else runtime.CUDA_R_32F,
                      cublas.CUBLAS_COMPUTE_64F if f64 else cublas.CUBLAS_COMPUTE_32F,
                      np.float64 if f64 else np.float32)
        return True

    def complex_from_parts(self, re, im):
        # the parts written in place: exact, also for non-finite parts (as on NumPy)
        cp = self._cp
        c = cp.empty(re.shape, dtype=cp.complex128 if re.dtype == cp.float64 else cp.complex64)
        c.real[...] = re
        c.imag[...] = im
        return c

    def exponent(self, x):
        # frexp is exact where log2 can round up just below a power of two
        e = self._cp.frexp(x)[1] - 1
        return self._cp.where(self._cp.isfinite(x) & (x > 0), e, 0).astype(self._cp.int32)

    def ldexp(self, x, e):
        from mpqr.backends.cupy.engine_kernels import ldexp_2d

        out = ldexp_2d(x, e) if getattr(e, "ndim", 0) == 2 else None  # a row or column's
        return self._cp.ldexp(x, e) if out is None else out  # exponent read once

    def ldexp_wide(self, x, e):
        from mpqr.backends.cupy.engine_kernels import ldexp_wide_2d

        # the widening and the scaling in one pass (two in CuPy), by the transposes for a
        # view contiguous along its columns
        if getattr(e, "ndim", 0) == 2 and x.ndim == 2:
            out = ldexp_wide_2d(x, e)
            if out is None and (t := ldexp_wide_2d(x.T, e.T)) is not None:
                out = t.T
            if out is not None:
                return out
        return super().ldexp_wide(x, e)

    def ldexp_in_place(self, x, e):
        from mpqr.backends.cupy.engine_kernels import ldexp_2d

        if getattr(e, "ndim", 0) != 2 or ldexp_2d(x, e, out=x) is None:
            self._cp.ldexp(x, e, out=x)

    def assign_ct(self, dst, src):
        cp = self._cp
        from cupy.cuda import cublas

        # CuPy's copy of a transposed view reads it strided (~0.3 TB/s on an H200); cuBLAS
        # geam transposes through tiles. Row-major dst (m x k) = src^T (src k x m) is, in
        # cuBLAS's column-major terms, the k x m matrix op(S)^T of the m x k S.
        if FAST_TRANSPOSE and dst.ndim == src.ndim == 2 and dst.dtype == src.dtype \
                and dst.dtype in (cp.float32, cp.float64) and dst.shape == src.shape[::-1] \
                and min(dst.shape) > 1 and dst.strides[1] == src.strides[1] == dst.itemsize:
            m, k = dst.shape
            ldd, lds = dst.strides[0] // dst.itemsize, src.strides[0] // src.itemsize
            one, zero = np.ones(1, dtype=dst.dtype), np.zeros(1, dtype=dst.dtype)
            handle = self._cublas_handle()
            cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)
            if blas.geam(handle, dst.dtype == cp.float64, cublas.CUBLAS_OP_T,
                         cublas.CUBLAS_OP_N, k, m, one.ctypes.data, src.data.ptr, lds,
                         zero.ctypes.data, dst.data.ptr, ldd, dst.data.ptr, ldd):
                return
        super().assign_ct(dst, src)

    def finite_or_zero(self, x):
        from mpqr.backends.cupy import engine_kernels as k

        out = k.finite_or_zero_fp16(x)
        return super().finite_or_zero(x) if out is None else out

    def mul_in_place(self, x, f):
        from mpqr.backends.cupy.engine_kernels import scale_2d

        # CuPy's multiply indexes a broadcast f per element; the kernel reads it once a row
        if getattr(f, "ndim", 0) != 2 or scale_2d(x, f, out=x) is None:
            x *= f

    # Fused single-pass versions of the engines' conversion steps.
    def all_finite(self, x):
        from mpqr.backends.cupy.engine_kernels import all_finite

        return all_finite(x)

    #: largest Gram matrix (elements) whose small steps run on the host (n = 256 was
    #: 2 ms slower there than on the GPU on an H100; n <= 64 saves ~0.5 ms per QR)
    host_steps_max = 128 * 128
    #: the preconditioned CholQR's steps (shifted factors, P = R P, condition estimates)
    #: launch hundreds of kernels on the GPU at 256 columns: on the host up to 256
    #: (H200, 2^20 x 256 at cond 1e12: 788 kernels, 38-40 ms on the GPU; 177 kernels,
    #: 36.8 ms on the host; `python3 bench/probes/ill_conditioned.py OUT --shapes
    #: 1048576x256 --profile`). CholQR2's own steps stay on the GPU past 128 columns
    #: (the same shape at cond 1 with its steps on the host: 14.1 ms against 11.5)
    precondition_small_max = 256 * 256

    #: below ~2^27 elements cuSOLVER's QR in the input's precision beats the fp32-emulated
    #: recursion, whose leaf panels and launches do not amortise (H200, one process:
    #: 8192^2 106 ms against 97; 16384^2 283 against 486), and below ~2^25 the fp16 and
    #: fp64-emulated ones (4096^2 41 / 40-49 ms against 29-30; 6144^2 44-45 / 51-52 against
    #: 57-59; 8192^2 56-61 / 82-83 against 97-100; ``python3 bench/probes/square_ab.py
    #: OUT small=2048,4096,6144,8192``): cuts between the measured sizes. Checked again
    #: against cuSOLVER's float32 QR (H200, float32 fp16, 3-5 calls each: 4096^2 the library
    #: 29.3 against 28.7 ms; recursion 6144^2 42.7 against 56.4, 8192^2 62.5 against 96.1,
    #: 16384^2 149 against 487; fp32-emulated 12288^2 162 against 232; the sweep rows of
    #: ``python bench/probes/smallgpu_gpu.py``)
    #: fp32-emulated's cut lies between 6144^2 and 8192^2, with the recursion's 8 leaves (eager
    #: calls, H200, one process: 6144^2 60.5 against cuSOLVER's 56.3 ms, 8192^2 80-88
    #: against 96.3; ``python bench/probes/flag_ab.py``, householder_recursive.MAX_LEAVES)
    library_qr_square_max = 2**27
    library_qr_square_max_by_precision = MappingProxyType({"fp16": 2**25,
                                                           "fp32-emulated": 3 * 2**24,
                                                           "fp64-emulated": 2**25})
    #: the certified recursion with native GEMMs against cuSOLVER's geqrf, at the input's
    #: own precision (H200, one process, medians of 9; float64 / float32, ms): 4096^2 42.0
    #: / 27.3 against 30.0 / 28.6, 6144^2 38.1 / 42.4 against 58.1 / 56.3
    #: (``bench/probes/native_recursion.py``); with the spine in blocks
    #: (``householder_recursive.SPINE_BLOCK``; medians of 6): 8192^2 60.5 / 63.5 against
    #: 99.6 / 95.9, 11264^2 123.7 / 131.5 against 192.8 / 190.4, 16384^2 317.2 / 317.4
    #: against 486.9 / 487.5, 20480^2 570.7 / 569.5 against 847.9 / 842.2
    #: (``bench/probes/spine_native.py``), the pool 2.69x / 2.63x the input at 16384^2
    #: (cuSOLVER's 2.07x). Larger sizes were not measured: geqrf keeps them.
    native_recursion_square = (2**25, 20480 * 20480)

    def small(self, x, limit=None):
        # The n x n steps of a CholQR pass (symmetrise, checks, Cholesky, certificate,
        # R2 R1) are ~20 tiny launches and ~7 syncs on the GPU: ~0.7 ms per pass (H100).
        # On the host they cost one transfer each way.
        if x.size > (self.host_steps_max if limit is None else limit):
            return self, x
        from mpqr.backends import get_backend
        from mpqr.backends.numpy.backend import host_namespace

        return get_backend(host_namespace()), x.get()

    # the small-input fast path (``mpqr/_fast.py``): cuSOLVER directly, see small.py.
    # Up to 2^18 elements (4096 x 64) for QR and least squares; QR that the route choice
    # gives to cuSOLVER anyway also takes the direct call up to the square cut (the
    # general route's checks and sign pass cost ~1.1 ms a call: H200, 1024^2 float64
    # 0.81x cupy.linalg.qr through it)
    small_max = 2**18
    direct_qr_max = 2**27
    # least squares takes the one geqrf of [A | b] beyond small_max too: the general
    # route's Gram/CGLS steps cost ~3 ms where geqrf costs a fraction; up to the cut
    # where the library's QR stops winning (H200, float64, fast path / general route:
    # 10000 x 50 0.97 / 3.16 ms, 4000 x 128 2.9 / 5.8, 1000 x 20 0.33 / 3.0; gels
    # against the general route 65536 x 64 2.54 / 3.57 ms, 262144 x 128 8.7 / 5.1;
    # `python bench/probes/smallgpu_gpu.py`, grid; at 2^22 elements 32768 x 128 took
    # 4.4 / 3.7 ms, 100000 x 20 at 2^21 2.1 / 3.1). R's singular values are taken on the
    # host, whose gesdd grows as n^3 (small.SVD_HOST_MAX_N).
    small_lstsq_max = 2**21
    small_lstsq_max_n = 128

    @property
    def small_type(self):
        return self._cp.ndarray

    def small_qr(self, a, mode, single=False):
        from mpqr.backends.cupy import small as _small

        if a.size <= _small.HOST_MAX:  # tiny: one round trip to the host's LAPACK
            return _small.host_qr(a, mode, single)
        return _small.small_qr(a, mode, single)

    def small_lstsq(self, a, b, cond, driver):
        from mpqr.backends.cupy import small as _small

        if a.size + b.size <= _small.HOST_MAX:  # tiny: SciPy's driver on the host
            return _small.host_lstsq(a, b, cond, driver)
        if driver not in (None, "gelsd", "gelss"):  # gelsy: the general route
            return None

        from mpqr.lstsq import _scipy_rules as rules

        single = a.dtype.char in "fF"
        eps = float(np.finfo(a.dtype).eps)
        cut = rules.cutoff(cond, driver or "gelsd", eps, single=single)
        res = _small.small_lstsq(a, b, cut, eps / 2)
        if res is None:
            return None
        x, rsq, rank, s = res
        return (x[:, 0] if b.ndim == 1 else x), rsq, rank, s

    def chol_steps(self, g):
        # one launch and no sync where the host route moves G over, factors it and moves
        # X back (~0.5 ms of GPU idle time per pass at 2^22 x 64, H100)
        from mpqr.backends.cupy import chol_steps as cupy_chol_steps

        if cupy_chol_steps.supports(g):
            return cupy_chol_steps.chol_steps(g)
        # past the kernel's width, library calls without a sync where the steps would
        # otherwise run here as small launches each read back (not where small() takes
        # them to the host)
        if cupy_chol_steps.supports_library(g) and g.size > self.host_steps_max:
            return cupy_chol_steps.library_chol_steps(g)
        return None

    def host_blas_scope(self):
        # Host BLAS on one thread during a call: its host work is the n x n steps of
        # small() (n <= 128), where OpenBLAS's thread wake-ups cost more than the work
        # (H100 host, 16 cores: qr of 2048x128 16-20 ms -> 5.4 ms).
        from mpqr.backends.host.blas import one_thread

        return one_thread()

    def from_small(self, x, like):
        cp = self._cp
        if isinstance(x, cp.ndarray):
            return x
        with cp.cuda.Device(like.device):
            return cp.asarray(x)

    def ignore_fp_warnings(self):
        # the small steps of a factorization may run in NumPy on the host (see small())
        return np.errstate(over="ignore", under="ignore", invalid="ignore")

    def column_norms(self, v):
        from mpqr.backends.cupy.engine_kernels import column_norms

        return column_norms(v)

    def column_sumsq(self, v):
        # CuPy reduces along axis 0 of a tall, narrow array with one block per column:
        # 2.1 ms for 4M x 1, 6.3 ms for 4M x 2 (H200, bench/probes/dask_leaves.py)
        from mpqr.backends.cupy.engine_kernels import column_sumsq

        return column_sumsq(v)

    def max_abs_finite(self, x, axis):
        from mpqr.backends.cupy import engine_kernels as k

        return k.max_abs_finite(x, axis)

    def pow2_shift(self, x, axis, target):
        # one reduction and one elementwise launch, not ~10 (a host-bound cost of
        # every tensor-core GEMM: ~0.3 ms of 1 ms per call in a 8192^2 QR, H100)
        from mpqr.backends.cupy import engine_kernels as k

        return k.shift_of_max(k.max_abs_finite(x, axis), target)

    def add_identity(self, x):
        # the diagonal of a C-contiguous matrix is a strided view of its memory: k entries
        # touched instead of a k x k identity built and added
        if x.ndim == 2 and x.flags.c_contiguous:
            k = min(x.shape)
            x.reshape(-1)[: (k - 1) * (x.shape[1] + 1) + 1: x.shape[1] + 1] += 1
            return
        super().add_identity(x)

    def unit_lower_fp16(self, src, out):
        # one pass (tril, eye, add and the cast are four), correctly rounded from float64
        from mpqr.backends.cupy import engine_kernels as k

        k.unit_lower_fp16(src, out)

    def empty_for(self, like, shape, dtype):
        # a transposed operand (F-order, or a block of one: COLUMN_VIEW_PARTS) gets F-order
        # parts: the split pass then reads and writes consecutive addresses, and cuBLAS
        # and the Triton kernel take either order
        f = _columns_first(like)
        return self._cp.empty(shape, dtype=dtype, order="F" if f else "C")

    def split_fp16(self, x, shift, hi, hf=None, lo=None, lo_shift=11):
        from mpqr.backends.cupy import engine_kernels as k

        if x.ndim == 2 and _columns_first(x) and _columns_first(hi):
            # run the elementwise pass in memory order (C order of the transposes)
            k.split_fp16(x.T, shift.T, hi.T, None if hf is None else hf.T,
                         None if lo is None else lo.T, lo_shift)
            return
        k.split_fp16(x, shift, hi, hf, lo, lo_shift)

    def unscale(self, c, row_shift, col_shift, out_dtype):
        from mpqr.backends.cupy import engine_kernels as k

        return k.unscale(c, row_shift, col_shift, out_dtype)

    def unscale_into(self, c, p, row_shift, col_shift, *, subtract):
        from mpqr.backends.cupy import engine_kernels as k

        if not k.unscale_into(c, p, row_shift, col_shift, subtract):
            super().unscale_into(c, p, row_shift, col_shift, subtract=subtract)

    def to_fp16(self, x):
        return x.astype(self._cp.float16)

    # --- cuBLAS gemmEx ------------------------------------------------------
    def _gemm_ex(self, a, b, out, alpha, beta, in_type, out_type, compute_type, scalar_dtype):
        cp = self._cp
        from cupy.cuda import cublas

        if a.ndim != 2 or b.ndim != 2:
            if self._gemm_strided_batched(a, b, out, alpha, beta, in_type, out_type,
                                          compute_type, scalar_dtype):
                return out
            # irregular stacks (rare): one call per matrix
            for idx in np.ndindex(*out.shape[:-2]):
                self._gemm_ex(a[idx], b[idx], out[idx], alpha, beta, in_type, out_type,
                              compute_type, scalar_dtype)
            return out
        m, k = a.shape
        n = b.shape[1]
        if m == 0 or n == 0:
            return out
        if k == 0:
            out *= beta
            return out
        p = split_k.parts(m, n, k, a.dtype, cp) if beta == 0 else 0
        if p and not self._on_lane() and split_k.gemm_split_k(
                self, a, b, out, p, alpha, (in_type, out_type, compute_type,
                                            scalar_dtype)) is not None:
            return out
        tb, ldb, b = _blas_operand(cp, b)  # B^T as column-major (n x k)
        ta, lda, a = _blas_operand(cp, a)  # A^T as column-major (k x m)
        if not _row_major_out(out):
            raise ValueError("internal: gemm output must be row-major (unit column stride)")
        ldc = out.strides[0] // out.itemsize if m > 1 else n
        al = np.array(alpha, dtype=scalar_dtype)
        be = np.array(beta, dtype=scalar_dtype)
        handle = self._cublas_handle()
        cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)
        blas.gemm_ex(handle, tb, ta, n, m, k, al.ctypes.data, b.data.ptr,
                     in_type, ldb, a.data.ptr, in_type, lda, be.ctypes.data, out.data.ptr,
                     out_type, ldc, compute_type, cublas.CUBLAS_GEMM_DEFAULT)
        return out

    def _gemm_strided_batched(self, a, b, out, alpha, beta, in_type, out_type, compute_type,
                              scalar_dtype) -> bool:
        """One cublasGemmStridedBatchedEx for 3-D stacks with uniform strides."""
        cp = self._cp
        from cupy.cuda import cublas

        if out.ndim != 3 or not out.flags.c_contiguous:
            return False
        nb, m, n = out.shape
        k = a.shape[-1]
        if a.ndim == 2:
            a = a[None]
        if b.ndim == 2:
            b = b[None]
        if a.ndim != 3 or b.ndim != 3 or m == 0 or n == 0 or k == 0 or nb == 0:
            return False
        opa = _blas_operand(cp, a[0], allow_copy=False)
        opb = _blas_operand(cp, b[0], allow_copy=False)
        if opa is None or opb is None:
            return False
        sa = a.strides[0] // a.itemsize if a.shape[0] > 1 else 0
        sb = b.strides[0] // b.itemsize if b.shape[0] > 1 else 0
        ta, lda, _ = opa
        tb, ldb, _ = opb
        al = np.array(alpha, dtype=scalar_dtype)
        be = np.array(beta, dtype=scalar_dtype)
        handle = self._cublas_handle()
        cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)
        blas.gemm_strided_batched_ex(
            handle, tb, ta, n, m, k, al.ctypes.data, b.data.ptr, in_type, ldb,
            sb, a.data.ptr, in_type, lda, sa, be.ctypes.data, out.data.ptr, out_type, n, m * n,
            nb, compute_type, cublas.CUBLAS_GEMM_DEFAULT)
        return True

    def gemm_fp16(self, a16, b16, out=None, alpha=1.0, beta=0.0):
        cp = self._cp
        from cupy.cuda import cublas, runtime

        if out is None:
            shape = (*a16.shape[:-1], b16.shape[-1])
            out = cp.empty(shape, dtype=cp.float32)
            beta = 0.0
        return self._gemm_ex(a16, b16, out, alpha, beta, runtime.CUDA_R_16F, runtime.CUDA_R_32F,
                             cublas.CUBLAS_COMPUTE_32F, np.float32)

    def fused_fp16_kernel(self, m, n, k, dtype):
        from mpqr.backends.cupy import triton_gemm

        return triton_gemm.kernel_name(m, n, k, dtype)

    def fused_fp16_gemm(self, a16, b16, sa, sb, c, *, accumulate, subtract):
        # the unscaling and C -= P in the epilogue of a Triton-compiled GEMM (optional: Triton)
        from mpqr.backends.cupy import triton_gemm

        return triton_gemm.fp16_gemm(a16, b16, sa, sb, c, accumulate=accumulate,
                                     subtract=subtract)

    def fused_sgemm_kernel(self, m, n, k, slice_k):
        from mpqr.backends.cupy import triton_sgemm

        return triton_sgemm.kernel_name(m, n, k, slice_k)

    def add_hi_slices(self, a_hi, b_hi, c, slice_k):
        # the slices added in registers by a CuTe DSL kernel (optional: nvidia-cutlass-dsl)
        from mpqr.backends.cupy import dsl_slices

        return dsl_slices.ENABLED and dsl_slices.add_hi_product(self._cp, a_hi, b_hi, c,
                                                                  slice_k)

    def fused_sgemm(self, a_hi, a_hf, a_lo, b_hi, b_hf, b_lo, sa, sb, c, *, slice_k,
                    accumulate, subtract):
        # tc-sgemm's slices, corrections and unscaling in one Triton kernel (optional: Triton)
        from mpqr.backends.cupy import triton_sgemm

        return triton_sgemm.sgemm_split(a_hi, a_hf, a_lo, b_hi, b_hf, b_lo, sa, sb, c,
                                        slice_k=slice_k, accumulate=accumulate,
                                        subtract=subtract)

    def add_partials(self, c, parts):
        from mpqr.backends.cupy import engine_kernels as k

        if k.add_partials(c, parts):  # one pass, the portable backends' order
            return None
        cp = self._cp
        if not (c.flags.c_contiguous and parts.flags.c_contiguous and parts.ndim == 3
                and c.dtype == parts.dtype == cp.float32 and parts.shape[0] > 0):
            # a block of a Gram matrix (a strided c): one reduction and one addition, not
            # the portable loop's pass per partial (65536 x 4096: float64 auto 106.7 against
            # 124.3 ms, float32 fp32-emulated 63.8 against 99.2; H200,
            # ``python bench/probes/partials_ab.py``)
            c[...] = c + cp.sum(parts, axis=0)
            return None
        from cupy.cuda import cublas, runtime

        # one FP32 GEMM with a row of ones, c as its beta = 1 output, instead of cupy.sum
        # over the leading axis and an addition: a 16384^2 QR took 270 against 281 ms at
        # fp16, 302 against 328-337 at fp32-emulated (H100,
        # ``python3 bench/probes/square_panels.py OUT partials 16384``)
        g = parts.shape[0]
        ones = cp.ones((1, g), dtype=cp.float32)
        self._gemm_ex(ones, parts.reshape(g, -1), c.reshape(1, -1), 1.0, 1.0,
                      runtime.CUDA_R_32F, runtime.CUDA_R_32F, cublas.CUBLAS_COMPUTE_32F,
                      np.float32)

    def gemm_int8(self, a8, b8):
        cp = self._cp
        from cupy.cuda import cublas

        k = a8.shape[-1]
        if k * 128 * 128 >= 2**31:  # worst case: every entry -128
            raise ValueError(f"int8 GEMM with k={k} can overflow int32; split k first")
        # cuBLAS int8 tensor-core GEMMs support only the "TN" layout with
        # k-contiguous operands and leading dimensions that are multiples of 4:
        # pad k with zeros (exact) and pass B as the transpose of a C-ordered B^T.
        kp = -(-k // 16) * 16
        if kp != k:
            a8 = cp.concatenate([a8, cp.zeros((*a8.shape[:-1], kp - k), cp.int8)], axis=-1)
            b8 = cp.concatenate([b8, cp.zeros((*b8.shape[:-2], kp - k, b8.shape[-1]),
                                              cp.int8)], axis=-2)
        a8 = cp.ascontiguousarray(a8)
        b8 = cp.swapaxes(cp.ascontiguousarray(cp.swapaxes(b8, -1, -2)), -1, -2)
        out = cp.empty((*a8.shape[:-1], b8.shape[-1]), dtype=cp.int32)
        return self._gemm_ex(a8, b8, out, 1, 0, _CUDA_R_8I, _CUDA_R_32I,
                             cublas.CUBLAS_COMPUTE_32I, np.int32)

    # --- small dense kernels ------------------------------------------------
    def solve_triangular(self, a, b, *, lower=False, unit_diagonal=False):
        if a.ndim == 2 and b.ndim == 2 and blas.is_capturing() and \
                a.dtype == b.dtype and a.dtype in (self._cp.float32, self._cp.float64):
            # CuPy's TRSM refuses a capturing stream (blas.py)
            return blas.trsm(a, b, lower=lower, unit_diagonal=unit_diagonal)
        if a.ndim == 2 and b.ndim == 2:
            from cupyx.scipy.linalg import solve_triangular

            return solve_triangular(a, b, lower=lower, unit_diagonal=unit_diagonal,
                                    check_finite=False)
        from mpqr.backends.cupy import trsm_stack

        if self.trsm_batched and trsm_stack.supports(a, b):
            # stacks: trsmBatched leaves for the whole stack, not ~2n launches per level
            return trsm_stack.solve(a, b, lower=lower, unit_diagonal=unit_diagonal)
        return super().solve_triangular(a, b, lower=lower, unit_diagonal=unit_diagonal)

    #: stacks' triangular inverses: "solve" (trsm_stack.solve on the identity) or
    #: "blocks" (trsm_stack.inverse_upper: leaves on LEAF right-hand sides, products above)
    stack_inverse = "solve"

    def triangular_inverse(self, r):
        from mpqr.backends.cupy import trsm_stack

        if (self.stack_inverse == "blocks" and self.trsm_batched
                and trsm_stack.supports(r, r)):
            return trsm_stack.inverse_upper(r)
        return super().triangular_inverse(r)

    #: stacks' triangular solves through cuBLAS trsmBatched (trsm_stack); False: the
    #: portable recursion
    trsm_batched = True

    right_solve_block = 64  # cupy_right_solve.MAX_N
    #: float64 leaves of at least 2^15 rows go in 32-column sub-panels (TSQR kernels + one
    #: reconstruction kernel + two update products each): ~0.5 ms per sub-panel at any
    #: height, bound by the TSQR passes' latency and host time, where cuSOLVER's geqrf
    #: costs ~0.3 ms per 32 columns at 8192 rows, ~0.6 at 16384 and ~0.9 at 65536. H100,
    #: recursion at 65536 x 4096 fp64-emulated: 218-241 ms against 263-293 with geqrf
    #: leaves on three machines; float32 (fp16, fp32-emulated) won on some machines and
    #: lost by up to 20% on others: those keep geqrf.
    panel_block = 32
    panel_block_min_rows = 2**15
    panel_block_dtypes = ("float64",)
    ozaki_fused = True  # cupy_ozaki_kernels: one-pass residues, reconstruction into C

    sketches = True

    def sketch_rows(self, a, k, seed):
        from mpqr.backends.cupy import sketch as cupy_sketch

        return cupy_sketch.count_sketch(a, k, seed)

    def right_solve_upper(self, a, r, out=None, sub=None):
        from mpqr.backends.cupy import right_solve as cupy_right_solve

        if cupy_right_solve.supports(a, r):  # tall 2-D real: a row-per-thread kernel
            return cupy_right_solve.right_solve_upper(a, r, out=out, sub=sub)
        return super().right_solve_upper(a, r, out=out, sub=sub)

    def right_solve_gram(self, a, r, out=None, sub=None):
        from mpqr.backends.cupy import right_solve as cupy_right_solve

        if cupy_right_solve.supports_gram(a):  # one read of A (Q1 written only into out)
            return cupy_right_solve.right_solve_gram(a, r, out=out, sub=sub)
        return super().right_solve_gram(a, r, out=out, sub=sub)

    #: the one-pass out-of-core lstsq (kernels/gram_dd.cu: 183-193 GB/s of float64 input
    #: on an H200 against a link-bound pass's ~36 GB/s; `python3 -m mpqr bench ooc --rows
    #: tall_big`)
    gram_dd_max_n = 128

    def gram_dd_update(self, a, b, acc):
        from mpqr.backends.cupy import gram_dd as cupy_gram_dd

        if (a.ndim == b.ndim == 2 and a.dtype == b.dtype == self._cp.float64
                and a.shape[1] + b.shape[1] <= cupy_gram_dd.MAX_N):  # sums in registers
            return cupy_gram_dd.gram_dd_update(a, b, acc)
        return super().gram_dd_update(a, b, acc)

    def right_solve_twice(self, a, r1, r2):
        from mpqr.backends.cupy import right_solve as cupy_right_solve

        if cupy_right_solve.supports(a, r1):  # A read once, Q written once
            return cupy_right_solve.right_solve_twice(a, r1, r2)
        return super().right_solve_twice(a, r1, r2)

    #: Cholesky factors of real stacks: "batched" (CuPy's potrfBatched) or "lanes"
    #: (potrf per member on the side streams, cupy_geqrf.cholesky_stack)
    stack_cholesky = "batched"

    #: real 2-D Cholesky factors and triangular inverses from this many columns on run by
    #: halves on cuBLAS (``chol_blocked``: potrf / trsm leaves of at most ``blocked_leaf``
    #: columns, the rest products). None (the default): never — at 4096 columns on an H200
    #: the halves took 6.4 ms against cuSOLVER potrf's 5.7 (float64) and 65536 x 4096
    #: CholQR2 ran 4 ms faster without them (`python bench/probes/sketch_gpu.py`)
    blocked_chol_min_n: int | None = None
    blocked_leaf = 512

    def _blocked(self, a) -> bool:
        from mpqr.backends.cupy import chol_blocked

        return (self.blocked_chol_min_n is not None and chol_blocked.supports(a)
                and a.shape[-1] >= self.blocked_chol_min_n)

    def right_inverse_upper(self, r):
        if self._blocked(r):
            from mpqr.backends.cupy import chol_blocked

            return chol_blocked.inverse_upper(r, self.blocked_leaf)
        return super().right_inverse_upper(r)

    def cholesky(self, a, *, upper=False, check=True):
        cp = self._cp
        from mpqr.backends.cupy import geqrf as cupy_geqrf

        if self._blocked(a):
            from mpqr.backends.cupy import chol_blocked

            r = chol_blocked.cholesky_upper(a, self.blocked_leaf)
            if check and not bool(cp.all(cp.isfinite(r))):
                raise LinAlgError("Cholesky factorization failed: matrix is not positive "
                                  "definite")
            return r if upper else r.T

        if self.stack_cholesky == "lanes" and cupy_geqrf.supports_cholesky_stack(a):
            r = cupy_geqrf.cholesky_stack(a)
            if check and not bool(cp.all(cp.isfinite(r))):
                raise LinAlgError("Cholesky factorization failed: matrix is not positive "
                                  "definite")
            return r if upper else cp.swapaxes(r, -1, -2)
        # cuSOLVER reports failure through `info`, which CuPy ignores by default.
        l = cp.linalg.cholesky(a)
        if check and not bool(cp.all(cp.isfinite(l))):
            raise LinAlgError("Cholesky factorization failed: matrix is not positive definite")
        return cp.swapaxes(l, -1, -2).conj() if upper else l

    def lu_signed(self, a):
        from mpqr.backends.cupy import lu as cupy_lu

        if cupy_lu.supports(a):  # real 2-D: recursive halves on cuBLAS, 64-blocks in one kernel
            return cupy_lu.lu_signed(a)
        # complex or stacked: one host round trip (the array-API version on the device
        # costs ~10 launches per column of its blocks, ~8 ms at n = 32, measured)
        from mpqr.backends import get_backend

        from mpqr._array_api import array_namespace

        host = np.asarray(a.get())
        l, u, s = get_backend(array_namespace(host)).lu_signed(host)
        return self._cp.asarray(l), self._cp.asarray(u), self._cp.asarray(s)

    #: n x n SVDs up to this size run on the host: cuSOLVER gesvd took 26 ms for
    #: 256 x 256 on an H200 (blocking launches), LAPACK ~7 ms plus a 0.5 MB round trip
    host_svd_max = 256
    #: smallest and largest 2-D factor whose SVD runs on the device by Jacobi (cuSOLVER
    #: gesvdj); past the largest, on the host up to ``host_svd_max``, else cuSOLVER gesvd
    gesvdj_min = 128
    #: 512: 2^18 x 512 float64 mpqr.svd 39.7 ms with gesvdj, 77.4 with gesvd (H200)
    gesvdj_max = 512
    #: how that Jacobi SVD runs (``backends/cupy/small_svd.py``): "gesvdj" on the factor,
    #: "gesvdj-t" on its transpose, "eigh-gesvdj" on it times the eigenvectors of its Gram
    small_svd_route = "gesvdj"

    #: singular values of stacks past 32 columns: "jacobi" (batched_svdvals, one block
    #: per member) where it fits, else the host's LAPACK; "host": always the host
    stack_svdvals = "jacobi"

    def svdvals(self, a):
        if a.ndim == 2 and max(a.shape) <= self.host_svd_max:
            return self._cp.asarray(np.linalg.svd(a.get(), compute_uv=False))
        if a.ndim > 2 and min(a.shape[-2:]) > 32:
            from mpqr.backends.cupy import batched_svdvals

            if self.stack_svdvals == "jacobi" and batched_svdvals.supports(a):
                # past gesvdj's batched 32 x 32 (CuPy loops gesvd per member: 512 x
                # (64x64) float64 241 ms, H200): one-sided Jacobi, a block per member
                return batched_svdvals.svdvals(a)
            if max(a.shape[-2:]) <= self.host_svd_max:
                # LAPACK on the host, the stack's members spread over its cores
                from mpqr.backends.host.stack_svd import threaded_svdvals

                return self._cp.asarray(threaded_svdvals(a.get()))
        return self._cp.linalg.svd(a, compute_uv=False)

    def svd(self, a, *, full_matrices=False):
        cp = self._cp
        if (a.ndim == 2 and not full_matrices and min(a.shape) >= self.gesvdj_min
                and max(a.shape) <= self.gesvdj_max):
            # Jacobi SVD on the device: 256 x 256 float64 9.2 ms against 17.3 ms for the
            # host's LAPACK with its transfers and 31 ms for gesvd (H200,
            # bench/probes/plugins2_gpu.py)
            from mpqr.backends.cupy import small_svd

            return small_svd.svd(a, self.small_svd_route)
        if a.ndim == 2 and max(a.shape) <= self.host_svd_max:
            u, s, vh = np.linalg.svd(a.get(), full_matrices=full_matrices)
            return cp.asarray(u), cp.asarray(s), cp.asarray(vh)
        return cp.linalg.svd(a, full_matrices=full_matrices)

    def householder_levels(self, a):
        from mpqr.backends.cupy import geqrf as cupy_geqrf

        return cupy_geqrf.supports(a)

    def householder_workspace(self, a, p):
        # a gather of a's transpose's rows: column-major in one pass
        return self._cp.take(a.T, p, axis=0).T

    def householder_steps(self, w, j0, j1):
        from mpqr.backends.cupy import geqrf as cupy_geqrf

        return cupy_geqrf.steps(w, j0, j1)

    def householder_q(self, w, tau):
        from mpqr.backends.cupy import geqrf as cupy_geqrf

        return cupy_geqrf.form_q(w, tau)

    def householder_panel(self, a):
        # one cuSOLVER geqrf instead of qr_panel + a host-side signed LU and two solves;
        # stacks keep the portable path (raw mode of stacks is not cuSOLVER-batched)
        from mpqr.backends._base import compact_wy_from_raw
        from mpqr.backends.cupy import geqrf as cupy_geqrf

        if a.ndim != 2:
            return super().householder_panel(a)
        if a.dtype in (self._cp.float32, self._cp.float64):
            # cuSOLVER directly: CuPy's mode "raw" waits for geqrf's info on every panel
            h, tau = cupy_geqrf.raw(a)
        else:
            h, tau = self._cp.linalg.qr(a, mode="raw")  # h: (k, m), transposed like NumPy's
            h, tau = h.astype(a.dtype, copy=False), tau.astype(a.dtype, copy=False)
        return compact_wy_from_raw(self, h, tau, *a.shape)

    def certified_panel(self, a, w, fails):
        from mpqr.backends.cupy import panel_cholqr as cupy_panel_cholqr

        if cupy_panel_cholqr.supports(a) and (w is None or cupy_panel_cholqr.supports(w)):
            # one launch (or three) instead of ~20 small library calls
            return cupy_panel_cholqr.certified_panel(a, w, fails)
        return super().certified_panel(a, w, fails)

    def certified_leaf(self, work, w_all, c0, c1, cert, woff=0, combine=False):
        from mpqr.backends.cupy import panel_cholqr as cupy_panel_cholqr

        if cupy_panel_cholqr.supports_leaf(work, w_all):
            # buffers allocated once per leaf, updates as direct cuBLAS calls: host time
            return cupy_panel_cholqr.certified_leaf(self, work, w_all, c0, c1, cert, woff,
                                                    combine)
        return None

    def reconstruct_panel(self, a):
        from mpqr.backends.cupy import lu as cupy_lu
        from mpqr.backends.cupy import tsqr as cupy_tsqr

        if a.ndim == 2 and a.shape[-1] <= cupy_lu.PANEL and cupy_tsqr.supports(a):
            # TSQR tile kernels for (Q, R), then the reconstruction in one launch; the
            # level-0 reflectors are stored, not recomputed: 0.33 -> 0.29 ms at 16384 x 32
            q, r = cupy_tsqr.tsqr(a, recompute=False)
            return cupy_lu.reconstruct(q, r)
        return super().reconstruct_panel(a)

    #: where a pivoted QR's sketch is factored: "kernel" (a launch a pivot,
    #: backends/cupy/qrcp.py), "host" (LAPACK geqp3 after a copy: ~75 ms a 128-pivot block
    #: at 16384 columns, H200) or "loop" (the portable device loop: ~12 launches a pivot)
    qrcp_route = "kernel"

    #: H200: 16384^2 float64 655 / 630 ms at 192 / 256 columns, 65536 x 4096 235 / 220 ms
    #: (`python -m mpqr bench qr --pivoting --qrcp-blocks 192,256`)
    qrcp_block = 256

    def read_later(self, x):
        # a pinned buffer, an asynchronous copy and an event: the host waits only when it
        # reads, and work queued after the copy keeps the device busy meanwhile
        cp = self._cp
        import cupyx

        buf = cupyx.empty_pinned(x.shape, dtype=x.dtype)
        x.get(out=buf, blocking=False)
        done = cp.cuda.Event(block=False, disable_timing=True)
        done.record()

        def read():
            done.synchronize()
            return buf

        return read

    def qrcp_order(self, y, k):
        from mpqr.backends.cupy import qrcp as cupy_qrcp

        if self.qrcp_route == "kernel" and cupy_qrcp.supports(y):
            return cupy_qrcp.qrcp_order(y, k)
        if self.qrcp_route == "loop":
            return None
        # complex sketches, or the host route asked for: LAPACK on the host
        from mpqr.backends._base import swap_order
        from mpqr.backends.numpy.backend import lapack_qrcp_pivots

        piv = lapack_qrcp_pivots(self._cp.asnumpy(y), k)
        return self._cp.asarray(swap_order(piv, y.shape[1]), dtype=self._cp.int32)

    def diagonal_repair(self, q, r, p, tol, limit):
        # real R: the exchanges in one kernel, the rotations of Q in another
        # (backends/cupy/diag_repair.py); complex: the portable steps
        from mpqr.backends.cupy import diag_repair

        if not diag_repair.supports(r):
            return NotImplemented
        return diag_repair.diagonal_repair(q, r, p, tol, limit)

    #: where the Gram-ordered pivoted QR's pivoted Cholesky runs: "kernel" (a launch a
    #: panel of steps, backends/cupy/pstrf.py; real matrices above ``pstrf_host_max``
    #: columns) or "host" (LAPACK ?pstrf after a copy: ~1 s at 4096 columns on a 16-core
    #: host, H200 round, bench/NOTES.md)
    pstrf_route = "kernel"
    #: Gram matrices of at most this many columns go to the host's LAPACK (a copy of a
    #: few hundred KiB against a launch a panel)
    pstrf_host_max = 128

    def pivoted_cholesky(self, g, tol):
        from mpqr.backends.cupy import pstrf as cupy_pstrf

        if (self.pstrf_route == "kernel" and cupy_pstrf.supports(g)
                and g.shape[0] > self.pstrf_host_max):
            return cupy_pstrf.pivoted_cholesky(g, tol)
        from mpqr.backends.host.pstrf import lapack_pivoted_cholesky

        p, k, gmax = lapack_pivoted_cholesky(g.get(), tol)
        return self._cp.asarray(p), k, gmax

    def permute_columns(self, x, dst, src):
        # one gather and one scatter kernel instead of a slice copy per column
        x[..., dst] = x[..., src]

    library_qr_positive = True  # real 2-D inputs (cupy_geqrf)
    library_qr_signed = True  # every branch below ends with diag(R) >= 0: no sign check
    #: geqrf-wy for stacks beyond the batched kernels, from the width where the TSQR
    #: tile kernels (reduced members up to 64 columns) stop
    stack_q_products_min_n = 65
    #: the fastest of cholqr2-batched, geqrf-wy and geqrf per grid point past the fused
    #: kernel (n >= 65): geqrf-wy on the lanes at every one (cholqr2-batched at most 0.75x
    #: of it: its batched triangular inverses and Cholesky factors cost more than geqrf
    #: on 16 lanes)
    stack_routes = MappingProxyType({
        dt: {n: dict.fromkeys((1, 2, 4, 8, 16), "geqrf-wy") for n in (128, 256, 512)}
        for dt in ("float32", "float64")})
    #: stacks of at most this many members take geqrf (the library per member, each on
    #: its own lane: its orgqr costs less than Q's batched products for so few members;
    #: 1.03-1.3x geqrf-wy at 2 to 4 members)
    stack_library_max_batch = 4
    stack_routes_source = ("H200, 2026-11-28, `python bench/probes/batched2_gpu.py`, "
                           "16 MB stacks against cupy.linalg.qr and torch.linalg.qr")

    def library_qr(self, a, mode):
        # cuSOLVER geqrf (+ orgqr unless mode "r"): real 2-D inputs with the layout copies
        # as tiled transposes and diag(R) >= 0 in the same passes (cupy_geqrf); others by
        # CuPy's own modes, their signs normalised unchecked (mixed anyway)
        from mpqr.backends.cupy import geqrf as cupy_geqrf

        from mpqr.qr._kernels import normalize_signs

        if cupy_geqrf.supports(a):
            return cupy_geqrf.qr(a, mode)
        if a.ndim > 2 and mode != "complete":
            from mpqr.backends import cupy_tsqr

            if cupy_tsqr.supports(a):  # a stack of n <= 64: TSQR tile kernels, no loop
                q, r = normalize_signs(self.xp, *cupy_tsqr.tsqr(a), check=False)
                return (None if mode == "r" else q), r
        if cupy_geqrf.supports_stack(a):  # per member, workspace and sign passes shared
            return cupy_geqrf.qr_stack(a, mode)
        if mode == "r":
            return normalize_signs(self.xp, None, self._cp.linalg.qr(a, mode="r"),
                                   check=False)
        return normalize_signs(self.xp, *self._cp.linalg.qr(a, mode=mode), check=False)

    def library_raw_stack(self, a):
        # cuSOLVER geqrf per member dealt to side streams, no orgqr, no info wait
        from mpqr.backends.cupy import geqrf as cupy_geqrf

        if not cupy_geqrf.supports_stack(a):
            return None
        return cupy_geqrf.raw_stack(a)

    def batched_qr(self, a, mode):
        from mpqr.backends.cupy import batched_qr as k

        if a.dtype in (self._cp.float32, self._cp.float64) and k.fits(a.dtype, *a.shape[-2:]):
            # one block per matrix, one launch for the stack, diag(R) >= 0 in the kernel
            return k.qr(a, mode)
        return None

    def batched_qr_apply(self, a, b):
        from mpqr.backends.cupy import batched_qr as k

        if a.dtype in (self._cp.float32, self._cp.float64) and k.fits(a.dtype, *a.shape[-2:]):
            return k.qr_apply(a, b)
        return None

    def qr_panel(self, a):
        from mpqr.backends.cupy.tsqr import supports, tsqr

        cp = self._cp
        if supports(a):  # tall-skinny float32/float64, n <= 64: TSQR tile kernels
            return tsqr(a)
        if a.ndim == 2:
            return cp.linalg.qr(a)
        *batch, m, n = a.shape
        if 0 in batch:
            k = min(m, n)
            return cp.empty((*batch, m, k), a.dtype), cp.empty((*batch, k, n), a.dtype)
        # wider stacks: cuSOLVER per matrix
        qs, rs = zip(*(cp.linalg.qr(a[idx]) for idx in np.ndindex(*a.shape[:-2])))
        q = cp.stack(qs).reshape(*a.shape[:-2], *qs[0].shape)
        r = cp.stack(rs).reshape(*a.shape[:-2], *rs[0].shape)
        return q, r



def _row_major_out(x):
    """Whether ``x`` can be a cuBLAS output in row-major form: unit column stride and a
    row stride of at least its width (a C-contiguous array or a column block of one)."""
    r, c = x.shape
    it = x.itemsize
    s0, s1 = x.strides
    return (s1 == it or c == 1) and s0 % it == 0 and (s0 // it >= c or r == 1)


def _columns_first(x):
    """Whether a matrix is stored column by column: F-contiguous and not C-contiguous, or
    (:data:`COLUMN_VIEW_PARTS`) any 2-D view with unit stride along axis 0 only."""
    if x.ndim != 2:
        return False
    if not COLUMN_VIEW_PARTS:
        return x.flags.f_contiguous and not x.flags.c_contiguous
    r, c = x.shape
    it = x.itemsize
    return r > 1 and c > 1 and x.strides[0] == it and abs(x.strides[1]) > it


def _blas_operand(cp, x, allow_copy=True):
    """(op, ld, array) describing ``x^T`` as a column-major cuBLAS operand
    (``None`` if that needs a copy and ``allow_copy`` is False)."""
    from cupy.cuda import cublas

    r, c = x.shape
    it = x.itemsize
    s0, s1 = x.strides
    if (s1 == it or c == 1) and (s0 % it == 0) and (s0 // it >= max(c, 1) or r == 1):
        return cublas.CUBLAS_OP_N, max(s0 // it if r > 1 else c, 1), x
    if (s0 == it or r == 1) and (s1 % it == 0) and (s1 // it >= max(r, 1) or c == 1):
        return cublas.CUBLAS_OP_T, max(s1 // it if c > 1 else r, 1), x
    if not allow_copy:
        return None
    x = cp.ascontiguousarray(x)
    return cublas.CUBLAS_OP_N, max(c, 1), x


# --- INT8 Ozaki scheme II (mpqr/engines/ozaki.py); kernels in cupy_ozaki_kernels --

def _cupy_ozaki_line_stats(self, x, axis):
    from mpqr.backends.cupy.ozaki_kernels import line_stats

    return line_stats(x, axis)


def _cupy_ozaki_workspace_limit(self) -> int:
    """Half of the free device memory (counting CuPy's pooled free blocks)."""
    cp = self._cp
    free, _ = cp.cuda.runtime.memGetInfo()
    return int(0.5 * (free + cp.get_default_memory_pool().free_bytes()))


def _cupy_ozaki_residues(self, x, shift, moduli, *, transpose, rows_p, cols_p):
    from mpqr.backends.cupy.ozaki_kernels import residues

    return residues(x, shift, moduli, transpose=transpose, rows_p=rows_p, cols_p=cols_p)


def _cupy_ozaki_int8_gemms(self, ar, brt, k0, k1):
    """All N planes in one strided-batched int8 GEMM, "TN" (both operands k-major):
    cuBLASLt with a timed algorithm choice for large products, else gemmEx."""
    cp = self._cp
    from cupy.cuda import cublas
    from mpqr.backends.cupy import int8_lt as cupy_int8_lt

    out = cp.empty((ar.shape[0], ar.shape[1], brt.shape[1]), dtype=cp.int32)
    # large products: cuBLASLt's fastest candidate, found by timing (1.2-1.4x on H100)
    if cupy_int8_lt.int8_gemms(ar, brt, k0, k1, out):
        return out
    a = ar[:, :, k0:k1]
    b = cp.swapaxes(brt[:, :, k0:k1], 1, 2)  # (N, kc, n) view, unit stride along k
    if not self._gemm_strided_batched(a, b, out, 1, 0, _CUDA_R_8I, _CUDA_R_32I,
                                      cublas.CUBLAS_COMPUTE_32I, np.int32):
        for l in range(ar.shape[0]):  # not expected: the planes are uniform views
            self._gemm_ex(a[l], b[l], out[l], 1, 0, _CUDA_R_8I, _CUDA_R_32I,
                          cublas.CUBLAS_COMPUTE_32I, np.int32)
    return out


def _cupy_ozaki_reconstruct(self, prods, consts, row_shift, col_shift, m, n, out=None):
    from mpqr.backends.cupy.ozaki_kernels import reconstruct

    return reconstruct(prods, consts.moduli, row_shift, col_shift, m, n, out=out)


CupyBackend.ozaki_line_stats = _cupy_ozaki_line_stats
CupyBackend.ozaki_workspace_limit = _cupy_ozaki_workspace_limit
CupyBackend.ozaki_residues = _cupy_ozaki_residues
CupyBackend.ozaki_int8_gemms = _cupy_ozaki_int8_gemms
CupyBackend.ozaki_reconstruct = _cupy_ozaki_reconstruct


def _cupy_ozaki_gauss_residues(self, rr, ri, moduli, js):
    from mpqr.backends.cupy.ozaki_kernels import gauss_residues

    return gauss_residues(rr, ri, moduli, js)


def _cupy_ozaki_gauss_combine(self, prods, moduli, js):
    from mpqr.backends.cupy.ozaki_kernels import gauss_combine

    return gauss_combine(prods, moduli, js)


CupyBackend.ozaki_gauss_residues = _cupy_ozaki_gauss_residues
CupyBackend.ozaki_gauss_combine = _cupy_ozaki_gauss_combine


def gpu_namespace() -> Any:
    """CuPy's namespace when a CUDA GPU is visible, else ``None`` (``mpqr.tune`` default)."""
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() == 0:
            return None
        from mpqr._array_api import array_namespace

        return array_namespace(cupy.zeros(1))
    except Exception:  # no CuPy, no driver or no device: the host is measured instead
        return None


# --- device faults -> clear errors (mpqr._gpu_errors); CuPy-specific exception types ---

_OOM_HINT = (
    "lower the workspace with mpqr.gemm_options(workspace_limit=...) (or "
    "options=mpqr.GemmOptions(workspace_limit=...)), factor fewer or smaller matrices per "
    "call, or free cached blocks with cupy.get_default_memory_pool().free_all_blocks()"
)


def _cupy_translate_error(self, exc, what):
    import re

    cp = self._cp
    from cupy.cuda import compiler, memory, runtime

    if isinstance(exc, _oom_class()):  # already translated by an inner mpqr call
        return None
    if isinstance(exc, DeviceMemoryError):  # the memory plan's refusal: also CuPy's error
        return _oom_class()(str(exc), needed=exc.needed, free=exc.free)
    if isinstance(exc, memory.OutOfMemoryError) or (
            isinstance(exc, runtime.CUDARuntimeError) and getattr(exc, "status", None) == 2):
        pool = cp.get_default_memory_pool()
        m = re.search(r"allocating ([\d,]+) bytes", str(exc))
        need = f"{int(m.group(1).replace(',', '')):,} bytes more" if m else "more memory"
        limit = pool.get_limit()
        cap = f", pool limit {limit:,} bytes" if limit else ""
        return _oom_class()(
            f"{what} ran out of device memory: its workspace needed {need} "
            f"({pool.used_bytes():,} bytes in use{cap}); {_OOM_HINT}. Device said: {exc}",
            needed=int(m.group(1).replace(',', '')) if m else None,
            free=self.device_memory_free())
    if isinstance(exc, compiler.CompileException):
        src = getattr(exc, "source", "") or ""
        names = sorted(set(re.findall(r"__global__\s+void\s+(\w+)", src))) or \
            [str(getattr(exc, "name", "?"))]
        dev = cp.cuda.Device()
        log = str(exc).strip().splitlines()
        return RuntimeError(
            f"{what}: NVRTC could not compile the mpqr kernel {', '.join(names)} for "
            f"sm_{dev.compute_capability} ({self.device_name()}); compiler log: "
            f"{' | '.join(log[:8])}")
    return None


@functools.cache
def _oom_class():
    """CuPy's OutOfMemoryError (a MemoryError) with mpqr's message; made lazily (no CuPy
    import at module load)."""
    from cupy.cuda.memory import OutOfMemoryError

    class MpqrOutOfMemoryError(OutOfMemoryError, DeviceMemoryError):
        def __init__(self, message: str, *, needed: int | None = None,
                     free: int | None = None):
            MemoryError.__init__(self, message)  # CuPy's __init__ wants (size, total, limit)
            self.needed, self.free = needed, free

    return MpqrOutOfMemoryError


CupyBackend.translate_error = _cupy_translate_error


def _cupy_device_memory_free(self):
    # the driver's free memory plus what CuPy's pool holds unused (it is handed out first)
    pool = self._cp.get_default_memory_pool()
    free = int(self._cp.cuda.runtime.memGetInfo()[0] + pool.free_bytes())
    limit = pool.get_limit()  # a pool limit (set_limit) caps what the pool may hand out
    return min(free, max(0, int(limit - pool.total_bytes() + pool.free_bytes()))) \
        if limit else free


def _cupy_host_staging(self, dtype, block_elems, *, nbuf=3, nout=2):
    # pinned ring buffers on their own copy streams (see mpqr.backends.cupy.staging)
    from mpqr.backends.cupy.staging import CupyStaging

    return CupyStaging(self, dtype, block_elems, nbuf=nbuf, nout=nout)


def _cupy_replay(self, key, fn, a, *, overwrite, hold_bytes):
    # repeated calls of a host-bound route as one CUDA graph launch (graphs.py)
    from mpqr.backends.cupy import graphs

    return graphs.replay(self._cp, key, fn, a, overwrite=overwrite, hold_bytes=hold_bytes)


#: The lean plan's hand-backs of the pool's cached blocks are skipped where the device has
#: this many times the call's estimate free beside them (the driver's free memory, within a
#: pool limit): each is a cudaFree, which waits for the device, and the blocks are taken
#: again by cudaMalloc. H200, one process, hand-backs as before against skipped: 16384^2
#: float64 fp64-emulated 377.0 against 353.5 ms, 8192^2 95.2 against 81.3, 16384^2
#: float32 fp16 (lean forced) 313.6 against 274.5 (``python bench/probes/pool_churn.py``)
AMPLE_FREE = 2


def _cupy_memory_ample(self, need):
    # the device's free memory (the driver's, within a pool limit; the pool's cached
    # blocks not counted) covers AMPLE_FREE times the call's estimate
    if need is None:
        return False
    pool = self._cp.get_default_memory_pool()
    free = int(self._cp.cuda.runtime.memGetInfo()[0])
    limit = pool.get_limit()
    if limit:
        free = min(free, int(limit) - int(pool.total_bytes()))
    return free >= AMPLE_FREE * int(need)


def _cupy_release_cached_memory(self, at_least=0, need=None):
    # CuPy's pool counts its cached blocks against a pool limit (set_limit) and hands a
    # request larger than any of them a new block: between the lean plan's phases the
    # workspace of the first would sit beside the factors of the second. Kept graphs hold
    # pools of their own: dropped too (memory is short where this is called)
    if _cupy_memory_ample(self, need):
        return False
    from mpqr.backends.cupy import graphs

    graphs.clear()
    pool = self._cp.get_default_memory_pool()
    if at_least <= 0 or pool.free_bytes() >= at_least:
        pool.free_all_blocks()
    return True


def _cupy_reserve_workspace(self, nbytes, need=None):
    # CuPy's pool gives a request larger than any free chunk a block of its own and merges
    # freed chunks only within their block: temporaries of changing sizes (Q's formation
    # on the lean plan: its trailing rows grow block after block) leave blocks beside
    # blocks. One block of the phase's workspace, held free in the pool, serves them all
    # (best fit, split and merged within it). Where it is free (whole: no temporary
    # outlives a block of Q) and little else is cached, nothing to do; else the cached
    # blocks go back and it is taken again.
    if _cupy_memory_ample(self, need):
        return
    cp = self._cp
    pool = cp.get_default_memory_pool()
    nbytes = -(-int(nbytes) // 512) * 512
    if nbytes <= 0 or nbytes <= pool.free_bytes() <= nbytes + max(nbytes >> 4, 1 << 20):
        return
    pool.free_all_blocks()
    if pool.free_bytes() >= nbytes:  # a block in use holds that much free: use it
        return
    try:
        mem = pool.malloc(nbytes)
    except cp.cuda.memory.OutOfMemoryError:
        return  # no room for it: the temporaries take what the pool finds
    del mem


def _cupy_reserve_scratch(self, nbytes):
    # one block taken from the current allocator (a graph's capture pool included) and
    # given back at once: a pool that holds none as large gets it from the device, and
    # the temporaries after are split from it (best fit) and merge back; one that holds
    # one already splits it and merges it back. Not while a stream is captured (no device
    # allocation there) and not where the device has no room for it.
    cp = self._cp
    if nbytes <= 0 or cp.cuda.get_current_stream().is_capturing():
        return
    try:
        mem = cp.cuda.alloc(int(nbytes))
    except cp.cuda.memory.OutOfMemoryError:
        return
    del mem


CupyBackend.device_memory_free = _cupy_device_memory_free
CupyBackend.release_cached_memory = _cupy_release_cached_memory
CupyBackend.replay = _cupy_replay
CupyBackend.reserve_workspace = _cupy_reserve_workspace
CupyBackend.reserve_scratch = _cupy_reserve_scratch
CupyBackend.host_staging = _cupy_host_staging
