"""``mpqr.lstsq`` of a dask array chunked by rows: the in-core solver's routes
(:mod:`mpqr.lstsq.solver`) with every operation on ``A`` and ``b`` distributed.

The Gram route sums ``A_i^H A_i`` over the row blocks in a tree and decides on the
client exactly as in-core (:func:`mpqr.lstsq.gram.factor_from_gram`); the QR route is
:func:`mpqr.backends.dask.qr.factor` (CholQR2 across the blocks, starting from that Gram matrix,
or the TSQR tree); CGLS and iterative refinement are the in-core loops of
:mod:`mpqr.lstsq.refine` with their products ``A v`` (``map_blocks``, persisted) and
``A^H v`` (a tree sum of per-block products) and their norms over the blocks, so each
iteration reads ``A`` twice, as in-core. The small ``n x k`` quantities (``x``, the
search directions, ``R``) live on the client.
"""

from __future__ import annotations

from typing import Any

from mpqr.backends.dask import _blocks
from mpqr.backends.dask._validate import check_layout, require_dask
from mpqr.backends.dask.qr import SPLIT_EVERY, factor, gram_sum

from mpqr.lstsq import _scipy_rules as rules
from mpqr.lstsq.gram import GRAM_COND_MAX, GRAM_MIN_ASPECT, factor_from_gram
from mpqr.lstsq.refine import _Ops, cgls, iterative_refinement
from mpqr.lstsq.solver import RESOLUTION, Solver
from mpqr.policy import record_event
from mpqr.qr._kernels import ct

__all__ = ["DaskSolver", "lstsq"]


def lstsq(a: Any, b: Any, cond: float | None = None, overwrite_a: bool = False,
          overwrite_b: bool = False, check_finite: bool = True,
          lapack_driver: str | None = None, *, precision: str | None = None,
          refine: str | None = "auto", tol: float | None = None,
          maxiter: int | None = None) -> tuple[Any, Any, Any, Any]:
    """:func:`mpqr.lstsq` for a ``dask.array.Array`` ``a`` chunked by rows (see there).

    ``b`` may be a dask array (its rows are rechunked to ``a``'s) or an in-memory array
    of the blocks' library. ``a`` must be tall (``M >= N``). Returns ``x``,
    ``residues`` and ``s`` as one-chunk dask arrays (computed during the call: the
    route and the refinement depend on the data) and ``rank`` as an int.
    """
    from mpqr.backends import get_backend

    from mpqr._array_api import array_namespace
    from mpqr.lstsq.api import check_options, lstsq_2d

    da = require_dask()
    prec_name = check_options(refine, precision, tol, maxiter, cond)
    if a.ndim != 2:
        raise ValueError(f"Input array a should be 2D (a dask array chunked by rows), got "
                         f"ndim={a.ndim}")
    check_layout(a, "a")
    if not hasattr(b, "ndim") or not hasattr(b, "dtype"):
        raise TypeError(f"`b` must be an array (a dask array or one of the blocks' library), "
                        f"got {type(b).__module__}.{type(b).__qualname__}")
    if b.ndim not in (1, 2):
        raise ValueError(f"`b` must be 1-D or 2-D with as many rows as `a`, got ndim={b.ndim}")
    rules.check_shapes(a, b)
    for name, v in (("a", a), ("b", b)):
        if v.dtype.kind not in "biufc":
            raise TypeError(f"`{name}` must have a numeric dtype, got {v.dtype}")
    from mpqr.backends.dask._detect import is_dask_array

    if not is_dask_array(b):
        b = da.from_array(b, chunks=(a.chunks[0], *b.shape[1:]), asarray=False)
    if any(c != c for cs in b.chunks for c in cs):
        raise ValueError("`b` has unknown chunk sizes (NaN); call `b.compute_chunk_sizes()` "
                         "first")
    b = b.rechunk((a.chunks[0], *b.shape[1:]))
    xp = array_namespace(a._meta)
    backend = get_backend(xp)
    m, n = a.shape
    if m == 0 or n == 0:
        x, res, rank, s = rules.empty_result(xp, xp.empty((m, n), dtype=a.dtype), b.compute())
        return _wrap(da, x), _wrap(da, res), rank, _wrap(da, s)
    if m < n:
        raise ValueError(f"`a` must have at least as many rows as columns for a distributed "
                         f"least-squares solve (a tall matrix chunked by rows), got shape "
                         f"{a.shape}")
    if check_finite:
        fa, fb = da.compute(da.isfinite(a).all(), da.isfinite(b).all())
        for name, ok in (("a", fa), ("b", fb)):
            if not bool(ok):
                raise ValueError(f"array must not contain infs or NaNs (`{name}`)")
    wdt = rules.lapack_dtype(xp, a.dtype, b.dtype)
    aw = a if a.dtype == wdt else a.astype(wdt)
    bw = b if b.dtype == wdt else b.astype(wdt)
    x, res, rank, s = lstsq_2d(backend, aw, bw, cond, lapack_driver, prec_name, refine, tol,
                               maxiter, solver=DaskSolver)
    return _wrap(da, x), _wrap(da, res), rank, (None if s is None else _wrap(da, s))


