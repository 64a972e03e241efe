"""The public QR entry point: validate, choose a method, run it (:mod:`mpqr.qr.driver`)."""

from __future__ import annotations

import math
import operator
from typing import Any, NamedTuple

from mpqr._array_api import device
from mpqr._gpu_errors import device_errors
from mpqr._validation import (
    check_choice,
    check_dtype,
    check_ndim,
    namespace_of,
    plain_array,
)
from mpqr._validation import check_finite as _check_finite
from mpqr.backends import bridge, get_backend
from mpqr.backends.dask._detect import is_dask_array
from mpqr.policy import record_event, resolve_precision, validate_precision
from mpqr.qr import driver
from mpqr.qr.choice import choose_method, factor_precision
from mpqr.qr.driver import METHODS

__all__ = ["METHODS", "MODES", "MODE_HINTS", "PivotedQRResult", "QRResult", "choose_method",
           "factor_precision", "qr"]

MODES = ("reduced", "complete", "r")
#: SciPy's names of the modes, answered with mpqr's (mpqr.compat.scipy.qr takes SciPy's)
_SCIPY_MODES = ("SciPy's 'economic' is mpqr's 'reduced' and SciPy's 'full' is 'complete'; "
                "mpqr.compat.scipy.qr takes SciPy's names")
MODE_HINTS = {"economic": _SCIPY_MODES, "full": _SCIPY_MODES}


class QRResult(NamedTuple):
    """``Q`` with orthonormal columns and upper-triangular ``R`` with ``A = Q @ R``."""

    Q: Any
    R: Any


