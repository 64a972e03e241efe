"""``mpqr.qr`` of a dask array chunked by rows, in as few passes over it as the result
allows, each pass one graph and one gather (:mod:`mpqr.backends.dask._graph`).

* ``mode="r"`` (``method="auto"``): one TSQR pass. Each block's in-core
  ``mpqr.qr(mode="r")`` runs on its worker; the ``R`` factors are stacked and factored
  again in a tree (``split_every`` at a time) up to one ``R``. Unconditionally stable
  (each leaf is the in-core QR, with its own certificate and fallback).
* With ``Q`` (``method="auto"``): CholQR2 across the blocks. Pass 1 sums the blocks'
  Gram products ``A_i^H A_i`` (through the precision policy) in a tree; the client runs
  the in-core CholQR's ``n x n`` steps once (Cholesky, checks); pass 2 applies
  ``R_1^-1`` and forms the Gram matrix of the result in the same block task, so ``Q_1``
  is never stored, and the client certifies it (``||Q_1^H Q_1 - I||_F <= 1/2``); ``Q =
  A R_1^-1 R_2^-1`` is one lazy ``map_blocks``. If CholQR2 breaks down: one TSQR pass
  for ``R_1`` (Householder leaves), then the same certified pass on ``A R_1^-1``, whose
  condition number is ``1 + O(u cond(A))``; only a numerically rank-deficient matrix
  goes on to the TSQR tree with ``Q`` (:mod:`mpqr.backends.dask.tree`).
* ``method="cholqr"``, ``"cholqr2"``, ``"shifted-cholqr3"``: their passes across the
  blocks, ``BreakdownError`` as in-core; any other method: TSQR with it at the leaves.

The route is data dependent, so ``R`` is computed when ``qr`` is called (``Q`` stays
lazy). The ``n x n`` steps run on the client's host whatever the blocks' device.
"""

from __future__ import annotations

import contextlib
import uuid
from typing import Any

from mpqr.backends import get_backend
from mpqr.backends.dask import _blocks
from mpqr.backends.dask._graph import Small, compute_pass, groups, reduce_pass, sum_parts
from mpqr.backends.dask._validate import as_float, check_layout, require_dask
from mpqr.backends.dask.tree import tree_depth, tsqr

from mpqr._errors import BreakdownError
from mpqr._validation import check_choice
from mpqr.policy import record_event, resolve_precision, validate_precision
from mpqr.qr._kernels import SAFE_EXPONENT, panel_precision
from mpqr.qr.choice import NATIVE_PRECISIONS, OWN_PRECISION_CHOLQR, precision_of

__all__ = ["CHOLQR_METHODS", "R_ONE_PASS_COND", "SPLIT_EVERY", "apply_factors", "factor",
           "qr"]

#: partial sums (and TSQR R factors) combined per node of the reduction trees; 8
#: keeps the depth at 2 up to 64 blocks with n x n operands that are cheap to add
SPLIT_EVERY = 8

#: ``mode="r"`` (``method="auto"``) returns pass 1's ``R = chol(x^H x)`` where
#: ``cond(x)`` is at most this (from the eigenvalues of ``x^H x``): its backward error,
#: ``cond(x) / 2`` times the Gram product's ``c u ||x||``, is then within 2x of
#: Householder QR's, as for lstsq's Gram route (:data:`mpqr.lstsq.gram.GRAM_COND_MAX`)
R_ONE_PASS_COND = 4.0

#: the methods run across the blocks; any other in-core method runs at the TSQR leaves
CHOLQR_METHODS = ("cholqr", "cholqr2", "shifted-cholqr3")

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
    from mpqr.qr.driver import METHODS
    from mpqr.qr.in_memory import MODES, QRResult

    check_choice(mode, "mode", MODES)
    check_choice(method, "method", ("auto", *sorted(METHODS)))
    if mode == "complete":
        raise NotImplementedError(
            "mode='complete' is not supported for a dask array: Q would be m x m; use "
            "mode='reduced' (or compute a small x into memory first)")
    if precision is not None:
        validate_precision(precision)
    done = _collective(x, mode, precision, method, check_finite)
    if done is not None:
        return done
    q, r = factor(x, want_q=mode != "r", precision=precision, method=method,
                  check_finite=check_finite)
    return QRResult(q, r) if mode != "r" else r


