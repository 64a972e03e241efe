"""The backend interface, with portable Array-API defaults.

A backend supplies what the Array API standard lacks and the engines need:
GEMM primitives (native, FP16-in/FP32-out, INT8-in/INT32-out), fp16 rounding,
triangular solve, and small dense kernels. ``ArrayAPIBackend`` implements the
portable part with nothing but the standard (and its ``linalg`` extension), so
any conforming library gets the native engines; NumPy and CuPy override pieces
with LAPACK/cuBLAS/cuSOLVER calls.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any

from mpqr.backends import panel_cholqr as _panel_cholqr

from mpqr._array_api import ct, device, namespace_name

__all__ = ["ArrayAPIBackend", "EngineRates", "SerialLane"]


class EngineRates(dict):
    """Sustained rates the cost model uses (FLOP/s, OP/s, B/s, s per launch)."""


class SerialLane:
    """The look-ahead lane of a backend with one queue: work runs where it is issued.

    ``mark()`` notes the point the lane's next work must wait for on the main queue;
    ``run_after(mark)`` runs a block on the lane after that point; ``main_waits()``
    makes the main queue wait for everything the lane was given."""

    def mark(self) -> Any:
        return None

    @contextlib.contextmanager
    def run_after(self, mark: Any) -> Iterator[None]:
        yield

    def main_waits(self) -> None:
        return None

    @contextlib.contextmanager
    def main_stream(self) -> Iterator[None]:
        """Where the factorization's own (non-lane) work runs: here, where it is."""
        yield


