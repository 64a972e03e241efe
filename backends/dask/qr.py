"""``mpqr.qr`` of a dask array chunked by rows: certified CholQR across the row blocks,
with a TSQR tree as the fallback.

A CholQR pass needs the ``n x n`` Gram matrix ``G = sum_i A_i^H A_i``: each block's
product runs on its worker through the precision policy and the partial sums meet in
a tree (``dask.array`` reduction, ``split_every`` at a time), so no worker holds more
than a few blocks. The ``n x n`` steps (Cholesky, checks, the certificate) run once,
on the client, with the in-core CholQR's code; the factors ``R_j`` go back to every
block, and ``Q = A R_1^-1 R_2^-1 ...`` is one lazy ``map_blocks``. Later passes apply
the earlier factors inside the block task, so ``Q_1`` is never stored: CholQR2 reads
``A`` twice for ``R`` and once more for ``Q``.

The route is data dependent (the certificate decides), so ``R`` is computed when
``qr`` is called (``Q`` stays lazy); if CholQR breaks down, ``method="auto"`` takes
the TSQR tree (:mod:`mpqr.backends.dask.tree`), whose leaves and nodes are ``mpqr.qr``.
"""

from __future__ import annotations

from typing import Any

from mpqr.backends import get_backend
from mpqr.backends.dask import _blocks
from mpqr.backends.dask._validate import as_float, check_layout, require_dask
from mpqr.backends.dask.tree import tree_depth, tsqr

from mpqr._errors import BreakdownError
from mpqr._validation import check_choice
from mpqr.policy import record_event, resolve_precision, validate_precision
from mpqr.qr._kernels import SAFE_EXPONENT, panel_precision
from mpqr.qr.choice import NATIVE_PRECISIONS, OWN_PRECISION_CHOLQR, precision_of

__all__ = ["CHOLQR_METHODS", "SPLIT_EVERY", "factor", "qr"]

#: partial sums (and TSQR R factors) combined per node of the reduction trees; 8
#: keeps the depth at 2 up to 64 blocks with n x n operands that are cheap to add
SPLIT_EVERY = 8

#: the methods run across the blocks; any other in-core method runs at the TSQR leaves
CHOLQR_METHODS = ("cholqr", "cholqr2", "shifted-cholqr3", "preconditioned-cholqr")

#: where ``method="auto"``'s CholQR2 breaks down, the method it continues with (from its
#: first Gram matrix) before the TSQR tree
RESCUE = "preconditioned-cholqr"

#: the largest column exponent that needs no scaling, by single precision or not
SAFE_RANGE = {True: SAFE_EXPONENT["float32"], False: SAFE_EXPONENT["float64"]}

_PASSES = {"cholqr": (False,), "cholqr2": (False, False),
           "shifted-cholqr3": (True, False, False)}


def qr(x: Any, mode: str = "reduced", precision: str | None = None, method: str = "auto", *,
       check_finite: bool = False, overwrite_a: bool = False) -> Any:
    """:func:`mpqr.qr` for a ``dask.array.Array`` chunked by rows (see there).

    ``Q`` is lazy (``x``'s row chunks, one column chunk); ``R`` is a one-chunk dask
    array computed during the call (CholQR's certificate chooses the route). Only
    ``mode="reduced"`` and ``"r"``; ``x`` is never modified (``overwrite_a`` is ignored).
    """
    from mpqr.qr.api import MODES, QRResult
    from mpqr.qr.driver import METHODS

    check_choice(mode, "mode", MODES)
    check_choice(method, "method", ("auto", *sorted(METHODS)))
    if mode == "complete":
        raise NotImplementedError(
            "mode='complete' is not supported for a dask array: Q would be m x m; use "
            "mode='reduced' (or compute a small x into memory first)")
    if precision is not None:
        validate_precision(precision)
    q, r = factor(x, want_q=mode != "r", precision=precision, method=method,
                  check_finite=check_finite)
    return QRResult(q, r) if mode != "r" else r


