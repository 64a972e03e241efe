"""NumPy reference backend: emulates each tensor-core engine on the CPU.

* fp16 engine: inputs are rounded to float16 exactly as the GPU's
  ``__float2half_rn`` does (NumPy's float16 cast is IEEE round-to-nearest-even,
  subnormals included); fp16 x fp16 products are exact in float32, and the
  accumulation is float32 (BLAS sgemm). The only difference from the tensor
  cores is the rounding *inside* one k-slice: BLAS rounds to nearest, tensor
  cores truncate; across slices both round to nearest.
* int8 engine: int8 x int8 products are < 2^14 and sums of them stay exact in
  float64 while below 2^53, so float64 BLAS computes the exact int32 result.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.linalg as sla
from mpqr.backends._base import ArrayAPIBackend, EngineRates, swap_order
from mpqr.backends.numpy import small as _small

from mpqr._errors import LinAlgError

__all__ = ["NumpyBackend", "lapack_qrcp_pivots"]


def lapack_qrcp_pivots(y: np.ndarray, k: int) -> list[int]:
    """The first ``k`` pivots of LAPACK geqp3 on a small host sketch ``y`` (R only, no Q
    formed); also the CuPy backend's route for sketches its kernel does not take."""
    if min(y.shape) == 0 or k <= 0:
        return []
    from mpqr.backends.host.blas import small_lapack

    with np.errstate(all="ignore"), small_lapack(y.size):
        _, piv = sla.qr(y, mode="r", pivoting=True, check_finite=False)
    return piv[:min(k, *y.shape)].tolist()