def _collective(x: Any, mode: str, precision: Any, method: str, check_finite: bool) -> Any:
    """``qr``'s result by the collective route (:mod:`mpqr.backends.dask.collective`)
    where it applies and CholQR2 holds, else None (the scheduler route then runs; a
    breakdown falls back to it as the in-core CholQR2 falls back)."""
    from mpqr.backends.dask import collective

    from mpqr.qr.in_memory import QRResult

    da = require_dask()
    check_layout(x, "x")
    m, n = x.shape
    if m < n or m == 0 or n == 0 or x.dtype.kind != "f":
        return None
    prec_name, _ = resolve_precision(precision)
    backend = get_backend(_meta_namespace(x))
    own = precision_of(backend, prec_name, x.dtype, "cholqr2") if method == "auto" \
        else prec_name
    picked = collective.route(x, method=method, prec_name=own, what="qr")
    if picked is None:
        return None
    client, kind = picked
    try:
        q, r = collective.cholqr2(x, client=client, kind=kind, want_q=mode != "r",
                                  precision=own, check_finite=check_finite)
    except BreakdownError as exc:
        record_event("fallback", f"qr (dask): the collective CholQR2 broke down ({exc}); "
                     "the scheduler route's fallbacks run", method="cholqr2",
                     fallback="scheduler", reason=str(exc))
        return None
    # one chunk under a fresh name (no hash of R's data), made from the host's R where
    # it is computed (on a worker: no copy to the device on the client's call path)
    name = "collective-r-" + uuid.uuid4().hex
    r = da.Array({(name, 0, 0): (r_block, r, x._meta)}, name, tuple((k,) for k in r.shape),
                 dtype=r.dtype, meta=x._meta)
    return QRResult(q, r) if mode != "r" else r


def r_block(r: Any, like: Any) -> Any:
    """The host's ``R`` on ``like``'s kind of device (``R``'s one block, computed
    where a task needs it)."""
    return _blocks.block_backend(like).from_small(r, like)


