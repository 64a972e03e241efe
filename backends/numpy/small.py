"""Small host QR and least squares straight through LAPACK, with mpqr's conventions.

The small-input fast path of :func:`mpqr.qr` and :func:`mpqr.lstsq` (``mpqr/_fast.py``)
calls these for exact ``numpy.ndarray`` inputs below the backend's ``small_max``: one
``geqrf`` (+ ``orgqr``/``ungqr``) or SciPy's ``lstsq`` driver, without the general
route's validation, method choice and trace bookkeeping. Each returns None where the
general route must decide instead (non-finite entries, columns outside the range the
general route would rescale), so NaN/Inf inputs behave exactly as there.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["AUG_MIN", "GRAM_SVD_TOL", "aug_solve", "cmax_in_range", "gram_svd", "in_range",
           "r_in_range", "small_lstsq", "small_qr"]

#: LAPACK routines per dtype character (looked up once)
_QR_FUNCS: dict[str, tuple[Any, Any]] = {}
#: the largest column maximum the general route leaves unscaled, per range: entries
#: in [2**-e, 2**(e+1)) (``mpqr.qr._kernels.SAFE_EXPONENT``: float32 40, float64 400)
_RANGE = {True: (2.0 ** -40, 2.0 ** 41), False: (2.0 ** -400, 2.0 ** 401)}
#: LAPACK routines for the augmented least squares per dtype character
_AUG_FUNCS: dict[str, tuple[Any, Any, Any]] = {}
#: least squares of at least this many elements of ``a`` (and ``m >= n``, 1-D or 2-D
#: ``b``, gelsd/gelss) take the QR of ``[a | b]`` before SciPy's driver: 1000 x 20
#: 0.72x gelsd's time, 4000 x 50 0.61x, 100 x 10 1.1x (2-core host, one BLAS thread,
#: round-robin medians; ``python -m mpqr bench small``)
AUG_MIN = 4096


def _qr_funcs(char: str) -> tuple[Any, Any]:
    f = _QR_FUNCS.get(char)
    if f is None:
        from scipy.linalg import lapack

        p = {"f": "s", "d": "d", "F": "c", "D": "z"}[char]
        gen = "ungqr" if char in "FD" else "orgqr"
        f = _QR_FUNCS[char] = (getattr(lapack, p + "geqrf"), getattr(lapack, p + gen))
    return f


def in_range(a: np.ndarray, single: bool) -> bool:
    """Whether every entry of ``a`` is finite and every nonzero column maximum lies where
    the general QR route runs the library's QR unscaled (one pass over ``a``)."""
    return cmax_in_range(np.abs(a).max(axis=0), single or a.dtype.char in "fF")


def cmax_in_range(mx: np.ndarray, single: bool) -> bool:
    """:func:`in_range` from the column maxima ``mx`` of ``|a|`` (NaN where a column
    holds one; float32's range if ``single``)."""
    if not mx.size:
        return True
    lo, hi = _RANGE[single]
    if not float(mx.max()) < hi:  # NaN compares False: the general route decides
        return False
    if float(mx.min()) >= lo:
        return True
    return not bool(((mx < lo) & (mx != 0)).any())


def r_in_range(cmax: np.ndarray, m: int, n: int, single: bool) -> bool:
    """Whether the column maxima ``cmax`` of ``|R|`` of an ``m x n`` input's QR (NaN
    where R is) show every column of the input finite and its maximum where the general
    route leaves it unscaled (:data:`_RANGE`). R's column j has the input column's norm
    ``c``, so ``max|R_j| <= c <= sqrt(n) max|R_j|`` and ``c / sqrt(m) <= max|A_j| <= c``:
    the test is sufficient (near the range's ends a few in-range inputs go to the general
    route, which computes the same result). Non-finite input leaves R non-finite (every
    entry reaches a column norm or R's rows), so NaN/Inf fail here."""
    if not cmax.size:
        return True
    lo, hi = _RANGE[single]
    if not float(cmax.max()) * math.sqrt(n) < hi:  # NaN compares False
        return False
    low = lo * math.sqrt(m)
    if float(cmax.min()) >= low:  # the usual case: one reduction, no temporaries
        return True
    # exact zero columns are the input's zero columns, factored exactly
    return not bool(((cmax < low) & (cmax != 0)).any())


