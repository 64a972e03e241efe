"""Least squares of a stack of small problems in one pass: ``householder-batched``'s
``(R, Q^H b)`` for the whole stack, the singular values of every R, one batched
triangular solve.

Taken by :func:`mpqr.lstsq` (while :data:`STACK_ROUTE`) for a stack whose members fit
the fused kernel's limits (:meth:`~mpqr.backends._base.ArrayAPIBackend.batched_qr_fits`)
or, on a backend with the kernel, whose 32-column panels do
(``householder-batched-blocked``, up to 256 rows), in their own, at least as accurate
precision, with ``refine`` ``"auto"`` or None and no ``tol``/``maxiter``. Without the
kernel (the portable steps, one pass a column) members up to :data:`PORTABLE_MAX_N`
columns take it, where it beats the per-problem loop. The outputs are those of the per-problem
loop (SciPy's batch rules): ``x`` ``(*batch, N[, K])``, ``residues`` ``(*batch[, K])``
where ``M > N``, else ``(*batch, 0)``, ``rank`` an int64 array, ``s`` ``(*batch, N)``
(None for ``gelsy``). Where some member's R is not safely solvable (rank below ``N`` by
the cutoff, or its smallest singular value within the factorization's rounding of it:
:func:`mpqr.lstsq.solver.solvable`), or anything is not finite, the whole stack goes
back to the loop, which treats such members as one problem each.
"""

from __future__ import annotations

import math
from typing import Any

from mpqr._array_api import device
from mpqr.lstsq import _scipy_rules as rules
from mpqr.lstsq.solver import RESOLUTION
from mpqr.policy import record_event
from mpqr.qr.batched_blocked import fits as blocked_fits
from mpqr.qr.batched_blocked import qr_apply_blocked
from mpqr.qr.batched_small import qr_apply
from mpqr.qr.choice import _covers_precision

__all__ = ["PORTABLE_MAX_N", "STACK_ROUTE", "lstsq_stack"]

#: whether stacks take this route (False: always the per-problem loop)
STACK_ROUTE = True
#: widest members that take the route without a fused kernel: 2-core host, float64,
#: portable steps against the per-problem loop: 200 x (20 x 8) 10 against 385 ms,
#: 100 x (64 x 32) 58 against 233 ms, 100 x (128 x 128) 1125 against 670 ms
PORTABLE_MAX_N = 32


def lstsq_stack(backend: Any, a: Any, b: Any, cond: Any, driver: Any, prec_name: str,
                refine: Any, tol: Any, maxiter: Any) -> tuple[Any, Any, Any, Any] | None:
    """``(x, residues, rank, s)`` of every problem of a stack, or None where the stack
    does not take this route (the caller loops over its problems then).

    Parameters
    ----------
    backend : ArrayAPIBackend
    a : array
        ``(*batch_a, M, N)``, validated as :func:`mpqr.lstsq` does; not modified.
    b : array
        ``(*batch_b, M)`` or ``(*batch_b, M, K)`` (SciPy's batch rules); not modified.
    cond, driver, prec_name, refine, tol, maxiter
        As :func:`mpqr.lstsq` received them (``prec_name`` resolved).

    Returns
    -------
    tuple or None
        SciPy's four outputs stacked over the broadcast batch shape, or None.

    Examples
    --------
    >>> import numpy as np
    >>> from mpqr.backends import get_backend
    >>> rng = np.random.default_rng(0)
    >>> a, b = rng.standard_normal((4, 6, 3)), rng.standard_normal(6)
    >>> x, res, rank, s = lstsq_stack(get_backend(np), a, b, None, None, "auto", "auto",
    ...                               None, None)
    >>> x.shape, res.shape, rank
    ((4, 3), (4,), array([3, 3, 3, 3]))
    """
    xp = backend.xp
    if not STACK_ROUTE or refine not in ("auto", None) or tol is not None \
            or maxiter is not None:
        return None
    b_core = 2 if b.ndim >= 2 else 1
    if a.ndim < 3 and b.ndim <= b_core:
        return None  # one problem
    dtype = a.dtype
    if dtype not in (xp.float32, xp.float64) or b.dtype != dtype:
        return None
    m, n = a.shape[-2:]
    blocked = not backend.batched_qr_fits(dtype, m, n)
    if not backend.batched_qr_fused and (blocked or n > PORTABLE_MAX_N):
        return None  # the portable steps: one pass a column, slower than the loop here
    if b.shape[-b_core] != m or (b_core == 2 and b.shape[-1] == 0) or not (m >= n >= 1) \
            or (blocked and not blocked_fits(backend, dtype, m, n)) \
            or not _covers_precision(backend, prec_name, dtype):
        return None
    try:
        batch = rules._broadcast_shapes(tuple(a.shape[:-2]), tuple(b.shape[:-b_core]))
    except ValueError:
        return None  # the loop raises SciPy's message
    if math.prod(batch) == 0:
        return None
    driver = rules.check_driver(driver)
    vec = b_core == 1
    aw = xp.broadcast_to(a, (*batch, m, n))
    bw = xp.broadcast_to(b[..., None] if vec else b, (*batch, m, 1 if vec else b.shape[-1]))
    eps = float(xp.finfo(dtype).eps)
    cut = rules.cutoff(cond, driver, eps, single=dtype == xp.float32)
    r, c = (qr_apply_blocked if blocked else qr_apply)(backend, aw, bw, prec_name=prec_name)
    if not bool(xp.all(xp.isfinite(r))):
        return None  # NaN or Inf (check_finite=False): the loop reports it
    s = backend.svdvals(r)
    s1, sn = s[..., 0], s[..., -1]
    # every member full rank by the cutoff and safely solvable (solver.solvable): one
    # host sync for the whole stack
    margin = (cut + RESOLUTION * math.sqrt(n) * eps / 2) * s1
    if not bool(xp.all((s1 > 0) & (sn > margin))):
        return None
    how = "householder-batched-blocked" if blocked else "householder-batched"
    record_event("method", f"lstsq: a stack of {math.prod(batch)} problems of {m}x{n} "
                 f"through {how} (R and Q^H b of every member at once) and one batched "
                 "triangular solve", path="batched", method=how)
    x = backend.solve_triangular(r, c[..., :n, :])
    if m > n and driver != "gelsy":
        res = xp.sum(c[..., n:, :] * c[..., n:, :], axis=-2)
        res = res[..., 0] if vec else res
    else:
        res = xp.empty((*batch, 0), dtype=dtype, device=device(x))
    if vec:
        x = x[..., 0]
    rank = xp.full(batch, n, dtype=xp.int64, device=device(x))
    return x, res, rank, (None if driver == "gelsy" else s)

