"""The public QR entry point: validate the arguments every route shares and hand the call to
the router (:mod:`mpqr._route`), which sends it to the Dask, bridge, host (out-of-core) or
in-memory route (:mod:`mpqr.qr.in_memory`)."""

from __future__ import annotations

import math
import operator
from typing import Any

from mpqr import _route
from mpqr.qr.choice import choose_method, factor_precision
from mpqr.qr.driver import METHODS
from mpqr.qr.in_memory import MODES, PivotedQRResult, QRResult

__all__ = ["METHODS", "MODES", "PivotedQRResult", "QRResult", "check_pivoting",
           "choose_method", "factor_precision", "qr"]


def qr(x: Any, mode: str = "reduced", precision: str | None = None, method: str = "auto", *,
       check_finite: bool = False, overwrite_a: bool = False, device: str | None = None,
       out: Any = None, memory_budget: int | str | None = None,
       progress: bool | None = None, pivoting: bool = False, max_rank: int | None = None,
       rtol: float | None = None) -> Any:
    """QR factorization ``x = Q @ R`` of a matrix or a stack of matrices.

    Parameters
    ----------
    x : array, shape (..., m, n)
        Input of any Array API library (NumPy, CuPy, ...). Integers are cast to
        float64, float16 to float32, ``longdouble``/``clongdouble`` to
        float64/complex128 (as SciPy computes them). Complex inputs are factored in
        complex arithmetic; at the emulated precisions their products run as real
        products of the parts (see :mod:`mpqr.engines.complex_product`).
        ``numpy.matrix`` is taken as a plain ndarray.
        ``x`` is never modified unless ``overwrite_a=True``.
        A tall 2-D ``dask.array.Array`` chunked by rows is factored across its
        blocks on their workers (``Q`` lazy, modes ``"reduced"`` and ``"r"``; see
        :mod:`mpqr.backends.dask.qr` and the "Many GPUs with Dask" page).
    mode : {"reduced", "complete", "r"}
        ``"reduced"``: Q is ``(..., m, k)``, R ``(..., k, n)`` with
        ``k = min(m, n)``. ``"complete"``: Q is ``(..., m, m)``, R ``(..., m, n)``.
        ``"r"``: only R ``(..., k, n)`` is computed and returned as an array
        (NumPy's convention), Q is never formed.
    precision : str, optional
        Precision of the matrix products (``"auto"``, ``"fp16"``, ``"fp32"``,
        ``"fp32-emulated"``, ``"fp64"``, ``"fp64-emulated"``); ``None`` uses the
        ``mpqr.precision`` context, ``mpqr.set_precision`` or ``MPQR_PRECISION``.
        Non-GEMM arithmetic (norms, reflector generation, the panels' small
        products) runs in the input's working dtype.
    method : str
        ``"auto"`` (chosen from shape, precision and the backend's engines and
        recorded in the explain trace; a single tall-skinny matrix at a
        working-precision setting gets CholQR2, certified; past its reach the
        preconditioned CholQR, and Householder only for numerically rank-deficient
        input — see :func:`choose_method`), ``"householder-recursive"``,
        ``"householder-tiled"``, ``"gram-schmidt-recursive"``, ``"cholqr"``,
        ``"cholqr2"``, ``"shifted-cholqr3"``, ``"preconditioned-cholqr"`` (CholQR's
        passes and certificate up to ``cond(x) ~ u^-1``), ``"sketch-cholqr"`` (a
        CountSketch preconditioner and one CholQR pass, to the same reach; what ``auto``
        continues with where CholQR2's first Cholesky fails on a tall matrix), ``"svqr"``,
        or ``"geqrf"`` (the array
        library's own QR — LAPACK through NumPy, cuSOLVER through CuPy — in the
        input's precision; ``auto`` takes it where mpqr's methods would only add
        passes, see :func:`choose_method`).
    check_finite : bool
        Raise ``ValueError`` if ``x`` holds NaN or Inf. Otherwise they
        propagate (IEEE): the result then contains NaN, never a finite answer.
    overwrite_a : bool
        Allow the Householder methods to use ``x`` as workspace when it already
        has the working dtype (its contents are then destroyed).
    device : {None, "cpu", "cuda", "cuda:<i>"}
        Where a host input (NumPy array, ``numpy.memmap``, or any object with
        ``shape``, ``dtype`` and NumPy-style slicing such as h5py/zarr datasets)
        is factored: ``"cuda"`` on the GPU through CuPy, results returned as host
        arrays; ``None``/``"cpu"``: on the host (NumPy). Device arrays are
        factored where they are. See the Out-of-core page of the documentation.
    out : array or (Q, R) pair of arrays, optional
        Host arrays receiving the results of a host input (``mode="r"``: R
        only; either of the pair may be None), e.g. a writable ``numpy.memmap``,
        so Q never needs to fit in memory twice. Checked (shape, dtype,
        writable) before any work.
    memory_budget : int or str, optional
        Device memory the call may use, in bytes or as ``"2GB"``/``"512MiB"``;
        default ``MPQR_MEMORY_BUDGET``, else 80% of the free device memory (none
        for the host backend). When the working set exceeds it the factorization
        runs out of core: tall-skinny inputs by streaming CholQR2 (TSQR fallback;
        ``mode="r"``: one-pass TSQR), others by block Gram-Schmidt with
        reorthogonalisation over column panels (``method="ooc-recursive"``;
        ``"ooc-blocked"``: the left-looking variant).
        ``mpqr.explain()`` records the route, piece sizes, passes, bytes moved and
        the overlap achieved.
    progress : bool, optional
        A tqdm progress bar for out-of-core runs; None: on for interactive
        terminals and runs expected to take more than a few seconds.
    pivoting : bool or "randomized"
        ``True``: QR with column pivoting as SciPy's ``pivoting=True``:
        ``x[..., :, P] = Q @ R`` with ``abs(diag(R))`` non-increasing exactly
        (``d[..., 1:] <= d[..., :-1]`` for the returned numbers). On NumPy ``P``
        is the greedy order of LAPACK ``geqp3`` (largest remaining column norm
        first, the first of equals) up to rounding, from ``geqp3`` itself; stacks
        and matrices of at most 2**16 entries use column-norm pivoting (the same
        greedy rule) on the array's device. Other single matrices (GPU) take the
        greedy order from pivoted Cholesky of the Gram matrix ``x^H x``
        (:mod:`mpqr.qr.pivoted_gram`): in exact arithmetic the same order, trusted
        while the pivot's squared residual norm is above ``1e3 (sqrt(m) +
        sqrt(n)) u`` times the largest squared column norm; the columns after it
        are ordered again, level by level, from the Gram matrix of their trailing
        block of ``R``. ``P`` is then ``geqp3``'s except where two remaining
        columns' squared residual norms agree to about 1e-3 relative (rounding
        decides between them) and below the factorization's rounding noise. A
        backend may instead take the blocked greedy QRCP
        (:mod:`mpqr.qr.pivoted_exact`, also the fallback) or HQRRP's order (below)
        repaired by exchanges (:mod:`mpqr.qr.pivoted_repair`; ``P`` not
        necessarily ``geqp3``'s); ``explain()`` says which. The permuted matrix is
        factored through the precision policy, and a last pass repairs increases
        of the stored diagonal (rounding: lowered within the backward error;
        larger: two columns exchanged by a Givens rotation).
        ``"randomized"``: the blocked randomized QRCP (HQRRP, a Gaussian sketch
        chooses each block's pivots; :func:`mpqr.qr.pivoted.hqrrp`), for single
        matrices of more than 2**16 entries: rank-revealing (``|R_kk|`` within a
        small factor of ``sigma_k``, the same numerical rank) but ``abs(diag(R))``
        NOT monotone (1500x200 with geometric decay: 48 increases, up to ~1.7x);
        on a shared 2-core CPU, 2000x500 Gaussian: 2.6 s against 12.8 s for
        ``True`` (bench/NOTES.md, 2026-11-28).
        Smaller matrices and stacks take the ``True`` route. Not for out-of-core
        or Dask inputs.
    max_rank : int, optional
        With ``pivoting=True``: stop after this many columns (a truncated
        factorization for low-rank work, ``O(m n k)`` flops): Q is
        ``(m, k)``, R ``(k, n)`` with ``k = min(m, n, max_rank)``, and
        ``x[:, P] - Q @ R`` is the part of ``x`` the kept columns leave out.
    rtol : float, optional
        With ``pivoting=True`` and a single matrix: also stop before the first
        ``k`` with ``|R[k, k]| <= rtol * |R[0, 0]|`` (the numerical rank at that
        tolerance). Neither ``max_rank`` nor ``rtol`` go with
        ``mode="complete"``.

    Returns
    -------
    QRResult or array
        ``QRResult(Q, R)``; for ``mode="r"`` just ``R``. In the caller's
        namespace and on its device. Sign convention: ``diag(R)`` is real and
        >= 0 (this makes Q and R unique for full-rank input; LAPACK/NumPy leave
        the signs arbitrary). With ``pivoting=True``:
        ``PivotedQRResult(Q, R, P)``, for ``mode="r"`` the tuple ``(R, P)``;
        ``P`` is int32 of shape ``(..., n)`` (as SciPy's), the same sign
        convention.

    Raises
    ------
    ValueError
        ``x`` not at least 2-D, an unknown ``mode``/``method``/``precision``,
        NaN/Inf with ``check_finite=True``, a masked array (its mask would be
        ignored), ``max_rank``/``rtol`` without ``pivoting=True``, with
        ``mode="complete"``, or ``rtol`` with a stack.
    TypeError
        ``x`` boolean or not an array.
    mpqr.BreakdownError
        An explicitly requested CholQR-type method cannot factor ``x`` (too
        ill-conditioned); ``method="auto"`` never raises it.
    NotImplementedError
        An emulated precision whose engine the backend lacks; ``pivoting=True``
        for a Dask array or on the out-of-core route.

    Examples
    --------
    >>> import numpy as np, mpqr
    >>> a = np.arange(12.0).reshape(4, 3) + np.eye(4, 3)
    >>> q, r = mpqr.qr(a, precision="fp64")
    >>> bool(np.allclose(q @ r, a)), bool(np.all(np.diag(r) >= 0))
    (True, True)
    >>> q, r, p = mpqr.qr(a, pivoting=True)
    >>> bool(np.allclose(q @ r, a[:, p])), p.dtype.name
    (True, 'int32')
    """
    check_pivoting(pivoting, max_rank, rtol, mode)
    return _route.qr(x, mode, precision, method, check_finite=check_finite,
                     overwrite_a=overwrite_a, device=device, out=out,
                     memory_budget=memory_budget, progress=progress, pivoting=pivoting,
                     max_rank=max_rank, rtol=rtol)


