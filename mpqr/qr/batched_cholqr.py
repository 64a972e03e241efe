"""``cholqr2-batched``: CholQR2 of every member of a stack at once, certified per member.

For stacks of tall members too large for one thread block, the library's QR runs per
member (cuSOLVER's ``geqrf``: a chain of latency-bound panel launches each). CholQR2
does the same work as a handful of batched calls for the whole stack, whatever its size:
per pass one batched Gram product, one batched Cholesky, one batched triangular solve
of ``n x n`` (``R^-1``) and one batched product ``Q = A R^-1`` (both products through
the precision policy at the working precision).

Certification is per member and read back in two host syncs: after the first Cholesky
(every member factored, and the worst ``cond_1(R_1)``: where it is at most
:data:`~mpqr.qr.cholqr.INVERSE_COND_MAX` the first ``A R_1^-1`` is a product with the
inverse, else a substitution) and after the second Gram matrix (every member's
``||Q_1^H Q_1 - I||_F <= 1/2``, which makes its ``Q`` orthonormal to working accuracy,
as the single-matrix CholQR2 certifies it). Where any member fails, the pass raises
:class:`~mpqr.BreakdownError` and ``qr(method="auto")`` factors the stack with
``geqrf-wy`` instead (recorded in the explain trace).
"""

from __future__ import annotations

import math
from typing import Any

from mpqr._array_api import device
from mpqr._errors import BreakdownError, LinAlgError
from mpqr.policy import gemm
from mpqr.qr._kernels import ct, panel_precision
from mpqr.qr.cholqr import INVERSE_COND_MAX, SCALE_FREE, column_scales
from mpqr.qr.gram_blocked import gram

__all__ = ["cholqr2_batched", "supports"]


def supports(backend: Any, a: Any) -> bool:
    """A real float32/float64 stack ``(..., m, n)`` with ``m >= n > 0``."""
    xp = backend.xp
    return (a.ndim > 2 and a.dtype in (xp.float32, xp.float64)
            and a.shape[-2] >= a.shape[-1] > 0)


def _chol(backend: Any, g: Any) -> tuple[Any, Any]:
    """``(R, ok)``: upper Cholesky factors of every member of ``g`` and, per member,
    whether it factored (R's squared column norms reproduce ``diag(g)``: cuSOLVER stops
    at a failed column and says so only through its ``info``). ``R`` None where the
    library raised."""
    xp = backend.xp
    try:
        r = backend.cholesky(g, upper=True, check=False)
    except LinAlgError:
        return None, None
    d = xp.real(xp.linalg.diagonal(g))
    cn = xp.sum(xp.real(r * xp.conj(r)), axis=-2)
    scale = xp.max(xp.abs(d), axis=-1, keepdims=True)
    ok = xp.all(xp.isfinite(cn) & (xp.abs(cn - d) <= 1e-3 * scale), axis=-1)
    return r, ok


def _cond1(xp: Any, r: Any, x: Any, scaled: bool) -> Any:
    """``cond_1(R) = ||R||_1 ||R^-1||_1`` per member (``x = R^-1``), or that of ``R D^-1``
    (:func:`~mpqr.qr.cholqr.column_scales`) where ``scaled`` and it is smaller."""
    k = xp.max(xp.sum(xp.abs(r), axis=-2), axis=-1) * xp.max(xp.sum(xp.abs(x), axis=-2),
                                                             axis=-1)
    if scaled:
        d = xp.astype(column_scales(xp, r), r.dtype)
        ks = (xp.max(xp.sum(xp.abs(r / xp.expand_dims(d, axis=-2)), axis=-2), axis=-1)
              * xp.max(xp.sum(xp.abs(x * xp.expand_dims(d, axis=-1)), axis=-2), axis=-1))
        k = xp.minimum(k, ks)
    return k


def _breakdown(why: str, cond: float) -> BreakdownError:
    return BreakdownError(
        f"cholqr2-batched broke down: {why}; use method='geqrf-wy', 'geqrf' or 'auto'",
        method="cholqr2-batched", cond_estimate=cond)


