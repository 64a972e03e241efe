"""Cholesky QR: CholQR, CholQR2 and shifted CholQR3 (Fukaya et al. 2020).

``R = chol(A^H A)``, ``Q = A R^{-1}``: one Gram GEMM (through the precision
policy) and one triangular solve — the fewest passes over A, but the Gram
matrix squares the condition number. CholQR's orthogonality error grows like
``cond(A)^2 u`` and its Cholesky fails once ``cond(A)^2 u`` nears 1; CholQR2
repeats it once and reaches ``O(u)`` orthogonality for ``cond(A) < u^{-1/2}``;
shifted CholQR3 first factors ``A^H A + s I`` with
``s = 11 (m n + n (n + 1)) u ||A||_F^2`` so the Cholesky cannot fail for
``cond(A) < u^{-1}``, then runs CholQR2 on the result.

A method that cannot factor its input raises :class:`mpqr.BreakdownError`
naming itself and an estimate of ``cond(A)``.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Callable, Iterator
from typing import Any

from mpqr._array_api import array_namespace, device
from mpqr._errors import BreakdownError, LinAlgError
from mpqr.policy import fused_gemm, gemm, gemm_into, gemm_sub, record_event, result_dtype
from mpqr.qr._kernels import SAFE_EXPONENT, panel_precision
from mpqr.qr.cholqr_steps import StepNumbers, passes
from mpqr.qr.gram_blocked import gram

__all__ = ["EARLY_HAND_OVER", "INVERSE_COND_MAX", "SAFE_GRAM_MIN", "TALL_EMULATED", "cholqr",
           "cholqr2", "defer_last_solve", "hand_over_early", "inverse_and_cond",
           "reuse_first_gram", "right_solve_upper", "right_solve_upper_gram",
           "shifted_cholqr3", "tall_precision"]

_REACH = {"cholqr": "cond(x) < ~u^(-1/2)", "cholqr2": "cond(x) < ~u^(-1/2)",
          "shifted-cholqr3": "cond(x) < ~u^(-1)"}


#: smallest squared column norm a Gram matrix takes without underflow losses: the square
#: of the smallest column maximum that scale_columns(only_if_needed=True) leaves alone
SAFE_GRAM_MIN = {k: 2.0 ** (-2 * v) for k, v in SAFE_EXPONENT.items()}


def unit_roundoff(xp: Any, dtype: Any) -> float:
    return 2.0**-24 if dtype in (xp.float32, xp.complex64) else 2.0**-53


#: unit roundoff of each precision's GEMM inputs (fp16 rounds its inputs to 11 bits)
_GEMM_U = {"fp32": 2.0**-24, "fp32-emulated": 2.0**-24, "fp16": 2.0**-11}


def gram_roundoff(xp: Any, dtype: Any, prec_name: str) -> float:
    """Unit roundoff of a Gram matrix made at ``prec_name``: the larger of the GEMM's and
    the dtype's (a float64 Gram from fp16 products is only fp16-accurate)."""
    return max(unit_roundoff(xp, dtype), _GEMM_U.get(prec_name, 0.0))


#: policy precisions whose engine is as accurate as the named dtype's own arithmetic
#: (tc-sgemm: split-FP16 products, FP32-accurate normwise): a pass in that dtype may run its
#: products over the tall operand at them where the route allows (:func:`tall_precision`)
TALL_EMULATED = {"fp32-emulated": "float32"}


def tall_precision(xp: Any, dtype: Any, precision: Any, prec_name: str) -> str | None:
    """The precision of a CholQR pass's products over its tall operand besides the Gram
    matrix (a blocked substitution's off-diagonal updates; a certified pass's ``Q1 X``):
    ``precision`` itself where it names an emulation as accurate as ``dtype``'s own
    arithmetic (:data:`TALL_EMULATED`), else None (the working precision,
    ``panel_precision``). Those products' operands are balanced (``Q1``'s columns have
    norms within ``[2^-1/2, 1.5^1/2]``; ``X = R^-1`` of a certified ``R``; the updates
    ``W_1 R_12`` are not inversely graded), where the split-FP16 engine's per-row and
    per-column scaling loses nothing that matters; an uncertified ``A R^-1`` by GEMM,
    whose ``X`` is graded inversely to ``A``'s columns, keeps the working precision."""
    name = TALL_EMULATED.get(precision) if isinstance(precision, str) else None
    if name is None or dtype != getattr(xp, name):
        return None
    return precision


#: whether :func:`right_solve_upper` past ``backend.right_solve_block`` columns runs
#: left-looking (each leaf's whole update ``W[:, :j] R[:j, leaf]`` one product, subtracted
#: in the leaf's pass: at 256 columns 20 units of ``m x 64`` moved against the halving's
#: 28) instead of by column halves (each update a product, a subtraction pass, a solve)
LEFT_LOOKING = True


#: from this many columns on, :func:`right_solve_upper` runs right-looking by column halves
#: instead (:func:`_right_solve_acc`): each update ``W_1 R_12`` one product, accumulated
#: into one temporary that the leaves subtract in their pass. Left-looking, leaf ``j``'s
#: update reads all of ``W_{<j}`` (at 65536 x 4096, 64-column leaves: 69 GB of reads in
#: products of 64 output columns); by halves the top products are ``m x n/2 x n/2``,
#: at the GEMM rate (None: never)
RIGHT_LOOKING_MIN_N: int | None = 512


def right_solve_upper(backend: Any, a: Any, r: Any, prec_name: str = "auto",
                      tall: str | None = None) -> Any:
    """``a @ inv(r)`` for upper-triangular ``r``, by row-wise substitution.

    Solves wider than the backend's ``right_solve_block`` are blocked: from
    :data:`RIGHT_LOOKING_MIN_N` columns on (2-D) right-looking by column halves, each
    update accumulated into one temporary subtracted in the leaves' passes; narrower,
    left-looking (:data:`LEFT_LOOKING`), leaf ``j`` solves ``(A_j - W_{<j} R_{<j,j})
    R_jj^-1`` with the update one product (its rounding the standard blocked solve's:
    componentwise ``γ_k |W_{<j}||R_{<j,j}|``) subtracted in the leaf's pass; else in
    column halves, ``Q1 = A1 R11^-1``, ``Q2 = (A2 - Q1 R12) R22^-1``. The products in the
    working precision through the policy, or at ``tall`` (:func:`tall_precision`: an
    emulation as accurate as it); every block is written straight into its columns of
    the result. Either way each row of the result is a backward-stable solve of that
    row (the diagonal blocks by substitution, never by an inverse).
    """
    xp = backend.xp
    blk = backend.right_solve_block
    if blk is None or r.shape[-1] <= blk:
        return backend.right_solve_upper(a, r)
    out = xp.empty(a.shape, dtype=a.dtype, device=device(a))
    prec = tall or panel_precision(prec_name, a.dtype, xp)
    if (a.ndim == 2 and RIGHT_LOOKING_MIN_N is not None
            and r.shape[-1] >= RIGHT_LOOKING_MIN_N):
        _right_solve_acc(backend, a, r, out, blk, prec, None)
    elif LEFT_LOOKING and a.ndim == 2:
        _right_solve_left(backend, a, r, out, blk, prec)
    else:
        _right_solve_into(backend, a, r, out, blk, prec)
    return out


