"""The public QR entry point: validate, pick a method, dispatch, normalise signs."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Any, NamedTuple

from mpqr._array_api import device
from mpqr._errors import BreakdownError
from mpqr._gpu_errors import device_errors
from mpqr._validation import (
    check_choice,
    check_dtype,
    check_ndim,
    namespace_of,
)
from mpqr._validation import check_finite as _check_finite
from mpqr.backends import get_backend
from mpqr.policy import gemm, record_event, resolve_precision, validate_precision
from mpqr.qr._kernels import (
    column_exponents,
    ct,
    eye_like,
    in_safe_range,
    normalize_signs,
    pow2_scale,
    safe_exponent,
    scale_columns,
)

__all__ = ["METHODS", "MODES", "QRResult", "factor_precision", "qr"]

MODES = ("reduced", "complete", "r")


class QRResult(NamedTuple):
    """``Q`` with orthonormal columns and upper-triangular ``R`` with ``A = Q @ R``."""

    Q: Any
    R: Any


def _householder_tiled(backend, a, **kw):
    from mpqr.qr.householder_tiled import householder_tiled

    return householder_tiled(backend, a, **kw)


def _householder_recursive(backend, a, **kw):
    from mpqr.qr.householder_recursive import householder_recursive

    return householder_recursive(backend, a, **kw)


def _gram_schmidt_recursive(backend, a, **kw):
    from mpqr.qr.gram_schmidt_recursive import gram_schmidt_recursive

    return gram_schmidt_recursive(backend, a, **kw)


def _cholqr(name):
    def run(backend, a, **kw):
        from mpqr.qr import cholqr as c

        return {"cholqr": c.cholqr, "cholqr2": c.cholqr2,
                "shifted-cholqr3": c.shifted_cholqr3}[name](backend, a, **kw)

    return run


def _geqrf(backend, a, *, precision, prec_name, want_q, complete, overwrite):
    # the backend library's blocked Householder QR; it runs in the input's precision
    q, r = backend.library_qr(a, "complete" if complete else ("reduced" if want_q else "r"))
    return q, r[..., :a.shape[-1], :]  # complete: R's zero rows are added by the caller


def _svqr(backend, a, **kw):
    from mpqr.qr.svqr import svqr

    return svqr(backend, a, **kw)


#: method name -> implementation ``f(backend, a, *, precision, prec_name, want_q,
#: complete, overwrite) -> (Q or None, R)`` for ``m >= n`` (before sign normalisation).
METHODS: dict[str, Callable[..., tuple[Any, Any]]] = {
    "householder-recursive": _householder_recursive,
    "householder-tiled": _householder_tiled,
    "gram-schmidt-recursive": _gram_schmidt_recursive,
    "cholqr": _cholqr("cholqr"),
    "cholqr2": _cholqr("cholqr2"),
    "shifted-cholqr3": _cholqr("shifted-cholqr3"),
    "svqr": _svqr,
    "geqrf": _geqrf,
}

#: methods that build an orthonormal basis of the columns only (no complete Q).
_THIN_ONLY: set[str] = {"gram-schmidt-recursive", "cholqr", "cholqr2", "shifted-cholqr3",
                        "svqr"}


#: methods whose R has a real, positive diagonal by construction (Cholesky factors and
#: their products): no sign test (a reduction and a host sync; its removal measured
#: within run-to-run noise on an H100, bench/NOTES.md session 14) and no pass over Q
_POSITIVE_DIAGONAL: frozenset[str] = frozenset({"cholqr", "cholqr2", "shifted-cholqr3"})


def register_method(name: str, func: Callable[..., tuple[Any, Any]], *,
                    thin_only: bool = False) -> None:
    """Add a QR method to :data:`METHODS` (used by the method modules)."""
    METHODS[name] = func
    if thin_only:
        _THIN_ONLY.add(name)


#: ``method="auto"`` takes CholQR2 for single matrices with ``m >= TALL_RATIO * n``
TALL_RATIO = 16
#: precisions whose Gram matrix is formed in the working precision (the certificate's
#: threshold assumes it); fp16 and fp32-emulated run CholQR2 in the input's own instead
_CHOLQR_PRECISIONS = ("auto", "fp32", "fp64", "fp64-emulated")
#: precisions whose tall-skinny QR runs CholQR2 in the input's own precision instead (its
#: fp16-based Gram matrices would square the condition number at 11 bits)
_OWN_PRECISION_CHOLQR = ("fp16", "fp32-emulated")
#: precisions whose engines keep the input's exponent range (native GEMMs, or the INT8
#: Ozaki engine's exact per-line scaling): no fp16 range to respect, so columns are
#: scaled only where a Gram matrix or a norm could over- or underflow
_NATIVE_PRECISIONS = ("auto", "fp32", "fp64", "fp64-emulated")


def _in_working_precision(backend: Any, prec_name: str, dtype: Any) -> bool:
    """Whether ``prec_name`` asks for nothing but the input dtype's own arithmetic
    (fp64-emulated included: it runs native DGEMM wherever emulation does not pay)."""
    xp = backend.xp
    double = dtype in (xp.float64, xp.complex128)
    single = dtype in (xp.float32, xp.complex64)
    return (prec_name == "auto" or (prec_name in ("fp64", "fp64-emulated") and double)
            or (prec_name == "fp32" and single))


def _own_precision(backend: Any, dtype: Any) -> str:
    """The precision name of the input dtype's own arithmetic (``fp32`` or ``fp64``)."""
    xp = backend.xp
    return "fp32" if dtype in (xp.float32, xp.complex64) else "fp64"