class ArrayAPIBackend:
    """Native engines for any Array API namespace; no tensor-core engines."""

    name = "array-api"
    #: capability flags: "fp16" (fp16 GEMM engine), "int8" (exact int8 GEMM),
    #: "tensor-cores" (the fp16/int8 engines are faster than native ones).
    capabilities: frozenset[str] = frozenset()
    #: k-slice lengths of tc-sgemm's round-to-nearest hi*hi accumulation,
    #: measured on an H200 (bench/results/gemm_*): cuBLAS' kernels for small
    #: outputs truncate more inside the tensor cores than its large ones. The square QR's
    #: error follows the large slice: 32768^2 float32 backward error 4.7e-6 / 8.8e-6 /
    #: 1.7e-5 in 998 / 941 / 917 ms at 1024 / 2048 / 4096 (H200, bench/probes/slice_ab.py)
    tc_sgemm_slice_small = 128
    tc_sgemm_slice_large = 1024
    tc_sgemm_small_mn = 2**24

    def tc_sgemm_slice_k(self, m: int, n: int, k: int) -> int:
        """Default k-slice length for an (m, n, k) tc-sgemm product."""
        return self.tc_sgemm_slice_small if m * n < self.tc_sgemm_small_mn \
            else self.tc_sgemm_slice_large

    def __init__(self, xp: Any):
        self.xp = xp

    @classmethod
    def matches(cls, xp: Any) -> bool:
        return hasattr(xp, "matmul") and hasattr(xp, "linalg")

    def __repr__(self) -> str:
        return f"<mpqr backend {self.name} ({namespace_name(self.xp)})>"

    # --- device -----------------------------------------------------------
    def device_name(self) -> str:
        return f"{namespace_name(self.xp)} default device"

    def synchronize(self) -> None:
        """Wait for queued device work (no-op on the CPU)."""

    def rates(self) -> EngineRates:
        """Engine rates for the cost model; only relative values matter here."""
        return EngineRates({"native-fp64": 2e10, "native-fp32": 4e10, "bandwidth": 1e10,
                            "launch_s": 2e-6})

    # --- exact power-of-two scaling -----------------------------------------
    def exponent(self, x: Any) -> Any:
        """``floor(log2(x))`` for finite ``x > 0`` (int32; 0 for zero/inf/nan)."""
        return _portable_exponent(self.xp, x)

    def ldexp(self, x: Any, e: Any) -> Any:
        """``x * 2**e`` exactly (``e`` an int array broadcasting against ``x``)."""
        xp = self.xp
        # two factors so that 2**h stays representable for any shift we produce
        h = e // 2
        two = xp.asarray(2.0, dtype=x.dtype, device=device(x))
        return (x * xp.pow(two, xp.astype(h, x.dtype))) * xp.pow(two, xp.astype(e - h, x.dtype))

    def ldexp_wide(self, x: Any, e: Any) -> Any:
        """``x * 2**e`` exactly in float64 (a float32 ``x`` widened first; float64 as
        :meth:`ldexp`)."""
        xp = self.xp
        return self.ldexp(xp.astype(x, xp.float64) if x.dtype == xp.float32 else x, e)

    def ldexp_in_place(self, x: Any, e: Any) -> None:
        """``x *= 2**e`` exactly, in place (``e`` an int array broadcasting against ``x``,
        of ``x``'s shape or smaller): no temporary of ``x``'s size."""
        xp = self.xp
        h = e // 2
        two = xp.asarray(2.0, dtype=x.dtype, device=device(x))
        x *= xp.pow(two, xp.astype(h, x.dtype))
        x *= xp.pow(two, xp.astype(e - h, x.dtype))

    def assign_ct(self, dst: Any, src: Any) -> None:
        """``dst[...] = src^H`` (the conjugate transpose of the last two axes)."""
        dst[...] = ct(self.xp, src)

    def finite_or_zero(self, x: Any) -> Any:
        """``x`` with its NaN and infinite entries zeroed (a new array)."""
        xp = self.xp
        return xp.where(xp.isfinite(x), x, xp.zeros_like(x))

    def mul_in_place(self, x: Any, f: Any) -> None:
        """``x *= f`` (``f`` broadcasting against ``x``, of its dtype), in place."""
        x *= f

    # --- fused conversions for the tensor-core engines (overridden on CuPy) ----
    def ignore_fp_warnings(self) -> Any:
        """Context in which IEEE overflow/underflow give inf/0 silently (an expected probe,
        e.g. auto's unscaled CholQR2, which checks its Gram matrix afterwards)."""
        import contextlib

        return contextlib.nullcontext()

    def all_finite(self, x: Any) -> bool:
        """Whether every entry of ``x`` is finite (one host sync)."""
        xp = self.xp
        return bool(xp.all(xp.isfinite(x)))

    def small(self, x: Any, limit: int | None = None) -> tuple[ArrayAPIBackend, Any]:
        """``(backend, array)`` to run the small n x n steps on ``x`` with (Cholesky of a
        Gram matrix, its checks), or to read a few scalars with one transfer: here, this
        backend and ``x`` itself. ``limit``: the caller's own largest size (elements) for
        the host, where a device backend has one."""
        return self, x

    #: largest Gram matrix (elements) whose n x n steps the preconditioned CholQR runs
    #: where :meth:`small` puts them with this ``limit`` (its steps are many small
    #: factorizations, products and solves; see the GPU backend)
    precondition_small_max: int | None = None

    #: whether :meth:`sketch_rows` forms sketches of 2-D float and complex arrays
    sketches: bool = False

    def sketch_rows(self, a: Any, k: int, seed: int) -> Any | None:
        """``S @ a`` for a 2-D ``a`` (``m x n``) and a CountSketch ``S`` (``k x m``): row
        ``i`` of ``a`` is added, with sign ``s_i``, to row ``h_i`` of the result
        (:func:`mpqr.backends.sketch_hash.row_hash` of ``i`` and ``seed``), one pass over ``a``.
        None where the backend has no scatter-add (the caller takes another route)."""
        return None

    def from_small(self, x: Any, like: Any) -> Any:
        """An array from :meth:`small`'s namespace back on ``like``'s device."""
        return x

    def column_norms(self, v: Any) -> Any:
        """2-norms of the columns of a 2-D ``v`` (shape ``(k,)``, real dtype)."""
        return self.xp.linalg.vector_norm(v, axis=0)

    def column_sumsq(self, v: Any) -> Any:
        """Squared 2-norms of the columns of a 2-D ``v``: ``sum_i |v_ij|^2`` (shape
        ``(k,)``, real dtype; no scaling, so squares over- and underflow as they are)."""
        xp = self.xp
        return xp.sum(xp.real(v * xp.conj(v)), axis=0)

    def max_abs_finite(self, x: Any, axis: int) -> Any:
        """Largest finite ``|x|`` along ``axis`` (keepdims; 0 where none)."""
        xp = self.xp
        return xp.max(xp.where(xp.isfinite(x), xp.abs(x), xp.zeros_like(x)), axis=axis,
                      keepdims=True)

    def pow2_shift(self, x: Any, axis: int, target: int) -> Any:
        """Int32 shifts ``s`` (keepdims along ``axis``) putting the largest finite
        ``|x| * 2**s`` along ``axis`` in ``[2**target, 2**(target+1))``; 0 for lines
        with no finite nonzero entry (:func:`mpqr.engines.scaling.pow2_shift`)."""
        xp = self.xp
        mx = self.max_abs_finite(x, axis)
        e = self.exponent(mx)
        return xp.where(mx > 0, target - e, xp.zeros_like(e))

    def empty_for(self, like: Any, shape: tuple[int, ...], dtype: Any) -> Any:
        """Uninitialized work array for converted copies of ``like`` (the CuPy
        backend matches ``like``'s memory order so conversions stay coalesced)."""
        from mpqr._array_api import device

        return self.xp.empty(shape, dtype=dtype, device=device(like))

    def split_fp16(self, x: Any, shift: Any, hi: Any, hf: Any = None, lo: Any = None,
                   lo_shift: int = 11) -> None:
        """Write the fp16 parts of ``y = x * 2**shift`` into the given views:
        ``hi = fp16(y)``; ``hf = hi`` with non-finite entries 0;
        ``lo = fp16((y - hi) * 2**lo_shift)`` (0 where ``hi`` is not finite)."""
        xp = self.xp
        y = self.ldexp(x, shift)
        h = self.to_fp16(y)
        hi[...] = h
        if hf is None and lo is None:
            return
        finite = xp.isfinite(h)
        h_f = xp.where(finite, h, xp.zeros_like(h))
        if hf is not None:
            hf[...] = h_f
        if lo is not None:
            # exact: h is y rounded to 11 bits (masking avoids inf - inf)
            r = xp.where(finite, y, xp.zeros_like(y)) - xp.astype(h_f, y.dtype)
            lo[...] = self.to_fp16(self.ldexp(r, xp.asarray(lo_shift, dtype=xp.int32)))

    def unscale(self, c: Any, row_shift: Any, col_shift: Any, out_dtype: Any) -> Any:
        """``c * 2**-(row_shift + col_shift)`` in ``out_dtype``, exactly."""
        xp = self.xp
        return self.ldexp(xp.astype(c, out_dtype), -(row_shift + col_shift))

    def unscale_into(self, c: Any, p: Any, row_shift: Any, col_shift: Any, *,
                     subtract: bool | None) -> None:
        """``c = q`` (``subtract=None``), ``c -= q`` or ``c += q`` in place for
        ``q = unscale(p, row_shift, col_shift, c.dtype)`` (:meth:`unscale`): ``q`` rounded to
        ``c``'s dtype first, then the one rounded update."""
        q = self.unscale(p, row_shift, col_shift, c.dtype)
        if subtract is None:
            c[...] = q
        elif subtract:
            c -= q
        else:
            c += q

    # --- GEMM primitives ------------------------------------------------------
    def gemm(self, a: Any, b: Any) -> Any:
        """Native product in the operands' (common) dtype."""
        return self.xp.matmul(a, b)

    def gemm_sub_into(self, c: Any, a: Any, b: Any) -> bool:
        """``c -= a @ b`` in place without a temporary, if the backend can (2-D, one
        dtype); returns whether it did. The portable version cannot: the policy's
        :func:`~mpqr.policy.gemm_sub` then subtracts the product."""
        return False

    def gemm_into(self, out: Any, a: Any, b: Any) -> bool:
        """``out[...] = a @ b`` written straight into ``out`` (2-D, one dtype; ``out`` a
        view the caller owns), if the backend can; returns whether it did. The portable
        version cannot: :func:`~mpqr.policy.gemm_into` then copies the product in."""
        return False

    def fused_fp16_kernel(self, m: int, n: int, k: int, dtype: Any) -> str | None:
        """The name of the backend's fused ``tc-fp16`` kernel (the unscaling and any
        accumulation into the output in the GEMM's epilogue) for a 2-D ``m x n x k``
        product with a ``dtype`` result, or None where the engine's separate passes run.
        The portable version has none."""
        return None

    def fused_fp16_gemm(self, a16: Any, b16: Any, sa: Any, sb: Any, c: Any, *,
                        accumulate: bool, subtract: bool) -> bool:
        """``c = P``, ``c += P`` or ``c -= P`` for ``P = 2**-(sa_i + sb_j) (a16 b16)_ij``,
        the ``tc-fp16`` product of the engine's scaled fp16 operands
        (:mod:`mpqr.engines.tc_fp16`), in one kernel where :meth:`fused_fp16_kernel`
        names one; returns whether it ran."""
        return False

    def fused_sgemm_kernel(self, m: int, n: int, k: int, slice_k: int) -> str | None:
        """The name of the backend's one-kernel ``tc-sgemm`` product (:meth:`fused_sgemm`)
        for a 2-D ``m x n x k`` product in slices of ``slice_k``, or None (the portable
        version has none)."""
        return None

    def fused_sgemm(self, a_hi: Any, a_hf: Any, a_lo: Any, b_hi: Any, b_hf: Any, b_lo: Any,
                    sa: Any, sb: Any, c: Any, *, slice_k: int, accumulate: bool,
                    subtract: bool) -> bool:
        """``c = P``, ``c += P`` or ``c -= P`` for the ``tc-sgemm`` product of the engine's
        fp16 parts (:mod:`mpqr.engines.tc_sgemm`: the corrections, then the ``hi hi``
        slices of ``slice_k`` added with round-to-nearest, unscaled by
        ``2**-(sa_i + sb_j)``) in one kernel; returns whether it ran. The portable version
        has none (the engine's GEMMs run)."""
        return False

    def add_hi_slices(self, a_hi: Any, b_hi: Any, c: Any, slice_k: int) -> bool:
        """``c += a_hi @ b_hi`` for ``tc-sgemm``'s ``hi hi`` term (fp16 ``m x k``, ``k x
        n``; ``c`` float32, the corrections' product) summed ``slice_k`` at a time on the
        tensor cores, the slices added with round-to-nearest in one kernel; returns whether
        it ran. The portable version has none (the engine's slices run, each added to
        ``c``)."""
        return False

    def add_partials(self, c: Any, parts: Any) -> None:
        """``c[...] = c + sum(parts, axis=0)`` for float32 partial products ``parts``
        (``(g, m, n)``) and ``c`` (``(m, n)``), every addition rounded to nearest: here one
        partial after the other, the order of the one-kernel product
        (:meth:`fused_sgemm`: C = corrections, C += slice, slice by slice), which the
        portable backends so emulate. Silent on non-finite sums, as a GEMM is."""
        with self.ignore_fp_warnings():
            for i in range(parts.shape[0]):
                c[...] = c + parts[i]

    def add_identity(self, x: Any) -> None:
        """``x[..., i, i] += 1`` for ``i < min(m, n)``, in place."""
        xp = self.xp
        k = min(x.shape[-2:])
        x[..., :k, :k] = x[..., :k, :k] + xp.eye(k, dtype=x.dtype, device=device(x))

    def unit_lower_fp16(self, src: Any, out: Any) -> None:
        """``out[...] = fp16(tril(src, -1)) + I``: the Householder vectors stored below the
        diagonal of ``src`` (``..., m, n``, ``m >= n``; R above is not read) as an explicit
        unit-lower-trapezoidal float16 array, each entry rounded to nearest (no scaling)."""
        xp = self.xp
        m, n = src.shape[-2:]
        out[...] = self.to_fp16(xp.tril(src, k=-1)
                                + xp.eye(m, n, dtype=src.dtype, device=device(src)))

    def to_fp16(self, x: Any) -> Any:
        raise NotImplementedError(
            f"the {self.name} backend has no float16 support (needed by the fp16 engines)"
        )

    def gemm_fp16(self, a16: Any, b16: Any, out: Any = None, alpha: float = 1.0,
                  beta: float = 0.0) -> Any:
        """``alpha * (a16 @ b16) + beta * out`` with fp16 inputs and fp32 accumulation."""
        raise NotImplementedError(f"the {self.name} backend has no fp16 GEMM engine")

    def gemm_int8(self, a8: Any, b8: Any) -> Any:
        """Exact ``a8 @ b8`` of int8 matrices, as int32."""
        raise NotImplementedError(f"the {self.name} backend has no int8 GEMM engine")

    # --- small dense kernels ------------------------------------------------
    def solve_triangular(self, a: Any, b: Any, *, lower: bool = False,
                         unit_diagonal: bool = False) -> Any:
        """Solve ``a @ x = b`` for triangular ``a`` (2-D ``b``) by recursive halving."""
        xp = self.xp
        n = a.shape[-1]
        if n == 1:
            return b if unit_diagonal else b / a[..., :1, :1]
        h = n // 2
        if lower:
            x1 = self.solve_triangular(a[..., :h, :h], b[..., :h, :], lower=True,
                                       unit_diagonal=unit_diagonal)
            x2 = self.solve_triangular(a[..., h:, h:], b[..., h:, :] - a[..., h:, :h] @ x1,
                                       lower=True, unit_diagonal=unit_diagonal)
        else:
            x2 = self.solve_triangular(a[..., h:, h:], b[..., h:, :], lower=False,
                                       unit_diagonal=unit_diagonal)
            x1 = self.solve_triangular(a[..., :h, :h], b[..., :h, :] - a[..., :h, h:] @ x2,
                                       lower=False, unit_diagonal=unit_diagonal)
        return xp.concat([x1, x2], axis=-2)

    def triangular_inverse(self, r: Any) -> Any:
        """``r^-1`` of every member of an upper-triangular stack ``(..., n, n)`` (by
        :meth:`solve_triangular` on the identity here)."""
        xp = self.xp
        eye = xp.eye(r.shape[-1], dtype=r.dtype, device=device(r))
        return self.solve_triangular(r, xp.broadcast_to(eye, r.shape), lower=False)

    #: widest ``r`` that :meth:`right_solve_upper` takes in one call; ``None``: any width
    #: (callers block wider solves and do the off-diagonal products through the policy)
    right_solve_block: int | None = None
    #: Leaf panels wider than this are factored in sub-panels of this width by
    #: :meth:`reconstruct_panel` with updates in between (:mod:`mpqr.qr.panel_blocked`);
    #: ``None``: one :meth:`householder_panel` call per leaf (LAPACK's ``geqrf``).
    panel_block: int | None = None
    #: ... for leaves of at least this many rows (shorter ones take one
    #: :meth:`householder_panel` call)
    panel_block_min_rows: int = 0
    #: ... and of these dtypes (names in the array namespace)
    panel_block_dtypes: tuple[str, ...] = ("float32", "float64")
    #: ``qr(method="auto")`` gives a single tall-skinny matrix of at most this many
    #: elements to the library's own QR (``geqrf``) instead of CholQR2, whose n x n steps
    #: and host round trips cost ~3 ms on a GPU: H100 fp64, cuSOLVER vs CholQR2:
    #: 2048 x 64 0.56 vs 3.7 ms, 2048 x 128 0.85 vs 3.5, 2^22 x 64 86 vs 5.8; through
    #: mpqr (~1.1 ms of its own per call) 16384 x 128 (2^21) took 3.8 ms against
    #: CholQR2's 3.1, so the cut is 2^20. Every backend uses the GPU's value so CI runs
    #: the same choice.
    library_qr_tall_max: int = 2**20
    #: whether ``qr(method="auto")`` gives stacks of small matrices to
    #: ``householder-batched``: only where one fused kernel runs the whole stack (CuPy);
    #: elsewhere the library's QR per matrix is faster (NumPy, 40 x (16x16) float64: the
    #: portable steps 15.5 ms) and gives each member exactly the single-matrix result
    batched_qr_fused: bool = False
    #: ``qr(method="auto")`` gives a single matrix (not tall-skinny) of at most this many
    #: elements to the library's own QR in the input's precision where the recursive
    #: tensor-core QR would run otherwise (0: never; backends with tensor cores set it).
    library_qr_square_max: int = 0
    #: per-precision overrides of ``library_qr_square_max`` (a precision whose recursion
    #: was measured no faster than the library's QR up to a larger size)
    library_qr_square_max_by_precision: Mapping[str, int] = MappingProxyType({})
    #: ``qr(method="auto")`` at the input's own precision (every product native) gives a
    #: single real near-square matrix (``n <= m <= 2 n``) of more than the first and at
    #: most the second many elements to the recursion in certified panels rather than
    #: the library's QR ((0, 0): never; backends whose panels and GEMMs beat it set it)
    native_recursion_square: tuple[int, int] = (0, 0)
    #: CholQR applies a well-conditioned R^-1 by GEMM from this many columns on (None:
    #: never). Measured on an H100 (fp64): 2^22 x 64 GEMM 1.7 ms vs substitution 3.2 ms,
    #: 2^24 x 32 4.0 vs 3.7 ms; every backend uses the GPU's value so CI runs that path.
    inverse_gemm_min_n: int | None = 64
    #: CholQR applies an upper-triangular R^-1 by two GEMMs that skip its lower zeros from
    #: this many columns on (mpqr.qr.cholqr._times_upper; None: one GEMM). H100, whole QR
    #: fp64, one process: 2^20 x 256 12.4-12.8 vs 13.1-14.5 ms, 2^19 x 512 18.7-20.8 vs
    #: 21.5-23.2, 65536 x 4096 135-137 vs 144-145; but 2^21 x 128 8.7-8.9 vs 8.3-8.4 (the
    #: product is memory-bound there). Every backend uses the GPU's value so CI runs it.
    triangular_split_min_n: int | None = 256
    #: Gram matrices of 2-D inputs at least twice this wide are built from the products of
    #: their upper-triangular blocks (mpqr/qr/gram_blocked.py; None: one GEMM). H100 fp64:
    #: 65536 x 2048 10.6 -> 6.3 ms, 65536 x 4096 45.3 -> 24.6, 2^20 x 512 9.3 -> 8.0,
    #: 2^20 x 256 split once 2.46 -> 2.31. H200, 2^20 x 256 float64 ``auto``, split once
    #: (128) against one GEMM (256), six alternations: cond 1 10.4 / 11.0 ms, cond 1e12
    #: 19.4 / 19.8, cond 1e15 19.3 / 19.7 (``bench/probes/tall256_ab.py``). Every backend
    #: uses the GPU's value so CI runs that path.
    gram_block: int | None = 128
    #: the Ozaki steps are fused kernels without temporaries (see ozaki.workspace_bytes)
    ozaki_fused: bool = False

    #: CholQR2 on a 2-D float64 input at most this wide does not store ``Q1 = A R1^-1``:
    #: :meth:`right_solve_gram` gives its Gram matrix in the solve's pass and
    #: :meth:`right_solve_twice` the final Q from A (two passes over A fewer; None: never).
    #: H100, fp64, fused vs stored, same process: 2^24 x 32
    #: 10.4-10.5 vs 11.4 ms (mode "r" 5.8-5.9 vs 8.1), 2^24 x 16 5.1 vs 6.1, 2^22 x 32
    #: a tie at 4.0 (the fused kernels' width limit is 32). Every backend uses the
    #: GPU's value so CI runs that path.
    fused_cholqr_max_n: int | None = 32
    #: the preconditioned CholQR forms the Gram matrix of ``W = A P^-1`` in the solve's
    #: pass over a 2-D float64 A at most this wide (:meth:`right_solve_gram`; W not
    #: stored) where the next W is not expected to be the certified one (None: never).
    #: H200, 2^22 x 64: fused 2.77 ms against substitution 2.88 + Gram 0.86 ms; the
    #: certified W is stored past ``fused_cholqr_max_n`` (Q = W R^-1 by GEMM 1.1 ms,
    #: against 4.2 ms solving twice from A). Every backend uses the GPU's value so CI
    #: runs that path.
    fused_gram_max_n: int | None = 64

    def chol_steps(self, g: Any) -> tuple[Any, Any, Any] | None:
        """The ``n x n`` steps of a CholQR pass without a host sync, or None.

        ``(R, X, st)`` on ``g``'s device: ``R = chol(g)`` (upper), ``X = R^-1`` by
        row-wise substitution on ``I``, and ``st`` the eight float64 numbers that
        :mod:`mpqr.qr.cholqr_steps` checks. None (here): the pass moves ``g`` to
        :meth:`small` and takes its steps there; a GPU backend returns them without a
        sync (one launch, or library calls queued back to back), so a pass reads eight
        numbers back instead."""
        return None

    def update_lane(self, a: Any) -> SerialLane:
        """A second queue for the trailing updates of a factorization of ``a`` that may run
        while the next panel is factored (look-ahead; :mod:`mpqr.qr.householder_tiled`).
        Here: :class:`SerialLane`, everything in order on the one queue; a GPU backend
        returns a stream where it supports ``a``."""
        return SerialLane()

    def right_solve_gram(self, a: Any, r: Any, out: Any = None, sub: Any = None) -> Any:
        """``Q1^T Q1`` (exactly symmetric) for ``Q1 = a @ inv(r)``, real 2-D ``a``, native
        arithmetic; ``Q1`` is also written into ``out`` (m x n) when given. ``sub`` (the
        shape of ``a``): ``a - sub`` is solved instead of ``a``. This portable version
        forms ``a - sub`` and ``Q1`` (a GPU backend fuses them in one pass over ``a``)."""
        if sub is not None:
            a = a - sub
        q = self.right_solve_upper(a, r, out=out)
        g = self.gemm(self.xp.matrix_transpose(q), q)
        return (g + self.xp.matrix_transpose(g)) / 2

    #: widest ``[a | b]`` whose double-double Gram matrix the out-of-core ``lstsq`` forms
    #: in its one pass (0: it takes two passes instead). 0 here: this portable
    #: :meth:`gram_dd_update` (the reference of a GPU kernel) was ~280x slower than two
    #: BLAS passes on a host, which moves no data over a link (2-core CPU, 2^19 x 64:
    #: ``mpqr.lstsq(a, b, memory_budget="64MB")`` 75.5 s with this at 128, 0.27 s at 0)
    gram_dd_max_n: int = 0

    def gram_dd_update(self, a: Any, b: Any, acc: Any) -> Any:
        """``acc + [a | b]^T [a | b]`` in double-double arithmetic (exact products,
        compensated sums: :mod:`mpqr.lstsq.double_double`) for real float64 ``a`` (``h x
        n``) and ``b`` (``h x k``); ``acc`` is ``2 x N x N`` (hi, lo), ``N = n + k``,
        symmetric. A new array; ``acc`` is not modified."""
        from mpqr.lstsq import double_double as dd

        xp = self.xp
        hi, lo = dd.add(xp, (acc[0, ...], acc[1, ...]),
                        dd.gram(xp, xp.concat([a, b], axis=1)))
        return xp.stack([hi, lo])

    def right_solve_twice(self, a: Any, r1: Any, r2: Any) -> Any:
        """``(a @ inv(r1)) @ inv(r2)``, the intermediate rounded as :meth:`right_solve_gram`
        rounds it (here both as :meth:`right_solve_upper`)."""
        return self.right_solve_upper(self.right_solve_upper(a, r1), r2)

    def right_solve_upper(self, a: Any, r: Any, out: Any = None, sub: Any = None) -> Any:
        """``a @ inv(r)`` for upper-triangular ``r`` (solved as ``r^H x^H = a^H``);
        written into ``out`` (a view the caller owns) when given. ``sub`` (the shape of
        ``a``): ``a - sub`` is solved instead (a GPU backend subtracts it in the solve's
        pass; here it is formed)."""
        xp = self.xp
        if sub is not None:
            a = a - sub

        def ct(x):
            t = xp.matrix_transpose(x)
            return xp.conj(t) if xp.isdtype(x.dtype, "complex floating") else t

        q = ct(self.solve_triangular(ct(r), ct(a), lower=True))
        if out is None:
            return q
        out[...] = q
        return out

    def right_inverse_upper(self, r: Any) -> Any:
        """``X = r^-1`` for a 2-D upper-triangular ``r``, solved as ``X r = I`` by row-wise
        substitution (``|X r - I| <= γ_n |X||r|``: the bound CholQR's inverse-by-GEMM
        test assumes). Here :meth:`right_solve_upper` on the identity; a GPU backend
        blocks wide ones."""
        xp = self.xp
        return self.right_solve_upper(xp.eye(r.shape[-1], dtype=r.dtype, device=device(r)), r)

    def cholesky(self, a: Any, *, upper: bool = False, check: bool = True) -> Any:
        """Cholesky factor; raises :class:`mpqr.LinAlgError` if not positive definite.

        ``check=False``: a library that reports failure only through a non-finite
        factor (cuSOLVER) returns it unchecked, without a host sync; the caller
        checks (:func:`mpqr.lstsq.gram.cholesky_flagged`)."""
        # imported here: mpqr._errors takes its base class from this package
        from mpqr._errors import LinAlgError

        xp = self.xp
        try:
            l = xp.linalg.cholesky(a, upper=upper)
        except Exception as exc:  # each library has its own LinAlgError
            raise LinAlgError(f"Cholesky factorization failed: {exc}") from exc
        if check and not bool(xp.all(xp.isfinite(l))):
            raise LinAlgError("Cholesky factorization failed: matrix is not positive definite")
        return l

    def svdvals(self, a: Any) -> Any:
        """Singular values of a small matrix, descending."""
        return self.xp.linalg.svdvals(a)

    def svd(self, a: Any, *, full_matrices: bool = False) -> tuple[Any, Any, Any]:
        return self.xp.linalg.svd(a, full_matrices=full_matrices)

    #: inputs of at most this many elements whose precision request the input dtype's
    #: own arithmetic meets take the small-input fast path of ``mpqr.qr``/``mpqr.lstsq``
    #: (``mpqr/_fast.py``: :meth:`small_qr`, :meth:`small_lstsq`); 0: none
    small_max: int = 0
    #: single QRs the route choice gives to the library's QR (``geqrf``) take the same
    #: direct call up to this many elements where it exceeds ``small_max``; 0: none
    direct_qr_max: int = 0
    #: least squares (tall, a request the dtype's own arithmetic meets) takes the fast
    #: path up to this many elements of ``a`` where it exceeds ``small_max``, and up to
    #: ``small_lstsq_max_n`` columns; 0: none
    small_lstsq_max: int = 0
    small_lstsq_max_n: int = 0
    #: the exact array type the fast path accepts (subclasses take the general route)
    small_type: type | None = None

    def small_qr(self, a: Any, mode: str, single: bool = False) -> tuple[Any, Any] | None:
        """``(Q or None, R)`` of a small 2-D ``a`` with ``diag(R) >= 0`` as
        ``qr(method="geqrf")`` gives it, or None where the general route must decide
        (non-finite entries; columns it would rescale, float32's range if ``single``)."""
        return None

    def small_lstsq(self, a: Any, b: Any, cond: Any, driver: str | None
                    ) -> tuple[Any, Any, Any, Any] | None:
        """SciPy's ``lstsq`` results for small finite ``a``, ``b`` of one float dtype
        through the LAPACK driver SciPy calls, or None (the general route decides)."""
        return None

    #: whether :meth:`library_qr` gives ``diag(R) >= 0`` where it can (the driver then
    #: checks before normalising the signs, instead of rescaling Q and R unchecked)
    library_qr_positive: bool = False
    #: whether every output of :meth:`library_qr` has ``diag(R) >= 0`` (the driver then
    #: neither checks nor normalises: no host sync)
    library_qr_signed: bool = False

    def library_qr(self, a: Any, mode: str) -> tuple[Any | None, Any]:
        """The array library's own QR of a 2-D ``a`` (``mode``: reduced, complete or r;
        Q is None for r): ``qr(method="geqrf")``."""
        q, r = self.xp.linalg.qr(a, mode="complete" if mode == "complete" else "reduced")
        return (None if mode == "r" else q), r

    def library_raw_stack(self, a: Any) -> tuple[Any, Any] | None:
        """``(h, tau)`` of the library's ``geqrf`` on every member of a stack ``(..., m,
        n)``, ``m >= n``, as ``numpy.linalg.qr(a, mode="raw")`` gives them (``h``
        ``(..., n, m)``), or None where the library has no such call (``geqrf-wy``
        then takes :meth:`library_qr`)."""
        return None

    #: stacks beyond the batched kernels' reach with at least this many columns take
    #: ``geqrf-wy`` (geqrf per member, Q by batched products) rather than ``geqrf`` (the
    #: library's QR per member); None: never
    stack_q_products_min_n: int | None = None
    #: the fastest stack route measured per dtype, member width and ratio for stacks
    #: past :attr:`stack_q_products_min_n` columns (``{dtype name: {n: {m/n: route}}}``,
    #: read by :func:`mpqr.qr.choice.stack_table_route`); None: ``geqrf-wy`` throughout
    stack_routes: Mapping[str, Mapping[int, Mapping[int, str]]] | None = None
    #: with :attr:`stack_routes`, stacks of at most this many members take ``geqrf``
    #: (the library per member) whatever the table says; None: no such rule
    stack_library_max_batch: int | None = None
    #: where :attr:`stack_routes` was measured (device and command), for ``explain()``
    stack_routes_source: str = ""

    def batched_qr_fits(self, dtype: Any, m: int, n: int) -> bool:
        """Whether stacks of ``m x n`` (``m >= n``) matrices of ``dtype`` take
        ``householder-batched``: the GPU kernel's limits (one block's registers and
        shared memory, :func:`mpqr.backends.cupy.batched_qr.fits`) on every backend, so
        that the route, and the scheme CI tests, are the same everywhere."""
        from mpqr.backends.cupy.batched_qr import fits

        xp = self.xp
        if dtype not in (xp.float32, xp.float64):
            return False
        return fits("float32" if dtype == xp.float32 else "float64", m, n)

    def batched_qr(self, a: Any, mode: str) -> tuple[Any | None, Any] | None:
        """``householder-batched`` in one fused kernel: ``(Q or None, R)`` with
        ``diag(R) >= 0`` for ``mode`` reduced, complete or r, or None where the backend
        has no such kernel for ``a`` (the portable scheme runs instead)."""
        return None

    def batched_qr_apply(self, a: Any, b: Any) -> tuple[Any, Any] | None:
        """``(R, Q^H b)`` as :meth:`batched_qr`'s kernel gives them, or None."""
        return None

    def qr_panel(self, a: Any) -> tuple[Any, Any]:
        """Reduced Householder QR of a (small or tall-skinny) panel, native precision."""
        return self.xp.linalg.qr(a)

    def lu_signed(self, a: Any) -> tuple[Any, Any, Any]:
        """``L @ U = a - diag(s)`` without pivoting, ``s_i = -phase(pivot_i)``,
        for the Householder reconstruction of an explicit Q (LAPACK's
        ``orhr_col``); see :func:`mpqr.qr._kernels.lu_signed`. Recursive halves
        (``U12 = L11^-1 A12``, ``L21 = A21 U11^-1``, ``A22 -= L21 U12``; the signs
        only touch diagonal blocks, so this is the column loop's factorization) down
        to blocks of 8, which take the column loop."""
        from mpqr._array_api import device

        xp = self.xp
        *batch, n, _ = a.shape
        w = xp.asarray(a, copy=True)
        s = xp.empty((*batch, n), dtype=a.dtype, device=device(a))
        self._lu_signed_halves(w, s, 0, n)
        eye = xp.eye(n, dtype=a.dtype, device=device(a))
        return xp.tril(w, k=-1) + eye, xp.triu(w), s

    def _lu_signed_halves(self, w: Any, s: Any, lo: int, hi: int) -> None:
        """``w[lo:hi, lo:hi] <- L\\U`` in place (its Schur complement already formed)."""
        xp = self.xp
        if hi - lo <= 8:
            self._lu_signed_columns(w, s, lo, hi)
            return
        h = lo + (hi - lo) // 2
        self._lu_signed_halves(w, s, lo, h)
        lu11 = w[..., lo:h, lo:h]
        w[..., lo:h, h:hi] = self.solve_triangular(lu11, w[..., lo:h, h:hi], lower=True,
                                                   unit_diagonal=True)
        # L21 = A21 U11^-1, solved as U11^T L21^T = A21^T
        u11t = xp.matrix_transpose(xp.triu(lu11))
        w[..., h:hi, lo:h] = xp.matrix_transpose(self.solve_triangular(
            u11t, xp.matrix_transpose(w[..., h:hi, lo:h]), lower=True))
        w[..., h:hi, h:hi] = w[..., h:hi, h:hi] - w[..., h:hi, lo:h] @ w[..., lo:h, h:hi]
        self._lu_signed_halves(w, s, h, hi)

    def _lu_signed_columns(self, w: Any, s: Any, lo: int, hi: int) -> None:
        """The column loop of :meth:`lu_signed` on ``w[lo:hi, lo:hi]``, in place."""
        xp = self.xp
        for i in range(lo, hi):
            d = w[..., i, i]
            si = -phase(xp, d)
            s[..., i] = si
            piv = d - si
            w[..., i, i] = piv
            if i + 1 < hi:
                col = w[..., i + 1:hi, i] / xp.expand_dims(piv, axis=-1)
                w[..., i + 1:hi, i] = col
                w[..., i + 1:hi, i + 1:hi] = (w[..., i + 1:hi, i + 1:hi]
                                              - xp.expand_dims(col, axis=-1)
                                              * w[..., i:i + 1, i + 1:hi])

    #: block width of the blocked randomized QRCP (None: ``mpqr.qr.pivoted.BLOCK``)
    qrcp_block: int | None = None

    def read_later(self, x: Any) -> Any:
        """A callable returning the values of a small array ``x`` on the host (anything
        ``float()`` and ``bool()`` take per entry), its transfer started now so the
        device can go on with work queued after it; here ``x`` itself."""
        return lambda: x

    def qrcp_order(self, y: Any, k: int) -> Any | None:
        """The column order of a small 2-D ``y`` (a sketch of a few dozen rows) after
        ``min(k, *y.shape)`` steps of QR with column pivoting, step ``i`` swapping
        column ``i`` with its pivot (LAPACK ``geqp3``'s rule and swaps; the pivots come
        first, see :func:`swap_order`): int32 ``(n,)`` on ``y``'s device, from the
        array library's own QRCP (NumPy: LAPACK ``geqp3``); None here: the caller runs
        its vectorized loop (:func:`mpqr.qr.pivoted.deterministic_pivots`). ``y`` is not
        modified."""
        return None

    #: the route of ``qr(pivoting=True)`` where the backend has no library QRCP:
    #: "gram" (the greedy order from pivoted Cholesky of the Gram matrix, recursing on the
    #: unresolved trailing block, then adjacent column exchanges: :mod:`mpqr.qr.pivoted_gram`;
    #: the blocked QRCP past the exchanges' bound or for non-finite input), "repair"
    #: (HQRRP's order, then the exchanges: :mod:`mpqr.qr.pivoted_repair`) or "blocked" (the
    #: blocked greedy QRCP of :mod:`mpqr.qr.pivoted_exact`). "gram": the unpivoted QR's
    #: flops plus a Gram matrix and ``n^3 / 3`` for the Cholesky, no exchanges on any test
    #: family and geqp3's P on all but exact ties (2-core CPU, bench/NOTES.md); HQRRP's
    #: order needed more exchanges than the bound (16 a column) on every 4096^2 and
    #: 65536 x 4096 matrix measured on an H200, and the blocked route's blocks shrink to a
    #: few columns where norms are close
    qrcp_exact_route = "gram"

    def householder_levels(self, a: Any) -> bool:
        """Whether :meth:`householder_steps` and :meth:`householder_q` take 2-D ``a``'s
        dtype (the pivoted QR's Gram route then factors once, ordering the trailing
        columns between blocks of reflectors: :mod:`mpqr.qr.pivoted_gram`). Here no:
        the array API has no Householder steps to resume."""
        return False

    def householder_workspace(self, a: Any, p: Any) -> Any:
        """A column-major copy of ``a[:, p]`` (2-D ``a``, ``p`` an index vector) for
        :meth:`householder_steps`."""
        raise NotImplementedError

    def householder_steps(self, w: Any, j0: int, j1: int) -> Any:
        """LAPACK ``geqrf`` of ``w[j0:, j0:j1]`` in place (reflectors below the
        diagonal, R on and above it), then its ``Q^H`` applied to ``w[j0:, j1:]`` in place
        (``ormqr``/``unmqr``); returns the ``j1 - j0`` scalars ``tau``. ``w``: from
        :meth:`householder_workspace`."""
        raise NotImplementedError

    def householder_q(self, w: Any, tau: Any) -> Any:
        """``Q`` (``m x k``, ``k = len(tau)``) from the reflectors in ``w[:, :k]``
        (``orgqr``/``ungqr``); ``w`` is overwritten."""
        raise NotImplementedError

    def diagonal_repair(self, q: Any | None, r: Any, p: Any, tol: float, limit: int) -> Any:
        """The exchanges of :func:`mpqr.qr.pivoted_repair.repair_diagonal` done by the
        array library's own kernels: ``(Q, R, P, exchanges, entries lowered, largest
        lowering)``, None past ``limit`` exchanges; ``NotImplemented`` here (the
        portable steps, :func:`~mpqr.qr.pivoted_repair.reference_repair`, run instead)."""
        return NotImplemented

    def pivoted_cholesky(self, g: Any, tol: float) -> tuple[Any, int, float]:
        """Pivoted Cholesky of a Hermitian positive semidefinite ``g`` (``n x n``), as
        LAPACK ``?pstrf``: each step takes the largest remaining diagonal entry of the
        Schur complement (the first of equals) and stops before the first at most
        ``tol gmax``. Returns ``(P, k, gmax)``: ``P`` the order (int32 ``(n,)`` on
        ``g``'s device; after ``k`` the columns not yet taken), ``k`` the steps taken,
        ``gmax`` the largest diagonal entry of ``g`` (a float; ``k = 0`` and ``P`` the
        identity when it is not positive). ``g`` is not modified.

        Here the steps with array operations and a host read each (any Array API
        library); NumPy calls LAPACK, CuPy a blocked kernel."""
        xp = self.xp
        n = g.shape[0]
        dev = device(g)
        w = xp.asarray(g, copy=True)
        d = xp.real(xp.linalg.diagonal(w))
        idx = list(range(n))
        gmax = float(xp.max(d)) if n else 0.0
        k = 0
        if gmax > 0:
            stop = tol * gmax
            while k < n:
                at = k + int(xp.argmax(d[k:]))
                if not float(d[at]) > stop:
                    break
                if at != k:
                    sw = list(range(n))
                    sw[k], sw[at] = at, k
                    sw = xp.asarray(sw, dtype=xp.int64, device=dev)
                    w = xp.take(xp.take(w, sw, axis=0), sw, axis=1)
                    d = xp.take(d, sw)
                    idx[k], idx[at] = idx[at], idx[k]
                col = w[k + 1:, k] / xp.astype(xp.sqrt(d[k]), w.dtype)
                w[k + 1:, k + 1:] = w[k + 1:, k + 1:] - \
                    xp.expand_dims(col, axis=1) * xp.expand_dims(xp.conj(col), axis=0)
                d = xp.concat([d[:k + 1], d[k + 1:] - xp.real(col * xp.conj(col))])
                k += 1
        return xp.asarray(idx, dtype=xp.int32, device=dev), k, max(gmax, 0.0)

    def permutable_copy(self, a: Any) -> Any:
        """A copy of 2-D ``a`` to permute the columns of (the pivoted QR's workspace),
        in the layout where :meth:`permute_columns` is cheapest; here a plain copy."""
        return self.xp.asarray(a, copy=True)

    def permute_columns(self, x: Any, dst: Any, src: Any) -> None:
        """``x[..., dst] = x[..., src]`` in place (the right side read first; a repeated
        ``dst`` always comes with the same ``src``) for integer index arrays on ``x``'s
        device; here, without integer-array assignment in the standard, one slice copy
        per column after reading the indices."""
        xp = self.xp
        dst, src = [int(v) for v in dst], [int(v) for v in src]
        cols = [xp.asarray(x[..., s:s + 1], copy=True) for s in src]
        for d, col in zip(dst, cols):
            x[..., d:d + 1] = col

    def lu_nopivot(self, a: Any) -> tuple[Any, Any]:
        """``a = L @ U`` without pivoting (L unit lower); for Householder reconstruction."""
        xp = self.xp
        n = a.shape[-1]
        if n == 1:
            one = xp.ones_like(a[..., :, :1])
            return xp.concat([one[..., :1, :], a[..., 1:, :1] / a[..., :1, :1]], axis=-2), a[
                ..., :1, :
            ]
        h = n // 2
        l11, u11 = self.lu_nopivot(a[..., :h, :h])
        u12 = self.solve_triangular(l11, a[..., :h, h:], lower=True, unit_diagonal=True)
        l21 = xp.matrix_transpose(
            self.solve_triangular(xp.matrix_transpose(u11), xp.matrix_transpose(a[..., h:, :h]),
                                  lower=True)
        )
        l22, u22 = self.lu_nopivot(a[..., h:, h:] - l21 @ u12)
        zl = xp.zeros_like(a[..., :h, h:])
        zu = xp.zeros_like(a[..., h:, :h])
        l = xp.concat([xp.concat([l11, zl], axis=-1), xp.concat([l21, l22], axis=-1)], axis=-2)
        u = xp.concat([xp.concat([u11, u12], axis=-1), xp.concat([zu, u22], axis=-1)], axis=-2)
        return l, u


