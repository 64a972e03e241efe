"""Complex products on the real engines (``tc-fp16``, ``tc-sgemm``, ``ozaki-int8``).

A complex product ``C = A B`` with ``A = Ar + i Ai`` and ``B = Br + i Bi`` is
formed from real engine products, so every engine (and both backends) gets
complex support from its real path, bit for bit the same on NumPy and CuPy.
``ozaki-int8`` has a third scheme of its own, 2M (see
:mod:`mpqr.engines.ozaki_complex`): modular arithmetic splits a complex product
into two real ones per modulus. Each engine's default is in
:data:`DEFAULT_SCHEME`, chosen by measurement.

``"4m"`` (the default of ``tc-fp16``): the four real products
as ONE real product of twice the size, the smaller operand written twice::

    [[Ar, -Ai], [Ai, Ar]] @ [Br; Bi] = [Cr; Ci]      (m <= n)
    [Ar, Ai] @ [[Br, Bi], [-Bi, Br]] = [Cr | Ci]     (m > n)

The real and imaginary parts are each one real dot product of length ``2k``:
the engine's own error bound applies to them (with ``|Ar||Br| + |Ai||Bi|``,
at most ``sqrt(2) |A||B|``, in place of ``|A||B|``), the cancellation in
``Ar Br - Ai Bi`` happens inside the engine (exactly, for ``ozaki-int8``), and
one scaling and splitting pass serves all four products.

``"3m"`` (Karatsuba, the default of ``tc-sgemm`` and ``ozaki-int8``)::

    T1 = Ar Br,  T2 = Ai Bi,  T3 = (Ar + Ai)(Br + Bi)
    Cr = T1 - T2,  Ci = (T3 - T1) - T2

three real products (25% fewer flops, three scaling passes instead of one),
but ``Ci`` carries the errors of three products of up to ``2 |A||B|`` each,
and ``Ar + Ai`` is rounded (and can overflow near the overflow threshold).
Measured on the NumPy backend (16x16 outputs, k = 64..8192, exact reference;
``bench/NOTES.md``): the real parts agree, the imaginary part of 3M is
1.0-2.0x 4M's error on every engine; on an H100 (8192^3 and 16384^3, random
data) both parts stayed at 0.05-0.22x the native complex GEMM's error, and 3M
was the fastest scheme of ``tc-sgemm`` and ``ozaki-int8``, so they default to it.
``tc-fp16`` keeps 4M: at half precision a 2x larger imaginary error is not free.

NaN/Inf: a non-finite entry of row ``i`` of A (column ``j`` of B) reaches
both ``Cr`` and ``Ci`` of that row (column), as in the native complex GEMM.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["DEFAULT_SCHEME", "SCHEMES", "default_scheme", "real_dims", "real_dtype",
           "run_complex"]

#: complex-product schemes
SCHEMES = ("4m", "3m", "2m")

#: each engine's default scheme, by measurement (H100, `python -m mpqr bench gemm --kinds
#: complex`): 3M was fastest on both engines with errors 0.05-0.22x the native complex
#: GEMM's (ZGEMM 16384^3: 3M 1.98x cuBLAS, 4M 1.59x, 2M 1.43x; CGEMM: 3M 3.93x, 4M
#: 3.05x); tc-fp16 keeps 4M, the scheme with the real engine's error bound
DEFAULT_SCHEME = {"ozaki-int8": "3m", "tc-sgemm": "3m"}


def default_scheme(engine: str) -> str:
    """The complex-product scheme ``engine`` runs unless ``GemmOptions`` names one."""
    return DEFAULT_SCHEME.get(engine, "4m")


def real_dtype(xp: Any, dtype: Any) -> Any:
    """The real dtype of a complex dtype's parts."""
    return xp.float64 if dtype == xp.complex128 else xp.float32


def real_dims(m: int, n: int, k: int, scheme: str) -> tuple[tuple[int, int, int], int]:
    """``((m', n', k'), count)``: the real products one complex ``(m, n, k)`` product runs
    (``"2m"``: two modular products per modulus, counted as two real products)."""
    if scheme == "3m":
        return (m, n, k), 3
    if scheme == "2m":
        return (m, n, k), 2
    return ((2 * m, n, 2 * k) if m <= n else (m, 2 * n, 2 * k)), 1


def run_complex(backend: Any, real_gemm: Callable[[Any, Any], Any], a: Any, b: Any, *,
                scheme: str) -> Any:
    """``a @ b`` for complex ``a``, ``b`` (equal complex dtypes) from ``real_gemm``
    products of their real dtype (see the module docstring)."""
    xp = backend.xp
    ar, ai, br, bi = xp.real(a), xp.imag(a), xp.real(b), xp.imag(b)
    m, n = a.shape[-2], b.shape[-1]
    if scheme == "3m":
        with backend.ignore_fp_warnings():  # Inf - Inf is NaN, as in the native GEMM
            t1 = real_gemm(ar, br)
            t2 = real_gemm(ai, bi)
            t3 = real_gemm(ar + ai, br + bi)
            return backend.complex_from_parts(t1 - t2, (t3 - t1) - t2)
    k = a.shape[-1]
    rdt = ar.dtype
    if m <= n:
        a2 = backend.empty_for(a, (*a.shape[:-2], 2 * m, 2 * k), rdt)  # written once
        a2[..., :m, :k] = ar
        a2[..., :m, k:] = -ai
        a2[..., m:, :k] = ai
        a2[..., m:, k:] = ar
        c2 = real_gemm(a2, xp.concat([br, bi], axis=-2))
        return backend.complex_from_parts(c2[..., :m, :], c2[..., m:, :])
    b2 = backend.empty_for(b, (*b.shape[:-2], 2 * k, 2 * n), rdt)
    b2[..., :k, :n] = br
    b2[..., :k, n:] = bi
    b2[..., k:, :n] = -bi
    b2[..., k:, n:] = br
    c2 = real_gemm(xp.concat([ar, ai], axis=-1), b2)
    return backend.complex_from_parts(c2[..., :n], c2[..., n:])