class NumpyBackend(ArrayAPIBackend):
    name = "numpy"
    capabilities = frozenset({"fp16", "int8"})  # emulated: correct, not faster

    @classmethod
    def matches(cls, xp: Any) -> bool:
        from mpqr._array_api import is_numpy_namespace

        return is_numpy_namespace(xp)

    def device_name(self) -> str:
        return "cpu"

    # the small-input fast path (``mpqr/_fast.py``): LAPACK directly, see small.py; up to
    # 256 x 256 (measured: `python -m mpqr bench small`, bench/NOTES.md)
    small_max = 2**16
    small_type = np.ndarray

    sketches = True

    def sketch_rows(self, a, k, seed):
        from mpqr.backends.sketch_hash import row_hash

        m = a.shape[0]
        bucket, sign = row_hash(np.arange(m, dtype=np.uint64), k, seed)
        order = np.argsort(bucket, kind="stable")
        rows = bucket[order]
        starts = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]])
        signed = a[order] * sign[order].astype(a.real.dtype)[:, None]
        out = np.zeros((k, a.shape[1]), dtype=a.dtype)
        # one reduction per occupied bucket (sort + reduceat: np.add.at is unbuffered)
        out[rows[starts]] = np.add.reduceat(signed, starts, axis=0)
        return out

    def small_qr(self, a, mode, single=False):
        return _small.small_qr(a, mode, single)

    def small_lstsq(self, a, b, cond, driver):
        return _small.small_lstsq(a, b, cond, driver)

    def ignore_fp_warnings(self) -> Any:
        # NumPy warns where the GPU silently gives IEEE inf/0; the caller checks the result
        return np.errstate(over="ignore", under="ignore", invalid="ignore")

    def rates(self) -> EngineRates:
        # Emulated engines run on the same float BLAS as the native ones, so
        # they can never be faster here; the cost model sees that.
        return EngineRates({"native-fp64": 5e10, "native-fp32": 1e11, "tc-fp16": 1e11,
                            "int8": 5e10, "bandwidth": 1e10, "launch_s": 5e-6})

    def gemm(self, a: Any, b: Any) -> Any:
        # a GEMM propagates NaN/Inf silently, as cuBLAS does; NumPy >= 2.4 flags them
        with np.errstate(over="ignore", invalid="ignore"):
            return np.matmul(a, b)

    def gemm_sub_into(self, c, a, b):
        # c laid out by columns (the pivoted QR's workspace): the product is made in the
        # same order (as (b^T a^T)^T), else the subtraction reads it across its rows
        # (4000^2 pivoted QR, 2-core CPU: 1.6 s of subtraction -> 0.4 s)
        if c.ndim != 2 or c.flags.c_contiguous or c.strides[0] != c.itemsize:
            return False
        with np.errstate(over="ignore", invalid="ignore"):
            c -= np.matmul(b.T, a.T).T
        return True

    def complex_from_parts(self, re, im):
        # the parts written in place: exact, also for non-finite parts
        c = np.empty(re.shape, dtype=np.complex128 if re.dtype == np.float64 else np.complex64)
        c.real, c.imag = re, im
        return c

    def exponent(self, x):
        # frexp is exact where log2 can round up just below a power of two
        e = np.frexp(x)[1] - 1
        return np.where(np.isfinite(x) & (x > 0), e, 0).astype(np.int32)

    def ldexp(self, x, e):
        with np.errstate(over="ignore", under="ignore"):  # IEEE result is what we want
            return np.ldexp(x, e)

    def to_fp16(self, x: Any) -> Any:
        with np.errstate(over="ignore"):  # beyond 65504 is inf, as on the GPU
            return np.asarray(x).astype(np.float16)

    #: the fp16 GEMM's emulation widens its operands to float32 (up to two fp16 copies of an
    #: operand element: 8 bytes) and forms its product before accumulating it (4 bytes):
    #: the policy's tiles of a product on the split engines count them
    split_operand_overhead = 8
    split_product_overhead = 4

    def gemm_fp16(self, a16, b16, out=None, alpha=1.0, beta=0.0):
        with np.errstate(over="ignore", invalid="ignore"):  # as gemm: IEEE, no flags
            prod = np.matmul(a16.astype(np.float32), b16.astype(np.float32))
            if alpha != 1.0:
                prod *= np.float32(alpha)
            if out is None:
                return prod
            if beta == 0.0:
                out[...] = prod
            else:
                out *= np.float32(beta)
                out += prod
        return out

    def add_identity(self, x):
        if x.ndim == 2 and x.flags.c_contiguous and x.flags.writeable:
            k = min(x.shape)
            x.reshape(-1)[: (k - 1) * (x.shape[1] + 1) + 1: x.shape[1] + 1] += 1
            return
        super().add_identity(x)

    def gemm_int8(self, a8, b8):
        k = a8.shape[-1]
        if k * 128 * 128 >= 2**31:  # worst case: every entry -128
            raise ValueError(f"int8 GEMM with k={k} can overflow int32; split k first")
        return np.matmul(a8.astype(np.float64), b8.astype(np.float64)).astype(np.int32)

    def solve_triangular(self, a, b, *, lower=False, unit_diagonal=False):
        if a.ndim == 2 and b.ndim == 2:
            return sla.solve_triangular(a, b, lower=lower, unit_diagonal=unit_diagonal,
                                        check_finite=False)
        return super().solve_triangular(a, b, lower=lower, unit_diagonal=unit_diagonal)

    def max_abs_finite(self, x, axis):
        # one full-size temporary (|x|, zeroed in place where not finite) instead of
        # three: the range check of every QR peaked at 3x the input here
        if x.dtype.kind != "f":
            return super().max_abs_finite(x, axis)
        t = np.abs(x)
        t[~np.isfinite(t)] = 0
        return np.max(t, axis=axis, keepdims=True)

    def _lu_signed_columns(self, w, s, lo, hi):
        # scalar NumPy steps: the array-API loop costs ~4x per column here (phase,
        # expand_dims), ~2.5x on the whole LU at n = 64
        if w.ndim != 2:
            super()._lu_signed_columns(w, s, lo, hi)
            return
        cplx = np.iscomplexobj(w)
        for i in range(lo, hi):
            d = w[i, i]
            si = (-(d / abs(d)) if d != 0 else -1.0) if cplx else (1.0 if d < 0 else -1.0)
            s[i] = si
            w[i, i] = d - si
            if i + 1 < hi:
                w[i + 1:hi, i] /= w[i, i]
                w[i + 1:hi, i + 1:hi] -= np.outer(w[i + 1:hi, i], w[i, i + 1:hi])

    #: QR with column pivoting of a whole matrix: ``qrcp_order`` (LAPACK geqp3) gives the
    #: greedy order at geqp3's speed, the fastest exact route here (2-core CPU, see
    #: bench/NOTES.md)
    qrcp_library = True

    def qrcp_order(self, y, k):
        return np.asarray(swap_order(lapack_qrcp_pivots(y, k), y.shape[1]), dtype=np.int32)

    def pivoted_cholesky(self, g, tol):
        from mpqr.backends.host.pstrf import lapack_pivoted_cholesky

        return lapack_pivoted_cholesky(g, tol)

    def permute_columns(self, x, dst, src):
        x[..., dst] = x[..., src]

    def permutable_copy(self, a):
        # column order: a permute of 128 of 4000 columns takes 0.6 ms instead of 7
        # (rows of a C-order array are gathered element by element)
        return np.array(a, order="F", copy=True)

    def cholesky(self, a, *, upper=False, check=True):
        try:
            l = np.linalg.cholesky(a)
        except np.linalg.LinAlgError as exc:
            raise LinAlgError(f"Cholesky factorization failed: {exc}") from exc
        return np.swapaxes(l, -1, -2).conj() if upper else l

    def svd(self, a, *, full_matrices=False):
        return np.linalg.svd(a, full_matrices=full_matrices)

    def qr_panel(self, a):
        return np.linalg.qr(a)

    library_qr_positive = True  # 2-D LAPACK dtypes (lapack_qr); stacks are checked

    def library_qr(self, a, mode):
        # one LAPACK geqrf/orgqr call on one Fortran copy (numpy.linalg.qr's copies made a
        # square QR slower than SciPy's); skinny calls on one thread (the pivoted QR's
        # candidate panels: 2000 x 256 took 4.6 s on two busy cores)
        from mpqr.backends.host.blas import small_lapack
        from mpqr.backends.numpy.lapack_qr import LAPACK_DTYPES, lapack_qr

        with small_lapack(a.size):
            if a.ndim == 2 and a.size and a.dtype in LAPACK_DTYPES:
                return lapack_qr(a, mode)
            if a.size and a.dtype in LAPACK_DTYPES:
                # a stack: the same LAPACK per member, so that each member's factors equal
                # the single-matrix call's (NumPy's bundled LAPACK can round differently)
                flat = a.reshape(-1, *a.shape[-2:])
                parts = [lapack_qr(x, mode) for x in flat]
                r = np.stack([p[1] for p in parts]).reshape(*a.shape[:-2], *parts[0][1].shape)
                if mode == "r":
                    return None, r
                q = np.stack([p[0] for p in parts]).reshape(*a.shape[:-2], *parts[0][0].shape)
                return q, r
            # NumPy's own mode "r" skips forming Q (LAPACK orgqr)
            if mode == "r":
                return None, np.linalg.qr(a, mode="r")
            return tuple(np.linalg.qr(a, mode=mode))

    def householder_levels(self, a):
        from mpqr.backends.numpy.lapack_qr import LAPACK_DTYPES

        return a.ndim == 2 and a.dtype in LAPACK_DTYPES

    def householder_workspace(self, a, p):
        return np.take(a.T, p, axis=0).T  # column-major

    def householder_steps(self, w, j0, j1):
        from mpqr.backends.host.blas import small_lapack
        from mpqr.backends.numpy.lapack_qr import householder_steps

        with small_lapack(w.size):  # as library_qr: one thread for small calls
            return householder_steps(w, j0, j1)

    def householder_q(self, w, tau):
        from mpqr.backends.host.blas import small_lapack
        from mpqr.backends.numpy.lapack_qr import householder_q

        with small_lapack(w.size):
            return householder_q(w, tau)

    def library_raw_stack(self, a):
        from mpqr.backends.numpy.lapack_qr import LAPACK_DTYPES

        if a.ndim < 3 or not a.size or a.dtype not in LAPACK_DTYPES:
            return None
        h, tau = np.linalg.qr(a, mode="raw")  # LAPACK geqrf per member, in one call
        return h.astype(a.dtype, copy=False), tau.astype(a.dtype, copy=False)

    def householder_panel(self, a):
        # LAPACK geqrf (stacks too) gives the reflectors directly: no reconstruction
        from mpqr.backends._base import compact_wy_from_raw
        from mpqr.backends.host.blas import small_lapack

        with small_lapack(a.size):
            h, tau = np.linalg.qr(a, mode="raw")
        return compact_wy_from_raw(self, h, tau, *a.shape[-2:])


def host_namespace() -> Any:
    """The NumPy namespace (``mpqr.tune``'s fallback device: the host)."""
    from mpqr._array_api import array_namespace

    return array_namespace(np.zeros(1))