def _portable_exponent(xp: Any, x: Any) -> Any:
    """floor(log2(x)) for finite x > 0, as an int32 array (0 elsewhere)."""
    pos = xp.isfinite(x) & (x > 0)
    e = xp.floor(xp.log2(xp.where(pos, x, xp.ones_like(x))))
    return xp.astype(xp.where(pos, e, xp.zeros_like(e)), xp.int32)


# --- INT8 Ozaki scheme II primitives (generic versions; CuPy fuses them) -----
# Appended as plain functions bound onto ArrayAPIBackend so the class body above
# stays as it was; see mpqr/engines/ozaki.py for the algorithm.

def _ozaki_line_stats(self: ArrayAPIBackend, x: Any, axis: int) -> tuple[Any, Any, Any, Any]:
    from mpqr.engines.ozaki import line_stats

    return line_stats(self, x, axis)


def _ozaki_workspace_limit(self: ArrayAPIBackend) -> int:
    """Default scratch-memory cap (bytes) of the Ozaki engine: 1 GiB on the host."""
    return 1 << 30


def _ozaki_residues(self: ArrayAPIBackend, x: Any, shift: Any, moduli: tuple[int, ...], *,
                    transpose: bool, rows_p: int, cols_p: int) -> Any:
    """Symmetric int8 residues of ``round(x' * 2**shift)`` modulo each of ``moduli``.

    ``x' = x.T`` if ``transpose`` else ``x`` (float64, 2-D); ``shift`` is an int32
    vector with one entry per row of ``x'``; non-finite entries count as 0. The
    result has shape ``(len(moduli), rows_p, cols_p)``, zero-padded beyond ``x'``.
    Exact: the scaled integers stay below 2**62 and go through int64.
    """
    xp = self.xp
    from mpqr._array_api import device

    xt = xp.matrix_transpose(x) if transpose else x
    r, c = xt.shape
    finite = xp.where(xp.isfinite(xt), xt, xp.zeros_like(xt))
    scaled = xp.astype(xp.round(self.ldexp(finite, shift[:, None])), xp.int64)
    planes = []
    for p in moduli:
        res = xp.remainder(scaled, xp.asarray(p, dtype=xp.int64))
        res = xp.where(res > 127, res - p, res)
        planes.append(xp.astype(res, xp.int8))
    out = xp.stack(planes, axis=0)
    dev = device(x)
    if cols_p > c:
        out = xp.concat([out, xp.zeros((len(moduli), r, cols_p - c), dtype=xp.int8,
                                       device=dev)], axis=2)
    if rows_p > r:
        out = xp.concat([out, xp.zeros((len(moduli), rows_p - r, cols_p), dtype=xp.int8,
                                       device=dev)], axis=1)
    return out


