"""``geqrf-wy``: the library's ``geqrf`` per member of a stack, Q of the whole stack from
its reflectors by batched products.

For stacks whose members are too large for one thread block, the library's QR per member
(cuSOLVER's ``geqrf`` then ``orgqr``) spends about half its time in ``orgqr``, a chain of
latency-bound launches per member that also waits on the host. Here only ``geqrf`` runs
per member (:meth:`~mpqr.backends._base.ArrayAPIBackend.library_raw_stack`); Q of every
member is then formed at once from the compact WY form of its reflectors (UT transform,
Joffrain et al. 2006):

    ``H_1 ... H_n = I - Y T Y^H``,  ``T^-1 = diag(1/tau) + striu(Y^H Y)``,

so ``Q = I - Y W`` with ``W = (I + diag(tau) striu(Y^H Y))^-1 diag(tau) Y^H[:, :cols]``:
one batched product ``Y^H Y``, one batched unit upper-triangular solve and one batched
product ``Y W`` (both products through the precision policy, at the working precision).
``tau_i = 0`` (``H_i = I``) needs no special case: row and column ``i`` of ``T`` vanish.
The result is LAPACK's Q (the same reflectors), orthogonal to working precision; row
``j`` of R and column ``j`` of Q take the sign that makes ``diag(R) >= 0``.
"""

from __future__ import annotations

from typing import Any

from mpqr._array_api import device
from mpqr.policy import gemm
from mpqr.qr._kernels import is_complex, panel_precision

__all__ = ["geqrf_wy", "q_from_reflectors"]


def geqrf_wy(backend: Any, a: Any, *, precision: Any, prec_name: str, want_q: bool,
             complete: bool, overwrite: bool = False) -> tuple[Any | None, Any]:
    """``(Q or None, R)`` of a stack ``(..., m, n)``, ``m >= n``, ``diag(R) >= 0``.

    Parameters
    ----------
    backend : ArrayAPIBackend
    a : array
        ``(..., m, n)``; not modified.
    precision, prec_name : str
        The policy's precision (the two products run at the panel precision of
        ``prec_name``, the input's own for the working precisions).
    want_q, complete : bool
        Q wanted; complete ``(m x m)`` rather than reduced ``(m x n)``.
    overwrite : bool
        Unused (the library works on its own copy).

    Returns
    -------
    q : array or None
        ``(..., m, n)`` or ``(..., m, m)``.
    r : array
        ``(..., n, n)`` upper triangular, ``diag(r) >= 0``.

    Examples
    --------
    >>> import numpy as np
    >>> from mpqr.backends import get_backend
    >>> a = np.random.default_rng(0).standard_normal((3, 40, 30))
    >>> q, r = geqrf_wy(get_backend(np), a, precision="fp64", prec_name="fp64",
    ...                 want_q=True, complete=False)
    >>> bool(np.allclose(q @ r, a)) and bool(np.all(np.diagonal(r, axis1=1, axis2=2) >= 0))
    True
    """
    xp = backend.xp
    n = a.shape[-1]
    raw = backend.library_raw_stack(a)
    if raw is None:  # the backend's library has no raw stack: its QR per member
        q, r = backend.library_qr(a, "complete" if complete else ("reduced" if want_q
                                                                    else "r"))
        from mpqr.qr._kernels import normalize_signs

        return normalize_signs(xp, q, r[..., :n, :], check=False)
    h, tau = raw
    d = xp.linalg.diagonal(h[..., :, :n])
    if is_complex(xp, h):
        from mpqr.backends._base import phase

        s = phase(xp, d)
        r = xp.triu(xp.matrix_transpose(h[..., :, :n])) * xp.expand_dims(xp.conj(s), axis=-1)
        r = r - xp.eye(n, dtype=r.dtype, device=device(r)) * xp.expand_dims(
            xp.linalg.diagonal(r) - xp.astype(xp.abs(d), r.dtype), axis=-1)
    else:
        s = xp.where(d < 0, -xp.ones_like(d), xp.ones_like(d))
        r = xp.triu(xp.matrix_transpose(h[..., :, :n])) * xp.expand_dims(s, axis=-1)
    if not want_q:
        return None, r
    prec = panel_precision(prec_name, a.dtype, xp)
    q = q_from_reflectors(backend, h, tau, complete=complete, precision=prec)
    n_cols = q.shape[-1]
    if n_cols > n:
        q[..., :, :n] = q[..., :, :n] * xp.expand_dims(s, axis=-2)
    else:
        q = q * xp.expand_dims(s, axis=-2)
    return q, r


def q_from_reflectors(backend: Any, h: Any, tau: Any, *, complete: bool, precision: Any
                      ) -> Any:
    """Q (``(..., m, n)``, or ``(..., m, m)`` if ``complete``) of ``geqrf``'s reflectors.

    ``h`` ``(..., n, m)`` and ``tau`` ``(..., n)`` as ``numpy.linalg.qr(a, mode="raw")``
    gives them (row ``i`` of ``h`` holds reflector ``i`` below its unit entry); neither is
    modified. Two batched products through :func:`mpqr.policy.gemm` at ``precision``
    and one batched unit upper-triangular solve.
    """
    xp = backend.xp
    *_, n, m = h.shape
    dev = device(h)
    cols = m if complete else n
    yh = xp.triu(h, k=1) + xp.eye(n, m, dtype=h.dtype, device=dev)  # Y^T: reflectors as rows
    cplx = is_complex(xp, h)
    y = xp.matrix_transpose(yh)
    if cplx:
        yh = xp.conj(yh)
    g = gemm(yh, y, precision=precision, label="geqrf-wy-gram", backend=backend)
    tau = xp.astype(tau, h.dtype)
    lhs = xp.eye(n, dtype=h.dtype, device=dev) + xp.expand_dims(tau, axis=-1) * xp.triu(g, k=1)
    w = backend.solve_triangular(lhs, xp.expand_dims(tau, axis=-1) * yh[..., :, :cols],
                                 lower=False, unit_diagonal=True)
    q = gemm(y, w, precision=precision, label="geqrf-wy-q", backend=backend)
    return xp.eye(m, cols, dtype=h.dtype, device=dev) - q