class PivotedQRResult(NamedTuple):
    """``Q``, ``R`` and the column order ``P`` with ``A[..., :, P] = Q @ R``."""

    Q: Any
    R: Any
    P: Any


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
        passes and certificate up to ``cond(x) ~ u^-1``), ``"svqr"``, or ``"geqrf"`` (the array
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
    pivoting : bool
        QR with column pivoting (rank-revealing, SciPy's ``pivoting=True``):
        ``x[..., :, P] = Q @ R`` with ``|diag(R)|`` non-increasing in the
        rank-revealing sense. A single matrix of more than 2**16 entries is
        factored by blocked randomized QRCP (a Gaussian sketch chooses each
        block's pivots; the large products go through the precision policy);
        stacks and smaller matrices by column-norm pivoting (LAPACK's rule)
        followed by the unpivoted QR of the permuted matrix with ``method``.
        See :mod:`mpqr.qr.pivoted` and the "Choosing a method" page. Not for
        out-of-core or Dask inputs.
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
    _check_pivoting(pivoting, max_rank, rtol, mode)
    if pivoting and (is_dask_array(x) or _host_route(x, device, out, memory_budget,
                                                      progress)):
        raise NotImplementedError(
            "qr(pivoting=True) runs on arrays in memory (NumPy, CuPy, ...); it is not "
            "available for Dask arrays, host datasets or with `device`, `out`, "
            "`memory_budget` or `progress`")
    if is_dask_array(x):  # a matrix chunked by rows: the distributed factorization
        from mpqr.backends.dask.qr import qr as dask_qr

        return dask_qr(x, mode, precision, method, check_finite=check_finite,
                       overwrite_a=overwrite_a)
    if bridge.is_foreign(x):  # PyTorch/JAX: DLPack views run on the CuPy or NumPy backend
        extra = dict(pivoting=True, max_rank=max_rank, rtol=rtol) if pivoting else {}
        return bridge.call("qr", qr, (x,), ("x",), mode=mode, precision=precision,
                           method=method, check_finite=check_finite, overwrite_a=overwrite_a,
                           **extra)
    x = plain_array(x, "x")  # numpy.matrix: a plain ndarray (SciPy's rule)
    if _host_route(x, device, out, memory_budget, progress):
        from mpqr.ooc.driver import qr as host_qr

        return host_qr(x, mode, precision, method, device=device, out=out,
                       memory_budget=memory_budget, progress=progress,
                       check_finite=check_finite, overwrite_a=overwrite_a)
    xp = namespace_of(x, names=("x",))
    check_ndim(x, "x", minimum=2, what="2-D or a stack of matrices")
    check_choice(mode, "mode", MODES, MODE_HINTS)
    check_choice(method, "method", ("auto", *sorted(METHODS)))
    if precision is not None:
        validate_precision(precision)
    prec_name, _ = resolve_precision(precision)
    a = check_dtype(xp, x, "x")
    overwrite = bool(overwrite_a) and a is x
    backend = get_backend(xp)
    if check_finite:
        _check_finite(backend, a, "x",
                      message="`x` must not contain infs or NaNs (check_finite=True)")
    *batch, m, n = a.shape
    complete = mode == "complete"
    want_q = mode != "r"
    if prec_name in ("fp16", "fp32-emulated") and "fp16" not in backend.capabilities:
        # checked up front: a single-panel QR would run no GEMM to notice it
        raise NotImplementedError(
            f"precision={prec_name!r} needs a float16 GEMM engine, which the {backend.name} "
            "backend does not provide (it has no float16 GEMM); use 'fp32' or 'fp64'")

    if rtol is not None and batch:
        raise ValueError("`rtol` needs a single matrix (the rank it finds differs across a "
                         f"stack); got x of shape {tuple(a.shape)}: use `max_rank`")
    if pivoting:
        return _qr_pivoted(backend, a, mode=mode, method=method, precision=precision,
                           prec_name=prec_name, max_rank=max_rank, rtol=rtol)

    auto = method == "auto"
    if auto:
        method, why = choose_method(backend, prec_name, a.dtype, m, n, batch=math.prod(batch))
        record_event("method", f"qr: {method} ({why})", method=method, shape=(m, n),
                     batch=math.prod(batch), precision=prec_name)
    else:
        record_event("method", f"qr: {method} (requested)", method=method, shape=(m, n),
                     batch=math.prod(batch), precision=prec_name)

    if m == 0 or n == 0 or math.prod(batch) == 0:
        q, r = driver.empty(xp, a, want_q=want_q, complete=complete)
    else:
        q, r = driver.run(backend, a, method, auto=auto, precision=precision,
                          prec_name=prec_name, want_q=want_q, complete=complete,
                          overwrite=overwrite)
    return QRResult(q, r) if want_q else r


def _check_pivoting(pivoting: Any, max_rank: Any, rtol: Any, mode: str) -> None:
    """Validate ``pivoting``, ``max_rank`` and ``rtol`` (naming the argument)."""
    if not isinstance(pivoting, bool) and type(pivoting).__name__ != "bool_":
        raise TypeError(f"`pivoting` must be True or False, got {pivoting!r}")
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


def _qr_pivoted(backend: Any, a: Any, *, mode: str, method: str, precision: Any,
                prec_name: str, max_rank: Any, rtol: Any) -> Any:
    """``qr(pivoting=True)`` after validation (:mod:`mpqr.qr.pivoted`)."""
    from mpqr.qr.pivoted import qr_pivoted

    xp = backend.xp
    *batch, m, n = a.shape
    complete = mode == "complete"
    want_q = mode != "r"
    max_rank = None if max_rank is None else operator.index(max_rank)
    rtol = None if rtol is None else float(rtol)
    if m == 0 or n == 0 or math.prod(batch) == 0:
        q, r = driver.empty(xp, a, want_q=want_q, complete=complete)
        if max_rank is not None:
            k = min(m, n, max_rank)
            q = None if q is None else q[..., :, :k]
            r = r[..., :k, :]
        p = xp.broadcast_to(xp.arange(n, dtype=xp.int32, device=device(a)), (*batch, n))
        p = xp.asarray(p, copy=True)
    else:
        def factor(ap: Any) -> tuple[Any, Any]:
            mth, auto = method, method == "auto"
            if auto:
                mth, why = choose_method(backend, prec_name, ap.dtype, m, n,
                                         batch=math.prod(batch))
                record_event("method", f"qr: {mth} ({why}) of the permuted matrix",
                             method=mth, shape=(m, n), batch=math.prod(batch),
                             precision=prec_name)
            return driver.run(backend, ap, mth, auto=auto, precision=precision,
                              prec_name=prec_name, want_q=want_q, complete=complete,
                              overwrite=True)

        with device_errors(backend, "mpqr.qr"):
            q, r, p = qr_pivoted(backend, a, factor=factor, precision=precision,
                                 prec_name=prec_name, want_q=want_q, complete=complete,
                                 max_rank=max_rank, rtol=rtol)
    return PivotedQRResult(q, r, p) if want_q else (r, p)


def _host_route(x: Any, device: Any, out: Any, memory_budget: Any, progress: Any) -> bool:
    """Whether ``x`` goes to the host-array driver (:mod:`mpqr.ooc.driver`): a host
    input with any of the device keywords, or a host dataset that is no Array API
    array (h5py, zarr). Device arrays with ``out=`` are refused."""
    from mpqr._array_api import is_array_api_obj
    from mpqr.backends.host import is_host_array

    given = device is not None or out is not None or memory_budget is not None or \
        progress is not None
    if not is_host_array(x) or getattr(x, "ndim", len(getattr(x, "shape", ()))) != 2:
        if out is not None and not is_array_api_obj(x):
            return False  # namespace_of names the bad argument
        if out is not None:
            raise TypeError("`out` is for host inputs (NumPy arrays, memmaps, datasets); "
                            f"got x of type {type(x).__module__}.{type(x).__qualname__}")
        return False
    if given:
        from mpqr.ooc.driver import check_device_args

        check_device_args(device, memory_budget, progress)
        return True
    return not is_array_api_obj(x)