def factor_precision(backend: Any, prec_name: str, dtype: Any, m: int, n: int, *,
                     batch: int = 1) -> str:
    """The precision ``qr(method="auto")`` factors an ``m x n`` input at: the input's own
    (``fp32``/``fp64``) where :func:`choose_method` gives an ``fp16``/``fp32-emulated``
    request to CholQR2 or the library's QR in it, else ``prec_name``. ``mpqr.lstsq``
    sizes its rank decisions and Gram route by it."""
    if prec_name not in _OWN_PRECISION_CHOLQR or 0 in (m, n):
        return prec_name
    return _precision_of(backend, prec_name, dtype,
                         choose_method(backend, prec_name, dtype, m, n, batch=batch)[0])


def _precision_of(backend: Any, prec_name: str, dtype: Any, method: str) -> str:
    """The precision an auto-chosen ``method`` factors a ``prec_name`` request at."""
    if prec_name in _OWN_PRECISION_CHOLQR and method in ("cholqr2", "geqrf"):
        return _own_precision(backend, dtype)
    return prec_name


def _covers_precision(backend: Any, prec_name: str, dtype: Any) -> bool:
    """Whether the input dtype's own arithmetic is at least as accurate as ``prec_name``."""
    xp = backend.xp
    if dtype in (xp.float64, xp.complex128):
        return True
    return dtype in (xp.float32, xp.complex64) and prec_name in ("fp16", "fp32-emulated",
                                                                 "fp32", "auto")


