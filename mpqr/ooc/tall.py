"""Tall-skinny QR of a host matrix streamed through the device by row pieces.

* Streaming CholQR2 (the default): pass 1 forms ``G1 = sum A_i^H A_i``, ``R1 =
  chol(G1)``; pass 2 forms ``G2`` of ``Q1_i = A_i R1^-1`` (never stored), ``R2 =
  chol(G2)`` with the certificate of :mod:`mpqr.qr.cholqr` (``||G2 - I||_F <= 1/2``);
  pass 3 writes ``Q_i = Q1_i R2^-1``. Three reads of ``A``, one write of ``Q``.
* Shifted CholQR3: a shifted first pass, then CholQR2: four reads, one write.
* TSQR by row pieces: each piece's in-core QR, its ``Q_i`` written to the output,
  the stacked ``R_i`` factored once more, and ``Q_i`` multiplied by its block of that
  factor's Q in a second pass over the output. One read of ``A``; the fallback when
  the certificate fails (and, without Q, the method of ``mode="r"``: one pass).

The ``n x n`` steps (Cholesky, checks, certificate) are those of the in-core CholQR.
"""

from __future__ import annotations

from typing import Any

from mpqr._errors import BreakdownError
from mpqr.ooc.run import collapsed
from mpqr.policy import gemm, record_event
from mpqr.qr._kernels import panel_precision
from mpqr.qr.cholqr import (
    INVERSE_COND_MAX,
    _final_r,
    _one_pass,
    _times_upper,
    right_solve_upper,
)
from mpqr.qr.gram_blocked import gram

__all__ = ["TALL_METHODS", "tall_qr", "tsqr_stream"]

#: out-of-core tall-skinny methods and their reads of A (with Q / without Q)
TALL_METHODS = {"cholqr2": (3, 2), "shifted-cholqr3": (4, 3), "tsqr": (1, 1)}


class _Shape:
    """Stands for the whole host matrix where the in-core steps ask for its shape."""

    ndim = 2

    def __init__(self, m: int, n: int, dtype: Any):
        self.shape, self.dtype = (m, n), dtype


def _check_finite(run: Any, blk: Any, check: str | None) -> None:
    if check is not None and not run.backend.all_finite(blk):
        raise ValueError(check)


def _inverse(backend: Any, r: Any, method: str, prec_name: str) -> Any:
    """``blk -> blk R^-1`` as the in-core CholQR applies it: one GEMM with the explicit
    inverse where the backend takes that route and ``cond_1(R)`` is small (see
    :func:`mpqr.qr.cholqr._apply_inverse`), else row-wise substitution. Decided once
    for all pieces, so every pass rounds each piece the same way."""
    xp = backend.xp
    n = r.shape[-1]
    min_n = backend.inverse_gemm_min_n
    if min_n is not None and n >= min_n:
        x = backend.right_solve_upper(xp.eye(n, dtype=r.dtype), r)
        kappa = float(xp.max(xp.sum(xp.abs(r), axis=0))) * \
            float(xp.max(xp.sum(xp.abs(x), axis=0)))
        if kappa <= INVERSE_COND_MAX:
            record_event("apply-inverse", f"{method}: Q = A @ inv(R) by GEMM for every "
                         f"piece (cond_1(R) = {kappa:.3g} <= {INVERSE_COND_MAX:g})",
                         cond_1=kappa)
            prec = panel_precision(prec_name, r.dtype, xp)
            return lambda blk: _times_upper(backend, blk, x, f"ooc-{method}-apply-inverse",
                                            prec)
    return lambda blk: right_solve_upper(backend, blk, r, prec_name)