def factor(x: Any, *, want_q: bool, precision: Any, method: str = "auto",
           check_finite: bool = False, split_every: int = SPLIT_EVERY,
           as_dask: bool = True) -> tuple[Any, Any]:
    """``(Q or None, R)`` of the row-chunked dask array ``x``; ``R`` as a one-chunk dask
    array, or in memory (on the blocks' kind of device) with ``as_dask=False``."""
    from mpqr.qr.driver import empty

    da = require_dask()
    check_layout(x, "x")
    x = as_float(x, "x")
    prec_name, _ = resolve_precision(precision)
    if precision is None:
        # the workers do not see the caller's mpqr.precision context: send its value
        precision = prec_name
    backend = get_backend(_meta_namespace(x))
    xp = backend.xp
    m, n = x.shape
    if m < n:
        raise ValueError(f"`x` must have at least as many rows as columns for a distributed "
                         f"QR (a tall matrix chunked by rows), got shape {x.shape}")
    if x.dtype.kind == "c" and prec_name in ("fp16", "fp32-emulated", "fp64-emulated"):
        raise NotImplementedError(
            f"precision={prec_name!r} is not supported for complex input ({x.dtype}): the "
            "emulated engines are real-only; use precision 'auto', 'fp32' or 'fp64'")
    if prec_name in ("fp16", "fp32-emulated") and "fp16" not in backend.capabilities:
        raise NotImplementedError(
            f"precision={prec_name!r} needs a float16 GEMM engine, which the {backend.name} "
            "backend does not provide (it has no float16 GEMM); use 'fp32' or 'fp64'")
    if check_finite and not bool(da.isfinite(x).all().compute()):
        raise ValueError("`x` must not contain infs or NaNs (check_finite=True)")
    nb = len(x.chunks[0])
    wrap = (lambda a: da.from_array(a, chunks=a.shape, asarray=False)) if as_dask else \
        (lambda a: a)
    if m == 0 or n == 0:
        q, r = empty(xp, xp.empty((m, n), dtype=x.dtype), want_q=want_q, complete=False)
        return (None if q is None else da.from_array(q, chunks=(x.chunks[0], (n,)),
                                                     asarray=False)), wrap(r)
    auto = method == "auto"
    cholqr = "cholqr2" if auto else method
    depth = tree_depth(nb, split_every)
    if cholqr in CHOLQR_METHODS:
        own = precision_of(backend, prec_name, x.dtype, cholqr) if auto else prec_name
        record_event("method", f"qr (dask): {cholqr} across {nb} row blocks of {x.shape} "
                     f"({'chosen: ' if auto else 'requested: '}tall-skinny, each block's "
                     f"Gram product on its worker at precision={own!r}, the partial sums in a "
                     f"tree of depth {depth} (split_every={split_every}), the {n} x {n} steps "
                     "once on the client, Q = A R^-1 by map_blocks)",
                     method=cholqr, route="cholqr", blocks=nb, depth=depth, shape=(m, n),
                     precision=own)
        try:
            if not auto and prec_name not in NATIVE_PRECISIONS:
                # as in-core: products with a narrower range than the input's always
                # see columns scaled by powers of two
                return _scaled(x, backend, cholqr, precision=precision, prec_name=prec_name,
                               want_q=want_q, split_every=split_every, wrap=wrap)
            return _cholqr(x, backend, cholqr, precision=own if auto else precision,
                           prec_name=own, want_q=want_q, quiet=True,
                           split_every=split_every, wrap=wrap)
        except BreakdownError as exc0:
            exc = exc0
            if auto:
                try:
                    return _rescue(x, backend, exc, precision=own, want_q=want_q,
                                   split_every=split_every, wrap=wrap)
                except BreakdownError as exc2:
                    exc, cholqr = exc2, RESCUE
            if not auto:
                # a Gram matrix out of range (a column whose squares over- or underflow):
                # again on scaled columns, as the in-core driver scales them
                scaled = None if exc.cond_estimate != float("inf") else _scaled(
                    x, backend, cholqr, precision=precision, prec_name=prec_name,
                    want_q=want_q, split_every=split_every, wrap=wrap, only_if_needed=True)
                if scaled is None:
                    raise
                return scaled
            fb = _fallback_method(backend, prec_name, n)
            record_event("fallback", f"qr (dask): {cholqr} broke down (estimated cond(x) >= "
                         f"{exc.cond_estimate:.2e}); falling back to a TSQR tree over the "
                         f"{nb} row blocks with {fb} at its leaves and nodes, "
                         f"precision={prec_name!r}", method=cholqr, fallback="tsqr",
                         leaf_method=fb, cond_estimate=exc.cond_estimate, reason=str(exc))
            method = fb
    else:
        record_event("method", f"qr (dask): TSQR tree over {nb} row blocks of {x.shape}, "
                     f"{method} at its leaves and nodes (requested), depth {depth} "
                     f"(split_every={split_every})", method=method, route="tsqr", blocks=nb,
                     depth=depth, shape=(m, n), precision=prec_name)
    q, r = tsqr(x, precision=precision, method=method, want_q=want_q,
                split_every=split_every, wprec=panel_precision(prec_name, x.dtype, xp))
    if not as_dask:
        if q is not None:
            # R is read now and Q right after (lstsq's direct solve): the leaves' QRs run
            # once, their Q blocks kept on the workers
            import dask

            q, r = dask.persist(q, r)
        r = r.compute()
    return q, r


