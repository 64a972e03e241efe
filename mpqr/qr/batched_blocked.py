"""``householder-batched-blocked``: QR of stacks whose members are too wide for one
thread block but short enough that their panels fit one.

Every ``BLOCK``-column panel step runs on the whole stack at once: the panel of every
member (``(m - j) x BLOCK``) is factored by ``householder-batched`` (CuPy: one fused
launch for the stack) with its complete orthogonal factor ``Q_j`` (``(m - j) x (m - j)``,
``diag(R) >= 0``), the trailing columns of every member are updated by one batched
product ``Q_j^H C`` and Q is accumulated by one more, ``Q[:, j:] = Q[:, j:] Q_j``; both
products through the precision policy (at the working precision). With ``m <= 256``
rows these explicit products cost less than the launches of a WY update and every
step is one launch per kind for the whole stack, where the library's QR makes a chain
of calls per member.

The product of the panels' factors is ``Q``; ``R`` collects each panel's ``R`` and the
updated rows beside it. Each ``Q_j`` is orthogonal to working precision, so the result
is backward stable like Householder QR; its signs give ``diag(R) >= 0``.
"""

from __future__ import annotations

from typing import Any

from mpqr._array_api import ct, device
from mpqr.policy import gemm
from mpqr.qr._kernels import eye_like, panel_precision
from mpqr.qr.batched_small import householder_batched

__all__ = ["BLOCK", "fits", "householder_batched_blocked", "qr_apply_blocked"]

#: panel width (columns) of every step
BLOCK = 32


def fits(backend: Any, dtype: Any, m: int, n: int) -> bool:
    """Whether stacks of ``m x n`` (``m >= n``) take this route: every panel (at most
    ``m x BLOCK``) fits :meth:`~mpqr.backends._base.ArrayAPIBackend.batched_qr_fits`."""
    return m >= n > BLOCK and backend.batched_qr_fits(dtype, m, BLOCK)


def householder_batched_blocked(backend: Any, a: Any, *, precision: Any, prec_name: str,
                                want_q: bool, complete: bool, overwrite: bool = False
                                ) -> tuple[Any | None, Any]:
    """``(Q or None, R)`` of a real stack ``(..., m, n)``, ``m >= n``, ``diag(R) >= 0``.

    Parameters
    ----------
    backend : ArrayAPIBackend
    a : array
        ``(..., m, n)``, float32 or float64, :func:`fits`; not modified.
    precision, prec_name : str
        The policy's precision (products run at the panel precision of ``prec_name``).
    want_q, complete : bool
        Q wanted; complete ``(m x m)`` rather than reduced ``(m x n)``.
    overwrite : bool
        Unused (the stack is copied once).

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
    >>> a = np.random.default_rng(0).standard_normal((3, 50, 40))
    >>> q, r = householder_batched_blocked(get_backend(np), a, precision="fp64",
    ...                                    prec_name="fp64", want_q=True, complete=False)
    >>> bool(np.allclose(q @ r, a)) and bool(np.all(np.diagonal(r, axis1=1, axis2=2) >= 0))
    True
    """
    q, r, _ = _blocked(backend, a, None, prec_name, want_q)
    if q is None:
        return None, r
    return (q if complete else q[..., :, :a.shape[-1]]), r


def qr_apply_blocked(backend: Any, a: Any, b: Any, *, prec_name: str) -> tuple[Any, Any]:
    """``(R, Q^H b)`` of a stack as :func:`householder_batched_blocked` factors it
    (``a``: ``(..., m, n)``, ``b``: ``(..., m, k)``; ``Q`` complete); neither modified."""
    _, r, c = _blocked(backend, a, b, prec_name, False)
    return r, c


def _blocked(backend, a, b, prec_name, want_q):
    xp = backend.xp
    *batch, m, n = a.shape
    prec = panel_precision(prec_name, a.dtype, xp)
    w = xp.asarray(a, copy=True)
    c = None if b is None else xp.asarray(b, copy=True)
    q = eye_like(xp, tuple(batch), m, m, a.dtype, device(a)) if want_q else None
    for j0 in range(0, n, BLOCK):
        j1 = min(n, j0 + BLOCK)
        qj, rj = householder_batched(backend, w[..., j0:, j0:j1], precision=prec,
                                     prec_name=prec_name, want_q=True, complete=True)
        w[..., j0:, j0:j1] = xp.zeros_like(w[..., j0:, j0:j1])
        w[..., j0:j1, j0:j1] = rj
        if j1 < n:  # the trailing columns of every member: one batched product
            w[..., j0:, j1:] = gemm(ct(xp, qj), w[..., j0:, j1:],
                                    precision=prec, label="batched-blocked-update",
                                    backend=backend)
        if q is not None:
            q[..., :, j0:] = gemm(q[..., :, j0:], qj, precision=prec,
                                  label="batched-blocked-q", backend=backend)
        if c is not None:
            c[..., j0:, :] = gemm(ct(xp, qj), c[..., j0:, :], precision=prec,
                                  label="batched-blocked-apply", backend=backend)
    return q, w[..., :n, :], c