def _wrap(da: Any, v: Any) -> Any:
    return da.from_array(v, chunks=v.shape, asarray=False)


def _delayed(v: Any) -> Any:
    import dask

    return dask.delayed(v, pure=True)


def tree_sum_qh(q: Any, b: Any, precision: str, label: str, split_every: int) -> Any:
    """Lazy ``q^H b`` (``n x k``) of two arrays with the same row chunks: one product per
    block pair on its worker, the partial products summed in a tree."""
    import dask.array as da

    n, k = q.shape[1], b.shape[1]
    parts = da.map_blocks(_blocks.bind(_blocks.qh_times), q, b, precision, label,
                          chunks=((1,) * len(q.chunks[0]), (n,), (k,)), new_axis=[2],
                          dtype=q.dtype, meta=q._meta.reshape((0, 0, 0)),
                          token=f"mpqr-{label}")
    return parts.sum(axis=0, split_every=split_every)


def column_sq(v: Any, split_every: int) -> Any:
    """Lazy squared column norms (real) of a row-chunked ``v``."""
    import dask.array as da

    k = v.shape[1]
    real = v.real.dtype
    parts = da.map_blocks(_blocks.column_sq, v, chunks=((1,) * len(v.chunks[0]), (k,)),
                          dtype=real, meta=v._meta.real.reshape((0, 0)),
                          token="mpqr-column-sq")
    return parts.sum(axis=0, split_every=split_every)


def times(a: Any, v: Any, precision: str, label: str) -> Any:
    """Lazy ``a @ v`` for a row-chunked ``a`` and a small ``v`` (sent to every block)."""
    return a.map_blocks(_blocks.bind(_blocks.times), _delayed(v), precision, label,
                        chunks=(a.chunks[0], (v.shape[1],)), dtype=a.dtype, meta=a._meta,
                        token="mpqr-Av")


class DaskOps(_Ops):
    """The refinement's operations with a row-chunked ``A``: ``A v`` by ``map_blocks``
    (persisted: it is used twice), ``A^H v`` and the norms over the blocks in a tree."""

    def __init__(self, backend: Any, a: Any, r: Any, wprec: str, label: str,
                 split_every: int):
        self.backend, self.a, self.wprec, self.label = backend, a, wprec, label
        self.split_every = split_every
        xp = backend.xp
        self.r = r
        self.rh = xp.asarray(ct(xp, r), copy=True)

    def av(self, v: Any, what: str) -> Any:
        return times(self.a, v, self.wprec, f"{self.label}:{what}-Av").persist()

    def ahv(self, v: Any, what: str) -> Any:
        return tree_sum_qh(self.a, v, self.wprec, f"{self.label}:{what}-AHv",
                           self.split_every).compute()

    def norms(self, v: Any) -> Any:
        return self.backend.xp.sqrt(column_sq(v, self.split_every).compute())

    def axpy(self, v: Any, alpha: Any, w: Any) -> Any:
        return v.map_blocks(_blocks.axpy, w, _delayed(alpha), dtype=v.dtype, meta=v._meta,
                            token="mpqr-axpy").persist()

    def sub(self, v: Any, w: Any) -> Any:
        return (v - w).persist()