def check_pivoting(pivoting: Any, max_rank: Any, rtol: Any, mode: str) -> None:
    """Validate ``pivoting``, ``max_rank`` and ``rtol`` (naming the argument)."""
    if isinstance(pivoting, str):
        if pivoting != "randomized":
            raise ValueError(f"`pivoting` must be True, False or 'randomized', got {pivoting!r}")
    elif not isinstance(pivoting, bool) and type(pivoting).__name__ != "bool_":
        raise TypeError(f"`pivoting` must be True, False or 'randomized', got {pivoting!r}")
    if max_rank is not None:
        if isinstance(max_rank, bool) or not hasattr(max_rank, "__index__"):
            raise TypeError(f"`max_rank` must be an integer or None, got {max_rank!r}")
        if operator.index(max_rank) < 0:
            raise ValueError(f"`max_rank` must be >= 0, got {max_rank!r}")
    if rtol is not None:
        if isinstance(rtol, bool) or not hasattr(rtol, "__float__") or \
                (hasattr(rtol, "imag") and float(getattr(rtol, "imag", 0)) != 0):
            raise TypeError(f"`rtol` must be a real number or None, got {rtol!r}")
        if not 0.0 <= float(rtol) < math.inf:
            raise ValueError(f"`rtol` must be finite and >= 0, got {rtol!r}")
    if (max_rank is not None or rtol is not None) and not pivoting:
        which = "`max_rank`" if max_rank is not None else "`rtol`"
        raise ValueError(f"{which} truncates a QR with column pivoting: pass pivoting=True")
    if (max_rank is not None or rtol is not None) and mode == "complete":
        raise ValueError("a truncated factorization (`max_rank`/`rtol`) has no complete Q: "
                         "use mode='reduced' or 'r'")