def _ozaki_int8_gemms(self: ArrayAPIBackend, ar: Any, brt: Any, k0: int, k1: int) -> Any:
    """``ar[l][:, k0:k1] @ brt[l][:, k0:k1].T`` for every plane ``l``, exact, int32."""
    xp = self.xp
    return xp.stack([self.gemm_int8(ar[l, :, k0:k1], xp.matrix_transpose(brt[l, :, k0:k1]))
                     for l in range(ar.shape[0])], axis=0)


def _ozaki_reconstruct(self: ArrayAPIBackend, prods: Any, consts: Any, row_shift: Any,
                       col_shift: Any, m: int, n: int, out: Any = None) -> Any:
    """``2**-(row_shift_i + col_shift_j) * C_ij`` from the residue products (float64).

    ``prods[l]`` is congruent to the integer product ``C`` modulo ``consts.moduli[l]``;
    the CRT sum is done exactly in float64 limbs (see :mod:`mpqr.engines.ozaki_crt`).
    With ``out`` (an ``(m, n)`` float64 array, typically a block view of the whole
    product) the result is written there and ``out`` is returned.
    """
    xp = self.xp
    f64 = xp.float64
    n_limbs = len(consts.shifts)
    s = [None] * n_limbs
    for l, p in enumerate(consts.moduli):
        u = xp.astype(xp.remainder(prods[l, :m, :n], xp.asarray(p, dtype=prods.dtype)), f64)
        for r in range(n_limbs):
            term = consts.weights[l][r] * u  # exact: < 2**(beta + 8) units of 2**t_r
            s[r] = term if s[r] is None else s[r] + term
    head = s[0] + s[1] if n_limbs > 1 else s[0]
    q = xp.round(head / consts.p_float)
    t = [s[r] - q * consts.p_limbs[r] for r in range(n_limbs)]  # exact
    for r in range(n_limbs - 1, 0, -1):  # move carries up: limbs stop overlapping
        unit = 2.0 ** consts.shifts[r - 1]
        carry = xp.round(t[r] / unit) * unit
        t[r] = t[r] - carry
        t[r - 1] = t[r - 1] + carry
    acc = t[-1]
    for r in range(n_limbs - 2, -1, -1):
        acc = t[r] + acc
    c = self.ldexp(acc, -(row_shift[:, None] + col_shift[None, :]))
    if out is None:
        return c
    out[...] = c
    return out


