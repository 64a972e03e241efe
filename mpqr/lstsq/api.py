"""``mpqr.lstsq``: SciPy's ``lstsq`` contract on a (mixed-precision) QR factorization.

Route for one ``M x N`` problem (``M >= N``; ``M < N`` works on ``A^H``):

0. With refinement, at the working precision, and for a tall factored matrix
   (``M >= 16 N``): the Gram route (:mod:`mpqr.lstsq.gram`) — ``R = chol(A^H A)``
   and ``s = sqrt(eig(A^H A))`` from one pass over ``A``, taken only when
   ``cond(A) <= 4`` (then ``s`` is within 2x of the QR route's error bound; gelsy,
   which returns no ``s``: ``cond(A) <= 1e4``) and the rank is certainly full;
   step 3 follows. Otherwise (its ``G`` then starts step 1's CholQR2):
1. ``R`` from :func:`mpqr.qr` at the requested precision; with refinement
   ``mode="r"`` (Q is never formed), without it ``mode="reduced"``. Where ``qr``
   would factor an ``fp16``/``fp32-emulated`` request in the input's own precision
   (a tall-skinny factored matrix: :func:`mpqr.qr.api.factor_precision`), lstsq takes
   that precision from the start, so the Gram route (step 0), the rank resolution and
   the trace all refer to the R that is really computed.
2. The singular values of ``R`` are those of ``A`` (the QR-SVD route); they
   give ``s`` and the rank for the cutoff ``cond * s[0]``. A factorization
   below the working precision resolves singular values only to about
   ``sqrt(N) u_f ||A||``: when a singular value falls in that uncertainty
   band the rank is not decided from ``R`` (see below).
3. Full rank, with ``R`` clear of singular (its smallest singular value above the
   cutoff by more than the factorization's rounding): ``refine`` runs preconditioned
   CGLS or iterative refinement (:mod:`mpqr.lstsq.refine`) with residuals in working
   precision, or, with ``refine=None``, the direct ``x = R^-1 Q^H b``.
4. Rank deficient: the minimum-norm solution of the truncated problem,
   ``x = V_k S_k^-1 U_k^H Q^H b`` from the SVD ``R = U S V^H``. So is a full rank
   whose ``R`` is not clear of singular (an exactly zero column of ``A`` gives an
   exactly zero pivot, yet a computed singular value at the rounding level that the
   cutoff may count, as SciPy's gelsd does): ``R`` never reaches a triangular solve.

``refine="auto"`` never returns an answer less accurate than SciPy's: when the
rank is uncertain at the factorization precision, or the refinement does not
converge, it refactors at the working precision (``precision="auto"``) and
solves directly; every path is recorded in the explain trace.
"""

from __future__ import annotations

from typing import Any

from mpqr import _route
from mpqr.lstsq._scipy_rules import scipy_rank
from mpqr.lstsq.in_memory import REFINE, check_options, lstsq_2d

__all__ = ["REFINE", "check_options", "lstsq", "lstsq_2d"]


