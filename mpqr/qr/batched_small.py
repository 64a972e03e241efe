"""``householder-batched``: QR of stacks of small matrices, all of a matrix's steps at once.

A stack of small square or near-square matrices (each fitting one GPU thread block's
registers and shared memory, :meth:`~mpqr.backends._base.ArrayAPIBackend.batched_qr_fits`)
is factored by unblocked Householder QR in LAPACK's order (``geqrf``'s reflectors, then
``orgqr``'s backward accumulation of Q, or ``ormqr``'s forward application for
``Q^H b``), every step applied to the whole stack at once. Where the backend has a fused
kernel (:meth:`~mpqr.backends._base.ArrayAPIBackend.batched_qr`, CuPy: one block per
matrix, one launch for the stack) it runs that; elsewhere :func:`householder_batched_steps`
runs the same steps with array operations over the stack, which is what CI checks.

Signs: the reflectors follow LAPACK (``beta = -sign(alpha) ||x||``); row ``j`` of R and
column ``j`` of Q (row ``j`` of ``Q^H b``) are then multiplied by ``s_j = -1`` where
``R_jj < 0``, so ``diag(R) >= 0``, the public convention of :func:`mpqr.qr`.
"""

from __future__ import annotations

from typing import Any

from mpqr._array_api import device
from mpqr.policy import gemm
from mpqr.qr._kernels import eye_like, is_complex, panel_precision

__all__ = ["householder_batched", "householder_batched_steps", "qr_apply"]

#: sums of squares outside these bounds may have under- or overflowed: the column is
#: rescaled by its largest entry first (the kernel's rule)
_SUMSQ_RANGE = {"float32": (2.0**-100, 2.0**100), "float64": (2.0**-900, 2.0**900)}


def _mode(want_q: bool, complete: bool) -> str:
    return "complete" if complete else ("reduced" if want_q else "r")


def householder_batched(backend: Any, a: Any, *, precision: Any, prec_name: str,
                        want_q: bool, complete: bool, overwrite: bool = False
                        ) -> tuple[Any | None, Any]:
    """``(Q or None, R)`` of a stack ``(..., m, n)``, ``m >= n``, ``diag(R) >= 0``.

    The backend's fused kernel where it takes ``a``, else
    :func:`householder_batched_steps` (products at the working precision).
    """
    mode = _mode(want_q, complete)
    out = backend.batched_qr(a, mode)
    if out is not None:
        return out
    return householder_batched_steps(backend, a, mode,
                                     precision=panel_precision(prec_name, a.dtype, backend.xp))


def qr_apply(backend: Any, a: Any, b: Any, *, prec_name: str) -> tuple[Any, Any]:
    """``(R, Q^H b)`` of a stack (``a``: ``(..., m, n)``, ``m >= n``; ``b``:
    ``(..., m, k)``), ``diag(R) >= 0``, ``Q`` the complete orthogonal factor."""
    out = backend.batched_qr_apply(a, b)
    if out is not None:
        return out
    _, r, c = _steps(backend, a, "r", b,
                     precision=panel_precision(prec_name, a.dtype, backend.xp))
    return r, c


def householder_batched_steps(backend: Any, a: Any, mode: str, *, precision: Any
                              ) -> tuple[Any | None, Any]:
    """The scheme of the fused kernel in array operations over the stack.

    Parameters
    ----------
    backend : ArrayAPIBackend
    a : array
        ``(..., m, n)`` with ``m >= n``; not modified.
    mode : {"reduced", "complete", "r"}
    precision : str
        Precision of the two products per step (:func:`mpqr.policy.gemm`).

    Returns
    -------
    q : array or None
        ``(..., m, n)``, ``(..., m, m)`` or None.
    r : array
        ``(..., n, n)``, upper triangular, ``diag(r) >= 0``.

    Examples
    --------
    >>> import numpy as np
    >>> from mpqr.backends import get_backend
    >>> a = np.random.default_rng(0).standard_normal((5, 6, 4))
    >>> q, r = householder_batched_steps(get_backend(np), a, "reduced", precision="fp64")
    >>> bool(np.allclose(q @ r, a))
    True
    """
    q, r, _ = _steps(backend, a, mode, None, precision=precision)
    return q, r