def choose_method(backend: Any, prec_name: str, dtype: Any, m: int, n: int, *,
                  batch: int = 1) -> tuple[str, str]:
    """``(method, reason)`` for ``method="auto"``.

    A single tall-skinny matrix (``m >= 16 n``) at a working-precision setting
    takes CholQR2 when the policy runs its Gram product natively or on the
    fp64-accurate INT8 Ozaki engine: four passes
    over ``x`` that are all memory-bound GEMM-like sweeps, versus Householder's
    ``n`` dependent column steps. CholQR2's reach depends on ``cond(x)``, so its
    second Gram matrix certifies the result (``||Q1^H Q1 - I||_F <= 1/2``) and
    ``qr`` falls back to ``householder-tiled`` when it does not (explain shows it).

    A single tall-skinny matrix at ``fp16`` or ``fp32-emulated`` takes CholQR2 in the
    input's own precision (float32: fp32, float64: fp64), which is at least as
    accurate and an order of magnitude faster than the tensor-core recursion there
    (its leaf panels factor all ``m`` rows); if the certificate fails,
    ``qr`` runs what the requested precision would have run otherwise (the recursion
    where the backend has tensor cores).

    Small tall-skinny matrices in their own working precision, or at ``fp16`` /
    ``fp32-emulated`` (at most ``backend.library_qr_tall_max`` elements), take
    ``geqrf`` first: CholQR2's n x n steps cost more than their data.

    Otherwise a single matrix in its own working precision whose top-level update the
    policy runs natively takes ``geqrf``, the array library's QR (LAPACK, cuSOLVER):
    mpqr's Householder methods would run the same native GEMMs with more passes.

    Otherwise Leng et al., Algorithm 1:

    A single matrix that is not tall-skinny, of at most ``backend.library_qr_square_max``
    elements, takes ``geqrf`` in the input's own precision where the recursion below
    would run, if that precision is at least the one asked for: at that size the
    recursion's leaf panels and launches cost more than its tensor cores save.

    Recursive Householder when the backend has tensor-core engines and the
    policy would run this factorization's largest product — the top-level
    update, ``(n/2) x (n/2)`` with inner dimension ``m`` — on one of them
    (``fp16``, ``fp32-emulated``, and ``fp64-emulated`` or ``auto`` where the
    cost model picks the INT8 Ozaki / tc-sgemm engine): their speed depends on
    shape and the recursion makes the big GEMMs square. Tiled otherwise
    (native GEMMs are not shape-sensitive). Both are unconditionally stable;
    SVQR is never chosen automatically.
    """
    from mpqr.policy import as_gemm_options, decide

    if (batch == 1 and m >= TALL_RATIO * n and m * n <= backend.library_qr_tall_max
            and (_in_working_precision(backend, prec_name, dtype)
                 or prec_name in _OWN_PRECISION_CHOLQR)):
        return ("geqrf",
                f"small tall-skinny ({m}x{n} <= {backend.library_qr_tall_max} elements) at "
                f"precision={prec_name!r}: the backend library's QR (LAPACK / cuSOLVER geqrf) "
                "beats CholQR2, whose n x n steps cost more than the data here (H100, "
                "2048x128: 1.9 ms against 3.5 ms)")
    if batch == 1 and m >= TALL_RATIO * n and prec_name in _CHOLQR_PRECISIONS:
        engine = decide(backend, dtype, n, n, m, 1, prec_name, "qr",
                        as_gemm_options(None)).engine
        # the INT8 Ozaki engine is fp64-accurate (error <= 2x DGEMM's): its Gram matrix
        # is as good as a native one (65536 x 4096 fp64-emulated fell to Householder:
        # 1076 ms against 142 ms for CholQR2 at fp64, H100)
        if engine.startswith("native") or engine == "ozaki-int8":
            return ("cholqr2",
                    f"tall-skinny (m >= {TALL_RATIO} n) at precision={prec_name!r}: CholQR2, "
                    "four memory-bound passes over x, certified orthonormal by its second "
                    "Gram matrix; falls back to householder-tiled if the certificate fails")
    if batch == 1 and m >= TALL_RATIO * n and prec_name in _OWN_PRECISION_CHOLQR:
        own = _own_precision(backend, dtype)
        return ("cholqr2",
                f"tall-skinny (m >= {TALL_RATIO} n) at precision={prec_name!r}: CholQR2 in the "
                f"input's own, at least as accurate precision ({own}), four memory-bound "
                "passes over x, beats the tensor-core recursion, whose leaf panels "
                "factor all m rows (H100, 2^20x256 float32: 14 ms against 199 ms at fp16, "
                "65536x4096: 149 against 253 ms); if its certificate fails, what "
                f"precision={prec_name!r} runs otherwise (the fallback event names it)")
    # the engine of the largest product, the top-level update (n/2 x n/2, inner dim. m)
    h = n // 2
    try:
        engine = decide(backend, dtype, h, n - h, m, 1, prec_name, "qr",
                        as_gemm_options(None)).engine
    except NotImplementedError:  # e.g. complex with an emulated precision: qr() reports it
        engine = "native"
    if (batch == 1 and engine.startswith("native")
            and _in_working_precision(backend, prec_name, dtype)):
        return ("geqrf",
                f"precision={prec_name!r} runs every product natively ({engine}) and the "
                "matrix is not tall-skinny: the backend library's blocked Householder QR "
                "(LAPACK / cuSOLVER geqrf) does the same work in fewer passes (H100, "
                "16384^2 fp64: 505 ms against 731 ms for householder-tiled)")
    if n <= 32:
        return "householder-tiled", f"n={n} fits one panel: Householder panel QR directly"
    if "tensor-cores" not in backend.capabilities:
        return "householder-tiled", "the backend has no tensor-core engines: fixed-width panels"
    if not engine.startswith("native"):
        cut = backend.library_qr_square_max_by_precision.get(
            prec_name, backend.library_qr_square_max)
        if (batch == 1 and m < TALL_RATIO * n and m * n <= cut
                and _covers_precision(backend, prec_name, dtype)):
            return ("geqrf",
                    f"{m}x{n} <= {cut} elements at "
                    f"precision={prec_name!r}: the backend library's QR in the input's own, "
                    "at least as accurate precision beats the tensor-core recursion, whose "
                    "leaf panels and launches do not amortise at this size (H100, " + (
                        "8192^2 fp16: 98 ms against 140 ms; from 16384^2 the recursion "
                        "wins, 371 against 490 ms)" if cut == backend.library_qr_square_max
                        else f"the {prec_name} recursion was no faster up to this size; "
                        "fp64-emulated: 0.97x cuSOLVER at 16384^2, 1.01-1.06x from 24576^2)"))
        return ("householder-recursive",
                f"precision={prec_name!r} runs the {h}x{n - h}x{m} update on {engine}, a "
                "tensor-core engine, which is shape-sensitive: recursion gives square GEMMs")
    return ("householder-tiled",
            f"precision={prec_name!r} runs native GEMMs ({engine}), which are not "
            "shape-sensitive: fixed-width panels")


