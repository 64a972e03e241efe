"""``ozaki-int8`` complex products in two real modular products per modulus (2M).

Modulo a ``p`` for which ``j^2 = -1 (mod p)`` has a solution (every prime factor
of ``p`` is 1 mod 4; :data:`mpqr.engines.ozaki_crt.GAUSS_MODULI`), the Gaussian
integers split: ``Z[i]/p = Z/p x Z/p`` by ``x + i y -> (x + j y, x - j y)``. So
the exact integer product ``C' = A'B'`` of the scaled complex operands (as in
:mod:`mpqr.engines.ozaki`, rows of ``A = Ar + i Ai`` sharing one shift, columns of
``B`` likewise) is, modulo each ``p_l``::

    X+ = (Ar' + j Ai')(Br' + j Bi'),   X- = (Ar' - j Ai')(Br' - j Bi')
    Cr' = (X+ + X-) / 2,               Ci' = (X+ - X-) / (2 j)

two int8 GEMMs per modulus where the 4M product runs four (one of twice the size)
and 3M three. ``Cr'`` and ``Ci'`` are then rebuilt by the Chinese remainder theorem
exactly as real products are: ``Cr' = Ar'Br' - Ai'Bi'`` is the same integer the 4M
product forms, so with the same shifts the result is the same bits, the error
bound is the real engine's for a length-``2k`` product, and the moduli count is
chosen the same way (:func:`mpqr.engines.ozaki.need_bits`, the k-grading floor).
The moduli are smaller (``log2 P`` about 7.5 bits per modulus instead of 7.9), so
a product needs about 8% more of them: ``2 * 17`` int8 GEMMs of ``m x n x k``
against 4M's ``15`` of ``2m x n x 2k`` (60 units), 1.8x fewer integer products.

This is the scheme of GEMMul8's complex GEMMs (Uchino, Ozaki and Imamura).
Special values, zero lines and blocking are as in the real engine.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from mpqr.engines import ENGINES, register_engine
from mpqr.engines import ozaki as oz
from mpqr.engines.ozaki_crt import GAUSS_MODULI, crt_constants_for, sqrt_minus_one
from mpqr.policy.trace import record_event, tracing

__all__ = ["run_ozaki_2m", "run_ozaki_gram_2m", "terms_2m"]


def terms_2m(k: int) -> int:
    """The policy's estimate of the 2M moduli count for inner dimension ``k`` (dense data)."""
    return oz.terms_for(2 * oz.need_bits(2 * k, 2), math.log2(max(2 * k / 3.0, 1.0) + 1.0),
                        GAUSS_MODULI)


def _joint_stats(backend: Any, xr: Any, xi: Any, axis: int) -> tuple[Any, Any, Any, Any]:
    """:func:`mpqr.engines.ozaki.line_stats` of the lines of ``[Xr, Xi]`` (``axis=1``) or
    ``[Xr; Xi]`` (``axis=0``) from those of the parts (no concatenated copy)."""
    xp = backend.xp
    er, bad_r, sum_r, nnz_r = backend.ozaki_line_stats(xr, axis)
    ei, bad_i, sum_i, nnz_i = backend.ozaki_line_stats(xi, axis)
    e = xp.maximum(er, ei)
    # each part's relative sum moved to the joint exponent (exact powers of two)
    rel = backend.ldexp(sum_r, er - e) + backend.ldexp(sum_i, ei - e)
    return e, xp.logical_or(bad_r, bad_i), rel, nnz_r + nnz_i