def _scaled(x: Any, backend: Any, method: str, *, precision: Any, prec_name: str,
            want_q: bool, split_every: int, wrap: Any, only_if_needed: bool = False
            ) -> tuple[Any, Any] | None:
    """``method`` on columns scaled by powers of two so that each one's largest entry is
    in ``[1, 2)`` (one pass over ``x`` for the column maxima): ``A D = Q R_s``,
    ``R = R_s D^-1``, exact. ``only_if_needed``: None when every column is within
    :data:`SAFE_RANGE` (no scaling would help)."""
    from mpqr.qr._kernels import in_safe_range, pow2_scale

    n = x.shape[1]
    parts = x.map_blocks(_blocks.column_max, chunks=((1,) * len(x.chunks[0]), (n,)),
                         dtype=x.real.dtype if x.dtype.kind == "c" else x.dtype,
                         meta=x._meta.real, token="mpqr-column-max")
    mx = parts.max(axis=0, keepdims=True, split_every=split_every).compute()
    e = backend.exponent(mx)
    single = prec_name == "fp32"
    if only_if_needed:
        if in_safe_range(backend.xp, x, e, single=single):
            return None
        record_event("scale", f"qr (dask): a column's largest entry is outside 2^+-"
                     f"{SAFE_RANGE[single]}: {method} runs again on columns scaled by "
                     "powers of two", method=method)
    xs = x.map_blocks(_blocks.pow2, _delayed_small(-e), dtype=x.dtype, meta=x._meta,
                      token="mpqr-scale")
    q, r = _cholqr(xs, backend, method, precision=precision, prec_name=prec_name,
                   want_q=want_q, quiet=True, split_every=split_every, wrap=lambda a: a)
    return q, wrap(pow2_scale(backend, r, backend.from_small(e, r)))


def _rescue(x: Any, backend: Any, exc: BreakdownError, *, precision: str, want_q: bool,
            split_every: int, wrap: Any) -> tuple[Any, Any]:
    """``auto``'s CholQR2 broke down: :data:`RESCUE` from CholQR2's first Gram matrix
    where it was in range, else on columns scaled where that helps (BreakdownError
    where nothing is left to try: the caller takes the TSQR tree)."""
    from mpqr.qr.cholqr import reuse_first_gram

    first = getattr(exc, "first_gram", None)
    reuse = first is not None and first[0] is x
    scale = not reuse and exc.cond_estimate == float("inf")
    if not reuse and not scale:  # CholQR2's certificate: its first Gram matrix is gone
        scale = None
    record_event("fallback", f"qr (dask): cholqr2 broke down (estimated cond(x) >= "
                 f"{exc.cond_estimate:.2e}); continuing with {RESCUE} at "
                 f"precision={precision!r}" + (" from CholQR2's Gram matrix" if reuse else
                                               " on columns scaled where needed" if scale
                                               else ""),
                 method="cholqr2", fallback=RESCUE, cond_estimate=exc.cond_estimate,
                 reason=str(exc))
    if scale:
        out = _scaled(x, backend, RESCUE, precision=precision, prec_name=precision,
                      want_q=want_q, split_every=split_every, wrap=wrap, only_if_needed=True)
        if out is None:
            raise exc
        return out
    with reuse_first_gram(x, first[1], first[2]) if reuse else _null():
        return _cholqr(x, backend, RESCUE, precision=precision, prec_name=precision,
                       want_q=want_q, quiet=True, split_every=split_every, wrap=wrap)


def _preconditioned(x: Any, backend: Any, *, precision: Any, prec_name: str, want_q: bool,
                    quiet: bool, split_every: int, wrap: Any) -> tuple[Any, Any]:
    """The preconditioned CholQR across the blocks (:mod:`mpqr.qr.cholqr_precond`): every
    pass one Gram sum of ``A_i R_1^-1 R_2^-1 ...`` (the factors applied in the block task,
    never stored), the ``n x n`` steps on the client."""
    from mpqr.qr import cholqr as c
    from mpqr.qr import cholqr_precond as p

    applied: list[Any] = []

    def gram_of() -> tuple[Any, Any]:
        with backend.ignore_fp_warnings() if quiet else _null():
            g = gram_sum(x, tuple(applied), RESCUE, precision, prec_name, quiet,
                         split_every).compute()
        return get_backend(_namespace(g)).small(g)

    def next_gram(r: Any, _pre: Any) -> tuple[Any, Any]:
        applied.append((r, c.inverse_and_cond(get_backend(_namespace(r)), r)))
        return gram_of()

    pair = c._first_gram(x, RESCUE) or gram_of()
    with pair[0].ignore_fp_warnings() if quiet else _null():
        chain = p.precondition(*pair, next_gram, n=x.shape[1], prec_name=prec_name,
                               where=f"qr (dask): {RESCUE}")
    applied.append((chain.rc, c.inverse_and_cond(get_backend(_namespace(chain.rc)),
                                                 chain.rc)))
    r = c._final_r(backend, chain.sb, [chain.rc, *chain.factors],
                   backend.xp.empty((0, 0), dtype=x.dtype), prec_name)
    record_event("certificate", f"qr (dask): {RESCUE} certified: the last pass's Gram "
                 "matrix is within 1/2 of I", method=RESCUE, passes=len(applied))
    q = apply_factors(x, tuple(applied), RESCUE, prec_name, quiet) if want_q else None
    return q, wrap(r)