def qr(x: Any, mode: str = "reduced", precision: str | None = None, method: str = "auto", *,
       check_finite: bool = False, overwrite_a: bool = False) -> Any:
    """QR factorization ``x = Q @ R`` of a matrix or a stack of matrices.

    Parameters
    ----------
    x : array, shape (..., m, n)
        Input of any Array API library (NumPy, CuPy, ...). Integers are cast to
        float64, float16 to float32; complex inputs are factored natively.
        ``x`` is never modified unless ``overwrite_a=True``.
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
        working-precision setting gets CholQR2, certified, with a Householder
        fallback — see :func:`choose_method`), ``"householder-recursive"``,
        ``"householder-tiled"``, ``"gram-schmidt-recursive"``, ``"cholqr"``,
        ``"cholqr2"``, ``"shifted-cholqr3"``, ``"svqr"``, or ``"geqrf"`` (the array
        library's own QR — LAPACK through NumPy, cuSOLVER through CuPy — in the
        input's precision; ``auto`` takes it where mpqr's methods would only add
        passes, see :func:`choose_method`).
    check_finite : bool
        Raise ``ValueError`` if ``x`` holds NaN or Inf. Otherwise they
        propagate (IEEE): the result then contains NaN, never a finite answer.
    overwrite_a : bool
        Allow the Householder methods to use ``x`` as workspace when it already
        has the working dtype (its contents are then destroyed).

    Returns
    -------
    QRResult or array
        ``QRResult(Q, R)``; for ``mode="r"`` just ``R``. In the caller's
        namespace and on its device. Sign convention: ``diag(R)`` is real and
        >= 0 (this makes Q and R unique for full-rank input; LAPACK/NumPy leave
        the signs arbitrary).

    Raises
    ------
    ValueError
        ``x`` not at least 2-D, an unknown ``mode``/``method``/``precision``, or
        NaN/Inf with ``check_finite=True``.
    TypeError
        ``x`` boolean or not an array.
    mpqr.BreakdownError
        An explicitly requested CholQR-type method cannot factor ``x`` (too
        ill-conditioned); ``method="auto"`` never raises it.
    NotImplementedError
        Complex input with an emulated precision or a real-only method.

    Examples
    --------
    >>> import numpy as np, mpqr
    >>> a = np.arange(12.0).reshape(4, 3) + np.eye(4, 3)
    >>> q, r = mpqr.qr(a, precision="fp64")
    >>> bool(np.allclose(q @ r, a)), bool(np.all(np.diag(r) >= 0))
    (True, True)
    """
    xp = namespace_of(x, names=("x",))
    check_ndim(x, "x", minimum=2, what="2-D or a stack of matrices")
    check_choice(mode, "mode", MODES)
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
    if xp.isdtype(a.dtype, "complex floating") and prec_name in (
            "fp16", "fp32-emulated", "fp64-emulated"):
        raise NotImplementedError(
            f"precision={prec_name!r} is not supported for complex input ({a.dtype}): the "
            "emulated engines are real-only; use precision 'auto', 'fp32' or 'fp64'"
        )
    if prec_name in ("fp16", "fp32-emulated") and "fp16" not in backend.capabilities:
        # checked up front: a single-panel QR would run no GEMM to notice it
        raise NotImplementedError(
            f"precision={prec_name!r} needs a float16 GEMM engine, which the {backend.name} "
            "backend does not provide (it has no float16 GEMM); use 'fp32' or 'fp64'")

    auto = method == "auto"
    if auto:
        method, why = choose_method(backend, prec_name, a.dtype, m, n, batch=math.prod(batch))
        record_event("method", f"qr: {method} ({why})", method=method, shape=(m, n),
                     batch=math.prod(batch), precision=prec_name)
    else:
        record_event("method", f"qr: {method} (requested)", method=method, shape=(m, n),
                     batch=math.prod(batch), precision=prec_name)

    if m == 0 or n == 0 or math.prod(batch) == 0:
        return _empty(xp, a, mode)

    kw = dict(precision=precision, prec_name=prec_name, want_q=want_q, complete=complete,
              overwrite=overwrite)
    fallback, fallback_kw = "householder-tiled", kw
    own = _precision_of(backend, prec_name, a.dtype, method) if auto else prec_name
    if own != prec_name:
        # the input's own precision (choose_method says why): no scaling pass for an fp16
        # range it will not use; CholQR2's fallback is what the requested precision would
        # have run without the tall-skinny rule
        kw = {**kw, "precision": own, "prec_name": own}
        if n > 32 and "tensor-cores" in backend.capabilities:
            fallback = "householder-recursive"
    # auto's CholQR2 checks the range itself (its Gram diagonal holds the squared column
    # norms: overflow or underflow raise BreakdownError), so the pass computing column
    # maxima is saved; the fallback below scales as usual
    unscaled = auto and method == "cholqr2" and kw["prec_name"] in _NATIVE_PRECISIONS
    with device_errors(backend, "mpqr.qr"):
        try:
            with backend.ignore_fp_warnings() if unscaled else contextlib.nullcontext():
                q, r = _factor(backend, method, a, scale=not unscaled, **kw)
        except BreakdownError as exc:
            if not auto:
                raise
            record_event("fallback", f"qr: {method} broke down (estimated cond(x) >= "
                         f"{exc.cond_estimate:.2e}); falling back to {fallback} at "
                         f"precision={prec_name!r}", method=method, fallback=fallback,
                         cond_estimate=exc.cond_estimate, reason=str(exc))
            q, r = _factor(backend, fallback, a, **fallback_kw)
    if not want_q:
        return r
    return QRResult(q, r)