def run_ozaki_2m(backend: Any, a: Any, b: Any, *, out_dtype: Any, terms: int,
                 auto_terms: bool, workspace_limit: int | None = None) -> Any:
    """Complex ``a @ b`` (2-D) to float64 accuracy by the 2M scheme (module docstring)."""
    xp = backend.xp
    a, b = oz.operands_2d(xp, a, b, xp.complex128)
    m, k = a.shape
    n = b.shape[1]
    ar, ai, br, bi = xp.real(a), xp.imag(a), xp.real(b), xp.imag(b)
    ea, bad_a, sum_a, nnz_a = _joint_stats(backend, ar, ai, 1)
    eb, bad_b, sum_b, nnz_b = _joint_stats(backend, br, bi, 0)
    grading = None
    if auto_terms:
        ca = xp.maximum(backend.max_abs_finite(ar, 0), backend.max_abs_finite(ai, 0))
        rb = xp.maximum(backend.max_abs_finite(br, 1), backend.max_abs_finite(bi, 1))
        grading = oz.grading_from_maxima(backend, xp.reshape(ca, (-1,)), xp.reshape(rb, (-1,)))
    rho, spread_a, spread_b, any_bad_a, any_bad_b, grade = oz._operand_summary(
        backend, sum_a, nnz_a, bad_a, sum_b, nnz_b, bad_b, grading)
    log2_rho = math.log2(rho)
    k2 = 2 * k  # each part is one real dot product of length 2k
    need_a, need_b = oz.need_bits(k2, spread_a), oz.need_bits(k2, spread_b)
    why = ""
    if auto_terms:
        floor = oz.graded_need(grade)
        if floor > oz._MAX_ALPHA:
            if tracing():
                record_event("ozaki", f"ozaki-int8 2M: A's columns and B's rows graded by "
                             f"{grade} bits along k need alpha >= {floor} bits per operand "
                             f"(at most {oz._MAX_ALPHA}): native ZGEMM instead",
                             grading=grade, need=floor)
            c = backend.gemm(a, b)
            return c if c.dtype == out_dtype else xp.astype(c, out_dtype)
        need_a, need_b = max(need_a, floor), max(need_b, floor)
        terms = oz.terms_for(need_a + need_b, log2_rho, GAUSS_MODULI)
        why = (f"; need ({need_a}, {need_b}) bits (spread ({spread_a}, {spread_b}), "
               f"k-grading {grade} bits), log2 rho {log2_rho:.3g}")
    terms = min(terms, len(GAUSS_MODULI))
    alpha_a, alpha_b = oz._choose_alphas(terms, log2_rho, need_a, need_b, k2, GAUSS_MODULI)
    mods = GAUSS_MODULI[:terms]
    js = tuple(sqrt_minus_one(p) for p in mods)
    consts = crt_constants_for(mods)
    sa = xp.astype(alpha_a - ea, xp.int32)
    sb = xp.astype(alpha_b - eb, xp.int32)
    limit = workspace_limit or backend.ozaki_workspace_limit()
    # 2N product planes and the 2N planes of Cr, Ci live together; the parts' residues
    # (2N) beside their Gaussian combinations (2N): the real formula at 4N planes
    mb, nb = oz._block_sizes(m, n, k, 4 * terms, len(consts.shifts), limit,
                             backend.ozaki_fused)
    if tracing():
        record_event("ozaki", f"ozaki-int8 2M: {terms} Gaussian moduli "
                     f"({'auto' if auto_terms else 'fixed'}), {2 * terms} int8 GEMMs, "
                     f"alpha=({alpha_a}, {alpha_b}) bits, blocks {mb}x{nb}{why}",
                     terms=terms, alpha=(alpha_a, alpha_b), block=(mb, nb), scheme="2m")
    kp = oz._pad(k)
    planes = mods + mods  # X+ then X- for each modulus

    def residues(xr: Any, xi: Any, shift: Any, transpose: bool, rows: int) -> Any:
        kw = {"transpose": transpose, "rows_p": oz._pad(rows), "cols_p": kp}
        rr = backend.ozaki_residues(xr, shift, mods, **kw)
        ri = backend.ozaki_residues(xi, shift, mods, **kw)
        return backend.ozaki_gauss_residues(rr, ri, mods, js)

    c = xp.empty((m, n), dtype=xp.complex128, device=oz._dev(a))
    brt_all = residues(br, bi, sb, True, n) if nb >= n else None
    for i0 in range(0, m, mb):
        i1 = min(m, i0 + mb)
        ua = residues(ar[i0:i1, :], ai[i0:i1, :], sa[i0:i1], False, i1 - i0)
        for j0 in range(0, n, nb):
            j1 = min(n, j0 + nb)
            ub = brt_all if brt_all is not None else \
                residues(br[:, j0:j1], bi[:, j0:j1], sb[j0:j1], True, j1 - j0)
            prods = oz._int8_products(backend, ua, ub, planes, kp)
            cr, ci = backend.ozaki_gauss_combine(prods, mods, js)
            del prods
            re = backend.ozaki_reconstruct(cr, consts, sa[i0:i1], sb[j0:j1], i1 - i0, j1 - j0)
            im = backend.ozaki_reconstruct(ci, consts, sa[i0:i1], sb[j0:j1], i1 - i0, j1 - j0)
            c[i0:i1, j0:j1] = backend.complex_from_parts(re, im)
            del cr, ci, re, im, ub
        del ua
    c = oz._patch_nonfinite(backend, c, a, b, bad_a if any_bad_a else None,
                            bad_b if any_bad_b else None)
    return c if c.dtype == out_dtype else xp.astype(c, out_dtype)




