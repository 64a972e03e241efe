"""What QR is used for: the QR-SVD and orthonormal bases."""

from __future__ import annotations

import contextlib
from typing import Any

from mpqr import _route
from mpqr._array_api import device
from mpqr._gpu_errors import device_errors
from mpqr._validation import check_dtype, check_ndim, namespace_of, plain_array
from mpqr.backends import get_backend
from mpqr.policy import gemm, record_event, resolve_precision, validate_precision
from mpqr.qr._kernels import ct, panel_precision
from mpqr.qr.cholqr import defer_last_solve, right_solve_upper, unit_roundoff
from mpqr.qr.gram_blocked import gram
from mpqr.qr.in_memory import qr

__all__ = ["orth", "svd"]


def svd(x: Any, full_matrices: bool = False, precision: str | None = None) -> tuple[Any, Any, Any]:
    """Singular value decomposition through QR: ``x = Q R``, ``R = U_r S Vh``, ``U = Q U_r``.

    The big work (the QR and the product ``Q U_r``) runs through the precision
    policy; only the SVD of the small ``n x n`` factor R is a dense kernel. For
    ``m < n`` the SVD of ``x^H`` is transposed back.

    Parameters
    ----------
    x : array, shape (..., m, n)
    full_matrices : bool
        If True, U is ``(..., m, m)`` and Vh ``(..., n, n)``; otherwise
        ``(..., m, k)`` and ``(..., k, n)`` with ``k = min(m, n)``.
    precision : str, optional
        Precision setting for the QR and the ``Q U_r`` product (see :func:`mpqr.qr`).

    Returns
    -------
    U, S, Vh : arrays
        ``x = U @ diag(S) @ Vh`` with ``S`` descending and real, in the
        caller's namespace and on its device.

    Raises
    ------
    ValueError, TypeError
        As :func:`mpqr.qr` for bad input.

    Examples
    --------
    >>> import numpy as np, mpqr
    >>> a = np.random.default_rng(0).standard_normal((50, 4))
    >>> u, s, vh = mpqr.svd(a, precision="fp64")
    >>> bool(np.allclose(s, np.linalg.svd(a, compute_uv=False)))
    True
    """
    return _route.call("svd", _svd, (x,), ("x",), full_matrices=full_matrices,
                       precision=precision)


def _svd(x: Any, full_matrices: bool, precision: str | None) -> tuple[Any, Any, Any]:
    """:func:`svd` of an array in memory."""
    x = plain_array(x, "x")  # numpy.matrix: a plain ndarray (SciPy's rule)
    xp = namespace_of(x, names=("x",))
    check_ndim(x, "x", minimum=2, what="2-D or a stack of matrices")
    if precision is not None:
        validate_precision(precision)
    a = check_dtype(xp, x, "x")
    m, n = a.shape[-2:]
    if m < n:
        u, s, vh = _svd(ct(xp, a), full_matrices, precision)
        return ct(xp, vh), s, ct(xp, u)
    backend = get_backend(xp)
    # CholQR2's Q = Q1 R2^-1 is left as its factors (see defer_last_solve): U = Q1 (R2^-1 U_r)
    with contextlib.nullcontext([None, None]) if full_matrices else defer_last_solve(a) as slot:
        q, r = qr(a, mode="complete" if full_matrices else "reduced", precision=precision)
    with device_errors(backend, "mpqr.svd"):
        r = r[..., :n, :]
        if not bool(xp.all(xp.isfinite(r))):
            # LAPACK refuses non-finite input (NumPy raises): propagate NaN instead (IEEE)
            nan = float("nan")
            sdt = xp.float32 if r.dtype in (xp.float32, xp.complex64) else xp.float64
            return (xp.full((*a.shape[:-1], m if full_matrices else n), nan, dtype=r.dtype,
                            device=device(r)),
                    xp.full(r.shape[:-1], nan, dtype=sdt, device=device(r)),
                    xp.full_like(r, nan))
        ur, s, vh = backend.svd(r, full_matrices=False)
        if q is None:
            q, ur = _deferred_factor(backend, slot[1], ur, precision, a)
    u1 = gemm(q[..., :, :n], ur, precision=precision, label="qrsvd-QU", backend=backend)
    if full_matrices and m > n:
        u1 = xp.concat([u1, q[..., :, n:]], axis=-1)
    return u1, s, vh