def cholqr_stream(run: Any, src: Any, plan: Any, *, method: str, precision: Any,
                  prec_name: str, want_q: bool, q_out: Any, check: str | None,
                  first_gram: Any = None) -> Any:
    """Streaming CholQR2 / shifted CholQR3; returns R on the device. BreakdownError
    as in core (the caller falls back to TSQR for ``method="auto"``). ``first_gram``:
    ``A^H A`` already formed (on the device) in place of the first pass."""
    backend = run.backend
    xp = backend.xp
    m, n = src.shape
    stub = _Shape(m, n, getattr(xp, src.dtype.name))
    shifted = method == "shifted-cholqr3"
    npass = 3 if shifted else 2
    factors: list[Any] = []  # R_k in the small backend, last one last
    devs: list[Any] = []  # the same on the device, for the solves
    sb = backend
    regions = plan.regions

    def transform(blk: Any) -> Any:
        for solve in devs:
            blk = solve(blk)
        return blk

    for k in range(npass):
        g = first_gram if k == 0 else None
        for _region, blk in (run.over(src, regions, "x") if g is None else ()):
            if k == 0:
                _check_finite(run, blk, check)
            gi = gram(backend, transform(blk), precision, f"ooc-{method}-gram")
            g = gi if g is None else g + gi
        certify = factors[-1] if k == npass - 1 else None
        _q, r, sb = _one_pass(backend, stub, precision, method, prec_name,
                              shift=shifted and k == 0, certify=certify, want_q=False, g=g)
        factors.append(r)
        devs.append(_inverse(backend, backend.from_small(r, g), method, prec_name))
    if want_q:
        for region, blk in run.over(src, regions, "x"):
            run.store(q_out, region, transform(blk))
    return _final_r(backend, sb, factors[::-1], g, prec_name)


def tsqr_stream(run: Any, src: Any, plan: Any, *, precision: Any, want_q: bool, q_out: Any,
                check: str | None, extra: Any = None) -> Any:
    """TSQR by row pieces; returns R (``n x n``) on the device. ``extra``: a second host
    array whose columns are appended to each piece (``[A | b]`` for least squares)."""
    from mpqr.qr.in_memory import qr

    backend = run.backend
    xp = backend.xp
    regions = plan.regions
    rs, ks = [], []
    n = src.shape[1]
    if extra is None:
        items = [[(src, rg)] for rg in regions]
    else:
        items = [[(src, (r0, r1, 0, n)), (extra, (r0, r1, 0, extra.shape[1]))]
                 for r0, r1, _c0, _c1 in regions]
    with collapsed("out-of-core pieces"):
        for blks, region in zip(run.over_multi(items, "x"), regions):
            for b in blks:
                _check_finite(run, b, check)
            blk = blks[0] if len(blks) == 1 else xp.concat(blks, axis=1)
            if want_q:
                q, r = qr(blk, mode="reduced", precision=precision)
                run.store(q_out, region, q)
            else:
                r = qr(blk, mode="r", precision=precision)
            rs.append(r)
            ks.append(r.shape[0])
    stacked = xp.concat(rs, axis=0) if len(rs) > 1 else rs[0]
    if not want_q:
        return qr(stacked, mode="r", precision=precision) if len(rs) > 1 else stacked
    if len(rs) == 1:
        return stacked
    qc, r = qr(stacked, mode="reduced", precision=precision)
    run.st.flush()  # the second pass reads what the first one wrote
    offs = [sum(ks[:i]) for i in range(len(ks) + 1)]
    for i, (region, qi) in enumerate(run.over(q_out, regions, "Q")):
        run.store(q_out, region, gemm(qi, qc[offs[i]:offs[i + 1], :], precision=precision,
                                      label="ooc-tsqr-combine", backend=backend))
    return r


def tall_qr(run: Any, src: Any, plan: Any, *, method: str, auto: bool, precision: Any,
            prec_name: str, want_q: bool, q_out: Any, check: str | None,
            first_gram: Any = None) -> Any:
    """R on the device (and Q in ``q_out``) by ``method``; ``auto`` falls back to TSQR.
    ``first_gram``: the CholQR methods' first Gram matrix, already formed."""
    if method == "tsqr":
        return tsqr_stream(run, src, plan, precision=precision, want_q=want_q, q_out=q_out,
                           check=check)
    try:
        return cholqr_stream(run, src, plan, method=method, precision=precision,
                             prec_name=prec_name, want_q=want_q, q_out=q_out, check=check,
                             first_gram=first_gram)
    except BreakdownError as exc:
        if not auto:
            raise
        record_event("fallback", f"qr: out-of-core {method} broke down (estimated cond(x) >= "
                     f"{exc.cond_estimate:.2e}); falling back to TSQR by row pieces",
                     method=method, fallback="tsqr", cond_estimate=exc.cond_estimate)
        return tsqr_stream(run, src, plan, precision=precision, want_q=want_q, q_out=q_out,
                           check=check)