def _right_solve_acc(backend: Any, a: Any, r: Any, out: Any, blk: int, prec: str,
                     sub: Any) -> None:
    """Right-looking blocked ``out = (a - sub) r^-1`` (2-D; ``sub``: None, or the updates
    so far, a view of the caller's temporary, accumulated in place): ``W_1`` of the left
    half (whole leaves of ``blk`` columns), then ``T_2 += W_1 R_12`` (one product; a new
    temporary where ``sub`` is None), then the right half solving ``A_2 - T_2``. Every
    entry is still ``a_ij - sum_k w_ik r_kj``, summed in another order; the leaves
    subtract the update in their pass (``A - T`` is never written)."""
    n = r.shape[-1]
    if n <= blk:
        backend.right_solve_upper(a, r, out=out, sub=sub)
        return
    h = -(-(n // 2) // blk) * blk
    if h >= n:
        h = n // 2
    _right_solve_acc(backend, a[:, :h], r[:h, :h], out[:, :h], blk, prec,
                     None if sub is None else sub[:, :h])
    if sub is None:
        t = gemm(out[:, :h], r[:h, h:], precision=prec, label="trsm-update", backend=backend)
    else:
        t = sub[:, h:]
        gemm_sub(t, out[:, :h], -r[:h, h:], precision=prec, label="trsm-update",
                 backend=backend)
    _right_solve_acc(backend, a[:, h:], r[h:, h:], out[:, h:], blk, prec, t)
    del t


def _right_solve_left(backend: Any, a: Any, r: Any, out: Any, blk: int, prec: str) -> None:
    """Left-looking blocked ``out = a r^-1`` (2-D): leaves of ``blk`` columns in order,
    each solving ``a_j - out_{<j} r_{<j,j}`` (the backend subtracts the update in the
    solve's pass where it can)."""
    n = r.shape[-1]
    for j0 in range(0, n, blk):
        j1 = min(n, j0 + blk)
        if j0 == 0:
            backend.right_solve_upper(a[:, :j1], r[:j1, :j1], out=out[:, :j1])
            continue
        t = gemm(out[:, :j0], r[:j0, j0:j1], precision=prec, label="trsm-update",
                 backend=backend)
        backend.right_solve_upper(a[:, j0:j1], r[j0:j1, j0:j1], out=out[:, j0:j1], sub=t)
        del t


def _right_solve_into(backend: Any, a: Any, r: Any, out: Any, blk: int, prec: str) -> None:
    n = r.shape[-1]
    if n <= blk:
        backend.right_solve_upper(a, r, out=out)
        return
    h = n // 2
    _right_solve_into(backend, a[..., :, :h], r[..., :h, :h], out[..., :, :h], blk, prec)
    c = a[..., :, h:] - gemm(out[..., :, :h], r[..., :h, h:], precision=prec,
                             label="trsm-update", backend=backend)
    _right_solve_into(backend, c, r[..., h:, h:], out[..., :, h:], blk, prec)


#: past ``backend.right_solve_block`` columns, whether :func:`right_solve_upper_gram`
#: runs the blocked solve with fused leaves (each leaf's Gram block and its update
#: subtraction in the leaf's pass, the cross products by GEMM) instead of the blocked
#: solve and then one Gram product. Off: on an H200 at 2^20 x 256 the fused leaves took
#: 12.1 ms against 6.3 + 2.5 ms (``bench/probes/sketch_gpu.py``); at one leaf (2^22 x 64)
#: the fused pass is the faster (3.8 ms stored, 2.9 unstored, against 3.0 + 1.0)
BLOCKED_GRAM_FUSED = False


def right_solve_upper_gram(backend: Any, a: Any, r: Any, precision: Any, prec_name: str,
                           label: str, store: bool = True) -> tuple[Any, Any]:
    """``(W, G)``: ``W = a @ inv(r)`` (row-wise substitution) and its Gram matrix
    ``G = W^H W`` (exactly Hermitian), for 2-D ``a``. ``store=False``: ``W`` may be
    None where the fused pass did not need to write it (one leaf).

    Where the backend fuses a solve with its Gram product (real float64, at most
    ``backend.fused_gram_max_n`` columns) and the policy runs that product natively,
    ``W`` and ``G`` come from one pass over ``a``; wider, with :data:`BLOCKED_GRAM_FUSED`,
    the solve is split in column halves as :func:`right_solve_upper` splits it, each leaf
    fused (its update ``W_1 R_12`` subtracted in its pass) and the off-diagonal blocks
    ``W_1^T W_2`` products through the policy. Elsewhere: the solve, then
    :func:`~mpqr.qr.gram_blocked.gram`."""
    m, n = a.shape[-2:]
    blk = backend.right_solve_block or n
    max_n = backend.fused_gram_max_n or 0
    one_leaf = n <= min(blk, max_n)
    blocked = BLOCKED_GRAM_FUSED and not one_leaf and blk <= max_n
    if not ((one_leaf or blocked) and a.ndim == 2 and a.dtype == backend.xp.float64
            and fused_gemm(backend, a.dtype, (n, n, m), engine="native-fp64",
                           precision=precision, label=label)):
        w = right_solve_upper(backend, a, r, prec_name)
        return w, gram(backend, w, precision, label)
    if one_leaf and not store:
        return None, backend.right_solve_gram(a, r)
    xp = backend.xp
    w = xp.empty(a.shape, dtype=a.dtype, device=device(a))
    if one_leaf:
        return w, backend.right_solve_gram(a, r, out=w)
    g = xp.empty((n, n), dtype=a.dtype, device=device(a))
    _solve_gram_into(backend, a, r, w, g, blk, panel_precision(prec_name, a.dtype, xp),
                     precision, label)
    return w, g


def _solve_gram_into(backend: Any, a: Any, r: Any, out: Any, g: Any, blk: int, prec: str,
                     precision: Any, label: str, sub: Any = None) -> None:
    """The recursion of :func:`right_solve_upper_gram`: ``out = (a - sub) r^-1``,
    ``g = out^T out`` (views written in place; ``sub``: None, or the updates so far, a view
    of this function's own temporary, accumulated in place). The leaves subtract ``sub``
    in their pass (``A - T`` is never written); the updates at ``prec``, the Gram blocks
    at the policy's ``precision``."""
    n = r.shape[-1]
    if n <= blk:
        g[...] = (backend.right_solve_gram(a, r, out=out) if sub is None else
                  backend.right_solve_gram(a, r, out=out, sub=sub))
        return
    h = n // 2
    _solve_gram_into(backend, a[:, :h], r[:h, :h], out[:, :h], g[:h, :h], blk, prec,
                     precision, label, None if sub is None else sub[:, :h])
    if sub is None:
        t = gemm(out[:, :h], r[:h, h:], precision=prec, label="trsm-update", backend=backend)
    else:  # T2 += W1 R12 (every entry still a - sum_i w_i r_ij, in another order)
        t = sub[:, h:]
        gemm_sub(t, out[:, :h], -r[:h, h:], precision=prec, label="trsm-update",
                 backend=backend)
    _solve_gram_into(backend, a[:, h:], r[h:, h:], out[:, h:], g[h:, h:], blk, prec,
                     precision, label, t)
    del t
    xp = backend.xp
    g12 = gemm(xp.matrix_transpose(out[:, :h]), out[:, h:], precision=precision, label=label,
               backend=backend)
    g[:h, h:] = g12
    g[h:, :h] = xp.matrix_transpose(g12)


def _cond_from_gram(backend: Any, g: Any) -> float:
    """``sqrt(cond(G))`` from the eigenvalues of the (small, Hermitian) Gram matrix (their
    moduli are its singular values; ``eigvalsh`` is ~3x faster than the SVD at 256)."""
    xp = backend.xp
    s = xp.abs(xp.linalg.eigvalsh(g))
    hi = float(xp.max(s))
    lo = float(xp.min(s))
    if not math.isfinite(hi):
        return math.inf
    return math.sqrt(hi / lo) if lo > 0 else math.inf


def _cond_lower_bound(backend: Any, g: Any) -> float:
    """``sqrt(max g_ii / min g_ii) <= sqrt(cond(G))`` (``λ_max >= max g_ii``,
    ``λ_min <= min g_ii``)."""
    xp = backend.xp
    d = xp.real(xp.linalg.diagonal(g))
    lo, hi = float(xp.min(d)), float(xp.max(d))
    return math.sqrt(hi / lo) if lo > 0 and math.isfinite(hi) else math.inf


#: precisions whose products scale exactly with powers of two (native float32/float64
#: arithmetic, no float16 range): CholQR on ``x`` then rounds exactly as on ``x D`` for a
#: power-of-two diagonal ``D``, so its tests may read ``cond(x D)`` (column scaling)
SCALE_FREE = frozenset({"auto", "fp32", "fp64"})


def column_scales(xp: Any, r: Any) -> Any:
    """Powers of two nearest to the column norms of ``r`` (those of ``x`` where
    ``x = Q R``): ``R D^-1`` has columns of norm in ``[2^-1/2, 2^1/2]``."""
    norms = xp.linalg.vector_norm(r, axis=-2)
    safe = xp.where(norms > 0, norms, xp.ones_like(norms))
    return xp.pow(xp.full_like(safe, 2.0), xp.round(xp.log2(safe)))


def _diag_ratio(backend: Any, r: Any, scaled: bool) -> float:
    """``max |r_ii| / min |r_ii|`` over ``r`` (stacks too), or that of ``R D^-1``
    (:func:`column_scales`) where ``scaled`` and it is smaller: a lower bound of
    ``cond(x)``, resp. of ``cond(x D^-1)``."""
    xp = backend.xp
    d = xp.abs(xp.linalg.diagonal(r))
    parts = [xp.min(d), xp.max(d)]
    if scaled:
        ds = d / xp.astype(column_scales(xp, r), d.dtype)
        parts += [xp.min(ds), xp.max(ds)]
    v = [float(p) for p in parts]  # host syncs of scalars (as many as the tests)
    ratios = [hi / lo if lo > 0 and math.isfinite(hi) else math.inf
              for lo, hi in zip(v[::2], v[1::2])]
    return min(ratios)


def _chol_or_breakdown(backend: Any, g: Any, method: str, u: float, cheap: bool = False,
                       scaled: bool = False) -> Any:
    """Upper Cholesky factor of ``g`` (accurate to ``u``); :class:`BreakdownError` if it
    fails or is useless. ``scaled``: the test may read the column-scaled factor (see
    :data:`SCALE_FREE`). ``cheap``: the error's condition estimate comes from what the
    factorization showed (the diagonal ratio; after a failed Cholesky ``(n u)^-1/2``,
    where a failure puts the scaled Gram matrix's smallest eigenvalue, and the Gram
    diagonal's ``sqrt(max g_ii / min g_ii)``, the larger) instead of the Gram matrix's
    eigenvalues: for a caller that continues with a method that estimates its own (at
    256 columns on a GPU the eigenvalues cost milliseconds)."""
    ratio = math.inf
    try:
        r = backend.cholesky(g, upper=True)
        # diag(R) only bounds cond(x) from below: the factor n keeps a margin (without it
        # fp32-emulated CholQR returned ||I - Q^T Q||_F = 21 at cond(x) = 1e4, n = 70)
        ratio = _diag_ratio(backend, r, scaled)
        ok = ratio ** 2 * u * g.shape[-1] < 1
    except LinAlgError:
        ok = False
    if ok:
        return r
    if cheap:
        cond = ratio if math.isfinite(ratio) else max(
            _cond_lower_bound(backend, g), (g.shape[-1] * u) ** -0.5)
    else:
        cond = _cond_from_gram(backend, g)
    raise BreakdownError(
        f"{method} broke down: the Gram matrix x^H x is not numerically positive definite "
        f"(estimated cond(x) >= {cond:.2e}; {method} needs {_REACH[method]}, u = {u:.1e}); "
        "use method='preconditioned-cholqr', 'svqr', a Householder method, or 'auto'",
        method=method, cond_estimate=cond)


#: ``[a, (small backend, G)]`` set by :func:`reuse_first_gram`
_FIRST_GRAM: contextvars.ContextVar[list[Any] | None] = contextvars.ContextVar(
    "mpqr_first_gram", default=None)


@contextlib.contextmanager
def reuse_first_gram(a: Any, sb: Any, g: Any) -> Iterator[None]:
    """Within the block, the first CholQR pass over exactly the array object ``a`` takes
    ``g = a^H a`` (already computed, in the small backend ``sb``) instead of a new
    Gram product, once; traced. ``mpqr.lstsq`` passes the Gram matrix of a declined
    Gram route to its QR route this way (one pass over ``A`` fewer)."""
    token = _FIRST_GRAM.set([a, (sb, g)])
    try:
        yield
    finally:
        _FIRST_GRAM.reset(token)


def _first_gram(a: Any, method: str) -> tuple[Any, Any] | None:
    hint = _FIRST_GRAM.get()
    if hint is None or hint[0] is not a:
        return None
    pair = hint[1]
    hint[0] = None  # once
    record_event("gram-reuse", f"{method}: the first Gram matrix x^H x is the one the "
                 "caller already computed (one pass over x fewer)", method=method)
    return pair


#: ``[a, pieces]`` set by :func:`defer_last_solve`
_DEFER: contextvars.ContextVar[list[Any] | None] = contextvars.ContextVar(
    "mpqr_cholqr2_defer", default=None)


@contextlib.contextmanager
def defer_last_solve(a: Any) -> Iterator[list[Any]]:
    """Within the block, :func:`cholqr2` of exactly the array object ``a`` (2-D, thin
    ``Q``, not the fused route) returns ``Q`` as None and puts ``(Q1, R2, sb)`` in the
    yielded list's second slot instead: ``Q = Q1 R2^-1`` (``R2`` in the small backend
    ``sb``, certified ``cond_2(R2) <= sqrt(3)``). For a caller that applies ``Q`` to a
    small matrix next: ``Q M = Q1 (R2^-1 M)`` is one product over ``a``'s size instead
    of two (the QR-SVD's ``U = Q U_r``). Taken once; the slot stays None where CholQR2
    did not run on ``a`` or broke down."""
    slot: list[Any] = [a, None]
    token = _DEFER.set(slot)
    try:
        yield slot
    finally:
        _DEFER.reset(token)


def _take_defer(a: Any) -> list[Any] | None:
    slot = _DEFER.get()
    if slot is None or slot[0] is not a or a.ndim != 2:
        return None
    slot[0] = None  # once: a rescue's own CholQR2 computes its Q
    return slot


#: where ``u cond(x D^-1)^2`` of CholQR2's first factor (``D``: column norms) is at least
#: this, its first pass's orthogonality error (``~ u cond^2``) leaves the second pass's
#: certificate (``||Q1^H Q1 - I||_F <= 1/2``) to chance: under :func:`hand_over_early` it
#: stops there (float64: cond >= ~2e7)
EARLY_HAND_OVER = 0.05

#: the estimate above is made only where ``u (max r_ii / min r_ii)^2`` (free: a lower bound
#: on ``u cond(R)^2`` without the column scaling) reaches this
_EARLY_GATE = 1e-6

#: the largest first factor whose condition estimate (:func:`hand_over_early`) runs on
#: the host; wider, where the factor is (the device)
EARLY_HOST_MAX_N = 512

#: ``(estimator, prefetch)`` of the :func:`hand_over_early` block, or None outside one
_EARLY: contextvars.ContextVar[tuple[Callable[..., Any], Callable[..., Any] | None] | None] = (
    contextvars.ContextVar("mpqr_cholqr2_early", default=None))


@contextlib.contextmanager
def hand_over_early(estimate: Callable[..., Any], prefetch: Callable[..., Any] | None = None
                    ) -> Iterator[None]:
    """Within the block, :func:`cholqr2` raises :class:`BreakdownError` (with its first
    Gram matrix, as a failed first Cholesky does) right after its first factor where
    that factor's estimated condition number says its second pass would not be
    certified (:data:`EARLY_HAND_OVER`): ``qr(method="auto")`` uses it where a sketch
    route can take over, so that ``Q1 = x R1^-1`` and a second Gram pass are not paid
    for a certificate that would fail. ``estimate(sb, r, prec_name)``: the scaled
    2-norm condition number of the upper-triangular ``r`` in the small backend ``sb``
    (:func:`mpqr.qr.cholqr_precond.estimate_cond`). ``prefetch(backend, x)``: queues the
    route that takes over's first pass over ``x`` (the sketch) where a hand-over is
    likely (the first Cholesky failed, or the gate below passed), before the host's
    steps that decide it, so the device works while the host does."""
    token = _EARLY.set((estimate, prefetch))
    try:
        yield
    finally:
        _EARLY.reset(token)


def _prefetch(backend: Any, a: Any) -> None:
    """The :func:`hand_over_early` block's prefetch of ``a``'s hand-over pass, if any."""
    early = _EARLY.get()
    if early is not None and early[1] is not None:
        early[1](backend, a)


def _early_check(method: str, backend: Any, a: Any, g_pair: tuple[Any, Any],
                 prec_name: str) -> Any:
    """The check :func:`hand_over_early` asks of CholQR2's first pass: a function of
    ``(sb, r, hi, lo, ratio=None)`` (``r`` in ``sb``; ``hi``, ``lo``: the extremes of
    ``|diag r|``; ``ratio``: the column-scaled diagonal ratio where already made, else
    made here at the precisions of :data:`SCALE_FREE` where the unscaled one reaches the
    gate) that raises where the pass should stop; None outside the block."""
    early = _EARLY.get()
    if early is None:
        return None
    estimate_cond = early[0]

    def check(sb: Any, r: Any, hi: float, lo: float, ratio: float | None = None) -> None:
        u = gram_roundoff(sb.xp, r.dtype, prec_name)
        if not (lo > 0 and (hi / lo if ratio is None else ratio) ** 2 * u >= _EARLY_GATE):
            return
        # a few hundred tiny steps: on the host up to EARLY_HOST_MAX_N columns; a wider R
        # stays where it is (on a GPU the host's n^3 product and solves of 4096 columns
        # took ~1 s a call, against a few ms there)
        hs, rh = sb.small(r, limit=r.size if r.shape[-1] <= EARLY_HOST_MAX_N else 0)
        if ratio is None and prec_name in SCALE_FREE and not _diag_ratio(
                hs, rh, True) ** 2 * u >= _EARLY_GATE:
            # the estimate is of the column-scaled condition number: graded columns with
            # a small scaled ratio skip it (a host SVD of R per call on a GPU)
            return
        # queued after R's transfer (which waits for the stream): the device sketches
        # while the host estimates
        _prefetch(backend, a)
        cond = float(hs.xp.max(estimate_cond(hs, rh, prec_name)))
        if not cond**2 * u >= EARLY_HAND_OVER:
            return
        exc = BreakdownError(
            f"{method} stopped after its first pass: estimated cond(x) = {cond:.2e} (columns "
            f"scaled to unit norm), so u cond^2 = {cond**2 * u:.2e} >= {EARLY_HAND_OVER:g} "
            "and its second pass would likely not be certified", method=method,
            cond_estimate=cond)
        exc.first_gram = (a, *g_pair)
        raise exc

    return check


def _one_pass(backend: Any, a: Any, precision: Any, method: str, prec_name: str,
              shift: bool = False, certify: Any = None, want_q: bool = True,
              g: Any = None, early: bool = False, may_keep: bool = False
              ) -> tuple[Any, Any, Any]:
    """One CholQR pass: ``(Q, R, small backend)``, R in the small backend's namespace
    (``backend.small``; the caller moves the final R back with ``backend.from_small``).

    ``certify``: the previous pass's R, when ``a`` is that pass's Q — then ``a``'s Gram
    matrix must be within 1/2 of I (Frobenius), i.e. ``cond(a)^2 <= 3``, which makes this
    pass's Q orthonormal to working accuracy; else BreakdownError. ``g``: ``a``'s Gram
    matrix, already formed (``a`` is then only read for its shape). ``early``: CholQR2's
    first pass, which may stop after its factor (:func:`hand_over_early`). ``may_keep``
    (a certified pass, 2-D): where ``a``'s Gram matrix already shows it orthonormal to
    working accuracy (:func:`_keeps_q1`), ``(a, None, backend)``: no factor, no solve
    (with or without ``want_q``)."""
    pair = _first_gram(a, method) if certify is None else None
    if pair is None:
        if g is None:
            g = gram(backend, a, precision, f"{method}-gram")
        if may_keep and certify is not None and _keeps_q1(backend, g, method):
            return a, None, backend
        if not shift:
            check = (_early_check(method, backend, a, (backend, g), prec_name) if early
                     else None)
            done = _device_pass(backend, a, g, method, prec_name, certify, want_q, check)
            if done:
                return done
        # the n x n steps run in backend.small's namespace; where the device's steps
        # failed, the host redoes them up to the preconditioned route's limit (a failed
        # factor is mostly a hand-over: its checks and estimate, a few hundred small
        # launches each read back on a device, cost more there than G's transfer)
        lim = backend.precondition_small_max if not shift and done is False else None
        pair = backend.small(g) if lim is None else backend.small(g, limit=lim)
        if not shift and done is False and check is not None:
            # the device's steps failed (mostly a failed Cholesky): the hand-over's first
            # pass is queued (after G's transfer, which waits for the stream) and runs
            # while the host redoes them
            _prefetch(backend, a)
    sb, g = pair
    xp = sb.xp
    u = gram_roundoff(xp, g.dtype, prec_name)
    _check_gram(sb, g, method, prec_name)
    if certify is not None:
        n = g.shape[-1]
        dist = float(xp.max(xp.linalg.matrix_norm(
            g - xp.eye(n, dtype=g.dtype, device=device(g)), ord="fro")))
        if not dist <= 0.5:
            cx = array_namespace(certify)  # the first pass may have run on the device
            d = cx.abs(cx.linalg.diagonal(certify))
            cond = float(cx.max(d)) / float(cx.min(d)) if float(cx.min(d)) > 0 else math.inf
            raise _with_gram(BreakdownError(
                f"{method} broke down: after the first pass ||Q1^H Q1 - I||_F = {dist:.2e} > "
                f"0.5, so the result would not be orthonormal to working accuracy "
                f"(estimated cond(x) >= {cond:.2e}; {method} needs {_REACH[method]}); use "
                "method='svqr', a Householder method, or method='auto'",
                method=method, cond_estimate=cond), sb, g)
    if shift:
        m, n = a.shape[-2:]
        fro2 = xp.sum(xp.abs(xp.linalg.diagonal(g)), axis=-1)  # ||A||_F^2 per matrix
        s = 11 * (m * n + n * (n + 1)) * u * fro2
        eye = xp.eye(n, dtype=g.dtype, device=device(g))
        g = g + xp.expand_dims(xp.expand_dims(xp.astype(s, g.dtype), axis=-1), axis=-1) * eye
    try:
        r = _chol_or_breakdown(sb, g, method, u, cheap=early and _EARLY.get() is not None
                               and not shift and certify is None,
                               scaled=prec_name in SCALE_FREE)
    except BreakdownError as exc:
        if certify is None and not shift:
            # x's Gram matrix, in range and finite: qr(method="auto") continues from it
            # with the preconditioned method instead of paying for it again
            exc.first_gram = (a, sb, g)
        elif certify is not None:
            _with_gram(exc, sb, g)
        raise
    check = (_early_check(method, backend, a, (sb, g), prec_name) if early and not shift
             else None)
    if check is not None:
        d = xp.abs(xp.linalg.diagonal(r))
        check(sb, r, float(xp.max(d)), float(xp.min(d)))
    q = (_apply_inverse(backend, sb, a, r, method, prec_name,
                        tall=tall_precision(backend.xp, a.dtype, precision, prec_name),
                        certified=certify is not None) if want_q else None)
    return q, r, sb


#: single-precision CholQR2 keeps its first pass's ``Q1`` (no second Cholesky, no ``Q =
#: Q1 X2``) where ``||Q1^H Q1 - I||_F / n``, read from the second pass's Gram matrix, is at
#: most this many units of ``Q1``'s own roundoff (None: never; see :func:`_keeps_q1`)
KEEP_Q1_MAX: float | None = 3.0


def _keeps_q1(backend: Any, g: Any, method: str) -> bool:
    """Whether CholQR2's second pass can keep ``Q1`` as it is: its Gram matrix ``G =
    Q1^H Q1`` (the one the certificate reads anyway) within :data:`KEEP_Q1_MAX` ``u`` of
    ``I`` in ``||.||_F / n``. The pass would return ``Q = Q1 R2^-1`` with ``R2 R2^H = G``:
    ``R2 = I + O(||G - I||)``, so ``Q`` differs from ``Q1`` by about as much as ``Q1`` is
    from orthonormal, which is what the test bounds (up to the Gram product's own
    rounding, ``u``-sized entrywise: the threshold leaves the targets' ``9 u`` room for
    it). ``Q1 R1 = A`` keeps its backward error (row-wise, by substitution; by GEMM only
    under the inverse's condition bound). Where the first pass's Gram matrix was made at
    a lower precision than ``Q1``'s (float64 with a tc-sgemm first Gram), ``Q1`` is only
    that accurate and the test fails: the second pass runs. Single precision only: its
    targets (``9 u``) leave the threshold room, where float64's CholQR2 is held to ``~1 u``
    and always runs its second pass. One host sync."""
    xp = backend.xp
    if KEEP_Q1_MAX is None or g.ndim != 2 or g.dtype not in (xp.float32, xp.complex64):
        return False
    n = g.shape[-1]
    u = unit_roundoff(xp, g.dtype)
    dist = float(xp.linalg.matrix_norm(g - xp.eye(n, dtype=g.dtype, device=device(g)),
                                       ord="fro")) / n
    if not dist <= KEEP_Q1_MAX * u:
        return False
    record_event("keep-q1", f"{method}: Q = Q1, R = R1: Q1's Gram matrix is within "
                 f"{dist / u:.2g} u of I (||.||_F / n <= {KEEP_Q1_MAX:g} u): the second "
                 "pass's factor and solve skipped", method=method, distance=dist)
    return True


def _with_gram(exc: BreakdownError, sb: Any, g: Any) -> BreakdownError:
    """``exc`` carrying the (finite, in-range) Gram matrix its certified pass could not
    certify: CholQR2 hands it over with its first factor (see :func:`cholqr2`)."""
    exc.certify_gram = (sb, g)
    return exc


def _hand_over(exc: BreakdownError, backend: Any, a: Any, r1: Any, w: Any) -> None:
    """Attach what ``qr(method="auto")`` needs to continue a CholQR2 whose second Gram
    matrix was not certified with the preconditioned method (``exc.chain``: ``a``, the
    Gram matrix's small backend and itself, ``[R1]`` there, ``W = a R1^-1`` or None where
    it was not stored)."""
    pair = getattr(exc, "certify_gram", None)
    if pair is None:
        return
    sb, g = pair
    if array_namespace(r1) is not sb.xp:  # R1 from the device's steps, G2 on the host
        r1 = backend.small(r1)[1]
        if array_namespace(r1) is not sb.xp:
            return
    exc.chain = (a, sb, g, [r1], w)


def _check_gram(sb: Any, g: Any, method: str, prec_name: str) -> None:
    """BreakdownError where the Gram matrix ``g`` (small backend ``sb``) holds NaN/Inf
    or a squared column norm below the safe range."""
    xp = sb.xp
    if not bool(xp.all(xp.isfinite(g))):  # nothing to factor; the cond estimate's SVD would fail
        raise BreakdownError(
            f"{method} broke down: the Gram matrix x^H x is not finite (x holds NaN or Inf)",
            method=method, cond_estimate=math.inf)
    lo = _gram_min(xp, g, prec_name)
    dmin = float(xp.min(xp.real(xp.linalg.diagonal(g))))
    if dmin < lo:
        # a zero column, or one so small that its Gram entries underflow; qr(method="auto")
        # runs CholQR2 on unscaled input and falls back to the scaled path
        raise BreakdownError(
            f"{method} broke down: a squared column norm of x is {dmin:.2e}, below {lo:.1e} "
            "(a zero column, or underflow in the Gram matrix); use a Householder method "
            "or method='auto'", method=method, cond_estimate=math.inf)


def _gram_min(xp: Any, g: Any, prec_name: str) -> float:
    single = prec_name == "fp32" or g.dtype in (xp.float32, xp.complex64)
    return SAFE_GRAM_MIN["float32" if single else "float64"]


def _device_pass(backend: Any, a: Any, g: Any, method: str, prec_name: str, certify: Any,
                 want_q: bool, check: Any = None) -> tuple[Any, Any, Any] | bool | None:
    """A pass whose ``n x n`` steps come from ``backend.chol_steps`` (one launch; see
    :mod:`mpqr.qr.cholqr_steps`), or None where the backend has none for ``g``, False where
    a check fails: the caller then takes the host route from the same ``g``.

    The pass reads the checks' numbers back once. A certified pass (``certify``) first
    launches ``Q = A X``: its certificate, checked once the product is on its way, bounds
    ``cond_2(R)`` by ``sqrt(3)``, which is what the inverse-by-GEMM bound needs."""
    steps = backend.chol_steps(g)
    if steps is None:
        return None
    r, x, st = steps
    xp = backend.xp
    n = g.shape[-1]
    by_gemm = _inverse_by_gemm(backend, a, n)
    prec = panel_precision(prec_name, a.dtype, xp)
    q = None
    if certify is not None and want_q and by_gemm:
        q = _times_upper(backend, a, x, f"{method}-apply-inverse", prec)
    s = StepNumbers.from_host(backend.small(st)[1])  # the pass's one host sync
    limits = dict(u=gram_roundoff(xp, g.dtype, prec_name), n=n,
                  gram_min=_gram_min(xp, g, prec_name), certified=certify is not None)
    scaled = prec_name in SCALE_FREE and certify is None
    cond1 = s.cond1
    ratio = None  # the column-scaled diagonal ratio, where the unscaled one failed
    if not passes(s, **limits) and not (scaled and passes(
            s, **limits, diag_ratio=(ratio := _diag_ratio(backend, r, True)))):
        record_event("small-steps", f"{method}: a check of the device's n x n steps failed; "
                     "the pass redoes them on the host route", method=method)
        return False
    if scaled and not cond1 <= INVERSE_COND_MAX and by_gemm and want_q:
        cond1 = _cond1(backend, r, x, True)  # graded columns: R D^-1's (see _apply_inverse)
    record_event("small-steps", f"{method}: the {n} x {n} steps (Cholesky, R^-1, checks) "
                 "ran on the device without a host sync; their 8 numbers were read back "
                 "once",
                 method=method, n=n)
    if check is not None:
        check(backend, r, s.r_diag_max, s.r_diag_min, ratio)
    if q is not None:
        record_event("apply-inverse", f"{method}: Q = A @ inv(R) by GEMM (certified pass: "
                     f"cond_2(R) <= sqrt(3); cond_1(R) = {s.cond1:.3g})", cond_1=s.cond1)
    elif want_q:
        q = _apply_inverse(backend, backend, a, r, method, prec_name, inverse=(x, cond1))
    return q, r, backend


#: from this many columns on :func:`_times_upper` splits its halves again: ``Q_2 = A_2 X_22
#: + A_1 X_12`` (the first term recursively, the second accumulated into it) and ``Q_1 =
#: A_1 X_11`` recursively, so the flops tend to ``m n^2`` from the one split's 3/4 of
#: the GEMM's ``2 m n^2`` (at 4096 columns 1.06 against 1.5 ``m n^2``); narrower blocks
#: keep the one split (where the product is memory-bound, more passes cost more)
TRIANGULAR_RECURSE_MIN_N: int | None = 1024


def _times_upper(backend: Any, a: Any, x: Any, label: str, prec: str) -> Any:
    """``A @ X`` for upper-triangular ``X`` (2-D). From ``backend.triangular_split_min_n``
    columns on, X's lower zeros are skipped: ``Q[:, h:] = A X[:, h:]`` and ``Q[:, :h] =
    A[:, :h] X[:h, :h]``, each written into its columns of Q (3/4 of the flops for 1.5
    reads of A: it pays where the product is compute-bound, as a wide float64 one is);
    from :data:`TRIANGULAR_RECURSE_MIN_N` columns on the halves are split again.
    Every entry is the same sum as the full product's, without the zero terms (in
    another order where a recursive split accumulates ``A_1 X_12``)."""
    n = x.shape[-1]
    cut = backend.triangular_split_min_n
    if cut is None or n < cut or a.ndim != 2:
        return gemm(a, x, label=label, precision=prec, backend=backend)
    xp = backend.xp
    q = xp.empty((a.shape[0], n), dtype=result_dtype(xp, a.dtype, x.dtype), device=device(a))
    _upper_into(backend, q, a, x, label, prec, cut)
    return q


def _upper_into(backend: Any, q: Any, a: Any, x: Any, label: str, prec: str,
                cut: int) -> None:
    """``q[...] = a @ x`` (upper-triangular ``x``; ``q`` a view) for :func:`_times_upper`."""
    n = x.shape[-1]
    if n < cut:
        gemm_into(q, a, x, label=label, precision=prec, backend=backend)
        return
    h = (n // 2 + 7) // 8 * 8  # a multiple of 8 keeps the column views aligned
    if TRIANGULAR_RECURSE_MIN_N is not None and n >= TRIANGULAR_RECURSE_MIN_N:
        _upper_into(backend, q[:, h:], a[:, h:], x[h:, h:], label, prec, cut)
        # Q_2 += A_1 X_12: accumulated in place (cuBLAS beta = 1 where native)
        gemm_sub(q[:, h:], a[:, :h], -x[:h, h:], label=label, precision=prec, backend=backend)
        _upper_into(backend, q[:, :h], a[:, :h], x[:h, :h], label, prec, cut)
        return
    gemm_into(q[:, h:], a, x[:, h:], label=label, precision=prec, backend=backend)
    gemm_into(q[:, :h], a[:, :h], x[:h, :h], label=label, precision=prec, backend=backend)


def _inverse_by_gemm(backend: Any, a: Any, n: int) -> bool:
    min_n = backend.inverse_gemm_min_n
    return min_n is not None and a.ndim == 2 and n >= min_n


#: ``A @ R^-1`` goes through a GEMM with an explicit inverse only when ``cond_1(R)`` is at
#: most this: its backward error bound is ``cond(R)`` times substitution's (see below)
INVERSE_COND_MAX = 8.0


def _cond1(sb: Any, r: Any, x: Any, scaled: bool = False) -> float:
    """``cond_1(R) = ||R||_1 ||X||_1`` (``X = R^-1``; 2-D), or ``cond_1(R D^-1)``
    (:func:`column_scales`) where ``scaled`` and it is smaller; one host sync."""
    xs = sb.xp
    parts = [xs.max(xs.sum(xs.abs(r), axis=0)), xs.max(xs.sum(xs.abs(x), axis=0))]
    if scaled:
        d = xs.astype(column_scales(xs, r), r.dtype)
        parts += [xs.max(xs.sum(xs.abs(r / d), axis=0)),
                  xs.max(xs.sum(xs.abs(x * d[:, None]), axis=0))]
    norms = [float(v) for v in sb.small(xs.stack(parts))[1]]
    return min(a * b for a, b in zip(norms[::2], norms[1::2]))


def inverse_and_cond(sb: Any, r: Any, scaled: bool = False) -> tuple[Any, float]:
    """``(X, cond_1(R))`` for upper-triangular ``r`` in the small backend ``sb``: ``X = R^-1``
    by row-wise substitution on ``I``, as :func:`_apply_inverse` uses it. ``scaled``: the
    smaller of ``cond_1(R)`` and ``cond_1(R D^-1)`` (:func:`column_scales`)."""
    # one backend call (cuBLAS trsm on CuPy, by halves past its cut), not the blocked
    # wrapper: X is small
    x = sb.right_inverse_upper(r)
    return x, _cond1(sb, r, x, scaled)


def _cond1_lower(sb: Any, r: Any, scaled: bool) -> float:
    """``||R||_1 / min |r_jj| <= ||R||_1 ||R^-1||_1 = cond_1(R)`` (``||R^-1||_1 >= max
    |1 / r_jj|``), or that of ``R D^-1`` (:func:`column_scales`) where ``scaled`` and it is
    smaller; at least the diagonal ratio. One host sync (2-D ``r``)."""
    xs = sb.xp
    d = xs.abs(xs.linalg.diagonal(r))
    parts = [xs.max(xs.sum(xs.abs(r), axis=0)), xs.min(d)]
    if scaled:
        cs = xs.astype(column_scales(xs, r), d.dtype)  # real: R complex too
        parts += [xs.max(xs.sum(xs.abs(r / cs), axis=0)), xs.min(d / cs)]
    v = [float(p) for p in sb.small(xs.stack(parts))[1]]
    return min(hi / lo if lo > 0 and math.isfinite(hi) else math.inf
               for hi, lo in zip(v[::2], v[1::2]))


#: an uncertified pass whose ``cond_1(R)`` exceeds :data:`INVERSE_COND_MAX` still applies
#: ``R^-1`` by GEMM where the estimated ``cond_2(R D^-1)`` (power iterations on ``R D^-1``
#: and ``D X``, ``X = R^-1``) is at most this, as the sketch route's ``Q = W X`` does
#: (``cond_1`` overstates ``cond_2`` by up to ``n``: 211 against ~1.7 for a random
#: 65536 x 4096 matrix); None: off (the substitution)
FIRST_PASS_COND2_MAX: float | None = None
_COND2_ITERS = 8


def _cond2_estimate(sb: Any, r: Any, x: Any, scaled: bool, limit: float = math.inf
                    ) -> float:
    """``||R||_2 ||X||_2`` (``X = R^-1``) by power iterations on a block of two vectors
    (products through the policy at the working precision): a lower bound of
    ``cond_2(R)``, close where the extreme singular values are apart; where it exceeds
    ``limit`` and ``scaled``, the smaller of it and that of ``R D^-1`` (:func:`column_scales`;
    its inverse ``D X``). One host sync per estimate (2-D ``r``)."""
    xs = sb.xp
    n = r.shape[-1]
    k = xs.arange(n, dtype=xs.float64, device=device(r))
    v0 = xs.astype(xs.stack([(1 + k / n) * (1 - 2 * (k % 2)), 1 + (k % 3)], axis=1), r.dtype)
    prec = panel_precision("auto", r.dtype, xs)

    def top(m: Any) -> Any:
        v = v0
        for _ in range(_COND2_ITERS):
            v = v / xs.linalg.vector_norm(v, axis=0)
            v = gemm(xs.matrix_transpose(m), gemm(m, v, precision=prec, label="cond-estimate",
                                                  backend=sb),
                     precision=prec, label="cond-estimate", backend=sb)
        return xs.max(xs.linalg.vector_norm(v, axis=0))  # ~ sigma_max^2 (v had unit norm)

    def est(rr: Any, xx: Any) -> float:
        both = [float(t) for t in sb.small(xs.stack([top(rr), top(xx)]))[1]]
        return math.sqrt(both[0] * both[1])

    out = est(r, x)
    if scaled and not out <= limit:
        d = xs.astype(column_scales(xs, r), r.dtype)
        out = min(out, est(r / d, x * xs.reshape(d, (n, 1))))
    return out


def _apply_inverse(backend: Any, sb: Any, a: Any, r: Any, method: str, prec_name: str,
                   inverse: tuple[Any, float] | None = None, tall: str | None = None,
                   certified: bool = False) -> Any:
    """``Q = A R^-1`` (``r`` in the small backend ``sb``), by row-wise substitution or, for
    ``n >= backend.inverse_gemm_min_n`` and a well-conditioned ``R``, by one GEMM.

    The inverse ``X`` is made by row-wise substitution on ``I`` (``|X R - I| <= γ_n |X||R|``),
    so ``A - fl(A X) R`` is bounded by ``~2 γ_n |A||X||R|``: normwise ``cond(R)`` times the
    ``γ_n ||A||`` of substituting ``A`` itself. With ``R = R_s D`` (``D`` diagonal,
    positive), ``|A||X||R| = |A D^-1||R_s^-1||R_s| D``: column ``j`` of the error is
    ``cond(R_s)`` times ``γ_n`` of column ``j``'s own scale, so at the precisions of
    :data:`SCALE_FREE` the test reads the smaller of ``cond_1(R)`` and ``cond_1(R D^-1)``
    (:func:`column_scales`: graded columns do not force the substitution). CholQR2's
    second pass has ``cond(R) <= sqrt(3)`` (certified by its Gram matrix); the first
    pass takes the GEMM only when that condition number is at most
    ``INVERSE_COND_MAX``. A GEMM streams A once at full bandwidth; the substitution is
    bound by its dependent FMA chains. ``inverse``: ``(X, cond_1(R))`` where already
    made (:func:`_device_pass`). ``tall`` (:func:`tall_precision`): the precision of the
    substitution's updates, and of the GEMM where ``certified`` (``a`` is a certified
    pass's ``Q1``).
    """
    n = r.shape[-1]
    if _inverse_by_gemm(backend, a, n):
        scaled = prec_name in SCALE_FREE
        cond2 = FIRST_PASS_COND2_MAX is not None and not certified and a.ndim == 2
        if inverse is None:
            # cond_1(R) >= ||R||_1 / min|r_ii| (>= max|r_ii| / min|r_ii|): where that alone
            # passes the limit, no X (at 4096 columns a trsm of n^3 flops)
            bound = _cond1_lower(sb, r, scaled)
            if not bound <= INVERSE_COND_MAX and not cond2:
                record_event("apply-inverse", f"{method}: Q = A R^-1 by substitution "
                             f"(cond_1(R) >= {bound:.3g} > {INVERSE_COND_MAX:g}, from its "
                             "column sums and diagonal" + (", columns scaled)" if scaled
                                                           else ")"), cond_1=bound)
                return right_solve_upper(backend, a, backend.from_small(r, a), prec_name,
                                         tall=tall)
        x, kappa = inverse if inverse is not None else inverse_and_cond(sb, r, scaled)
        if kappa <= INVERSE_COND_MAX:
            record_event("apply-inverse", f"{method}: Q = A @ inv(R) by GEMM (cond_1(R) = "
                         f"{kappa:.3g} <= {INVERSE_COND_MAX:g})", cond_1=kappa)
            prec = (tall if tall is not None and certified
                    else panel_precision(prec_name, a.dtype, backend.xp))
            return _times_upper(backend, a, backend.from_small(x, a), f"{method}-apply-inverse",
                                prec)
        if cond2:
            est = _cond2_estimate(sb, r, x, scaled, FIRST_PASS_COND2_MAX)
            if est <= FIRST_PASS_COND2_MAX:
                record_event("apply-inverse", f"{method}: Q = A @ inv(R) by GEMM (estimated "
                             f"cond_2(R D^-1) = {est:.3g} <= {FIRST_PASS_COND2_MAX:g}; "
                             f"cond_1(R) = {kappa:.3g})", cond_1=kappa, cond_2=est)
                return _times_upper(backend, a, backend.from_small(x, a),
                                    f"{method}-apply-inverse",
                                    panel_precision(prec_name, a.dtype, backend.xp))
        record_event("apply-inverse", f"{method}: Q = A R^-1 by substitution (cond_1(R) = "
                     f"{kappa:.3g} > {INVERSE_COND_MAX:g})", cond_1=kappa)
    return right_solve_upper(backend, a, backend.from_small(r, a), prec_name, tall=tall)


def _rr(backend: Any, r2: Any, r1: Any, prec_name: str) -> Any:
    """Product of two small upper-triangular factors, in the working precision (from
    :data:`TRIANGULAR_RECURSE_MIN_N` columns on without ``r1``'s zeros: :func:`_times_upper`,
    about half the flops)."""
    xp = backend.xp
    prec = panel_precision(prec_name, r1.dtype, xp)
    n = r1.shape[-1]
    if (r1.ndim == 2 and TRIANGULAR_RECURSE_MIN_N is not None
            and n >= TRIANGULAR_RECURSE_MIN_N):
        return xp.triu(_times_upper(backend, r2, r1, "cholqr-RR", prec))
    return xp.triu(gemm(r2, r1, precision=prec, label="cholqr-RR", backend=backend))


def _final_r(backend: Any, sb: Any, factors: list[Any], like: Any, prec_name: str) -> Any:
    """``R = factors[0] @ factors[1] @ ...`` (the passes' factors, last pass first) on
    ``like``'s device: in the last pass's namespace ``sb`` when every factor is there,
    else on the device (a pass that took the device route left its factor there)."""
    if any(array_namespace(f) is not sb.xp for f in factors):
        sb = backend
        factors = [backend.from_small(f, like) for f in factors]
    r = factors[-1]
    for f in factors[-2::-1]:
        r = _rr(sb, f, r, prec_name)
    return backend.from_small(r, like)


def cholqr(backend: Any, a: Any, *, precision: Any, prec_name: str, **_: Any
           ) -> tuple[Any, Any]:
    """One CholQR pass; ``(Q, R)`` with thin Q."""
    q, r, _sb = _one_pass(backend, a, precision, "cholqr", prec_name)
    return q, backend.from_small(r, a)


def _fusable(backend: Any, a: Any) -> bool:
    """A 2-D float64 ``a`` narrow enough for the backend's fused CholQR2 passes (see
    ``fused_cholqr_max_n``); the policy then decides on its second Gram product."""
    max_n = backend.fused_cholqr_max_n
    return (max_n is not None and a.ndim == 2 and a.dtype == backend.xp.float64
            and 0 < a.shape[1] <= max_n)


#: CholQR2's first Gram matrix only preconditions: ``Q1 = x R1^-1`` (substitution in the
#: working precision) keeps ``x = Q1 R1`` to working accuracy whatever ``R1``, and the
#: second pass's certificate (``||Q1^H Q1 - I||_F <= 1/2``) decides whether ``R1`` was
#: good enough. Where the policy predicts it faster, the first Gram of a real 2-D input
#: of these dtypes is made at the mapped precision (its error ``~u_low ||x||^2``, so
#: ``Q1``'s distance from orthonormal ``~u_low cond(x)^2``), under ``precision="auto"``
#: or ``"fp64-emulated"`` (not an explicit ``"fp64"``); None: never
LOW_FIRST_GRAM: dict[str, str] | None = {"float64": "fp32-emulated"}
#: ... and kept where ``u_low (max r_ii / min r_ii)^2`` of its factor (columns scaled) is
#: below this (fp32: a diagonal ratio below ~41), else the first Gram is made again in
#: the working precision (the certificate would likely fail)
LOW_GRAM_GATE = 1e-4


def _low_first_gram(backend: Any, a: Any, prec_name: str) -> str | None:
    """The precision of CholQR2's first Gram product of ``a`` (:data:`LOW_FIRST_GRAM`),
    or None (the working precision)."""
    from mpqr.engines import ENGINES
    from mpqr.policy import active_gemm_options, as_gemm_options, decide

    xp = backend.xp
    if LOW_FIRST_GRAM is None or a.ndim != 2 or prec_name not in ("auto", "fp64-emulated"):
        return None
    low = next((p for d, p in LOW_FIRST_GRAM.items() if a.dtype == getattr(xp, d, None)),
               None)
    if low is None or not all(ENGINES[e].available(backend) for e in ("tc-sgemm",)):
        return None
    hint = _FIRST_GRAM.get()
    if hint is not None and hint[0] is a:  # the caller's Gram matrix is free
        return None
    active = active_gemm_options()
    if active is not None and active.workspace_limit is not None:
        return None  # a capped plan: the engine's Gram call splits x whole
    m, n = a.shape
    opts = as_gemm_options(None)
    fast = decide(backend, a.dtype, n, n, m, 1, low, "qr", opts)
    own = decide(backend, a.dtype, n, n, m, 1, prec_name, "qr", opts)
    if not fast.predicted_s[fast.engine] < own.predicted_s[own.engine]:
        return None
    return low


def _low_first_pass(backend: Any, a: Any, low: str, prec_name: str
                    ) -> tuple[Any, Any, Any] | None:
    """CholQR2's first pass with its Gram matrix at ``low`` (:data:`LOW_FIRST_GRAM`):
    ``(Q1, R1, small backend)``, or None where that Gram matrix is out of range, not
    positive definite or its factor fails :data:`LOW_GRAM_GATE` (the caller then runs
    the pass in the working precision). ``Q1 = x R1^-1`` as the working-precision pass
    forms it."""
    g = gram(backend, a, low, "cholqr2-gram")
    sb, gs = backend.small(g)
    try:
        _check_gram(sb, gs, "cholqr2", prec_name)
        r = sb.cholesky(gs, upper=True)
    except (BreakdownError, LinAlgError):
        r = None
    ratio = _diag_ratio(sb, r, prec_name in SCALE_FREE) if r is not None else math.inf
    u = _GEMM_U[low]
    if not ratio**2 * u < LOW_GRAM_GATE:
        record_event("precondition", f"cholqr2: its first Gram matrix at precision={low!r} "
                     f"did not precondition (diagonal ratio of R1 {ratio:.3g}, u ratio^2 >= "
                     f"{LOW_GRAM_GATE:g}): made again at precision={prec_name!r}",
                     method="cholqr2", precision=low)
        return None
    record_event("precondition", f"cholqr2: its first Gram matrix at precision={low!r} "
                 f"(a preconditioner: Q1 = x R1^-1 by substitution keeps x = Q1 R1, and the "
                 f"second, certified pass in the working precision makes Q orthonormal; "
                 f"diagonal ratio of R1 {ratio:.3g}, u ratio^2 < {LOW_GRAM_GATE:g})",
                 method="cholqr2", precision=low)
    return _apply_inverse(backend, sb, a, r, "cholqr2", prec_name), r, sb


def cholqr2(backend: Any, a: Any, *, precision: Any, prec_name: str, want_q: bool = True,
            **_: Any) -> tuple[Any, Any]:
    """CholQR twice: ``O(u)`` orthogonality for ``cond(A) < u^{-1/2}`` (certified: see
    :func:`_one_pass`). ``want_q=False`` skips the last solve (``Q`` is then None).

    Narrow float64 inputs (:func:`_fusable`) whose second Gram product the policy runs
    natively keep ``Q1 = A R1^-1`` out of memory: its Gram matrix comes from the
    solve's pass over A, in float64 arithmetic, and ``Q = (A R1^-1) R2^-1`` is solved
    from A, rounding the intermediate rows exactly as that pass did (the Q1 whose Gram
    matrix the certificate checked), in four passes over A's size instead of six (two
    instead of four without Q). The explain trace says so (``fused-solve``).

    In single precision, where the second pass's Gram matrix shows ``Q1`` already
    orthonormal to working accuracy (:data:`KEEP_Q1_MAX`), ``(Q1, R1)`` is the answer:
    no second factor, no ``Q1 R2^-1`` (``keep-q1`` in the trace)."""
    fusable = _fusable(backend, a)
    slot = None if fusable or not want_q else _take_defer(a)
    low = None if fusable else _low_first_gram(backend, a, prec_name)
    first = _low_first_pass(backend, a, low, prec_name) if low is not None else None
    if first is not None:
        q1, r1, sb1 = first
    else:
        q1, r1, sb1 = _one_pass(backend, a, precision, "cholqr2", prec_name,
                                want_q=not fusable, early=True)
    if fusable:
        m, n = a.shape
        if fused_gemm(backend, a.dtype, (n, n, m), engine="native-fp64", precision=precision,
                      label="cholqr2-gram"):
            r1d = backend.from_small(r1, a)
            record_event("fused-solve", "cholqr2: Q1 = x R1^-1 is not stored: its Gram "
                         "matrix is formed in the solve's pass over x, and Q = (x R1^-1) "
                         "R2^-1 is solved from x (two passes over x fewer)", method="cholqr2")
            try:
                _q, r2, sb = _one_pass(backend, a, precision, "cholqr2", prec_name,
                                       certify=r1, want_q=False,
                                       g=backend.right_solve_gram(a, r1d))
            except BreakdownError as exc:
                _hand_over(exc, backend, a, r1, None)
                raise
            q = backend.right_solve_twice(a, r1d, backend.from_small(r2, a)) if want_q else None
            return q, _final_r(backend, sb, [r2, r1], a, prec_name)
        q1 = _apply_inverse(backend, sb1, a, r1, "cholqr2", prec_name)
    try:
        q, r2, sb = _one_pass(backend, q1, precision, "cholqr2", prec_name, certify=r1,
                              want_q=want_q and slot is None,
                              may_keep=a.ndim == 2)
    except BreakdownError as exc:
        _hand_over(exc, backend, a, r1, q1)
        raise
    if r2 is None:  # Q1 already orthonormal to working accuracy (_keeps_q1); a deferred
        # solve's slot stays empty: its caller takes Q1 as it is
        return (q1 if want_q else None), _final_r(backend, sb1, [r1], a, prec_name)
    if slot is not None:
        slot[1] = (q1, r2, sb)
        record_event("deferred-solve", "cholqr2: Q = Q1 R2^-1 is not formed; the caller "
                     "applies R2^-1 to its small factor first (one pass over x fewer)",
                     method="cholqr2")
    return q, _final_r(backend, sb, [r2, r1], a, prec_name)


def shifted_cholqr3(backend: Any, a: Any, *, precision: Any, prec_name: str,
                    want_q: bool = True, **_: Any) -> tuple[Any, Any]:
    """Shifted CholQR, then CholQR2: ``O(u)`` orthogonality for ``cond(A) < u^{-1}``."""
    q1, r1, _sb = _one_pass(backend, a, precision, "shifted-cholqr3", prec_name,
                            shift=True)
    q2, r2, _sb = _one_pass(backend, q1, precision, "shifted-cholqr3", prec_name)
    q, r3, sb = _one_pass(backend, q2, precision, "shifted-cholqr3", prec_name, certify=r2,
                          want_q=want_q)
    return q, _final_r(backend, sb, [r3, r2, r1], a, prec_name)