#: (rows, columns) -> the mask of a matrix's entries below its diagonal
_BELOW: dict[tuple[int, int], np.ndarray] = {}
#: the singular values of R run on one BLAS thread from this many columns (OpenBLAS's
#: thread wake-ups in gebrd's level-2 calls; H200 host, 16 cores, host gesdd of an
#: n x n R, one thread against the default: n = 64 185 / 176 us, 96 464 / 546, 128
#: 974 / 2018; `python bench/probes/smallgpu_gpu.py`)
SVD_ONE_THREAD_N = 96


def _below(p: int, w: int) -> np.ndarray:
    mask = _BELOW.get((p, w))
    if mask is None:
        if len(_BELOW) > 64:
            _BELOW.clear()
        mask = _BELOW[(p, w)] = ~np.triu(np.ones((p, w), dtype=bool))
    return mask


def _aug_funcs(char: str) -> tuple[Any, Any, Any]:
    f = _AUG_FUNCS.get(char)
    if f is None:
        from scipy.linalg import lapack

        p = {"f": "s", "d": "d", "F": "c", "D": "z"}[char]
        f = _AUG_FUNCS[char] = (getattr(lapack, p + "geqrf"), getattr(lapack, p + "gesdd"),
                                getattr(lapack, p + "trtrs"))
    return f


#: :func:`aug_solve` takes the singular values of the Cholesky factor of ``A^H A`` for
#: R's where the two factors differ by at most this many ``n u s1`` in the Frobenius
#: norm (then, by Weyl's inequality, every singular value is within that of R's: the
#: error of a backward-stable SVD of an ``n x n`` R, a few ``n u s1``); farther apart
#: (condition numbers past ~100, where the Gram matrix's rounding shows), R's own
GRAM_SVD_TOL = 4.0


