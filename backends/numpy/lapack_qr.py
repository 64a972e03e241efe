"""The NumPy backend's QR through LAPACK's ``geqrf``/``orgqr`` (SciPy's wrappers).

``numpy.linalg.qr`` copies its input into Fortran order, factors, copies the reflectors
again for ``orgqr`` and hands Q back in C order (another copy). Called directly, the
factorization runs in one Fortran-order copy of the input: ``geqrf`` in place, R taken out,
``orgqr`` in place on the same buffer (which becomes Q), then the signs of R's diagonal made
non-negative in place. 4000 x 4000 float64 on a 2-core CPU (OpenBLAS 0.3.31): as fast as
``scipy.linalg.qr(mode="economic")``, which does the same calls, and faster than
``numpy.linalg.qr`` (``python -m mpqr bench qr --cpu``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["LAPACK_DTYPES", "householder_q", "householder_steps", "lapack_qr"]

#: the dtypes LAPACK factors directly (others, and stacks, take ``numpy.linalg.qr``)
LAPACK_DTYPES = (np.float32, np.float64, np.complex64, np.complex128)


def _call(func: Any, name: str, *args: Any, **kw: Any) -> Any:
    *out, info = func(*args, **kw)
    if info < 0:  # an argument LAPACK refused: a bug here, not a property of the input
        raise ValueError(f"LAPACK {name}: illegal value in argument {-info}")
    return out


def _lwork(func: Any, *args: Any, **kw: Any) -> int:
    """LAPACK's optimal workspace for ``func`` (a ``lwork=-1`` query)."""
    work = func(*args, lwork=-1, overwrite_a=1, **kw)[-2]  # a is not touched by a query
    return max(1, int(np.real(np.ravel(work)[0])))


def lapack_qr(a: np.ndarray, mode: str) -> tuple[np.ndarray | None, np.ndarray]:
    """QR of a 2-D array of a LAPACK dtype, ``numpy.linalg.qr``'s modes (``"reduced"``,
    ``"complete"``, ``"r"``), with ``diag(R)`` real and non-negative. ``a`` is not
    modified; Q comes back in Fortran order.

    Returns ``(Q, R)``, Q ``None`` for mode ``"r"``; Q is (m, k) or (m, m) and R (k, n) or
    (m, n), ``k = min(m, n)``.
    """
    from scipy.linalg import lapack

    m, n = a.shape
    k = min(m, n)
    complete = mode == "complete" and m > n
    geqrf, orgqr = lapack.get_lapack_funcs(
        ("geqrf", "ungqr" if np.iscomplexobj(a) else "orgqr"), (a,))
    # one copy of the input, ours to overwrite (wide enough for a complete Q)
    x = np.zeros((m, m), dtype=a.dtype, order="F") if complete else \
        np.array(a, dtype=a.dtype, order="F", copy=True)
    if complete:
        x[:, :n] = a
    h = x[:, :n]
    h, tau = _call(geqrf, "geqrf", h, lwork=_lwork(geqrf, h), overwrite_a=1)[:2]
    assert np.shares_memory(h, x)  # factored in place (F-contiguous, the wrapper's dtype)
    rows = m if mode == "complete" else k
    r = np.triu(h[:rows, :])
    if k:  # the signs: diag(R) real and >= 0; Q's columns take the conjugate phase
        d = np.diagonal(r).copy()
        if np.iscomplexobj(r):
            mag = np.abs(d)
            p = np.where(mag > 0, d / np.where(mag > 0, mag, 1), 1)
        else:
            p = np.where(d < 0, -1, 1).astype(r.dtype)
        r[:k] *= p.conj()[:, None]
        if np.iscomplexobj(r):
            np.fill_diagonal(r, np.abs(d))
    if mode == "r":
        return None, r
    # Q is formed in place over the reflectors: the whole buffer for a complete Q of a tall
    # matrix, else its first k columns
    q = x if complete else x[:, :k]
    q = _call(orgqr, "orgqr", q, tau, lwork=_lwork(orgqr, q, tau), overwrite_a=1)[0]
    if k:
        q[:, :k] *= p[None, :]
    return q, r


def householder_steps(w: np.ndarray, j0: int, j1: int) -> np.ndarray:
    """``geqrf`` of ``w[j0:, j0:j1]``, its ``Q^H`` applied to ``w[j0:, j1:]`` (``ormqr``
    / ``unmqr``), both written back into ``w`` (2-D, Fortran order); returns ``tau``."""
    from scipy.linalg import lapack

    cplx = np.iscomplexobj(w)
    geqrf, ormqr = lapack.get_lapack_funcs(("geqrf", "unmqr" if cplx else "ormqr"), (w,))
    h = w[j0:, j0:j1]
    h, tau = _call(geqrf, "geqrf", h, lwork=_lwork(geqrf, h))[:2]
    w[j0:, j0:j1] = h
    if j1 < w.shape[1] and tau.size:
        c = w[j0:, j1:]
        trans = "C" if cplx else "T"
        h = h[:, :tau.shape[0]]
        work = ormqr("L", trans, h, tau, c, -1)[-2]
        lwork = max(1, int(np.real(np.ravel(work)[0])), c.shape[1])
        w[j0:, j1:] = _call(ormqr, "ormqr", "L", trans, h, tau, c, lwork)[0]
    return tau


def householder_q(w: np.ndarray, tau: np.ndarray) -> np.ndarray:
    """``Q`` (``m x k``) from the reflectors in ``w[:, :k]`` (``orgqr`` / ``ungqr``)."""
    from scipy.linalg import lapack

    orgqr = lapack.get_lapack_funcs(("ungqr" if np.iscomplexobj(w) else "orgqr",), (w,))[0]
    q = w[:, :tau.shape[0]]
    return _call(orgqr, "orgqr", q, tau, lwork=_lwork(orgqr, q, tau), overwrite_a=1)[0]