def _steps(backend: Any, a: Any, mode: str, b: Any, *, precision: Any):
    xp = backend.xp
    *batch, m, n = a.shape
    dev = device(a)
    cplx = is_complex(xp, a)
    w = xp.asarray(a, copy=True)
    taus = []
    lo, hi = _SUMSQ_RANGE["float32" if a.dtype in (xp.float32, xp.complex64) else "float64"]
    zero = xp.zeros((), dtype=a.dtype, device=dev)
    for j in range(n):
        alpha = w[..., j, j]
        x = w[..., j + 1:, j]
        ax = xp.abs(x) if cplx else x
        ss = xp.sum(ax * ax, axis=-1)
        with backend.ignore_fp_warnings():
            xnorm = xp.sqrt(ss)
            risky = (ss < lo) | (ss > hi)
            if bool(xp.any(risky)):  # as the kernel: rescale by the largest entry
                amax = xp.max(xp.abs(x), axis=-1) if m > j + 1 else xp.zeros_like(ss)
                safe = xp.where(amax > 0, amax, xp.ones_like(amax))
                y = ax / safe[..., None]
                scaled = amax * xp.sqrt(xp.sum(y * y, axis=-1))
                xnorm = xp.where(risky & ~xp.isnan(ss), scaled, xnorm)
            # LAPACK's larfg: H = I only where the column below is zero and alpha real
            ar = xp.real(alpha) if cplx else alpha
            nz = (xnorm != 0) | (xp.imag(alpha) != 0) if cplx else xnorm != 0
            norm = _hypot(xp, xp.abs(alpha) if cplx else alpha, xnorm)
            beta = xp.astype(-_copysign(xp, norm, ar), a.dtype) if cplx else -_copysign(
                xp, norm, ar)
            one_b = xp.ones_like(beta)
            tau = xp.where(nz, (beta - alpha) / xp.where(nz, beta, one_b), zero)
            scal = xp.where(nz, 1 / xp.where(nz, alpha - beta, one_b), zero)
        beta = xp.where(nz, beta, alpha)
        v = x * scal[..., None]
        w[..., j + 1:, j] = v
        w[..., j, j] = beta
        taus.append(tau)
        if j + 1 < n:
            # trailing columns: a_k -= conj(tau) (v^H a_k) v with v = [1; v] (H_j^H)
            vh = xp.conj(v) if cplx else v
            d = w[..., j, j + 1:] + gemm(vh[..., None, :], w[..., j + 1:, j + 1:],
                                         precision=precision, label="batched-householder",
                                         backend=backend)[..., 0, :]
            f = (xp.conj(tau) if cplx else tau)[..., None] * d
            w[..., j, j + 1:] = w[..., j, j + 1:] - f
            w[..., j + 1:, j + 1:] = w[..., j + 1:, j + 1:] - v[..., :, None] * f[..., None, :]
    diag = xp.stack([w[..., j, j] for j in range(n)], axis=-1)
    diag = xp.real(diag) if cplx else diag
    one = xp.ones_like(diag)
    s = xp.astype(xp.where(diag < 0, -one, one), a.dtype)
    r = xp.triu(w[..., :n, :]) * s[..., :, None]
    if b is not None:  # Q^H b = H_{n-1}^H ... H_0^H b
        c = xp.asarray(b, copy=True)
        for j in range(n):
            _reflect(xp, w, xp.conj(taus[j]) if cplx else taus[j], c, j, 0, precision, backend)
        c[..., :n, :] = c[..., :n, :] * s[..., :, None]
        return None, r, c
    if mode == "r":
        return None, r, None
    p = m if mode == "complete" else n
    q = eye_like(xp, tuple(batch), m, p, a.dtype, dev)
    for j in range(n - 1, -1, -1):  # Q = H_0 ... H_{n-1} I: columns < j are still e_k
        _reflect(xp, w, taus[j], q, j, j, precision, backend)
    q[..., :, :n] = q[..., :, :n] * s[..., None, :]
    return q, r, None


def _reflect(xp, w, tau, c, j, k0, precision, backend):
    """``c[..., j:, k0:] = (I - tau v v^H) c[..., j:, k0:]``, v = [1; w[j+1:, j]]."""
    v = w[..., j:, j]
    v = xp.concat([xp.ones_like(v[..., :1]), v[..., 1:]], axis=-1)
    vh = xp.conj(v) if is_complex(xp, v) else v
    d = gemm(vh[..., None, :], c[..., j:, k0:], precision=precision,
             label="batched-householder", backend=backend)
    c[..., j:, k0:] = c[..., j:, k0:] - v[..., :, None] * (tau[..., None, None] * d)


def _hypot(xp, x, y):
    return xp.hypot(x, y) if hasattr(xp, "hypot") else xp.sqrt(x * x + y * y)


def _copysign(xp, x, y):
    if hasattr(xp, "copysign"):
        return xp.copysign(x, y)
    return xp.where(y < 0, -xp.abs(x), xp.abs(x))