def gram_svd(g: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """``(U, s)``: the upper Cholesky factor ``U`` of the Hermitian ``g`` (``A^H A``; its
    upper triangle is read) and U's singular values, descending; None where the
    factorization or the SVD fails (``g`` numerically singular or non-finite)."""
    char = g.dtype.char
    potrf = _gram_funcs(char)
    gesdd = _aug_funcs(char)[1]
    n = g.shape[0]
    with _svd_threads(n):
        uf, info = potrf(g, lower=0, clean=1)
        if info != 0:
            return None
        s, info = gesdd(uf, compute_uv=0)[1::2]
    if info != 0 or not (n == 0 or math.isfinite(float(s[0]))):
        return None
    return uf, s


_GRAM_FUNCS: dict[str, Any] = {}


def _gram_funcs(char: str) -> Any:
    f = _GRAM_FUNCS.get(char)
    if f is None:
        from scipy.linalg import lapack

        f = _GRAM_FUNCS[char] = getattr(lapack, {"f": "s", "d": "d", "F": "c",
                                                 "D": "z"}[char] + "potrf")
    return f


def _svd_threads(n: int) -> Any:
    """One BLAS thread for R's n x n host steps from :data:`SVD_ONE_THREAD_N` columns."""
    if n >= SVD_ONE_THREAD_N:
        from mpqr.backends.host.blas import OneThread

        return OneThread()
    import contextlib

    return contextlib.nullcontext()


def aug_solve(raug: np.ndarray, m: int, n: int, cut: float, u: float, *,
              solved: bool = False, gram: tuple[np.ndarray, np.ndarray] | None = None
              ) -> tuple[Any, Any, int, Any] | None:
    """Least squares from the QR of ``[A | b]`` (``A``: ``m x n`` with ``m >= n``; ``b``:
    ``k`` columns): ``raug`` holds the factorization's first ``min(m, n + k)`` rows
    (what lies below the diagonal is ignored), so ``Q^H b`` is its ``[:n, n:]`` block and
    the squared residual norms the column sums of ``|R_aug[n:, n:]|^2``. Returns ``(x
    (n, k), rsq (k,) in the real dtype or None for m == n, rank == n, s)`` with ``s``
    the singular values of ``R`` (those of ``A``), descending; ``solved``: that block
    already holds ``x`` (a triangular solve ran where R_aug was factored). None (the
    general route decides) where R_aug is non-finite (NaN/Inf in ``A`` or ``b``), A's
    columns are out of range (:func:`r_in_range`), or the rank by the relative cutoff
    ``cut`` is below ``n`` or ``R`` too close to it for a triangular solve at unit
    roundoff ``u`` (:func:`mpqr.lstsq.solver.solvable`'s rule). ``gram``: ``(U, s_U)``
    of :func:`gram_svd` (computed while R_aug was factored); its ``s_U`` stands for R's
    singular values where ``U`` and R (rows by their diagonal's phase) are within
    :data:`GRAM_SVD_TOL` ``n u s1`` (the rank's margin then allows for that distance)."""
    from mpqr.lstsq.solver import RESOLUTION

    raug = np.array(raug, order="F")  # never the caller's buffer; R's columns contiguous
    raug[_below(*raug.shape)] = 0
    if not np.isfinite(raug).all():
        return None
    char = raug.dtype.char
    _, gesdd, trtrs = _aug_funcs(char)
    rr = raug[:n, :n]
    if not r_in_range(np.abs(rr).max(axis=0), m, n, char in "fF"):
        return None
    s = None
    dist = 0.0
    if gram is not None:
        uf, su = gram
        d = rr.diagonal()
        ad = np.abs(d)
        ph = np.where(ad != 0, d / np.where(ad != 0, ad, 1), 1)
        dist = float(np.linalg.norm(ph.conj()[:, None] * rr - uf))
        if su.size and dist <= GRAM_SVD_TOL * n * u * float(su[0]):
            s = su
        else:
            dist = 0.0
    if s is None:
        with _svd_threads(n):
            s, info = gesdd(rr, compute_uv=0)[1::2]
        if info != 0:
            return None
    s1 = float(s[0])
    if not (s1 > 0.0 and math.isfinite(s1)):
        return None
    # R's smallest singular value is at least s[-1] - dist (Weyl), its largest at most
    # s1 + dist
    if not float(s[-1]) - dist > (cut + RESOLUTION * math.sqrt(n) * u) * (s1 + dist):
        return None  # the rank by cut is below n, or R too close to it to solve by
    rank = n
    if solved:
        x = raug[:n, n:]
    else:
        x, info = trtrs(rr, raug[:n, n:])
        if info != 0:
            return None
    rsq = None
    if m > n:
        t = raug[n:, n:]
        rsq = (np.sum(t.real * t.real + t.imag * t.imag, axis=0) if t.dtype.kind == "c"
               else np.einsum("ij,ij->j", t, t)).astype(s.dtype, copy=False)
    return x, rsq, rank, s


def _aug_lstsq(a: np.ndarray, b: np.ndarray, cond: Any, driver: str) -> Any:
    """SciPy's results by the QR of ``[a | b]`` (:func:`aug_solve`), or None."""
    from mpqr.lstsq import _scipy_rules as rules

    m, n = a.shape
    b2 = b[:, None] if b.ndim == 1 else b
    w = n + b2.shape[1]
    geqrf = _aug_funcs(a.dtype.char)[0]
    x = np.empty((m, w), dtype=a.dtype, order="F")
    x[:, :n] = a
    x[:, n:] = b2
    qr, _, _, info = geqrf(x, lwork=max(1, 32 * w), overwrite_a=1)
    if info != 0:
        return None
    eps = float(np.finfo(a.dtype).eps)
    cut = rules.cutoff(cond, driver, eps, single=a.dtype.char in "fF")
    res = aug_solve(qr[:min(m, w)], m, n, cut, eps / 2)
    if res is None:
        return None
    sol, rsq, rank, s = res
    if b.ndim == 1:
        sol = sol[:, 0]
        if rsq is not None:
            rsq = rsq.reshape(())  # 0-D, not a scalar
    return sol, rsq, rank, s


def small_qr(a: np.ndarray, mode: str, single: bool = False) -> tuple[Any, Any] | None:
    """``(Q or None, R)`` of a 2-D float32/float64/complex ``a`` with ``diag(R)`` real and
    ``>= 0`` (``mode``: reduced, complete or r), as ``qr(method="geqrf")`` gives it; None
    where :func:`in_range` is false. ``a`` is never modified (LAPACK gets a copy)."""
    if not in_range(a, single):
        return None
    m, n = a.shape
    k = min(m, n)
    geqrf, orgqr = _qr_funcs(a.dtype.char)
    qr, tau, _, info = geqrf(a, lwork=max(1, 32 * n))
    if info != 0:  # not reached for valid input: the general route reports it
        return None
    r = np.triu(qr if mode == "complete" else qr[:k, :])
    if mode != "r":
        if mode == "complete" and m > n:
            qq = np.empty((m, m), dtype=qr.dtype, order="F")
            qq[:, :n] = qr
            q, _, info = orgqr(qq, tau, lwork=max(1, 32 * m), overwrite_a=1)
        else:
            q, _, info = orgqr(qr[:, :k], tau, lwork=max(1, 32 * k), overwrite_a=1)
        if info != 0:
            return None
    else:
        q = None
    # diag(R) >= 0: rows of R and columns of Q by the diagonal's phase (sign(0) = 1)
    d = r.diagonal()[:k]
    if np.iscomplexobj(r):
        ad = np.abs(d)
        p = np.where(ad != 0, d / np.where(ad != 0, ad, 1).astype(d.dtype), 1)
        r[:k, :] *= p.conj()[:, None]
        r[np.arange(k), np.arange(k)] = ad  # exactly real
    else:
        p = np.where(d < 0, -1, 1).astype(r.dtype)
        r[:k, :] *= p[:, None]
    if q is not None:
        q[:, :k] *= p
    return q, r


def small_lstsq(a: np.ndarray, b: np.ndarray, cond: Any, driver: str | None
                ) -> tuple[Any, Any, Any, Any] | None:
    """``scipy.linalg.lstsq(a, b, cond, lapack_driver=driver)``'s LAPACK call on finite 2-D
    ``a`` and 1-D/2-D ``b`` of one float dtype: ``(x, rsq, rank, s)``, ``rsq`` the squared
    residual norms of a full-rank ``M > N`` problem (else None; the caller applies SciPy's
    residues rules), ``s`` None for gelsy. None where either holds NaN/Inf (the general
    route decides) or LAPACK reports a failure. The inputs are never modified."""
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        return None
    from scipy.linalg.lapack import _compute_lwork, get_lapack_funcs

    driver = driver or "gelsd"
    m, n = a.shape
    if driver != "gelsy" and m >= n and a.size >= AUG_MIN:
        res = _aug_lstsq(a, b, cond, driver)
        if res is not None:
            return res
    nrhs = b.shape[1] if b.ndim == 2 else 1
    func, lwork_func = get_lapack_funcs((driver, driver + "_lwork"), (a, b))
    if m < n:  # b holds the longer solution
        b2 = np.zeros((n, *b.shape[1:]), dtype=func.dtype)
        b2[:m] = b
        b = b2
    rcond = np.finfo(func.dtype).eps if cond is None else cond
    s = None
    if driver == "gelsd":
        if func.dtype.kind == "f":
            lwork, iwork = _compute_lwork(lwork_func, m, n, nrhs, rcond)
            x, s, rank, info = func(a, b, lwork, iwork, rcond, False, False)
        else:
            lwork, rwork, iwork = _compute_lwork(lwork_func, m, n, nrhs, rcond)
            x, s, rank, info = func(a, b, lwork, rwork, iwork, rcond, False, False)
    elif driver == "gelss":
        lwork = _compute_lwork(lwork_func, m, n, nrhs, rcond)
        _, x, s, rank, _, info = func(a, b, rcond, lwork, overwrite_a=False,
                                      overwrite_b=False)
    else:  # gelsy
        lwork = _compute_lwork(lwork_func, m, n, nrhs, rcond)
        jptv = np.zeros((n, 1), dtype=np.int32)
        _, x, _, rank, info = func(a, b, jptv, rcond, lwork, False, False)
    if info != 0:
        return None
    rsq = None
    if m > n:
        if rank == n and driver != "gelsy":
            rsq = np.asarray(np.sum(np.abs(x[n:]) ** 2, axis=0))  # 0-D, not a scalar
        x = x[:n]
    return x, rsq, int(rank), s