def _factor(backend: Any, method: str, a: Any, *, precision: Any, prec_name: str,
            want_q: bool, complete: bool, overwrite: bool, scale: bool = True
            ) -> tuple[Any, Any]:
    """Run one method on any shape; returns sign-normalised ``(Q or None, R)``.

    Columns are first scaled by exact powers of two (see
    :func:`~mpqr.qr._kernels.scale_columns`) and R's columns unscaled at the end;
    at native precisions only when some column's magnitude could over- or
    underflow a Gram matrix or a norm (the scaling pass costs a read and a write
    of ``x``).
    """
    only_if_needed = prec_name in _NATIVE_PRECISIONS
    if scale and only_if_needed and method == "geqrf":
        # The library's QR is queued first and the range checked after it, so one host
        # sync serves both (on a GPU the check alone cost ~0.3 ms per call before the
        # QR could start). Out of range (rare): the unscaled result is dropped and the
        # scaled path below runs, as it would have at once.
        with backend.ignore_fp_warnings():
            q, r = _factor_scaled(backend, method, a, precision=precision,
                                  prec_name=prec_name, want_q=want_q, complete=complete,
                                  overwrite=False, check_signs=False)
            e = column_exponents(backend, a)
        if in_safe_range(backend.xp, a, e, single=prec_name == "fp32"):
            return q, r
        del q, r
        lim = safe_exponent(backend.xp, a, single=prec_name == "fp32")
        record_event("scale", f"qr: a column's largest entry is above 2^{lim} or below "
                     f"2^-{lim}: the library's QR runs again on columns scaled by powers "
                     "of two", method=method)
    a2, e = scale_columns(backend, a, only_if_needed=only_if_needed,
                          single=prec_name == "fp32") if scale else (a, None)
    q, r = _factor_scaled(backend, method, a2, precision=precision, prec_name=prec_name,
                          want_q=want_q, complete=complete,
                          overwrite=overwrite or a2 is not a,  # a scaled copy is ours
                          check_signs=method != "geqrf")
    return q, (r if e is None else pow2_scale(backend, r, e))