def factor(x: Any, *, want_q: bool, precision: Any, method: str = "auto",
           check_finite: bool = False, split_every: int = SPLIT_EVERY,
           as_dask: bool = True, first_gram: Any = None,
           passes: list[int] | None = None) -> tuple[Any, Any]:
    """``(Q or None, R)`` of the row-chunked dask array ``x``; ``R`` as a one-chunk dask
    array, or in memory (on the blocks' kind of device) with ``as_dask=False``.

    ``first_gram``: ``x^H x`` already summed over the blocks (a host array, from
    ``lstsq``'s first pass), which CholQR2's first pass then takes instead of a pass.
    ``passes``: a one-element list the number of passes over ``x`` is added to."""
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
    nb = len(x.chunks[0])

    def wrap(r: Any) -> Any:
        r = backend.from_small(r, x._meta)  # on the blocks' kind of device
        return da.from_array(r, chunks=r.shape, asarray=False) if as_dask else r

    if m == 0 or n == 0:
        q, r = empty(xp, xp.empty((m, n), dtype=x.dtype), want_q=want_q, complete=False)
        return (None if q is None else da.from_array(q, chunks=(x.chunks[0], (n,)),
                                                     asarray=False)), wrap(r)
    run = _Run(x, backend, precision, prec_name, split_every, check_finite, passes)
    auto = method == "auto"
    depth = tree_depth(len(run.groups), split_every) + 1
    if auto or method in CHOLQR_METHODS:
        cholqr = "cholqr2" if auto else method
        own = precision_of(backend, prec_name, x.dtype, cholqr) if auto else prec_name
        record_event("method", f"qr (dask): {cholqr} across {nb} row blocks of {x.shape} "
                     f"({'chosen: ' if auto else 'requested: '}tall-skinny, each block's "
                     f"Gram product on its worker at precision={own!r}, in "
                     f"{len(run.groups)} block tasks a pass, the partial sums in a tree of "
                     f"depth {depth} (split_every={split_every}), the {n} x {n} steps "
                     "once a pass on the client" + (", Q = A R^-1 by one lazy map_blocks)"
                                                    if want_q else "; mode='r': one pass "
                                                    f"where cond(x) <= {R_ONE_PASS_COND:g})"),
                     method=cholqr, route="cholqr", blocks=nb, depth=depth, shape=(m, n),
                     precision=own)
        try:
            if not auto and prec_name not in NATIVE_PRECISIONS:
                # as in-core: products with a narrower range than the input's always
                # see columns scaled by powers of two
                q, r = _scaled(run, cholqr, want_q=want_q)
                return q, wrap(r)
            q, r = _cholqr(run, x, cholqr, precision=own if auto else precision,
                           prec_name=own, want_q=want_q, quiet=True, first_gram=first_gram,
                           one_pass=auto and not want_q)
            return q, wrap(r)
        except BreakdownError as exc:
            if not auto:
                # a Gram matrix out of range (a column whose squares over- or underflow):
                # again on scaled columns, as the in-core driver scales them
                scaled = None if exc.cond_estimate != float("inf") else _scaled(
                    run, cholqr, want_q=want_q, only_if_needed=True)
                if scaled is None:
                    raise
                return scaled[0], wrap(scaled[1])
            method = _fallback_method(backend, prec_name, n)
            record_event("fallback", f"qr (dask): {cholqr} broke down (estimated cond(x) >= "
                         f"{exc.cond_estimate:.2e}); falling back to one TSQR pass for R "
                         f"({method} at its leaves and nodes, precision={prec_name!r})"
                         + (", then one CholQR pass on x R^-1 (certified) and Q lazy"
                            if want_q else ""), method=cholqr,
                         fallback="tsqr-cholqr" if want_q else "tsqr-r", leaf_method=method,
                         cond_estimate=exc.cond_estimate, reason=str(exc))
            if not want_q:
                return None, wrap(run.tsqr_r(method))
            try:
                q, r = _preconditioned(run, x, method)
                return q, wrap(r)
            except BreakdownError as exc2:
                record_event("fallback", f"qr (dask): CholQR on x R^-1 broke down too "
                             f"({exc2}); a TSQR tree with Q over the {nb} row blocks, "
                             f"{method} at its leaves and nodes", method="tsqr-cholqr",
                             fallback="tsqr", leaf_method=method,
                             cond_estimate=exc2.cond_estimate, reason=str(exc2))
    else:
        record_event("method", f"qr (dask): TSQR over {nb} row blocks of {x.shape}, "
                     f"{method} at its leaves and nodes (requested), depth {depth} "
                     f"(split_every={split_every})" + ("" if want_q else ": one pass for R"),
                     method=method, route="tsqr" if want_q else "tsqr-r", blocks=nb,
                     depth=depth, shape=(m, n), precision=prec_name)
        if not want_q:
            return None, wrap(run.tsqr_r(method))
        run.check_first_pass()
    q, r = tsqr(x, precision=precision, method=method, want_q=True,
                split_every=split_every, wprec=panel_precision(prec_name, x.dtype, xp))
    if not as_dask:
        # R is read now and Q right after (lstsq's direct solve): the leaves' QRs run
        # once, their Q blocks kept on the workers
        import dask

        q, r = dask.persist(q, r)
        r = r.compute()
    return q, r


class _Run:
    """One factorization's passes over ``x``: its block groups (found once), the
    finiteness check on the first pass, and each pass as one graph and one gather."""

    def __init__(self, x: Any, backend: Any, precision: Any, prec_name: str,
                 split_every: int, check_finite: bool, passes: list[int] | None = None):
        self.x, self.backend, self.precision, self.prec_name = x, backend, precision, prec_name
        self.split_every = split_every
        self.groups = groups(x)
        self.check = check_finite  # until the first pass has checked x
        self.host = _blocks.host_backend()
        self.passes = passes if passes is not None else [0]

    def reduce(self, what: str, leaf: Any, combine: Any, small: Any, arrays: Any = None,
               grouped: bool = True) -> Any:
        arrays = [self.x] if arrays is None else arrays
        d, stats = reduce_pass(what, _blocks.bind(leaf), combine, arrays, small,
                               split_every=self.split_every,
                               group=self.groups if grouped else None)
        out = compute_pass(d, stats)
        self.passes[0] += 1
        if self.check:
            self.check = False
            if not out["ok"]:
                raise ValueError("`x` must not contain infs or NaNs (check_finite=True)")
        return out

    def check_first_pass(self) -> None:
        """The finiteness check as a pass of its own (for the TSQR tree with Q)."""
        if self.check:
            self.reduce("check-finite", _blocks.gram_leaf, sum_parts,
                        ((), "check", "fp64", "fp64", True, True))

    def tsqr_r(self, method: str) -> Any:
        """``R`` by one TSQR pass (in-core ``mpqr.qr(mode="r")`` at the leaves and nodes),
        a host array."""
        return self.reduce(f"tsqr-r-{method}", _blocks.r_leaf, _blocks.r_combine,
                           (self.precision, method, self.check))["r"]

    def gram(self, rs: tuple[Any, ...], method: str, precision: Any, prec_name: str,
             quiet: bool, x: Any = None) -> Any:
        """``sum_i (A_i R1^-1 ...)^H (A_i R1^-1 ...)`` by one pass, a host array."""
        xs = self.x if x is None else x
        return self.reduce(f"{method}-gram", _blocks.gram_leaf, sum_parts,
                           (rs, method, precision, prec_name, quiet, self.check),
                           arrays=[xs], grouped=x is None)["g"]


