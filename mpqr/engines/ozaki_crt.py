"""Moduli and Chinese-remainder constants of the INT8 Ozaki scheme II.

The moduli are pairwise coprime and at most 256, so every symmetric residue
fits in int8: ``[-128, 127]`` for 256, ``[-(p-1)/2, (p-1)/2]`` for odd ``p``.
They are taken greedily in decreasing order, so the first ``N`` of them give
the largest product ``P`` (``log2 P`` is about ``7.9 N``).

Reconstruction of an integer ``C`` with ``|C| < P/2`` from its residues
``u_l = C mod p_l`` (in ``[0, p_l)``)::

    C = sum_l w_l u_l - Q P,    w_l = (P/p_l) * ((P/p_l)^-1 mod p_l) mod P

The weights ``w_l`` (up to ~160-bit integers) are stored as ``R`` float64
limbs of ``beta`` bits each, limb ``r`` a multiple of ``2**t_r``: then each
limb sum ``S_r = sum_l w_{l,r} u_l`` is exact in float64 (``beta + 8 +
log2 N <= 50`` bits), so is ``T_r = S_r - Q P_r``, and ``C = sum_r T_r``
exactly. The limbs are then renormalised (carries moved up, exact) and summed
smallest first, so ``C`` comes out faithfully rounded even when it is tiny
compared with ``P`` (heavy cancellation in the product).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

__all__ = ["GAUSS_MODULI", "MAX_TERMS", "MODULI", "CrtConstants", "crt_constants",
           "crt_constants_for", "log2_modulus_product", "sqrt_minus_one"]


def _coprime_moduli(limit: int = 256, count: int = 40) -> tuple[int, ...]:
    out: list[int] = []
    for p in range(limit, 2, -1):
        if all(math.gcd(p, q) == 1 for q in out):
            out.append(p)
            if len(out) == count:
                break
    return tuple(out)


#: pairwise coprime moduli <= 256, largest first: 256, 255, 253, 251, 247, 241, ...
MODULI: tuple[int, ...] = _coprime_moduli()
#: most moduli an Ozaki product may use (P < 2^250 keeps every limb far from overflow)
MAX_TERMS = 30


def sqrt_minus_one(p: int) -> int | None:
    """The smallest ``j`` with ``j**2 = -1 (mod p)``, or None if -1 is not a square mod p."""
    return next((j for j in range(1, p) if (j * j + 1) % p == 0), None)


def _gauss_moduli(limit: int = 255) -> tuple[int, ...]:
    out: list[int] = []
    for p in range(limit, 2, -2):  # odd (the residue kernels take 256 and odd moduli)
        if sqrt_minus_one(p) is not None and all(math.gcd(p, q) == 1 for q in out):
            out.append(p)
    return tuple(out)


#: pairwise coprime odd moduli <= 255 modulo which -1 is a square (every prime factor
#: is 1 mod 4), largest first: 241, 233, 229, 221, 205, 197, ... (22 of them, ~152
#: bits). Modulo such a p, ``Z[i]/p`` splits into two copies of ``Z/p`` (``i -> +-j``),
#: so a complex product costs two real modular products (the 2M scheme).
GAUSS_MODULI: tuple[int, ...] = _gauss_moduli()


def log2_modulus_product(n_terms: int, moduli: tuple[int, ...] = MODULI) -> float:
    """``log2`` of the product of the first ``n_terms`` of ``moduli``."""
    return sum(math.log2(p) for p in moduli[:n_terms])


@dataclass(frozen=True)
class CrtConstants:
    """Float64 constants for one number of moduli (see the module docstring)."""

    moduli: tuple[int, ...]
    beta: int  # bits per limb
    shifts: tuple[int, ...]  # t_r, limb r is a multiple of 2**t_r
    weights: tuple[tuple[float, ...], ...]  # weights[l][r] = limb r of w_l
    p_limbs: tuple[float, ...]  # limbs of P
    p_float: float  # P rounded to float64
    log2_p: float


def _limbs(value: int, shifts: tuple[int, ...]) -> tuple[float, ...]:
    """Limb r holds bits [t_r, t_{r-1}) of ``value`` (at most beta bits: exact in float64)."""
    out, top = [], value.bit_length()
    for t in shifts:
        out.append(float(((value & ((1 << top) - 1)) >> t) << t))
        top = t
    assert sum(int(x) for x in out) == value
    return tuple(out)


def crt_constants(n_terms: int) -> CrtConstants:
    """The CRT constants for the first ``n_terms`` moduli (cached)."""
    if not 1 <= n_terms <= MAX_TERMS:
        raise ValueError(f"ozaki_terms must be between 1 and {MAX_TERMS}, got {n_terms}")
    return crt_constants_for(MODULI[:n_terms])


@functools.cache
def crt_constants_for(mods: tuple[int, ...]) -> CrtConstants:
    """The CRT constants for a tuple of pairwise coprime moduli <= 256 (cached)."""
    n_terms = len(mods)
    big_p = math.prod(mods)
    bits = big_p.bit_length()
    # S_r < N * 256 * 2**(t_r + beta) and the carries must stay below 2**(t_r + 53)
    beta = 42 - max(1, math.ceil(math.log2(n_terms)))
    n_limbs = max(1, math.ceil(bits / beta))
    shifts = tuple(max(bits - (r + 1) * beta, 0) for r in range(n_limbs))
    ws = []
    for p in mods:
        q = big_p // p
        w = (q * pow(q, -1, p)) % big_p
        ws.append(_limbs(w, shifts))
    return CrtConstants(tuple(mods), beta, shifts, tuple(ws), _limbs(big_p, shifts),
                        float(big_p), math.log2(big_p))