def run_ozaki_gram_2m(backend: Any, x: Any, *, out_dtype: Any, terms: int, auto_terms: bool,
                      workspace_limit: int | None = None) -> Any | None:
    """``X^H X`` for complex 2-D ``x`` by 2M in one int8 GEMM per Gaussian modulus, or None
    where its workspace exceeds the limit (the caller takes two real triangles then).

    With ``U = Xr + j Xi`` and ``V = Xr - j Xi`` (mod p, one shift per column of X for
    both sides), ``X+ = V^T U`` and ``X- = U^T V = (X+)^T``: one product gives both, and
    ``Cr = (X+ + X+^T) / 2`` is exactly symmetric, ``Ci = (X+ - X+^T) / (2 j)`` exactly
    antisymmetric. That is one ``n x n x m`` product per modulus, where the real Gram of
    the same size needs 5/8 of one and the two real triangles of ``Re``/``Im`` 5/2.
    """
    from mpqr.engines.gram import mirror

    xp = backend.xp
    if x.dtype != xp.complex128:
        x = xp.astype(x, xp.complex128)
    m, n = x.shape
    xr, xi = xp.real(x), xp.imag(x)
    e, bad, rel, nnz = _joint_stats(backend, xr, xi, 0)
    rho, spread, _, any_bad, _, _ = oz._operand_summary(backend, rel, nnz, bad, rel, nnz, bad)
    log2_rho = math.log2(rho)
    need = oz.need_bits(2 * m, spread)
    if auto_terms:
        terms = oz.terms_for(2 * need, log2_rho, GAUSS_MODULI)
    terms = min(terms, len(GAUSS_MODULI))
    alpha = min(oz._choose_alphas(terms, log2_rho, need, need, 2 * m, GAUSS_MODULI))
    mods = GAUSS_MODULI[:terms]
    limit = workspace_limit or backend.ozaki_workspace_limit()
    np_, kp = oz._pad(n), oz._pad(m)
    if 4 * terms * kp * np_ + 16 * terms * np_ * np_ > limit:
        return None
    js = tuple(sqrt_minus_one(p) for p in mods)
    consts = crt_constants_for(mods)
    s = xp.astype(alpha - e, xp.int32)
    if tracing():
        record_event("ozaki", f"ozaki-int8 2M gram: {terms} Gaussian moduli "
                     f"({'auto' if auto_terms else 'fixed'}), {terms} int8 GEMMs (X+ = V^T U, "
                     f"X- its transpose), alpha={alpha} bits", terms=terms, alpha=alpha,
                     scheme="2m")
    kw = {"transpose": True, "rows_p": np_, "cols_p": kp}
    uv = backend.ozaki_gauss_residues(backend.ozaki_residues(xr, s, mods, **kw),
                                      backend.ozaki_residues(xi, s, mods, **kw), mods, js)
    plus = oz._int8_products(backend, uv[terms:], uv[:terms], mods, kp)  # V^T U per plane
    del uv
    prods = xp.concat([plus, xp.permute_dims(plus, (0, 2, 1))], axis=0)
    del plus
    cr, ci = backend.ozaki_gauss_combine(prods, mods, js)
    del prods
    re = mirror(backend, backend.ozaki_reconstruct(cr, consts, s, s, n, n), 1)
    im = mirror(backend, backend.ozaki_reconstruct(ci, consts, s, s, n, n), -1)
    g = backend.complex_from_parts(re, im)
    if any_bad:
        g = oz._patch_nonfinite(backend, g, xp.conj(xp.matrix_transpose(x)), x, bad, bad)
        g = backend.complex_from_parts(mirror(backend, xp.real(g), 1),
                                       mirror(backend, xp.imag(g), -1))
    return g if g.dtype == out_dtype else xp.astype(g, out_dtype)


register_engine(dataclasses.replace(ENGINES["ozaki-int8"], complex_2m=run_ozaki_2m,
                                    complex_gram=run_ozaki_gram_2m))
