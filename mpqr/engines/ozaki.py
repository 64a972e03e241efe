"""``ozaki-int8``: FP64-accurate GEMM on INT8 tensor cores (Ozaki scheme II).

Algorithm (Ozaki, Uchino & Imamura, "Ozaki Scheme II: a GEMM-oriented emulation
of floating-point matrix multiplication using an integer modular technique";
GEMMul8):

1. Row ``i`` of A is scaled by ``2**(alpha_A - e_i)`` (``e_i`` the exponent of its
   largest finite entry) and rounded to an integer, ``A' = round(D A)``; columns
   of B likewise with ``alpha_B``. Entries within ``alpha - 52`` bits of their
   line's maximum are kept exactly; smaller ones are rounded at ``2**-alpha``
   of the maximum.
2. ``alpha_A + alpha_B`` is as large as the moduli allow: the exact integer
   product ``C' = A'B'`` must satisfy ``|A'||B'| < P/2`` (``P`` the product of
   the moduli), bounded cheaply by ``2**(alpha_A+alpha_B+1) * rho`` with
   ``rho = min(max_i sum_k |a_ik| 2**-e_i, max_j sum_k |b_kj| 2**-f_j) + 1``
   (no GEMM needed).
3. For each modulus ``p_l`` (pairwise coprime, <= 256, see
   :mod:`mpqr.engines.ozaki_crt`) the symmetric residues of ``A'`` and ``B'``
   are int8, and ``A'_l B'_l`` is one exact int8 x int8 -> int32 GEMM. ``k``
   is cut into chunks of at most ``(2**31 - 1) // 128**2`` (rounded down to a
   multiple of 16) so int32 never
   overflows; chunk results are reduced modulo ``p_l`` and added.
4. The Chinese remainder theorem gives ``C'`` exactly from its residues; the
   sum is done in exact float64 limbs and rounded once (faithful), then
   unscaled by ``2**-(sa_i + sb_j)`` (exact barring under/overflow).

Why scheme II and not scheme I (int8 slices): scheme I needs ``s`` slices of
~7 bits per operand and ``s(s+1)/2`` int8 GEMMs for the triangle of slice
products (8 slices, 36 GEMMs for 53 bits), and every slice product must be
accumulated in floating point. Scheme II needs one GEMM per modulus, each
adding ~7.9 bits of ``log2 P`` shared by both operands: 16-17 GEMMs for the
same 56+ bits per operand, and the integer result is exact, so ``k`` does not
degrade accuracy. Measured on the NumPy backend (same numerics as the GPU):
``bench/results`` and ``tests/test_ozaki.py``.

Number of moduli. With ``options.ozaki_terms = N`` the caller fixes it (fewer
moduli: faster, less accurate, error about ``2**-(alpha_A, alpha_B)`` relative
to the line maxima). Otherwise it is chosen per product from the operands:
the smallest ``N`` whose ``P`` gives each operand ``need`` bits, where

* ``need_bits(k, spread) = 53 + GUARD_BITS + spread - floor(log2(k) / 2)``:
  ``spread`` (0..MAX_SPREAD) is how far below its line's maximum a typical
  entry lies (``log2(nnz * max / sum|x|)``, the worst line), the k credit is
  measured (random rounding errors grow like ``sqrt(k)``, DGEMM's bound like k);
* for operands graded against each other along k by ``E >= GRADING_SLACK`` bits
  (:func:`k_grading`: A's column maxima times B's row maxima), at least
  ``54 + E`` bits: the error bound ``2**(E + 2 - alpha) k M`` is then within
  DGEMM's ``k u M`` on the largest outputs (``M = max (|A||B|)_ij``). Where
  that exceeds the 60-bit shifts of int64 scaling, no moduli count can hold
  it and the product runs on native DGEMM (for ``fp64-emulated``, float64
  accuracy comes first).

The explain trace records the count, the bits and what raised them. Row
scalings of A and column scalings of B (any range) cost nothing: ``E = 0``.
The remaining limitation of per-line scaling (as in GEMMul8's fast mode) is
componentwise: the error is bounded relative to ``max_k |a_ik| * sum_k |b_kj|``
(and the mirror term), so an output much smaller than the largest ones of its
row and column can be less accurate than DGEMM makes it.

Special values. Non-finite entries are set to 0 for the integer part; every
output in a row of A or a column of B holding a NaN/Inf is then recomputed by
the native GEMM of that row/column, so exactly those outputs carry the IEEE
result native float64 gives (NaN, +-Inf), and the rest are unaffected. Zero
lines get shift 0 and give exact zeros. Subnormals and huge exponents are
handled by the exact power-of-two scaling (``backend.ldexp``).

Workspace (bytes) for a block of ``mb`` rows and ``nb`` columns, ``N`` moduli,
``kp, mbp, nbp`` the dimensions padded to multiples of 16::

    W = N*kp*(mbp + nbp)          int8 residues of both operands
      + 4*N*mbp*nbp               int32 products, one plane per modulus
      + 16*k*(mb + nb)            float64/int64 temporaries of the residue pass
      + 8*(L + 3)*mb*nb           reconstruction limbs (L = CRT limbs, <= 7)

The last two terms are the portable path's; a backend with fused kernels
(``backend.ozaki_fused``: CuPy) makes the residues in one pass and reconstructs
straight into C, so only the first two count there (16384^3 at 15 moduli: 23.6 GB
instead of 47 GB, one block instead of two on an 80 GB GPU).

It must stay below ``options.workspace_limit`` (default
``backend.ozaki_workspace_limit()``: 1 GiB on the host, half the free device
memory on CuPy); larger products are blocked over m and n. Blocking does not
change a single bit of the result: the scaling and the number of moduli are
fixed from the whole operands first, and each output is computed from exact
integers. Results are bitwise reproducible run to run.
"""