def lstsq(a: Any, b: Any, cond: float | None = None, overwrite_a: bool = False,
          overwrite_b: bool = False, check_finite: bool = True,
          lapack_driver: str | None = None, *, precision: str | None = None,
          refine: str | None = "auto", tol: float | None = None,
          maxiter: int | None = None, device: str | None = None,
          memory_budget: int | str | None = None,
          progress: bool | None = None) -> tuple[Any, Any, Any, Any]:
    """Least-squares solution of ``a @ x = b`` with SciPy's signature and results.

    Parameters
    ----------
    a : array, shape (M, N) or (..., M, N)
        Array of any Array API library (NumPy, CuPy, ...). Dtypes are cast as
        SciPy's LAPACK wrappers do (int32+ and longdouble to float64; bool, small
        ints and float16 to float32; clongdouble, and float64 with complex64, to
        complex128). ``numpy.matrix`` is taken as a plain ndarray.
        A tall 2-D ``dask.array.Array`` chunked by rows is solved across its
        blocks on their workers (``x``, ``residues``, ``s`` returned as dask arrays;
        see :mod:`mpqr.backends.dask.lstsq`).
    b : array, shape (M,) or (M, K) (or batched, as in SciPy)
        ``K = 0`` gives ``x`` of shape (N, 0) with ``rank`` and ``s`` of ``a``.
    cond : float, optional
        Singular values ``<= cond * s[0]`` count as zero (default: the machine
        epsilon ``eps`` of the computation dtype, as SciPy). The values LAPACK reads
        specially are read as SciPy's driver reads them: ``"gelsd"`` cuts
        ``cond <= 0`` and ``cond >= 1`` at the unit roundoff ``eps / 2``; ``"gelss"``
        cuts ``cond < 0`` at ``eps``; ``"gelsy"`` counts every nonzero singular value
        for ``cond <= 0``. NaN and ±Inf are refused.
    overwrite_a, overwrite_b : bool
        Accepted for compatibility; the inputs are never modified (the
        refinement and the residues need them).
    check_finite : bool
        Raise ``ValueError("array must not contain infs or NaNs ...")`` for
        NaN/Inf input. With False, NaN/Inf in ``b`` give NaN in ``x``; NaN/Inf
        in ``a`` raise :class:`mpqr.LinAlgError`.
    lapack_driver : {"gelsd", "gelsy", "gelss"}, optional
        Validated as SciPy does. ``"gelsy"`` gives ``s = None`` and empty
        ``residues`` (as in SciPy); the computation is the same for all three.
    precision : str, optional
        Precision of the QR factorization's matrix products (``"auto"``,
        ``"fp16"``, ``"fp32"``, ``"fp32-emulated"``, ``"fp64"``,
        ``"fp64-emulated"``); ``None`` uses the ``mpqr.precision`` context.
        Residuals and refinement products always run in the working precision.
        Complex input runs the emulated precisions' products as real products
        of its parts (see :mod:`mpqr.engines.complex_product`).
    refine : {"auto", "cgls", "ir", None}
        ``"cgls"``: CGLS preconditioned by ``R``; ``"ir"``: iterative
        refinement on the semi-normal equations; ``"auto"``: CGLS, with a
        working-precision refactorization when the rank is uncertain at the
        factorization precision or CGLS stalls; ``None``: the direct solution
        at the factorization precision (the fast answer; with a low
        ``precision`` the rank cutoff cannot go below that precision's
        resolution, ``10 sqrt(N) u_f``, which is recorded in the trace).
    tol : float, optional
        Refinement tolerance on the normal-equation backward error
        ``||A^H r|| / (||A|| (||A|| ||x|| + ||r||))`` (underdetermined:
        ``||R^-H r|| / ||x||``). Default: the unit roundoff ``u`` of the
        working precision, where a refinement that stalls below
        ``sqrt(max(M, N)) u`` (the rounding floor of the products with ``A``)
        also counts as converged; an explicit ``tol`` is strict.
    maxiter : int, optional
        Iteration cap of the refinement (default 50).
    device, memory_budget, progress
        As in :func:`mpqr.qr`, for host ``a`` and ``b`` (NumPy arrays, memmaps,
        h5py/zarr datasets): ``device="cuda"`` solves on the GPU and returns
        host arrays; beyond the budget the problem is solved out of core (one
        TSQR pass over ``[a | b]``, then one pass per refinement step; counted in
        the explain trace).

    Returns
    -------
    x : array, shape (N,) or (N, K)
        Least-squares solution (minimum norm when rank deficient or M < N).
    residues : array, shape (K,), () or (0,)
        Squared 2-norm of each column of ``b - a @ x`` (real, in the precision
        of ``x``) when ``M > N`` and ``rank == N`` (0-D for 1-D ``b``); otherwise
        empty with the dtype of ``x``; always empty for ``"gelsy"``. With
        SciPy >= 1.18 installed, a rank deficient ``M > N`` problem gets NaN
        residues of the full-rank shape instead, as ``scipy.linalg.lstsq`` does
        there.
    rank : int
        Effective rank of ``a`` (an integer array for batched input). For NumPy
        input with SciPy >= 1.18 installed, a NumPy ``int64``, as
        ``scipy.linalg.lstsq`` returns it there (an empty ``a`` keeps a Python int).
    s : array, shape (min(M, N),) or None
        Singular values of ``a`` (descending), ``None`` for ``"gelsy"``.

    Raises
    ------
    ValueError
        SciPy's errors: ``a`` not 2-D, row-count mismatch, unknown driver,
        NaN/Inf with ``check_finite``; also an unknown ``refine``/``precision``,
        a NaN or infinite ``cond`` and a masked array (its mask would be ignored).
    TypeError
        ``a`` or ``b`` not an array, or arrays of different libraries; ``cond``
        not a real number.
    NotImplementedError
        An emulated precision whose engine the backend lacks.
    mpqr.LinAlgError
        ``a`` holds NaN/Inf with ``check_finite=False`` (a
        ``numpy.linalg.LinAlgError``, which is ``scipy.linalg.LinAlgError``).

    Warns
    -----
    mpqr.RefinementWarning
        ``refine="cgls"`` or ``"ir"`` stopped before meeting ``tol``; the best
        iterate is returned.

    Examples
    --------
    >>> import numpy as np, mpqr
    >>> a = np.array([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]])
    >>> x, res, rank, s = mpqr.lstsq(a, np.array([1.0, 2.0, 2.0]))
    >>> np.round(x, 6).tolist(), int(rank)
    ([0.666667, 0.5], 2)
    """
    x, res, rank, s = _route.lstsq(a, b, cond, overwrite_a, overwrite_b, check_finite,
                                   lapack_driver, precision=precision, refine=refine,
                                   tol=tol, maxiter=maxiter, device=device,
                                   memory_budget=memory_budget, progress=progress)
    # an empty problem (M or N zero: no singular value; gelsy gives None otherwise)
    empty = s is not None and s.shape[-1] == 0
    return x, res, scipy_rank(x, rank, empty=empty), s
