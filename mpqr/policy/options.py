"""Per-call engine options, in the style of nvmath-python: a frozen dataclass
validated in ``__post_init__``, accepted as ``None``, a ``dict`` or the object."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

__all__ = ["GemmOptions", "as_gemm_options"]


@dataclass(frozen=True)
class GemmOptions:
    """Tuning knobs for the GEMM engines. ``None`` means "let the policy decide".

    Parameters
    ----------
    slice_k : int, optional
        Length of the k-slices that ``tc-sgemm`` accumulates outside the tensor
        cores with round-to-nearest. Smaller is more accurate, larger is faster.
    ozaki_terms : int, optional
        Number of INT8 slices / moduli of the ``fp64-emulated`` engine.
    workspace_limit : int, optional
        Bytes of scratch memory an engine may use; larger products are blocked.
    engine : str, optional
        Force one engine by name (``"native"``, ``"tc-fp16"``, ``"tc-sgemm"``,
        ``"ozaki-int8"``); the explain trace records that it was forced.
    complex_product : str, optional
        How an emulated engine forms a complex product: ``"4m"`` (one real
        product of twice the size, as accurate as the real engine; the default
        of the floating-point engines), ``"3m"`` (Karatsuba: three real
        products, 25% fewer flops, a larger error in the imaginary part) or
        ``"2m"`` (``ozaki-int8`` only, its default: two modular products per
        modulus, exact like 4M); see :mod:`mpqr.engines.complex_product` and
        :mod:`mpqr.engines.ozaki_complex`.
    """

    slice_k: int | None = None
    ozaki_terms: int | None = None
    workspace_limit: int | None = None
    engine: str | None = None
    complex_product: str | None = None

    def __post_init__(self) -> None:
        for name in ("slice_k", "ozaki_terms", "workspace_limit"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"GemmOptions.{name} must be a positive int or None, got {v!r}")
        if self.engine is not None and not isinstance(self.engine, str):
            raise TypeError(
                f"GemmOptions.engine must be an engine name or None, got {self.engine!r}"
            )
        if self.complex_product not in (None, "4m", "3m", "2m"):
            raise ValueError(
                "GemmOptions.complex_product must be '4m', '3m', '2m' or None, "
                f"got {self.complex_product!r}"
            )


_FIELDS = {f.name for f in dataclasses.fields(GemmOptions)}


def as_gemm_options(options: Any, argname: str = "options") -> GemmOptions:
    """Accept ``None``, a ``dict`` of fields or a :class:`GemmOptions`."""
    if options is None:
        return GemmOptions()
    if isinstance(options, GemmOptions):
        return options
    if isinstance(options, dict):
        unknown = sorted(set(options) - _FIELDS)
        if unknown:
            raise ValueError(
                f"`{argname}` has unknown keys {unknown}; valid keys are {sorted(_FIELDS)}"
            )
        return GemmOptions(**options)
    raise TypeError(
        f"`{argname}` must be None, a dict or a GemmOptions, got {type(options).__name__}"
    )