from __future__ import annotations

import math
from typing import Any

from mpqr.engines import Engine, register_engine
from mpqr.engines.ozaki_crt import MAX_TERMS, MODULI, crt_constants, log2_modulus_product
from mpqr.policy.trace import record_event, tracing

__all__ = ["GUARD_BITS", "MAX_SPREAD", "line_stats", "operands_2d", "ozaki_params",
           "ozaki_predict", "run_ozaki", "run_ozaki_gram", "terms_for"]

#: bits beyond float64's 53 kept per operand (before the k credit) when N is automatic;
#: 2 gives 15 moduli for dense k = 1024..65536 with a max error 0.15-0.9x DGEMM's (CPU,
#: exact reference; 4 gave 16 moduli at 0.08-0.22x), within 2x of DGEMM's error
GUARD_BITS = 2
#: at most this many extra bits are spent on a line's spread of magnitudes
MAX_SPREAD = 8
#: the automatic choice never uses more moduli than this
MAX_AUTO_TERMS = 22
#: the largest integer shift alpha (scaled integers below 2**62 for int64)
_MAX_ALPHA = 60
_PAD = 16
#: int8 x int8 products are at most 128**2 = 2**14: k-chunks below 2**17, multiples of 16
_K_CHUNK = ((2**31 - 1) // (128 * 128)) // _PAD * _PAD


def _pad(x: int) -> int:
    return -(-x // _PAD) * _PAD


def _alpha_sum(n_terms: int, log2_rho: float, moduli: tuple[int, ...] = MODULI) -> int:
    """Largest alpha_A + alpha_B with 2**(alpha_A+alpha_B+1) * rho < P/2 (with margin)."""
    return math.floor(log2_modulus_product(n_terms, moduli) - 2.0 - log2_rho - 1e-6)


def terms_for(need_bits: int, log2_rho: float, moduli: tuple[int, ...] = MODULI) -> int:
    """Fewest moduli giving ``alpha_A + alpha_B >= need_bits`` (capped at MAX_AUTO_TERMS
    and at the number of ``moduli``)."""
    top = min(MAX_AUTO_TERMS, len(moduli))
    for n in range(1, top + 1):
        if _alpha_sum(n, log2_rho, moduli) >= need_bits:
            return n
    return top


def need_bits(k: int, spread: int) -> int:
    """Bits one operand keeps when N is automatic: ``53 + GUARD_BITS + spread - log2(k)/2``.

    The rounding errors of independent entries of A' (or B') add in quadrature
    over k terms while |A||B| grows like k, so relative to |A||B| they shrink
    like ``2**-alpha / sqrt(k)``; float64 GEMM's own error relative to |A||B|
    does not shrink (measured: 1.5e-16 at k=16, 2e-17 at k=65536), so half a
    bit per doubling of k is credited.
    """
    return 53 + GUARD_BITS + spread - base_credit(k)


def base_credit(k: int) -> int:
    """The k credit of :func:`need_bits`: half a bit per doubling of k."""
    return math.floor(0.5 * math.log2(max(k, 1)))


#: k-grading below this many bits is within the exponents' rounding (E exceeds the
#: true log2 ratio by less than 2): ungraded data, no floor
GRADING_SLACK = 3


def graded_need(grade: int) -> int:
    """Bits per operand that bound the error by DGEMM's on the largest outputs for
    operands graded by ``grade`` bits along k (:func:`k_grading`); 0 below
    :data:`GRADING_SLACK` (ungraded data keeps the measured :func:`need_bits`)."""
    return 54 + grade if grade >= GRADING_SLACK else 0


def _estimate_terms(k: int) -> int:
    # typical dense (normal) data: sum|x| / max ~ k/3 along a line, spread 2 bits
    return terms_for(2 * need_bits(k, 2), math.log2(max(k / 3.0, 1.0) + 1.0))


def ozaki_params(backend: Any, m: int, n: int, k: int, dtype: Any, options: Any) -> dict:
    """Policy hook: the number of moduli (fixed by ``options.ozaki_terms`` or estimated)."""
    if options.ozaki_terms is not None:
        if options.ozaki_terms > MAX_TERMS:
            raise ValueError(
                f"GemmOptions.ozaki_terms must be at most {MAX_TERMS}, got {options.ozaki_terms}"
            )
        return {"terms": options.ozaki_terms, "auto_terms": False,
                "workspace_limit": options.workspace_limit}
    return {"terms": _estimate_terms(k), "auto_terms": True,
            "workspace_limit": options.workspace_limit}


def ozaki_predict(backend: Any, m: int, n: int, k: int, batch: int, in_bytes: int,
                  params: dict) -> float:
    """Predicted seconds: N int8 GEMMs plus the memory passes around them.

    Memory traffic per product: the stats and residue passes read both operands
    three times (``3 * 8 * (mk + kn)``; twice with fused kernels), the residues are
    written once and the
    int8 GEMMs read them (``2N(mk + kn)``, counted once in the GEMM rate and once
    here), the int32 planes are written and read back (``8N mn``), the output
    is written (``8 mn``).
    """
    r = backend.rates()
    nt = params["terms"]
    mp, np_, kp = _pad(m), _pad(n), _pad(k)
    ops = 2.0 * mp * np_ * kp * nt
    reads = 16.0 if backend.ozaki_fused else 24.0
    moved = reads * (m * k + k * n) + 2.0 * nt * kp * (mp + np_) + 8.0 * nt * mp * np_ + 8.0 * m * n
    launches = 12 + nt * -(-k // _K_CHUNK)
    return batch * (ops / r["int8"] + moved / r["bandwidth"] + launches * r["launch_s"])


# --- the engine ---------------------------------------------------------------

def line_stats(backend: Any, x: Any, axis: int) -> tuple[Any, Any, Any, Any]:
    """(exponent of the max finite |x|, any non-finite, sum |x| 2**-e, nonzero count) of
    every line along ``axis``: the portable version of ``backend.ozaki_line_stats``."""
    xp = backend.xp
    fin = xp.isfinite(x)
    ax = xp.where(fin, xp.abs(x), xp.zeros_like(x))
    e = backend.exponent(xp.max(ax, axis=axis, keepdims=True))
    rel_sum = xp.sum(backend.ldexp(ax, -e), axis=axis)
    nnz = xp.sum(xp.astype(ax > 0, xp.float64), axis=axis)
    bad = xp.any(xp.logical_not(fin), axis=axis)
    return xp.reshape(e, (-1,)), bad, rel_sum, nnz


def _worst_ratio(xp: Any, rel_sum: Any, nnz: Any) -> Any:
    """``max nnz / sum |x| 2**-e`` over the nonzero lines (0 if none), as a 0-D array."""
    ok = nnz > 0
    ratio = xp.where(ok, nnz / xp.where(ok, rel_sum, xp.ones_like(rel_sum)),
                     xp.zeros_like(rel_sum))
    return xp.max(ratio)


def _spread(worst: float) -> int:
    """Bits a typical nonzero entry lies below its line's maximum, worst line."""
    return min(MAX_SPREAD, max(0, math.ceil(math.log2(worst)))) if worst > 1 else 0


def _operand_summary(backend: Any, sum_a: Any, nnz_a: Any, bad_a: Any, sum_b: Any,
                     nnz_b: Any, bad_b: Any, grading: Any = None
                     ) -> tuple[float, int, int, bool, bool, int]:
    """``(rho, spread_a, spread_b, any bad in A, any bad in B, k-grading bits)`` with one
    host transfer (``backend.small``) instead of one sync per scalar."""
    xp = backend.xp
    f64 = xp.float64
    parts = [xp.max(sum_a), xp.max(sum_b), _worst_ratio(xp, sum_a, nnz_a),
             _worst_ratio(xp, sum_b, nnz_b), xp.astype(xp.any(bad_a), f64),
             xp.astype(xp.any(bad_b), f64)]
    if grading is not None:
        parts.append(xp.astype(grading, f64))
    sb, v = backend.small(xp.stack(parts))
    h = [float(sb.xp.reshape(v[i], ())) for i in range(len(parts))]
    g = int(h[6]) if grading is not None else 0
    return min(h[0], h[1]) + 1.0, _spread(h[2]), _spread(h[3]), h[4] != 0, h[5] != 0, g


def k_grading(backend: Any, a: Any, b: Any) -> Any:
    """Bits ``E`` by which A's columns and B's rows are graded against each other along k
    (a 0-D array): ``E = e(max_k c_k) + e(max_k r_k) - max_k e(c_k) + e(r_k)`` with
    ``c_k = max_i |a_ik|``, ``r_k = max_j |b_kj|`` and ``e`` the exponent (over the
    ``k`` where both are nonzero; 0 if none).

    Why: rounding A' and B' at ``2**-alpha`` of their lines' maxima errs by at most
    ``2**-alpha k max_k c_k max_k r_k <= 2**(E + 2 - alpha) k M`` on any output,
    ``M = max_ij (|A||B|)_ij >= max_k c_k r_k``, while DGEMM's error bound is
    ``k u M`` there: ``alpha >= 54 + E`` bits meet DGEMM's bound on the largest
    outputs whatever the grading. Row scalings of A and column scalings of B leave
    ``E = 0``; ``A0 D @ D^-1 B0`` gives ``E = log2`` of D's range.
    """
    xp = backend.xp
    ca = xp.reshape(backend.max_abs_finite(a, 0), (-1,))
    rb = xp.reshape(backend.max_abs_finite(b, 1), (-1,))
    return grading_from_maxima(backend, ca, rb)


def grading_from_maxima(backend: Any, ca: Any, rb: Any) -> Any:
    """:func:`k_grading` from A's column maxima ``ca`` and B's row maxima ``rb``."""
    xp = backend.xp
    ea = xp.astype(backend.exponent(ca), xp.int64)
    eb = xp.astype(backend.exponent(rb), xp.int64)
    low = xp.asarray(-(1 << 20), dtype=xp.int64, device=_dev(ea))
    both = (ca > 0) & (rb > 0)
    top = xp.max(xp.where(both, ea + eb, low))
    big = xp.max(xp.where(ca > 0, ea, low)) + xp.max(xp.where(rb > 0, eb, low))
    return xp.where(xp.any(both), big - top, xp.zeros_like(top))


def _choose_alphas(n_terms: int, log2_rho: float, need_a: int, need_b: int,
                   k: int, moduli: tuple[int, ...] = MODULI) -> tuple[int, int]:
    total = _alpha_sum(n_terms, log2_rho, moduli)
    extra = total - need_a - need_b
    alpha_a = need_a + extra // 2
    alpha_b = total - alpha_a
    alpha_a, alpha_b = min(alpha_a, _MAX_ALPHA), min(alpha_b, _MAX_ALPHA)
    if alpha_a < 1 or alpha_b < 1:
        need = terms_for(2, log2_rho, moduli)
        raise ValueError(
            f"ozaki_terms={n_terms} moduli cannot hold this product (k={k}): "
            f"at least {need} are needed"
        )
    return alpha_a, alpha_b


def operands_2d(xp: Any, a: Any, b: Any, dtype: Any) -> tuple[Any, Any]:
    """``(a, b)`` in ``dtype``; the engine takes 2-D operands only (NotImplementedError)."""
    if a.ndim != 2 or b.ndim != 2:
        raise NotImplementedError(
            f"the ozaki-int8 engine takes 2-D operands, got ndim {a.ndim} and {b.ndim}"
        )
    return (a if a.dtype == dtype else xp.astype(a, dtype),
            b if b.dtype == dtype else xp.astype(b, dtype))


def run_ozaki(backend: Any, a: Any, b: Any, *, out_dtype: Any, terms: int, auto_terms: bool,
              workspace_limit: int | None = None) -> Any:
    """``a @ b`` to float64 accuracy with INT8 GEMMs (see the module docstring)."""
    xp = backend.xp
    a, b = operands_2d(xp, a, b, xp.float64)
    m, k = a.shape
    n = b.shape[1]
    ea, bad_a, sum_a, nnz_a = backend.ozaki_line_stats(a, 1)
    eb, bad_b, sum_b, nnz_b = backend.ozaki_line_stats(b, 0)
    rho, spread_a, spread_b, any_bad_a, any_bad_b, grade = _operand_summary(
        backend, sum_a, nnz_a, bad_a, sum_b, nnz_b, bad_b,
        k_grading(backend, a, b) if auto_terms else None)
    log2_rho = math.log2(rho)
    spread = (spread_a, spread_b)
    need_a = need_bits(k, spread[0])
    need_b = need_bits(k, spread[1])
    why = ""
    if auto_terms:
        floor = graded_need(grade)
        if floor > _MAX_ALPHA:  # no moduli count can hold it: DGEMM keeps its bound
            if tracing():
                record_event("ozaki", f"ozaki-int8: A's columns and B's rows graded by {grade} "
                             f"bits along k need alpha >= {floor} bits per operand (at most "
                             f"{_MAX_ALPHA}): native DGEMM instead", grading=grade,
                             need=floor)
            c = backend.gemm(a, b)
            return c if c.dtype == out_dtype else xp.astype(c, out_dtype)
        base = (need_a, need_b)
        need_a, need_b = max(need_a, floor), max(need_b, floor)
        terms = terms_for(need_a + need_b, log2_rho)
        why = (f"; need ({need_a}, {need_b}) bits: 53 + {GUARD_BITS} guard + spread "
               f"({spread_a}, {spread_b}) - {base_credit(k)} k-credit")
        if floor > max(base):
            why += f", raised to {floor} by the k-grading ({grade} bits)"
        why += f", log2 rho {log2_rho:.3g}"
    alpha_a, alpha_b = _choose_alphas(terms, log2_rho, need_a, need_b, k)
    consts = crt_constants(terms)
    sa = xp.astype(alpha_a - ea, xp.int32)
    sb = xp.astype(alpha_b - eb, xp.int32)
    limit = workspace_limit or backend.ozaki_workspace_limit()
    mb, nb = _block_sizes(m, n, k, terms, len(consts.shifts), limit, backend.ozaki_fused)
    if tracing():
        record_event("ozaki", f"ozaki-int8: {terms} moduli ({'auto' if auto_terms else 'fixed'}),"
                     f" alpha=({alpha_a}, {alpha_b}) bits, blocks {mb}x{nb}{why}",
                     terms=terms, alpha=(alpha_a, alpha_b), block=(mb, nb), log2_rho=log2_rho,
                     spread=spread, grading=grade)
    def b_residues(j0: int, j1: int) -> Any:
        return backend.ozaki_residues(b[:, j0:j1], sb[j0:j1], consts.moduli, transpose=True,
                                      rows_p=_pad(j1 - j0), cols_p=_pad(k))

    # one column block (the common case of blocking): B's residues are made once
    brt_all = b_residues(0, n) if nb >= n else None
    # blocks are reconstructed straight into their slice of C (no concatenation copy)
    c = None if mb >= m and nb >= n else xp.empty((m, n), dtype=xp.float64, device=_dev(a))
    for i0 in range(0, m, mb):
        i1 = min(m, i0 + mb)
        ar = backend.ozaki_residues(a[i0:i1, :], sa[i0:i1], consts.moduli, transpose=False,
                                    rows_p=_pad(i1 - i0), cols_p=_pad(k))
        for j0 in range(0, n, nb):
            j1 = min(n, j0 + nb)
            brt = brt_all if brt_all is not None else b_residues(j0, j1)
            prods = _int8_products(backend, ar, brt, consts.moduli, _pad(k))
            blk = backend.ozaki_reconstruct(prods, consts, sa[i0:i1], sb[j0:j1], i1 - i0,
                                            j1 - j0, out=None if c is None else c[i0:i1, j0:j1])
            c = blk if c is None else c
            del brt, prods, blk
        del ar
    c = _patch_nonfinite(backend, c, a, b, bad_a if any_bad_a else None,
                         bad_b if any_bad_b else None)
    return c if c.dtype == out_dtype else xp.astype(c, out_dtype)


def run_ozaki_gram(backend: Any, a: Any, b: Any, *, out_dtype: Any, sign: int, terms: int,
                   auto_terms: bool, workspace_limit: int | None = None) -> Any:
    """The upper blocks of ``a^T b`` (``k x n`` operands, symmetric for ``sign = 1``,
    antisymmetric for ``-1``), mirrored: the SYRK-shaped call of
    :mod:`mpqr.engines.gram`. For ``a is b`` one residue pass serves both sides
    (equal shifts ``alpha_A = alpha_B``). Falls back to :func:`run_ozaki` and a
    mirror where the residues of the whole operands exceed the workspace limit."""
    from mpqr.engines.gram import gram_blocks, mirror, product_fraction

    xp = backend.xp
    same = b is a
    if a.dtype != xp.float64:
        a = xp.astype(a, xp.float64)
    b = a if same else (b if b.dtype == xp.float64 else xp.astype(b, xp.float64))
    k, n = a.shape
    ea, bad_a, sum_a, nnz_a = backend.ozaki_line_stats(a, 0)
    eb, bad_b, sum_b, nnz_b = (ea, bad_a, sum_a, nnz_a) if same else \
        backend.ozaki_line_stats(b, 0)
    # (a^T a has E = 0: no k-grading; the Im part a^T z likewise up to a sign swap)
    rho, spread_a, spread_b, any_bad_a, any_bad_b, _ = _operand_summary(
        backend, sum_a, nnz_a, bad_a, sum_b, nnz_b, bad_b)
    log2_rho = math.log2(rho)
    need = need_bits(k, max(spread_a, spread_b))
    if auto_terms:
        terms = terms_for(2 * need, log2_rho)
    alpha_a, alpha_b = _choose_alphas(terms, log2_rho, need, need, k)
    if same:  # one residue pass for both sides
        alpha_a = alpha_b = min(alpha_a, alpha_b)
    consts = crt_constants(terms)
    limit = workspace_limit or backend.ozaki_workspace_limit()
    res_bytes = (1 if same else 2) * terms * _pad(k) * _pad(n)
    if res_bytes + 4 * terms * _pad(n) ** 2 > limit:
        if tracing():
            record_event("ozaki", f"ozaki-int8 gram: the residues ({res_bytes / 2**30:.2g} GiB) "
                         "exceed the workspace limit: the full product, mirrored")
        c = run_ozaki(backend, xp.matrix_transpose(a), b, out_dtype=xp.float64, terms=terms,
                      auto_terms=False, workspace_limit=workspace_limit)
        c = mirror(backend, c, sign)
        return c if c.dtype == out_dtype else xp.astype(c, out_dtype)
    sa = xp.astype(alpha_a - ea, xp.int32)
    sb = xp.astype(alpha_b - eb, xp.int32)
    if tracing():
        how = "auto" if auto_terms else "fixed"
        passes = "one residue pass" if same else "two residue passes"
        record_event("ozaki", f"ozaki-int8 gram: {terms} moduli ({how}), alpha=({alpha_a}, "
                     f"{alpha_b}) bits, upper triangle in {len(gram_blocks(n))} blocks "
                     f"({product_fraction(n):.0%} of the GEMM's int8 products), {passes}",
                     terms=terms, alpha=(alpha_a, alpha_b), log2_rho=log2_rho,
                     fraction=product_fraction(n))
    ar = backend.ozaki_residues(a, sa, consts.moduli, transpose=True, rows_p=_pad(n),
                                cols_p=_pad(k))
    brt = ar if same else backend.ozaki_residues(b, sb, consts.moduli, transpose=True,
                                                 rows_p=_pad(n), cols_p=_pad(k))
    c = xp.zeros((n, n), dtype=xp.float64, device=_dev(a))
    for i0, i1, j0, j1 in gram_blocks(n):
        prods = _int8_products(backend, ar[:, i0:_pad(i1), :], brt[:, j0:_pad(j1), :],
                               consts.moduli, _pad(k))
        backend.ozaki_reconstruct(prods, consts, sa[i0:i1], sb[j0:j1], i1 - i0, j1 - j0,
                                  out=c[i0:i1, j0:j1])
        del prods
    del ar, brt
    at = xp.matrix_transpose(a)
    c = _patch_nonfinite(backend, c, at, b, bad_a if any_bad_a else None,
                         bad_b if any_bad_b else None)
    c = mirror(backend, c, sign)
    return c if c.dtype == out_dtype else xp.astype(c, out_dtype)


def _int8_products(backend: Any, ar: Any, brt: Any, moduli: tuple[int, ...], kp: int) -> Any:
    xp = backend.xp
    prods = None
    for k0 in range(0, kp, _K_CHUNK):
        part = backend.ozaki_int8_gemms(ar, brt, k0, min(kp, k0 + _K_CHUNK))
        if prods is None:
            prods = part
        else:  # reduce both chunks modulo p_l first so the int32 sum cannot overflow
            p = xp.reshape(xp.asarray(moduli, dtype=xp.int32, device=_dev(part)), (-1, 1, 1))
            prods = xp.remainder(prods, p) + xp.remainder(part, p)
    return prods


def _dev(x: Any) -> Any:
    from mpqr._array_api import device

    return device(x)


def workspace_bytes(mb: int, nb: int, k: int, n_terms: int, n_limbs: int,
                    fused: bool = False) -> int:
    """The workspace formula of the module docstring (``fused``: without the portable
    path's temporaries)."""
    kp, mbp, nbp = _pad(k), _pad(mb), _pad(nb)
    w = n_terms * kp * (mbp + nbp) + 4 * n_terms * mbp * nbp
    return w if fused else w + 16 * k * (mb + nb) + 8 * (n_limbs + 3) * mb * nb


def _block_sizes(m: int, n: int, k: int, n_terms: int, n_limbs: int,
                 limit: int, fused: bool = False) -> tuple[int, int]:
    """Largest (mb, nb), halving the larger side, whose workspace fits ``limit``."""
    mb, nb = m, n
    while workspace_bytes(mb, nb, k, n_terms, n_limbs, fused) > limit and max(mb, nb) > _PAD:
        if mb >= nb:
            mb = max(_PAD, _pad(-(-mb // 2)))
        else:
            nb = max(_PAD, _pad(-(-nb // 2)))
    return min(mb, m), min(nb, n)


def _patch_nonfinite(backend: Any, c: Any, a: Any, b: Any, bad_a: Any, bad_b: Any) -> Any:
    """Recompute natively the rows/columns that see a NaN/Inf (IEEE pattern of native);
    ``bad_a``/``bad_b`` are the line masks, or None where no line is bad."""
    xp = backend.xp
    if bad_a is not None:
        idx = xp.nonzero(bad_a)[0]
        fixed = backend.gemm(xp.take(a, idx, axis=0), b)
        c = _replace_lines(xp, c, bad_a, fixed, axis=0)
    if bad_b is not None:
        idx = xp.nonzero(bad_b)[0]
        fixed = backend.gemm(a, xp.take(b, idx, axis=1))
        c = _replace_lines(xp, c, bad_b, fixed, axis=1)
    return c


def _replace_lines(xp: Any, c: Any, mask: Any, new: Any, axis: int) -> Any:
    """``c`` with the lines where ``mask`` holds replaced by ``new``'s lines, in order."""
    size = c.shape[axis]
    pos = xp.cumulative_sum(xp.astype(mask, xp.int64)) - 1
    ar = xp.arange(size, dtype=xp.int64, device=_dev(c))
    src = xp.where(mask, size + pos, ar)
    return xp.take(xp.concat([c, new], axis=axis), src, axis=axis)


register_engine(Engine("ozaki-int8", 53, frozenset({"int8"}), run_ozaki, ozaki_predict,
                       ozaki_params, batched=False, gram=run_ozaki_gram))