def _delayed_small(v: Any) -> Any:
    import dask

    return dask.delayed(v, pure=True)


def _meta_namespace(x: Any) -> Any:
    from mpqr._array_api import array_namespace

    return array_namespace(x._meta)


def _fallback_method(backend: Any, prec_name: str, n: int) -> str:
    # as the in-core driver: what the requested precision runs without the tall-skinny rule
    if prec_name in OWN_PRECISION_CHOLQR and n > 32 and "tensor-cores" in backend.capabilities:
        return "householder-recursive"
    return "householder-tiled"


def gram_sum(x: Any, rs: tuple[Any, ...], method: str, precision: Any, prec_name: str,
             quiet: bool, split_every: int) -> Any:
    """Lazy ``n x n`` sum over the blocks of ``(A_i R1^-1 ...)^H (A_i R1^-1 ...)``
    (``rs``: the factors as :func:`mpqr.backends.dask._blocks.apply_inverses` takes them)."""
    import dask

    n = x.shape[1]
    meta = x._meta.reshape((0, 0, 0))
    small = dask.delayed(rs, pure=True) if rs else ()
    parts = x.map_blocks(_blocks.bind(_blocks.gram_block), small, method, precision,
                         prec_name, quiet, chunks=((1,) * len(x.chunks[0]), (n,), (n,)),
                         new_axis=[2], dtype=x.dtype, meta=meta, token=f"mpqr-{method}-gram")
    return parts.sum(axis=0, split_every=split_every)


def apply_factors(x: Any, rs: tuple[Any, ...], method: str, prec_name: str,
                  quiet: bool = False) -> Any:
    """Lazy ``Q = A R1^-1 R2^-1 ...`` block by block (``x``'s chunks)."""
    import dask

    return x.map_blocks(_blocks.bind(_blocks.apply_inverses), dask.delayed(rs, pure=True),
                        method, prec_name, quiet, dtype=x.dtype, meta=x._meta,
                        token=f"mpqr-{method}-q")


def _cholqr(x: Any, backend: Any, method: str, *, precision: Any, prec_name: str,
            want_q: bool, quiet: bool, split_every: int, wrap: Any) -> tuple[Any, Any]:
    """The CholQR passes across the blocks; BreakdownError as in-core."""
    from mpqr.qr import cholqr as c

    if method == RESCUE:
        return _preconditioned(x, backend, precision=precision, prec_name=prec_name,
                               want_q=want_q, quiet=quiet, split_every=split_every, wrap=wrap)

    factors: list[Any] = []
    applied: list[Any] = []  # (R, (R^-1, cond_1(R))) per pass, made once, sent to the blocks
    sb = backend
    for i, shift in enumerate(_PASSES[method]):
        pair = c._first_gram(x, method) if i == 0 else None
        if pair is None:
            # quiet: an over- or underflowing G is read as a breakdown below, so the
            # partial sums' warnings are noise (the threaded scheduler runs them here)
            with backend.ignore_fp_warnings() if quiet else _null():
                g = gram_sum(x, tuple(applied), method, precision, prec_name, quiet,
                             split_every).compute()
        else:
            g = pair[1]
        gb = get_backend(_namespace(g))
        certify = factors[-1] if i == len(_PASSES[method]) - 1 and i > 0 else None
        with gb.ignore_fp_warnings() if quiet else _null():
            _q, r, sb = c._one_pass(gb, x, precision, method, prec_name, shift=shift,
                                    certify=certify, want_q=False, g=g)
        factors.append(r)
        rb = get_backend(_namespace(r))
        applied.append((r, c.inverse_and_cond(rb, r)))
    # R on the blocks' kind of device (a device array for CuPy blocks)
    r = c._final_r(backend, sb, factors[::-1], backend.xp.empty((0, 0), dtype=x.dtype),
                   prec_name)
    record_event("certificate", f"qr (dask): {method} " + (
        "certified: the last pass's Gram matrix is within 1/2 of I" if len(factors) > 1
        else "(one pass, no certificate)"), method=method, passes=len(factors))
    q = apply_factors(x, tuple(applied), method, prec_name, quiet) if want_q else None
    return q, wrap(r)


def _namespace(a: Any) -> Any:
    from mpqr._array_api import array_namespace

    return array_namespace(a)


def _null() -> Any:
    import contextlib

    return contextlib.nullcontext()
