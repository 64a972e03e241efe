"""The backend interface, with portable Array-API defaults.

A backend supplies what the Array API standard lacks and the engines need:
GEMM primitives (native, FP16-in/FP32-out, INT8-in/INT32-out), fp16 rounding,
triangular solve, and small dense kernels. ``ArrayAPIBackend`` implements the
portable part with nothing but the standard (and its ``linalg`` extension), so
any conforming library gets the native engines; NumPy and CuPy override pieces
with LAPACK/cuBLAS/cuSOLVER calls.
"""

from __future__ import annotations

from typing import Any

from mpqr._array_api import namespace_name
from mpqr._errors import LinAlgError

__all__ = ["ArrayAPIBackend", "EngineRates"]


class EngineRates(dict):
    """Sustained rates the cost model uses (FLOP/s, OP/s, B/s, s per launch)."""


class ArrayAPIBackend:
    """Native engines for any Array API namespace; no tensor-core engines."""

    name = "array-api"
    #: capability flags: "fp16" (fp16 GEMM engine), "int8" (exact int8 GEMM),
    #: "tensor-cores" (the fp16/int8 engines are faster than native ones).
    capabilities: frozenset[str] = frozenset()
    #: k-slice length for tc-sgemm's round-to-nearest accumulation.
    tc_sgemm_slice_k = 1024

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
        two = xp.asarray(2.0, dtype=x.dtype)
        return (x * xp.pow(two, xp.astype(h, x.dtype))) * xp.pow(two, xp.astype(e - h, x.dtype))

    # --- GEMM primitives ------------------------------------------------------
    def gemm(self, a: Any, b: Any) -> Any:
        """Native product in the operands' (common) dtype."""
        return self.xp.matmul(a, b)

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

    def cholesky(self, a: Any, *, upper: bool = False) -> Any:
        """Cholesky factor; raises :class:`mpqr.LinAlgError` if not positive definite."""
        xp = self.xp
        try:
            l = xp.linalg.cholesky(a, upper=upper)
        except Exception as exc:  # each library has its own LinAlgError
            raise LinAlgError(f"Cholesky factorization failed: {exc}") from exc
        if not bool(xp.all(xp.isfinite(l))):
            raise LinAlgError("Cholesky factorization failed: matrix is not positive definite")
        return l

    def svd(self, a: Any, *, full_matrices: bool = False) -> tuple[Any, Any, Any]:
        return self.xp.linalg.svd(a, full_matrices=full_matrices)

    def qr_panel(self, a: Any) -> tuple[Any, Any]:
        """Reduced Householder QR of a (small or tall-skinny) panel, native precision."""
        return self.xp.linalg.qr(a)

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