def _factor_scaled(backend: Any, method: str, a: Any, *, precision: Any, prec_name: str,
                   want_q: bool, complete: bool, overwrite: bool, check_signs: bool = True
                   ) -> tuple[Any, Any]:
    """One method on the (scaled) input, signs normalised; ``check_signs=False`` for
    the library's QR, whose diagonal signs are mixed (see ``normalize_signs``)."""
    xp = backend.xp
    func = METHODS[method]
    *batch, m, n = a.shape

    def signs(q: Any, r: Any) -> tuple[Any, Any]:
        if method in _POSITIVE_DIAGONAL:
            return q, r
        return normalize_signs(xp, q, r, check=check_signs)

    if m < n:
        # wide: factor the leading m x m block, then R2 = Q^H A2
        q, r1 = signs(*func(backend, a[..., :, :m], precision=precision,
                            prec_name=prec_name, want_q=True, complete=False,
                            overwrite=False))
        r2 = gemm(ct(xp, q), a[..., :, m:], precision=precision, label="qr-wide-QhA2",
                  backend=backend)
        return q, xp.concat([r1, r2], axis=-1)
    if complete and method in _THIN_ONLY:
        q, r = _complete_from_thin(backend, func, a, precision, prec_name)
    else:
        q, r = func(backend, a, precision=precision, prec_name=prec_name, want_q=want_q,
                    complete=complete, overwrite=overwrite)
    if complete and m > n:
        r = xp.concat([r, xp.zeros((*batch, m - n, n), dtype=r.dtype, device=device(r))],
                      axis=-2)
    return signs(q, r)


def _empty(xp: Any, a: Any, mode: str) -> Any:
    *batch, m, n = a.shape
    k = min(m, n)
    dev = device(a)
    if mode == "complete":
        q = eye_like(xp, tuple(batch), m, m, a.dtype, dev) if math.prod(batch) else \
            xp.zeros((*batch, m, m), dtype=a.dtype, device=dev)
        return QRResult(q, xp.zeros((*batch, m, n), dtype=a.dtype, device=dev))
    r = xp.zeros((*batch, k, n), dtype=a.dtype, device=dev)
    if mode == "r":
        return r
    return QRResult(xp.zeros((*batch, m, k), dtype=a.dtype, device=dev), r)


def _complete_from_thin(backend: Any, func: Callable[..., Any], a: Any, precision: Any,
                        prec_name: str) -> tuple[Any, Any]:
    """Complete Q for methods that only give an orthonormal basis of the columns.

    Factor ``[Q1 | 0]`` completed by Householder: the complement of ``Q1`` comes
    from the complete Householder QR of ``Q1`` itself.
    """
    from mpqr.qr.householder_tiled import householder_tiled

    xp = backend.xp
    q1, r = func(backend, a, precision=precision, prec_name=prec_name, want_q=True,
                 complete=False, overwrite=False)
    qc, _ = householder_tiled(backend, q1, precision=precision, prec_name=prec_name,
                              want_q=True, complete=True)
    n = a.shape[-1]
    return xp.concat([q1, qc[..., :, n:]], axis=-1), r