def _scaled(run: _Run, method: str, *, want_q: bool, only_if_needed: bool = False
            ) -> tuple[Any, Any] | None:
    """``method`` on columns scaled by powers of two so that each one's largest entry is
    in ``[1, 2)`` (one pass over ``x`` for the column maxima): ``A D = Q R_s``,
    ``R = R_s D^-1``, exact. ``only_if_needed``: None when every column is within
    :data:`SAFE_RANGE` (no scaling would help). ``R`` on the host."""
    from mpqr.qr._kernels import in_safe_range, pow2_scale

    x, host = run.x, run.host
    prec_name = run.prec_name
    mx = run.reduce("column-max", _blocks.column_max_leaf, sum_parts, None)["colmax"]
    e = host.exponent(mx)
    single = prec_name == "fp32"
    if only_if_needed:
        if in_safe_range(host.xp, x, e, single=single):
            return None
        record_event("scale", f"qr (dask): a column's largest entry is outside 2^+-"
                     f"{SAFE_RANGE[single]}: {method} runs again on columns scaled by "
                     "powers of two", method=method)
    xs = x.map_blocks(_blocks.pow2, _delayed_small(-e), dtype=x.dtype, meta=x._meta,
                      token="mpqr-scale")
    q, r = _cholqr(run, xs, method, precision=run.precision, prec_name=prec_name,
                   want_q=want_q, quiet=True)
    return q, pow2_scale(host, r, host.xp.asarray(e))


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


def apply_factors(x: Any, rs: tuple[Any, ...], method: str, prec_name: str,
                  quiet: bool = False, r: Any = None) -> Any:
    """Lazy ``Q = A R1^-1 R2^-1 ...`` block by block (``x``'s chunks): one task per
    block, the factors inside each task (no key of their own, whose task would add a
    scheduler hop before the blocks' tasks). ``r``: the factors' product ``R`` as
    returned; where ``R^-1`` itself is well conditioned enough for a GEMM, the blocks
    take that one GEMM instead of one pass per factor."""
    if r is not None and len(rs) > 1:
        rs = _merged(rs, r, method)
    # keyed: each worker moves the factors to its device once for all its blocks
    return x.map_blocks(_blocks.bind(_blocks.apply_inverses), Small(rs, key=uuid.uuid4().hex),
                        method, prec_name, quiet, dtype=x.dtype, meta=x._meta,
                        token=f"mpqr-{method}-q")


def _merged(rs: tuple[Any, ...], r: Any, method: str) -> tuple[Any, ...]:
    """``((R, (R^-1, cond_1(R))),)`` where ``cond_1(R) <= INVERSE_COND_MAX`` (the in-core
    rule for a GEMM by the inverse), else ``rs`` unchanged."""
    from mpqr.qr import cholqr as c

    host = _blocks.host_backend()
    with host.ignore_fp_warnings():
        inv = c.inverse_and_cond(host, r)
    if not inv[1] <= c.INVERSE_COND_MAX:
        return rs
    record_event("apply-inverse", f"qr (dask): Q = A @ inv(R) by one GEMM per block for the "
                 f"{len(rs)} factors (cond_1(R) = {inv[1]:.3g} <= {c.INVERSE_COND_MAX:g})",
                 method=method, cond_1=inv[1], factors=len(rs))
    return ((r, inv),)