class DaskSolver(Solver):
    """:class:`mpqr.lstsq.solver.Solver` with a row-chunked dask ``a`` and ``b``; the
    small quantities live on the client in the blocks' library."""

    qrcp_gelsy = False  # no pivoted QR of a distributed matrix: gelsy's rank from the SVD

    split_every = SPLIT_EVERY

    def __init__(self, backend: Any, a: Any, b: Any, *args: Any, **kw: Any):
        super().__init__(backend, a, b, *args, **kw)
        record_event("method", f"lstsq (dask): {a.shape} in {len(a.chunks[0])} row blocks; "
                     "every product with A runs on the blocks' workers, sums over the blocks "
                     f"in trees (split_every={self.split_every}), the n x n steps and the "
                     "small vectors on the client", route="dask", blocks=len(a.chunks[0]),
                     shape=a.shape)

    def _like(self) -> Any:
        return self.xp.empty((0, 0), dtype=self.a.dtype)

    def _factor(self, prec: str, mode: str) -> Any:
        q, r = factor(self.f, want_q=mode != "r", precision=prec, as_dask=False,
                      split_every=self.split_every)
        return r if mode == "r" else (q, r)

    def _gram_route(self) -> Any:
        import math

        from mpqr.backends import get_backend
        from mpqr.backends.dask.qr import _namespace

        mf, nf = self.f.shape
        if self.u_f > self.u or mf < GRAM_MIN_ASPECT * nf:
            return None
        res = RESOLUTION * math.sqrt(nf) * self.u * GRAM_COND_MAX / 2
        prec = self._gram_precision()
        with self.backend.ignore_fp_warnings():  # an over- or underflowing G is declined
            g = gram_sum(self.f, (), "lstsq", prec, prec, True, self.split_every).compute()
        gb = get_backend(_namespace(g))
        sb, g = gb.small(g)
        return factor_from_gram(self.backend, sb, g, (mf, nf), self._like(), precision=prec,
                                need_s=self.need_s, cutoff=self.cond, resolution=res)

    def _b_finite(self) -> bool:
        import dask.array as da

        return bool(da.isfinite(self.b).all().compute())

    def _max_abs_b(self) -> float:
        return float(abs(self.b).max().compute())

    def _qh_b(self, q: Any) -> Any:
        return tree_sum_qh(q, self.b, self.wprec, "lstsq:QHb", self.split_every).compute()

    def _column_sq(self, v: Any) -> Any:
        return column_sq(v, self.split_every).compute()

    def _resid_sq(self, x: Any) -> Any:
        return self._column_sq(self.b - times(self.a, x, self.wprec, "lstsq:residual-Ax"))

    def _pow2(self, x: Any, e: int) -> Any:
        from mpqr.backends.dask._detect import is_dask_array

        if not is_dask_array(x):
            return super()._pow2(x, e)
        return x.map_blocks(_blocks.pow2, e, dtype=x.dtype, meta=x._meta, token="mpqr-pow2")

    def _refiner(self, method: str) -> Any:
        run = iterative_refinement if method == "ir" else cgls

        def distributed(backend: Any, a: Any, b: Any, r: Any, **kw: Any) -> Any:
            ops = DaskOps(backend, a, r, kw["wprec"], "lstsq", self.split_every)
            return run(backend, a, b, r, ops=ops, **kw)

        return distributed