def _deferred_factor(backend: Any, pieces: tuple[Any, Any, Any], ur: Any,
                     precision: str | None, like: Any) -> tuple[Any, Any]:
    """``(Q1, R2^-1 U_r)`` from CholQR2's deferred pieces ``(Q1, R2, sb)``: ``R2^-1`` by
    substitution (``cond_2(R2) <= sqrt(3)``, certified), its product with ``U_r`` small and
    in the working precision, so ``Q1 (R2^-1 U_r)`` rounds as ``(Q1 R2^-1) U_r`` does."""
    xp = backend.xp
    q1, r2, _sb = pieces
    r2 = backend.from_small(r2, like)
    n = r2.shape[-1]
    x2 = backend.right_solve_upper(xp.eye(n, dtype=r2.dtype, device=device(r2)), r2)
    prec_name, _ = resolve_precision(precision)
    w = gemm(x2, ur, precision=panel_precision(prec_name, r2.dtype, xp), label="qrsvd-R2invU",
             backend=backend)
    return q1, w


def orth(x: Any, precision: str | None = None) -> Any:
    """Orthonormal basis ``Q`` of the columns of ``x`` (the Q of its reduced QR).

    When the precision setting runs the GEMMs below the working precision
    (``"fp16"``, ``"fp32-emulated"`` or ``"fp32"`` on float64 input), Q is
    re-orthogonalised with Cholesky QR passes in the working precision until
    ``||I - Q^H Q||_F <= n u`` (Q is already well conditioned, so these
    passes cannot break down). No rank truncation is done: for rank-deficient
    ``x`` the extra columns are orthonormal but not in its range.

    Parameters
    ----------
    x : array, shape (..., m, n)
    precision : str, optional
        Precision setting (see :func:`mpqr.qr`).

    Returns
    -------
    array, shape (..., m, min(m, n))

    Examples
    --------
    >>> import numpy as np, mpqr
    >>> q = mpqr.orth(np.random.default_rng(1).standard_normal((40, 5)), precision="fp16")
    >>> bool(np.linalg.norm(q.T @ q - np.eye(5)) < 1e-14)
    True
    """
    return _route.call("orth", _orth, (x,), ("x",), precision=precision)


def _orth(x: Any, precision: str | None) -> Any:
    """:func:`orth` of an array in memory."""
    x = plain_array(x, "x")  # numpy.matrix: a plain ndarray (SciPy's rule)
    xp = namespace_of(x, names=("x",))
    check_ndim(x, "x", minimum=2, what="2-D or a stack of matrices")
    if precision is not None:
        validate_precision(precision)
    prec_name, _ = resolve_precision(precision)
    q = qr(x, precision=precision).Q
    k = q.shape[-1]
    if k == 0 or q.shape[-2] == 0:
        return q
    backend = get_backend(xp)
    with device_errors(backend, "mpqr.orth"):
        return _reorthogonalize(backend, q, prec_name, k)


def _reorthogonalize(backend: Any, q: Any, prec_name: str, k: int) -> Any:
    xp = backend.xp
    wp = panel_precision(prec_name, q.dtype, xp)
    if wp == "auto":
        return q
    u = unit_roundoff(xp, q.dtype)
    eye = xp.eye(k, dtype=q.dtype, device=device(q))
    for it in range(3):
        g = gram(backend, q, wp, "orth-gram")
        err = float(xp.max(xp.linalg.matrix_norm(g - eye, ord="fro")))
        if not err > k * u:  # NaN too: nothing to gain
            break
        record_event("reorth", f"orth: pass {it + 1}, ||I - Q^H Q||_F = {err:.2e}")
        q = right_solve_upper(backend, q, backend.cholesky(g, upper=True))
    return q