def _cholqr(run: _Run, x: Any, method: str, *, precision: Any, prec_name: str,
            want_q: bool, quiet: bool, first_gram: Any = None,
            applied: list[Any] | None = None, certify_first: Any = None,
            one_pass: bool = False) -> tuple[Any, Any]:
    """The CholQR passes across the blocks of ``x`` (``run.x`` or a lazy scaling of it);
    BreakdownError as in-core. Each pass is one graph and one gather: the second pass
    applies ``R_1^-1`` and forms its Gram matrix in the same block task. ``applied``:
    factors already applied before the first pass (then certified like a second pass
    against ``certify_first``). ``one_pass``: return the first pass's ``R`` where
    ``cond(x) <= R_ONE_PASS_COND`` (no ``Q``). ``R`` on the host."""
    from mpqr.qr import cholqr as c

    host = run.host
    factors: list[Any] = []
    applied = list(applied or [])  # (R, (R^-1, cond_1(R))) per pass, made once, sent out
    grouped = x is run.x
    nps = len(_PASSES[method])
    for i, shift in enumerate(_PASSES[method]):
        if i == 0 and first_gram is not None:
            g = first_gram
            record_event("gram-reuse", f"{method}: the first Gram matrix x^H x is the one the "
                         "caller already computed (one pass over x fewer)", method=method)
        else:
            g = run.gram(tuple(applied), method, precision, prec_name, quiet,
                         x=None if grouped else x)
        if i == nps - 1 and i > 0:
            certify = factors[-1]
        else:
            certify = certify_first if i == 0 else None
        with host.ignore_fp_warnings() if quiet else contextlib.nullcontext():
            _q, r, _sb = c._one_pass(host, x, precision, method, prec_name, shift=shift,
                                     certify=certify, want_q=False, g=g)
        factors.append(r)
        if one_pass and i == 0 and nps > 1 and _well_conditioned(host, g):
            record_event("certificate", f"qr (dask): mode='r' in one pass: cond(x) <= "
                         f"{R_ONE_PASS_COND:g} (eigenvalues of x^H x), so R = chol(x^H x)",
                         method="cholqr", passes=1)
            return None, r
        applied.append((r, c.inverse_and_cond(host, r)))
    like = host.xp.empty((0, 0), dtype=factors[0].dtype)
    r = c._final_r(host, host, factors[::-1], like, prec_name)
    record_event("certificate", f"qr (dask): {method} " + (
        "certified: the last pass's Gram matrix is within 1/2 of I"
        if len(factors) > 1 or certify_first is not None
        else "(one pass, no certificate)"), method=method, passes=len(factors))
    q = apply_factors(x, tuple(applied), method, prec_name, quiet, r=r) if want_q else None
    return q, r


def _well_conditioned(host: Any, g: Any) -> bool:
    """``cond(x) <= R_ONE_PASS_COND`` from the eigenvalues of ``g = x^H x`` (host)."""
    lam = host.xp.linalg.eigvalsh(g)
    lo, hi = float(lam[0]), float(lam[-1])
    return lo > 0 and hi <= R_ONE_PASS_COND**2 * lo


def _preconditioned(run: _Run, x: Any, leaf_method: str) -> tuple[Any, Any]:
    """``R_1`` by one TSQR pass (``leaf_method`` at its leaves), then one certified
    CholQR pass on ``x R_1^-1`` (whose condition number is ``1 + O(u cond(x))``): ``R =
    R_2 R_1`` and ``Q = x R_1^-1 R_2^-1`` lazily. BreakdownError if ``R_1`` is not finite
    or the certificate fails (numerically rank-deficient ``x``)."""
    from mpqr.qr import cholqr as c

    host = run.host
    r1 = run.tsqr_r(leaf_method)
    if not bool(host.all_finite(r1)):
        raise BreakdownError("the TSQR pass's R is not finite (x holds NaN or Inf)",
                             method="tsqr-cholqr", cond_estimate=float("inf"))
    if not bool(host.xp.all(host.xp.linalg.diagonal(r1) != 0)):
        # exactly rank-deficient x (a zero or repeated column): R_1 has no inverse
        raise BreakdownError("the TSQR pass's R has a zero diagonal entry (x is exactly "
                             "rank-deficient)", method="tsqr-cholqr",
                             cond_estimate=float("inf"))
    with host.ignore_fp_warnings():
        inv = c.inverse_and_cond(host, r1)
    _q, r2 = _cholqr(run, x, "cholqr", precision=run.precision, prec_name=run.prec_name,
                     want_q=False, quiet=True, applied=[(r1, inv)], certify_first=r1)
    like = host.xp.empty((0, 0), dtype=r1.dtype)
    r = c._final_r(host, host, [r2, r1], like, run.prec_name)
    with host.ignore_fp_warnings():
        applied = ((r1, inv), (r2, c.inverse_and_cond(host, r2)))
    return apply_factors(x, applied, "tsqr-cholqr", run.prec_name, True, r=r), r