def cholqr2_batched(backend: Any, a: Any, *, precision: Any, prec_name: str,
                    want_q: bool = True, **_: Any) -> tuple[Any | None, Any]:
    """CholQR2 of every member of a stack ``(..., m, n)`` (or of one matrix), ``m >= n``;
    ``(Q, R)`` with thin ``Q`` (None where not ``want_q``) and ``diag(R) > 0``.

    Parameters
    ----------
    backend : ArrayAPIBackend
    a : array
        ``(..., m, n)``, real or complex (``auto`` takes it for the real stacks of
        :func:`supports`); not modified.
    precision, prec_name : str
        The policy's precision; the Gram products run at it, the other products at
        the panel precision of ``prec_name`` (the input's own for the working ones).
    want_q : bool
        Form ``Q`` (else only ``R``, the last product skipped).

    Returns
    -------
    q : array or None
        ``(..., m, n)``, orthonormal columns per member.
    r : array
        ``(..., n, n)`` upper triangular with a positive diagonal.

    Raises
    ------
    BreakdownError
        Where a member's Gram matrix is not numerically positive definite or its second
        Gram matrix is farther than 1/2 from ``I`` (``cond`` beyond ~``u^-1/2``), or a
        member holds NaN/Inf.

    Examples
    --------
    >>> import numpy as np
    >>> from mpqr.backends import get_backend
    >>> a = np.random.default_rng(0).standard_normal((3, 64, 16))
    >>> q, r = cholqr2_batched(get_backend(np), a, precision="fp64", prec_name="fp64")
    >>> bool(np.allclose(q @ r, a)) and bool(np.allclose(q.transpose(0, 2, 1) @ q,
    ...                                                    np.eye(16)))
    True
    """
    xp = backend.xp
    n = a.shape[-1]
    prec = panel_precision(prec_name, a.dtype, xp)
    g1 = gram(backend, a, precision, "cholqr2-batched-gram")
    r1, ok1 = _chol(backend, g1)
    if r1 is None:
        raise _breakdown("a member's Gram matrix is not positive definite", math.inf)
    x1 = backend.triangular_inverse(r1)
    kappa = _cond1(xp, r1, x1, prec_name in SCALE_FREE)
    worst = xp.where(ok1, kappa, xp.full_like(kappa, math.inf))
    k1 = float(xp.max(worst))  # the first host sync: every member factored, cond_1(R_1)
    if not math.isfinite(k1):
        raise _breakdown("a member's Gram matrix is not numerically positive definite "
                         "(or it holds NaN/Inf)", math.inf)
    if k1 <= INVERSE_COND_MAX:
        q1 = gemm(a, x1, precision=prec, label="cholqr2-batched-apply-inverse",
                  backend=backend)
    else:  # Q1 R1 = A by substitution: R1^H Q1^H = A^H
        q1 = ct(xp, backend.solve_triangular(ct(xp, r1), ct(xp, a), lower=True))
    g2 = gram(backend, q1, precision, "cholqr2-batched-gram")
    eye = xp.eye(n, dtype=g2.dtype, device=device(g2))
    dist = xp.linalg.matrix_norm(g2 - eye, ord="fro")
    r2, ok2 = _chol(backend, g2)
    if r2 is None:
        raise _breakdown("a member's second Gram matrix is not positive definite", k1)
    q = None
    if want_q:  # queued before the certificate is read: cond_2(R_2) <= sqrt(3) if it holds
        x2 = backend.triangular_inverse(r2)
        q = gemm(q1, x2, precision=prec, label="cholqr2-batched-apply-inverse",
                 backend=backend)
    bad = xp.where(ok2, dist, xp.full_like(dist, math.inf))
    d2 = float(xp.max(bad))  # the second host sync: the certificate of every member
    if not d2 <= 0.5:
        raise _breakdown(f"after the first pass a member's ||Q1^H Q1 - I||_F = {d2:.2e} > "
                         "0.5, so its Q would not be orthonormal to working accuracy "
                         f"(cond_1(R_1) <= {k1:.2e})", max(k1, 1 / math.sqrt(
                             2.0 ** -24 if a.dtype == xp.float32 else 2.0 ** -53)))
    r = xp.triu(gemm(r2, r1, precision=prec, label="cholqr2-batched-RR", backend=backend))
    return q, r