def _ozaki_gauss_residues(self: ArrayAPIBackend, rr: Any, ri: Any, moduli: tuple[int, ...],
                          js: tuple[int, ...]) -> Any:
    """Residues of ``Xr + j_l Xi`` then of ``Xr - j_l Xi`` modulo each ``p_l`` (``j_l^2 = -1``),
    from the int8 residue planes ``rr``, ``ri`` (``(N, R, C)``): ``(2N, R, C)`` int8,
    symmetric (``[-(p-1)/2, (p-1)/2]``, odd moduli). Exact: ``|r + j i| < 2**15``."""
    xp = self.xp
    from mpqr._array_api import device

    dev = device(rr)
    shape = (-1, 1, 1)
    p = xp.reshape(xp.asarray(moduli, dtype=xp.int32, device=dev), shape)
    j = xp.reshape(xp.asarray(js, dtype=xp.int32, device=dev), shape)
    r32, i32 = xp.astype(rr, xp.int32), xp.astype(ri, xp.int32)
    out = []
    for t in (r32 + j * i32, r32 - j * i32):
        u = xp.remainder(t, p)
        out.append(xp.astype(xp.where(u > (p - 1) // 2, u - p, u), xp.int8))
    return xp.concat(out, axis=0)


def _ozaki_gauss_combine(self: ArrayAPIBackend, prods: Any, moduli: tuple[int, ...],
                         js: tuple[int, ...]) -> tuple[Any, Any]:
    """From ``X+ = prods[:N]`` and ``X- = prods[N:]`` (congruent to ``(Ar + j Ai)(Br + j Bi)``
    and ``(Ar - j Ai)(Br - j Bi)`` modulo ``p_l``): residues in ``[0, p)`` (int32) of
    ``Cr = (X+ + X-) / 2`` and ``Ci = (X+ - X-) / (2 j)`` modulo each ``p_l``. Exact."""
    xp = self.xp
    from mpqr._array_api import device

    dev = device(prods)
    nt = len(moduli)
    shape = (-1, 1, 1)
    p = xp.reshape(xp.asarray(moduli, dtype=xp.int32, device=dev), shape)
    inv2 = xp.reshape(xp.asarray([pow(2, -1, q) for q in moduli], dtype=xp.int32,
                                 device=dev), shape)
    inv2j = xp.reshape(xp.asarray([pow(2 * jj, -1, q) for jj, q in zip(js, moduli)],
                                  dtype=xp.int32, device=dev), shape)
    xpl = xp.remainder(prods[:nt], p)
    xmi = xp.remainder(prods[nt:], p)
    cr = xp.remainder((xpl + xmi) * inv2, p)  # < 2 p^2 < 2**17
    ci = xp.remainder((xpl - xmi + p) * inv2j, p)
    return cr, ci


ArrayAPIBackend.ozaki_line_stats = _ozaki_line_stats
ArrayAPIBackend.ozaki_workspace_limit = _ozaki_workspace_limit
ArrayAPIBackend.ozaki_residues = _ozaki_residues
ArrayAPIBackend.ozaki_int8_gemms = _ozaki_int8_gemms
ArrayAPIBackend.ozaki_reconstruct = _ozaki_reconstruct
ArrayAPIBackend.ozaki_gauss_residues = _ozaki_gauss_residues
ArrayAPIBackend.ozaki_gauss_combine = _ozaki_gauss_combine


# --- complex results from real parts (mpqr/engines/complex_product.py) -------

def _complex_from_parts(self: ArrayAPIBackend, re: Any, im: Any) -> Any:
    """``re + i im`` (equal real dtypes, equal shapes) in the matching complex dtype.

    The Array API has no constructor from parts: ``i * im`` turns a non-finite
    ``im`` into NaN in the real part as well (never a finite-looking value);
    NumPy and CuPy write the parts into place instead.
    """
    from mpqr._array_api import device

    xp = self.xp
    cdt = xp.complex128 if re.dtype == xp.float64 else xp.complex64
    return xp.astype(re, cdt) + xp.astype(im, cdt) * xp.asarray(1j, dtype=cdt,
                                                                 device=device(re))


ArrayAPIBackend.complex_from_parts = _complex_from_parts


# --- device fault translation (used by mpqr._gpu_errors.device_errors) --------

def _translate_error(self: ArrayAPIBackend, exc: BaseException, what: str) -> Exception | None:
    """A clearer replacement for a library-specific device fault, or ``None``."""
    return None


ArrayAPIBackend.translate_error = _translate_error


# --- compact-WY Householder panel (the recursive/tiled QR leaves) ---------------

def _householder_panel(self: ArrayAPIBackend, a: Any) -> tuple[Any, Any, Any]:
    """Householder QR of a panel ``a`` (``(..., m, k)``, ``m >= k``) in compact WY form.

    Returns ``(Y, T, R)`` with ``a = (I - Y T Y^H)[:, :k] R``: ``Y`` unit lower
    trapezoidal ``(..., m, k)`` (explicit zeros and ones), ``T`` upper
    triangular and ``R`` upper triangular ``(..., k, k)`` (signs arbitrary).
    Portable version: :meth:`reconstruct_panel`, and ``T = Y1^-1 W1`` from the top
    blocks of ``Y`` and ``W = Y T``; NumPy and CuPy call ``geqrf`` instead
    (:func:`compact_wy_t`).
    """
    k = a.shape[-1]
    y, w, _tau, r = self.reconstruct_panel(a)
    t = self.solve_triangular(y[..., :k, :], w[..., :k, :], lower=True, unit_diagonal=True)
    return y, self.xp.triu(t), r


def _reconstruct_panel(self: ArrayAPIBackend, a: Any) -> tuple[Any, Any, Any, Any]:
    """Householder reflectors of a panel ``a`` (``(..., m, k)``, ``m >= k``) through its
    explicit QR: ``(Y, W, tau, R)`` with ``a = (I - W Y^H)[:, :k] R``.

    :meth:`qr_panel` gives ``a = Q R0``; the signed LU of Q's top block,
    ``L U = Q1 - S`` (:meth:`lu_signed`, LAPACK ``orhr_col``; Ballard et al. 2014), gives
    ``Y = [L; Q2 U^-1]`` (unit lower trapezoidal, explicit zeros and ones) and
    ``W = Y T = ([I; 0] - Q conj(S)) L^-H`` with ``T = -U conj(S) L^-H`` upper
    triangular, ``tau = diag(T)`` and ``R = S R0``. The CuPy backend makes the same
    factors from its TSQR kernels and one reconstruction kernel
    (:mod:`mpqr.qr.panel_blocked` factors its leaves in such panels).
    """
    from mpqr._array_api import device

    xp = self.xp
    m, k = a.shape[-2:]
    q, r = self.qr_panel(a)
    l1, u, s = self.lu_signed(q[..., :k, :])

    def ct(x):
        t = xp.matrix_transpose(x)
        return xp.conj(t) if xp.isdtype(x.dtype, "complex floating") else t

    if m > k:
        y = xp.empty((*a.shape[:-2], m, k), dtype=q.dtype, device=device(a))
        y[..., :k, :] = l1
        # Y2 = Q2 U^{-1}, solved as U^H Y2^H = Q2^H
        y[..., k:, :] = ct(self.solve_triangular(ct(u), ct(q[..., k:, :]), lower=True))
    else:
        y = l1
    # H[:, :k] = Q conj(S) = [I; 0] - W L^H, so W L^H = [I; 0] - Q conj(S)
    sc = xp.conj(s) if xp.isdtype(s.dtype, "complex floating") else s
    z = xp.eye(m, k, dtype=q.dtype, device=device(a)) - q * xp.expand_dims(sc, axis=-2)
    w = ct(self.solve_triangular(l1, ct(z), lower=True, unit_diagonal=True))
    tau = -xp.linalg.diagonal(u) * sc
    return y, w, tau, xp.expand_dims(s, axis=-1) * r


def swap_order(pivots: list[int], n: int) -> list[int]:
    """The order of ``n`` columns after QR with column pivoting swapped column ``i``
    with pivot ``pivots[i]`` (an original column index) at each step ``i``: the pivots
    first, each column they displaced where the pivot came from."""
    order = list(range(n))
    where = list(range(n))  # position of each original column
    for i, c in enumerate(pivots):
        p = where[c]
        order[i], order[p] = order[p], order[i]
        where[order[i]], where[order[p]] = i, p
    return order


def compact_wy_t(backend: ArrayAPIBackend, y: Any, tau: Any) -> Any:
    """Upper-triangular ``T`` with ``H_1 H_2 ... H_k = I - Y T Y^H`` (``H_i = I - tau_i
    y_i y_i^H``, LAPACK's forward column-wise convention).

    UT transform (Joffrain et al. 2006): ``T^-1 = diag(1/tau) + striu(Y^H Y)``,
    evaluated as ``T = (I + diag(tau) striu(Y^H Y))^-1 diag(tau)`` — a unit
    upper-triangular solve, so ``tau_i = 0`` (``H_i = I``) needs no special case.
    """
    from mpqr._array_api import device

    xp = backend.xp
    k = y.shape[-1]
    yh = xp.matrix_transpose(y)
    if xp.isdtype(y.dtype, "complex floating"):
        yh = xp.conj(yh)
    tau = xp.astype(tau, y.dtype)
    eye = xp.eye(k, dtype=y.dtype, device=device(y))
    lhs = eye + xp.expand_dims(tau, axis=-1) * xp.triu(backend.gemm(yh, y), k=1)
    return backend.solve_triangular(lhs, eye * xp.expand_dims(tau, axis=-2), lower=False,
                                    unit_diagonal=True)


def compact_wy_from_raw(backend: ArrayAPIBackend, h: Any, tau: Any, m: int, k: int
                        ) -> tuple[Any, Any, Any]:
    """``(Y, T, R)`` from ``numpy.linalg.qr(a, mode="raw")``-style output (``h`` is the
    transpose, ``(..., k, m)``, of LAPACK's ``geqrf`` array)."""
    from mpqr._array_api import device

    xp = backend.xp
    f = xp.matrix_transpose(h)
    y = xp.tril(f, k=-1) + xp.eye(m, k, dtype=f.dtype, device=device(f))
    r = xp.triu(f[..., :k, :])
    return y, compact_wy_t(backend, y, tau), r


ArrayAPIBackend.householder_panel = _householder_panel
ArrayAPIBackend.reconstruct_panel = _reconstruct_panel
# certified CholQR2 panels with deferred checks (backends/panel_cholqr.py)
ArrayAPIBackend.certified_panels = True
ArrayAPIBackend.certified_panel = _panel_cholqr.certified_panel
ArrayAPIBackend.certified_leaf = _panel_cholqr.certified_leaf
ArrayAPIBackend.new_certificate = _panel_cholqr.new_certificate
ArrayAPIBackend.certificate_failed = _panel_cholqr.certificate_failed


def phase(xp: Any, d: Any) -> Any:
    """``sign(d)`` with ``sign(0) = 1``; ``d/|d|`` for complex (modulus one)."""
    one = xp.ones_like(d)
    if xp.isdtype(d.dtype, "complex floating"):
        ad = xp.abs(d)
        nz = ad != 0
        safe = xp.where(nz, ad, xp.ones_like(ad))
        return xp.where(nz, d / xp.astype(safe, d.dtype), one)
    return xp.where(d < 0, -one, one)


def _device_memory_free(self: ArrayAPIBackend) -> int | None:
    """Free device memory in bytes, or None where the "device" is host memory (no
    default out-of-core budget then)."""
    return None


def _host_staging(self: ArrayAPIBackend, dtype: Any, block_elems: int, *, nbuf: int = 3,
                  nout: int = 2) -> Any:
    """The staging between host arrays and this backend's arrays (see
    :mod:`mpqr.backends.host.staging`); here synchronous copies on the host."""
    from mpqr.backends.host.staging import SyncStaging

    return SyncStaging(self, dtype, block_elems, nbuf)


def _release_cached_memory(self: ArrayAPIBackend, at_least: int = 0,
                           need: int | None = None) -> bool | None:
    """Hand the blocks an array library's memory pool holds unused back to the device
    (between the phases of a call on the lean memory plan) where they are at least
    ``at_least`` bytes and, given the call's ``need`` in bytes, only where the device is
    short of memory beside it. Returns whether the device was short (False: the blocks
    stay), or None where there is no pool (here)."""
    return None


def _reserve_workspace(self: ArrayAPIBackend, nbytes: int, need: int | None = None) -> None:
    """Hold ``nbytes`` of an array library's memory pool as one free block for the
    temporaries that follow (a phase of the lean memory plan), the other cached blocks
    handed back; given the call's ``need``, only where the device is short of memory
    beside it; nothing here."""


def _reserve_scratch(self: ArrayAPIBackend, nbytes: int) -> None:
    """Make sure the array library's memory pool holds a free block of ``nbytes`` for the
    temporaries that follow (split from it and merged back into it, rather than blocks
    of each size beside each other); the pool's other cached blocks are kept. Nothing
    here."""


def _replay(self: ArrayAPIBackend, key: tuple, fn: Any, a: Any, *, overwrite: bool,
            hold_bytes: int) -> tuple:
    """``fn(a, overwrite)``, a route the core marks as free of host reads between its
    launches: a backend with CUDA graphs replays it from the second call of ``key`` on
    (:mod:`mpqr.backends.cupy.graphs`); here it simply runs. ``hold_bytes``: the route's
    workspace beyond its input, estimated (what a kept graph would hold)."""
    return fn(a, overwrite)


ArrayAPIBackend.device_memory_free = _device_memory_free
ArrayAPIBackend.replay = _replay
ArrayAPIBackend.release_cached_memory = _release_cached_memory
ArrayAPIBackend.reserve_workspace = _reserve_workspace
ArrayAPIBackend.reserve_scratch = _reserve_scratch
ArrayAPIBackend.host_staging = _host_staging
