"""Native GEMMs: the library's own FP32/FP64 (or complex) GEMM, no tricks."""

from __future__ import annotations

from typing import Any

__all__ = ["run_native"]


def run_native(backend: Any, a: Any, b: Any, *, compute_dtype: Any, out_dtype: Any) -> Any:
    xp = backend.xp
    if a.dtype != compute_dtype:
        a = xp.astype(a, compute_dtype)
    if b.dtype != compute_dtype:
        b = xp.astype(b, compute_dtype)
    c = backend.gemm(a, b)
    return c if c.dtype == out_dtype else xp.astype(c, out_dtype)
