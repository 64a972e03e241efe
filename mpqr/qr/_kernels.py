"""Building blocks shared by the QR methods (namespace-agnostic).

* :func:`tsqr` — tall-skinny QR: ``backend.qr_panel`` on row blocks (one
  stacked call) and a reduction tree over the stacked R factors.
* :func:`householder_from_q` — the compact WY form ``I - W Y^H`` of the
  Householder reflectors that reproduce an explicit orthonormal ``Q``
  (Ballard et al. 2014, LAPACK ``orhr_col``): a non-pivoted LU of ``Q1 - S``
  whose sign matrix ``S`` is chosen on the fly so every pivot has modulus >= 1.
* :func:`householder_panel` — the leaf of the Householder methods: LAPACK
  ``geqrf`` of the panel in compact WY form (``backend.householder_panel``),
  or TSQR + reconstruction for very tall-skinny panels.
* :func:`trmm_lower` — ``L @ B`` for lower-triangular ``L`` by recursive
  halving, so that the off-diagonal products are large square GEMMs
  (Leng et al., Algorithm 3).
* :func:`normalize_signs` — the public sign convention: ``diag(R)`` real >= 0.

Every product of more than panel size goes through :func:`mpqr.policy.gemm`.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator
from typing import Any

from mpqr._array_api import ct, device, is_complex
from mpqr.backends._base import phase  # one definition, shared with the backends
from mpqr.backends.panel_cholqr import CERTIFIED_PANEL_MAX_N
from mpqr.engines.scaling import pow2_scale  # here too: the QR routes' import point
from mpqr.policy import active_gemm_options, gemm
from mpqr.policy.trace import record_event

__all__ = [
    "CERTIFIED_PANEL_MAX_N",
    "TRMM_BATCHED",
    "UncertifiedPanels",
    "certificate_failed",
    "certified_allowed",
    "certified_panels",
    "certified_route",
    "column_exponents",
    "ct",
    "deferred_certificates",
    "eye_like",
    "householder_from_q",
    "householder_panel",
    "in_safe_range",
    "is_complex",
    "lu_signed",
    "normalize_signs",
    "panel_precision",
    "phase",
    "pow2_scale",
    "safe_exponent",
    "scale_columns",
    "solve_upper",
    "times_pow2",
    "trmm_lower",
    "tsqr",
    "unit_shift",
]

#: Rows per block of the TSQR leaves (Leng et al. factor 256 x 32 tiles).
TSQR_BLOCK_ROWS = 256
#: Width below which triangular products are done as one GEMM.
TRMM_CUTOFF = 64
#: Where True, :func:`trmm_lower` forms each level of its split in one stacked product
#: (halves equal down to the diagonal blocks), else one product a block: 8192^2 float32
#: fp32-emulated recursive QR launched eagerly 62.0 against 75.7 ms, 16384^2 to 65536 x
#: 8192 within 1%; replayed as a CUDA graph (no launch cost to save) 49.8 against 49.3 ms
#: (H200, ``bench/probes/flag_ab.py ... mpqr.qr._kernels.TRMM_BATCHED=False,True``)
TRMM_BATCHED = True
#: A panel with at least this many rows per column is "tall-skinny": TSQR (one
#: pass over the rows, a reduction tree) beats a column-by-column ``geqrf`` there.
TSQR_ASPECT = 64
#: Widest panel that goes to TSQR (the CuPy tile kernel's limit, ``cupy_tsqr.MAX_N``).
TSQR_MAX_WIDTH = 64
#: Fewest rows of a panel that goes to TSQR. TSQR plus the Householder reconstruction
#: (then with a host LU, triangular solves) had a fixed cost of ~5 ms; cuSOLVER's
#: ``geqrf`` was faster at every measured size (H100, k = 32/64, m = 4096 ... 2^20:
#: 1.04-22x; 1.3x at 2^20 x 32 and falling), so TSQR leaves start beyond the measured
#: range. The LU has run on the device since (0.33 ms at n = 64); not re-measured.
TSQR_MIN_ROWS = 2**22


class UncertifiedPanels(Exception):
    """A certified panel failed its check: the factorization must run again with
    ``geqrf`` panels (raised after the whole factorization, from one host sync)."""


#: whether the Householder methods may factor their panels by certified CholQR2; set by
#: the driver only where it can factor the input again if a certificate fails
_CERTIFIED = contextvars.ContextVar("mpqr_certified_panels", default=False)


@contextlib.contextmanager
def certified_panels(allowed: bool) -> Iterator[None]:
    """Allow (or forbid) certified CholQR2 panels in the Householder methods within."""
    token = _CERTIFIED.set(allowed)
    try:
        yield
    finally:
        _CERTIFIED.reset(token)


def certified_allowed() -> bool:
    """Whether certified panels are allowed here (:func:`certified_panels`)."""
    return _CERTIFIED.get()


#: certificates whose host read the caller does itself, after the whole factorization
#: (a route replayed from a CUDA graph reads them after the replay)
_DEFERRED: contextvars.ContextVar[list | None] = contextvars.ContextVar(
    "mpqr_deferred_certificates", default=None)


@contextlib.contextmanager
def deferred_certificates() -> Iterator[list]:
    """Collect the certificates of the certified panels within instead of reading them:
    the factorization runs to its end, the caller reads them (one host sync after the
    last launch) and factors again with ``geqrf`` panels if one failed."""
    token = _DEFERRED.set([])
    try:
        yield _DEFERRED.get()
    finally:
        _DEFERRED.reset(token)


def certificate_failed(backend: Any, cert: Any) -> bool:
    """Whether ``cert`` failed (a host read), or False where the caller collects it
    (:func:`deferred_certificates`) to read it later."""
    deferred = _DEFERRED.get()
    if deferred is not None:
        deferred.append(cert)
        return False
    return backend.certificate_failed(cert)


def certified_route(backend: Any, a: Any) -> Any | None:
    """A failure counter (:meth:`~mpqr.backends._base.ArrayAPIBackend.new_certificate`)
    when ``a``'s panels go through ``backend.certified_panel``, else None: allowed by
    :func:`certified_panels`, a backend that has them, one real float32/float64 matrix."""
    xp = backend.xp
    if not (_CERTIFIED.get() and getattr(backend, "certified_panels", False)
            and a.ndim == 2 and a.dtype in (xp.float32, xp.float64)):
        return None
    return backend.new_certificate(a)


def eye_like(xp: Any, batch: tuple[int, ...], m: int, n: int, dtype: Any, dev: Any) -> Any:
    """A fresh writable ``(*batch, m, n)`` array holding ``eye(m, n)`` in each matrix."""
    e = xp.eye(m, n, dtype=dtype, device=dev)
    if not batch:
        return e
    return xp.zeros((*batch, m, n), dtype=dtype, device=dev) + e


def panel_precision(prec: str, dtype: Any, xp: Any) -> str:
    """Precision of the small products inside a panel: the working precision.

    Panels are a few percent of the flops but set the orthogonality of Q, so
    they never run below the input's native precision; ``auto`` stays ``auto``.
    """
    if prec == "auto":
        return "auto"
    single = dtype in (xp.float32, xp.complex64)
    return "fp32" if single else "fp64"


def unit_shift(backend: Any, x: Any) -> int:
    """The power of two that brings ``x``'s largest magnitude into ``[1/2, 1)`` where it
    lies beyond ``2**±``:func:`safe_exponent`, else 0 (also for NaN/Inf or an all-zero
    ``x``; one host sync): one scale for the whole matrix, where :func:`scale_columns`'s
    scale per column would change what is computed (the pivots of a QRCP, a least-squares
    solution); squares and complex quotients then stay in range."""
    xp = backend.xp
    if not x.size:
        return 0
    mx = float(xp.max(xp.abs(x)))
    lim = 2.0 ** safe_exponent(xp, x)
    if not math.isfinite(mx) or mx == 0.0 or 1.0 / lim <= mx <= lim:
        return 0
    return -math.frexp(mx)[1]


def times_pow2(backend: Any, x: Any, e: int) -> Any:
    """``x * 2**e`` for a Python int ``e`` (a new array; ``x`` itself for ``e = 0``)."""
    if not e:
        return x
    xp = backend.xp
    return pow2_scale(backend, x, xp.asarray(e, dtype=xp.int32, device=device(x)))


def solve_upper(backend: Any, r: Any, c: Any, *, normal: bool = False) -> Any:
    """``R^-1 c`` (``normal``: ``(R^H R)^-1 c``) for an upper-triangular 2-D ``R``, solved
    with ``R`` at unit scale (times ``2^e``, :func:`unit_shift`) and ``c`` times the same
    power of two: the same solution, without the overflow of a complex quotient's
    ``1/|d|^2`` where the diagonal lies near the subnormals."""
    xp = backend.xp
    e = unit_shift(backend, r)
    rs = times_pow2(backend, r, e)
    c = times_pow2(backend, c, e)
    if normal:  # R^-1 R^-H c = Rs^-1 (Rs^-H (c 2^e)) 2^e
        c = times_pow2(backend, backend.solve_triangular(ct(xp, rs), c, lower=True), e)
    return backend.solve_triangular(rs, c, lower=False)


#: ``scale_columns(only_if_needed=True)`` leaves columns whose largest entry is within
#: ``2**±SAFE_EXPONENT`` alone: their squares, times any row count below 2**64, stay
#: normal and finite (float32: 2**±(2*40 + 64) vs 2**±126; float64: 2**±(2*400+64) vs 2**±1022)
SAFE_EXPONENT = {"float32": 40, "float64": 400}


def column_exponents(backend: Any, a: Any) -> Any:
    """int32 ``e`` of shape ``(..., 1, n)``: the largest finite ``|entry|`` of each column
    lies in ``[2**e, 2**(e+1))`` (0 for a column with no finite nonzero entry)."""
    xp = backend.xp
    if is_complex(xp, a):
        mx = xp.max(xp.abs(a), axis=-2, keepdims=True)
    else:  # the backend's reduction (coalesced on CuPy for this strided axis)
        mx = backend.max_abs_finite(a, -2)
    return backend.exponent(mx)


def safe_exponent(xp: Any, a: Any, single: bool = False) -> int:
    """:data:`SAFE_EXPONENT` for ``a``'s dtype; ``single``: float32's whatever the dtype."""
    single = single or a.dtype in (xp.float32, xp.complex64)
    return SAFE_EXPONENT["float32" if single else "float64"]


def in_safe_range(xp: Any, a: Any, e: Any, single: bool = False) -> bool:
    """Whether every column exponent ``e`` is within :func:`safe_exponent` (one host
    sync)."""
    return not e.size or int(xp.max(xp.abs(e))) <= safe_exponent(xp, a, single)


def scale_columns(backend: Any, a: Any, *, only_if_needed: bool = False,
                  single: bool = False) -> tuple[Any, Any | None]:
    """``(a * 2**-e, e)`` with the largest ``|entry|`` of each column in ``[1, 2)``.

    With ``only_if_needed``, ``(a, None)`` when every column is within
    :data:`SAFE_EXPONENT` of the dtype, or of float32 if ``single`` (the products
    run in float32: precision "fp32" on float64 input); one host sync, saving a
    pass over ``a``.

    ``e`` is int32 of shape ``(..., 1, n)``, from the finite entries; columns
    with no finite nonzero entry get 0 (Inf and NaN stay where they are).
    Powers of two are exact, so ``a D = Q R_s`` gives ``a = Q (R_s D^-1)``: every
    method then sees unit-order columns, whatever the input's range (no overflow
    of a Gram matrix or of an fp16/fp32 cast, no underflow of tiny columns).
    """
    e = column_exponents(backend, a)
    if only_if_needed and in_safe_range(backend.xp, a, e, single):
        return a, None
    return pow2_scale(backend, a, -e), e


def tsqr(backend: Any, a: Any, *, precision: str, block_rows: int = TSQR_BLOCK_ROWS
         ) -> tuple[Any, Any]:
    """Explicit reduced ``(Q, R)`` of a tall-skinny ``(..., m, n)`` panel.

    Row blocks go to ``backend.qr_panel`` as one stacked call; their R factors
    are stacked and factored again until one block is left; the Q factors are
    combined with one batched product per tree level.
    """
    xp = backend.xp
    *batch, m, n = a.shape
    b = max(block_rows, 2 * n)
    if m < 2 * b or n == 0:
        return backend.qr_panel(a)
    q = m // b
    h = m - (q - 1) * b  # the head block takes the remainder rows: b <= h < 2b
    qh, rh = backend.qr_panel(a[..., :h, :])
    rest = xp.reshape(a[..., h:, :], (*batch, q - 1, b, n))
    qs, rs = backend.qr_panel(rest)
    rstack = xp.concat([xp.expand_dims(rh, axis=-3), rs], axis=-3)
    qt, r = tsqr(backend, xp.reshape(rstack, (*batch, q * n, n)), precision=precision,
                 block_rows=block_rows)
    out = xp.empty((*batch, m, n), dtype=qh.dtype, device=device(a))
    out[..., :h, :] = gemm(qh, qt[..., :n, :], precision=precision, label="tsqr-combine",
                           backend=backend)
    qts = xp.reshape(qt[..., n:, :], (*batch, q - 1, n, n))
    prod = gemm(qs, qts, precision=precision, label="tsqr-combine", backend=backend)
    out[..., h:, :] = xp.reshape(prod, (*batch, (q - 1) * b, n))
    return out, r


def lu_signed(backend: Any, a: Any) -> tuple[Any, Any, Any]:
    """``L @ U = a - diag(s)`` without pivoting, ``s_i = -phase(pivot_i)``.

    Choosing each sign when its pivot is reached makes ``|u_ii| >= 1``, so the
    factorization exists and is stable for any ``a`` with orthonormal-column
    parent (Ballard et al. 2014, Lemma 6.2). Returns ``(L, U, s)``; L is unit
    lower triangular with explicit zeros above the diagonal. A small dense
    kernel of the backend (:meth:`ArrayAPIBackend.lu_signed`).
    """
    return backend.lu_signed(a)


def householder_from_q(backend: Any, q: Any, *, precision: str) -> tuple[Any, Any, Any]:
    """WY form of the reflectors behind an explicit orthonormal ``Q`` (m >= n).

    Returns ``(W, Y, s)`` with ``H = I - W Y^H`` unitary, ``Y`` unit lower
    trapezoidal (explicit zeros and ones), and ``H[:, :n] = Q conj(diag(s))``;
    a panel ``A = Q R`` is thus ``A = H [diag(s) R; 0]``.
    """
    xp = backend.xp
    m, n = q.shape[-2:]
    l1, u, s = lu_signed(backend, q[..., :n, :])
    y = xp.empty_like(q) if m > n else l1
    if m > n:
        y[..., :n, :] = l1
        # Y2 = Q2 U^{-1}, solved as U^H Y2^H = Q2^H
        y[..., n:, :] = ct(xp, backend.solve_triangular(ct(xp, u), ct(xp, q[..., n:, :]),
                                                        lower=True))
    # T = -U conj(S) Y1^{-H}, solved as Y1 T^H = -(U conj(S))^H
    us = -u * xp.expand_dims(xp.conj(s) if is_complex(xp, q) else s, axis=-2)
    t = ct(xp, backend.solve_triangular(l1, ct(xp, us), lower=True, unit_diagonal=True))
    w = gemm(y, t, precision=precision, label="panel-wy", backend=backend)
    return w, y, s


def householder_panel(backend: Any, a: Any, *, precision: str, need_w: bool = True
                      ) -> tuple[Any | None, Any, Any]:
    """Householder QR of a panel ``(..., m, k)``, ``m >= k``, as ``(W, Y, R)``.

    ``a = (I - W Y^H)[:, :k] R`` with ``Y`` unit lower trapezoidal (explicit
    zeros and ones) and ``R`` upper triangular (signs arbitrary). Panels with
    ``m >= TSQR_ASPECT * k``, ``m >= TSQR_MIN_ROWS`` and ``k <= TSQR_MAX_WIDTH`` go through
    :func:`tsqr` and :func:`householder_from_q`; panels wider than
    ``backend.panel_block``, with at least ``backend.panel_block_min_rows`` rows and of a
    dtype in ``backend.panel_block_dtypes``, through
    :func:`~mpqr.qr.panel_blocked.blocked_householder_panel`; all others through one
    ``backend.householder_panel`` call (``geqrf`` + the UT-transform ``T``); then
    ``W = Y T``. ``W`` is None unless ``need_w``.
    """
    xp = backend.xp
    m, k = a.shape[-2:]
    if m >= max(TSQR_ASPECT * k, TSQR_MIN_ROWS) and k <= TSQR_MAX_WIDTH:
        qp, rp = tsqr(backend, a, precision=precision)
        w, y, s = householder_from_q(backend, qp, precision=precision)
        return w, y, xp.expand_dims(s, axis=-1) * rp
    nb = backend.panel_block
    if (nb is not None and a.ndim == 2 and k > nb and m >= backend.panel_block_min_rows
            and any(a.dtype == getattr(xp, d, None) for d in backend.panel_block_dtypes)):
        from mpqr.qr.panel_blocked import blocked_householder_panel

        record_event("panel", f"{m}x{k} leaf: blocked Householder QR in {nb}-column "
                     "sub-panels (explicit QR + reconstruction each)", rows=m, cols=k,
                     block=nb)
        y, t, r = blocked_householder_panel(backend, a, block=nb, precision=precision)
    else:
        y, t, r = backend.householder_panel(a)
    w = gemm(y, t, precision=precision, label="panel-wy", backend=backend) if need_w else None
    return w, y, r


def unit_lower(xp: Any, blk: Any) -> Any:
    """Explicit unit-lower-trapezoidal copy of ``blk`` (``..., m, n``, ``m >= n``) whose
    strictly lower part holds Householder vectors (LAPACK's layout: R sits above)."""
    m, n = blk.shape[-2:]
    return xp.tril(blk, k=-1) + xp.eye(m, n, dtype=blk.dtype, device=device(blk))


def trmm_lower(l: Any, b: Any, *, precision: Any, label: str, backend: Any,
               cutoff: int = TRMM_CUTOFF, unit_implicit: bool = False) -> Any:
    """``l @ b`` for lower-triangular ``l`` (zeros stored above the diagonal).

    Splitting ``l`` in halves gives ``[l11 b1; l21 b1 + l22 b2]``: the
    off-diagonal product is a large square GEMM and only the diagonal blocks
    recurse, which halves the flops of a full GEMM. ``unit_implicit``: ``l`` is
    unit lower with anything stored on and above its diagonal (Householder
    vectors below R, LAPACK's layout); only the ``cutoff``-sized diagonal blocks
    are copied out with their unit diagonal. The result is one array filled in
    place: the temporaries are the recursion's half-size products.

    Where the halves are equal down to the diagonal blocks (:data:`TRMM_BATCHED`, 2-D
    operands, no ``workspace_limit``), each level's products are one stacked product
    instead of one a block (:func:`_trmm_levels`).
    """
    xp = backend.xp
    k = l.shape[-1]
    if k <= cutoff:
        if unit_implicit:
            l = unit_lower(xp, l)
        return gemm(l, b, precision=precision, label=label, backend=backend)
    opts = active_gemm_options()
    # (under a workspace limit the products stay one a block: a stacked product is not
    # tiled, and its stacked operands are copies)
    if TRMM_BATCHED and l.ndim == 2 and b.ndim == 2 and (
            opts is None or opts.workspace_limit is None):
        s, levels = k, 0
        while s > cutoff and s % 2 == 0:
            s, levels = s // 2, levels + 1
        if s <= cutoff and levels >= 1:
            return _trmm_levels(l, b, s, levels, precision=precision, label=label,
                                backend=backend, unit_implicit=unit_implicit)
    h = k // 2
    low = gemm(l[..., h:, :h], b[..., :h, :], precision=precision, label=label + "-gemm",
               backend=backend)
    out = xp.empty((*low.shape[:-2], k, b.shape[-1]), dtype=low.dtype, device=device(low))
    out[..., h:, :] = low
    del low
    out[..., :h, :] = trmm_lower(l[..., :h, :h], b[..., :h, :], precision=precision,
                                 label=label, backend=backend, cutoff=cutoff,
                                 unit_implicit=unit_implicit)
    out[..., h:, :] += trmm_lower(l[..., h:, h:], b[..., h:, :], precision=precision,
                                  label=label, backend=backend, cutoff=cutoff,
                                  unit_implicit=unit_implicit)
    return out


def _trmm_levels(l: Any, b: Any, s: int, levels: int, *, precision: Any, label: str,
                 backend: Any, unit_implicit: bool) -> Any:
    """:func:`trmm_lower` of a ``k x k`` ``l`` with ``k = s 2^levels``, level by level:
    the ``2^levels`` diagonal blocks (``s x s``) in one stacked product, then for each
    width ``t = s, 2 s, ..., k / 2`` the ``k / 2t`` blocks ``l[(2i+1)t:(2i+2)t,
    2it:(2i+1)t]`` below them in one more (the same products as the recursion's, fewer
    and larger calls)."""
    xp = backend.xp
    k, nc = l.shape[-1], b.shape[-1]
    nd = 2**levels
    diag = [l[i * s:(i + 1) * s, i * s:(i + 1) * s] for i in range(nd)]
    diag = xp.stack([unit_lower(xp, d) if unit_implicit else d for d in diag])
    out = xp.reshape(gemm(diag, xp.reshape(b, (nd, s, nc)), precision=precision,
                          label=label, backend=backend), (k, nc))
    del diag
    t = s
    while t < k:
        cnt = k // (2 * t)
        if cnt == 1:
            prod = gemm(l[t:, :t], b[:t, :], precision=precision, label=label + "-gemm",
                        backend=backend)
            out[t:, :] += prod
        else:
            lo = xp.stack([l[(2 * i + 1) * t:(2 * i + 2) * t, 2 * i * t:(2 * i + 1) * t]
                           for i in range(cnt)])
            bb = xp.reshape(b, (cnt, 2 * t, nc))[:, :t, :]  # a view where b is contiguous
            prod = gemm(lo, bb, precision=precision, label=label + "-gemm", backend=backend)
            del lo, bb
            for i in range(cnt):
                out[(2 * i + 1) * t:(2 * i + 2) * t, :] += prod[i, ...]
        del prod
        t *= 2
    return out


def normalize_signs(xp: Any, q: Any | None, r: Any, *, check: bool = True,
                    in_place: bool = False, backend: Any = None) -> tuple[Any | None, Any]:
    """Make ``diag(R)`` real and >= 0 by rescaling rows of R and columns of Q.

    Returns new arrays, or the inputs themselves when every diagonal entry is already
    real and >= 0 (the inputs are workspaces the caller owns). ``check=False`` skips
    that test (a host sync) and always rescales: for factors whose signs are mixed
    anyway (LAPACK's and cuSOLVER's Householder QR). ``in_place``: real factors are
    rescaled in their own storage (no copy of Q or R: the factors are the largest arrays
    of a call), by ``backend.mul_in_place`` where a backend is given.
    """
    k = min(r.shape[-2], r.shape[-1])
    if k == 0:
        return q, r
    d = xp.linalg.diagonal(r[..., :k, :k])
    if check and not is_complex(xp, r) and bool(xp.all(d >= 0)):
        return q, r  # already normalised (CholQR's R): skip a pass over Q (one host sync)
    p = phase(xp, d)
    if in_place and not is_complex(xp, r):
        rk, qk = r[..., :k, :], None if q is None else q[..., :, :k]
        if backend is None:
            rk *= xp.expand_dims(p, axis=-1)
            if qk is not None:
                qk *= xp.expand_dims(p, axis=-2)
        else:
            backend.mul_in_place(rk, xp.expand_dims(p, axis=-1))
            if qk is not None:
                backend.mul_in_place(qk, xp.expand_dims(p, axis=-2))
        return q, r
    pc = xp.conj(p) if is_complex(xp, r) else p
    rk = r[..., :k, :] * xp.expand_dims(pc, axis=-1)
    if is_complex(xp, r):
        # the rescaled diagonal is |d| up to rounding: store it exactly real
        fix = xp.astype(xp.abs(d), r.dtype) - xp.linalg.diagonal(rk[..., :, :k])
        rk = rk + xp.eye(k, r.shape[-1], dtype=r.dtype, device=device(r)) * \
            xp.expand_dims(fix, axis=-1)
    r = xp.concat([rk, r[..., k:, :]], axis=-2) if r.shape[-2] > k else rk
    if q is not None:
        qk = q[..., :, :k] * xp.expand_dims(p, axis=-2)
        q = xp.concat([qk, q[..., :, k:]], axis=-1) if q.shape[-1] > k else qk
    return q, r
