"""SciPy's ``scipy.linalg.lstsq`` conventions, written once for any namespace.

Everything here is bookkeeping copied from SciPy 1.17 (``scipy/linalg/_basic.py``
and ``scipy/linalg/blas.py``): which dtype LAPACK would compute in, the exact
error messages, the empty-input answers and the shapes of ``residues``. One rule
follows the installed SciPy, since 1.18 changed it: a rank-deficient overdetermined
problem gets NaN ``residues`` there, an empty array before
(:func:`nan_residues_when_rank_deficient`).
"""

from __future__ import annotations

import functools
import itertools
import math
import re
import struct
from importlib import metadata
from typing import Any

from mpqr._array_api import array_namespace, device, is_numpy_namespace

__all__ = [
    "DRIVERS",
    "apply_over_batch",
    "check_driver",
    "check_negative_cond",
    "check_shapes",
    "common_type",
    "cutoff",
    "empty_result",
    "lapack_dtype",
    "lstsq_dtype",
    "nan_residues_when_rank_deficient",
    "real_dtype",
    "residues",
    "residues_empty",
    "scipy_1_18_results",
    "scipy_rank",
]

#: The LAPACK drivers SciPy accepts (``gelsd`` is its default).
DRIVERS = ("gelsd", "gelsy", "gelss")


def _score(xp: Any, dt: Any) -> int:
    # scipy.linalg.blas._type_score: small ints, bool and float16 go to float32;
    # clongdouble to complex128 and longdouble to float64 (no LAPACK type of their own)
    if dt == xp.complex64:
        return 3
    if xp.isdtype(dt, "complex floating"):
        return 4
    small = [xp.bool, xp.int8, xp.uint8, xp.int16, xp.uint16, xp.float32]
    if hasattr(xp, "float16"):
        small.append(xp.float16)
    if any(dt == s for s in small):
        return 1
    return 2


def lapack_dtype(xp: Any, *dtypes: Any) -> Any:
    """The dtype ``get_lapack_funcs`` picks for arrays of these dtypes."""
    scores = [_score(xp, dt) for dt in dtypes]
    best = max(scores)
    if best == 3 and 2 in scores:  # float64 with complex64 -> complex128
        best = 4
    return {1: xp.float32, 2: xp.float64, 3: xp.complex64, 4: xp.complex128}[best]


def lstsq_dtype(xp: Any, *dtypes: Any) -> Any:
    """The dtype SciPy's lstsq solves in: LAPACK's pick (:func:`lapack_dtype`); from SciPy
    1.18 on (its ``_ensure_dtype_cdsz``, the inputs' common type first) float64 where no
    input is floating, small integers and bool included (LAPACK's pick: float32)."""
    if scipy_1_18_results() and not any(
            xp.isdtype(dt, ("real floating", "complex floating")) for dt in dtypes):
        return xp.float64
    return lapack_dtype(xp, *dtypes)


def common_type(xp: Any, *dtypes: Any) -> Any:
    """``numpy.common_type`` (used by SciPy for empty problems): integers count as
    float64, float16 and longdouble stay themselves, complex wins."""
    best, bits = None, -1
    for dt in dtypes:
        if dt == xp.bool:
            raise TypeError("can't get common type for non-numeric array")
        f, nb = (xp.float64, 64) if xp.isdtype(dt, "integral") else (dt, xp.finfo(dt).bits)
        if nb > bits:
            best, bits = f, nb
    if any(xp.isdtype(dt, "complex floating") for dt in dtypes) and \
            not xp.isdtype(best, "complex floating"):
        best = xp.result_type(best, xp.complex64)  # its complex counterpart
    return best


def real_dtype(xp: Any, dt: Any) -> Any:
    if dt == xp.complex128:
        return xp.float64
    if dt == xp.complex64:
        return xp.float32
    return dt


def check_driver(driver: Any) -> str:
    """SciPy's validation of ``lapack_driver`` (``None`` is ``'gelsd'``)."""
    if driver is None:
        driver = "gelsd"
    if driver not in DRIVERS:
        raise ValueError(f'LAPACK driver "{driver}" is not found')
    return driver


def cutoff(cond: float | None, driver: str, eps: float, single: bool) -> float:
    """The relative rank cutoff ``r`` (singular values ``<= r * s[0]`` count as zero) that
    SciPy's LAPACK ``driver`` applies for ``cond`` (validated: None or finite); ``eps``:
    the machine epsilon of the computation dtype (``numpy.finfo(dtype).eps``), ``single``:
    whether that dtype is single precision.

    ``None`` is SciPy's ``eps``. SciPy hands ``cond`` to LAPACK in the computation's
    precision (rounded to float32 for single precision), and the drivers read it so:

    * ``gelsd`` (xLALSD): ``cond <= 0`` or ``cond >= 1`` mean LAPACK's ``EPSILON``,
      the unit roundoff ``eps / 2`` (2^-53 in double precision);
    * ``gelss``: ``cond < 0`` means LAPACK's ``PRECISION``, ``eps``; ``0`` counts every
      nonzero singular value, ``cond >= 1`` none;
    * ``gelsy`` (no singular values; its incremental condition estimate accepts every
      column for ``cond <= 0``): ``cond <= 0`` counts every nonzero singular value.
    """
    if cond is None:
        return eps
    cond = float(cond)
    if single:  # float32 rounding: a tiny cond becomes 0.0, a huge one inf
        try:
            cond = struct.unpack("f", struct.pack("f", cond))[0]
        except OverflowError:
            cond = math.copysign(math.inf, cond)
    if driver == "gelsd" and (cond <= 0.0 or cond >= 1.0):
        return eps / 2
    if driver == "gelss" and cond < 0.0:
        return eps
    if driver == "gelsy" and cond <= 0.0:
        return 0.0
    return cond


def check_shapes(a: Any, b: Any) -> None:
    """SciPy's shape checks for one (unbatched) problem, with its messages."""
    if a.ndim != 2:
        raise ValueError("Input array a should be 2D")
    if b.ndim == 0:
        raise ValueError("`b` must be 1-D or 2-D with as many rows as `a`, got a 0-D array")
    if a.shape[0] != b.shape[0]:
        raise ValueError("Shape mismatch: a and b should have the same number"
                         f" of rows ({a.shape[0]} != {b.shape[0]}).")


def empty_result(xp: Any, a: Any, b: Any) -> tuple[Any, Any, int, Any]:
    """SciPy's answer when ``M == 0`` or ``N == 0`` (LAPACK is not called): ``x`` in
    ``numpy.common_type`` of the inputs, from SciPy 1.18 on of the inputs cast to
    :func:`lstsq_dtype` (which they are before it answers)."""
    n = a.shape[1]
    dev = device(a)
    if scipy_1_18_results():
        dt = lstsq_dtype(xp, a.dtype, b.dtype)
        b = b if b.dtype == dt else xp.astype(b, dt)
    else:
        dt = common_type(xp, a.dtype, b.dtype)
    x = xp.zeros((n, *b.shape[1:]), dtype=dt, device=dev)
    if n == 0:
        bf = b if xp.isdtype(b.dtype, ("real floating", "complex floating")) else \
            xp.astype(b, xp.float64)
        res = xp.asarray(xp.linalg.vector_norm(bf, axis=0) ** 2)  # 0-D array, not a scalar
    else:
        res = xp.empty((0,), dtype=xp.float64, device=dev)
    return x, res, 0, xp.empty((0,), dtype=xp.float64, device=dev)


def check_negative_cond(cond: float | None) -> None:
    """SciPy >= 1.18 refuses a negative ``cond`` (its lstsq raises ``ValueError:
    Expected rcond >= 0.``); before, LAPACK read it as its default. Follow the installed
    SciPy."""
    if cond is not None and cond < 0 and scipy_1_18_results():
        raise ValueError(f"`cond` must be >= 0 or None, got {cond!r} (as the installed "
                         "SciPy's lstsq requires: Expected rcond >= 0.)")


def scipy_1_18_results() -> bool:
    """Whether the installed SciPy returns lstsq's results as 1.18 does: full-rank
    ``residues`` in ``x``'s dtype (complex stays complex; before: real) and ``rank`` as a
    NumPy integer (before: a Python int). The same release as the NaN rule below."""
    return nan_residues_when_rank_deficient()


def scipy_rank(x: Any, rank: Any, *, empty: bool) -> Any:
    """``rank`` as the installed SciPy's lstsq gives it for a result ``x``: a NumPy
    ``int64`` from SciPy 1.18 on for a non-empty single problem on the host (before, and
    for an empty ``a``, a Python int); other libraries' results and batched ranks (already
    arrays) as they are."""
    if type(rank) is not int or empty or not scipy_1_18_results():
        return rank
    xp = array_namespace(x)
    if not is_numpy_namespace(xp):
        return rank
    return xp.asarray(rank, dtype=xp.int64)[()]


@functools.cache
def nan_residues_when_rank_deficient() -> bool:
    """Whether the installed SciPy (>= 1.18) returns NaN ``residues`` of the full-rank
    shape (not an empty array) when an overdetermined problem is rank deficient and the
    driver is ``gelsd``/``gelss``: "a non-empty residual is always returned ... set to
    NaN" (SciPy 1.18.0 release notes). Read from the package metadata, so SciPy itself
    is not imported."""
    try:
        found = re.match(r"(\d+)\.(\d+)", metadata.version("scipy"))
    except metadata.PackageNotFoundError:  # pragma: no cover - SciPy is a dependency
        return False
    return found is not None and (int(found[1]), int(found[2])) >= (1, 18)


def residues(xp: Any, rsq: Any, x_dtype: Any, *, m: int, n: int, rank: int, driver: str,
             vec: bool, k: int, dev: Any) -> Any:
    """SciPy's ``residues`` from the squared column norms ``rsq`` of ``b - a x`` (or None):
    0-D for 1-D ``b``, when ``M > N`` and the rank is full, real in ``x``'s precision
    (SciPy <= 1.17) or in ``x``'s dtype, complex staying complex (SciPy >= 1.18); NaN
    of that shape for a rank-deficient ``M > N`` problem under SciPy >= 1.18; otherwise
    empty. ``gelsy`` returns none."""
    if m > n and rank == n and driver != "gelsy" and rsq is not None:
        want = x_dtype if scipy_1_18_results() else real_dtype(xp, x_dtype)
        if rsq.dtype != want:
            rsq = xp.astype(rsq, want)
        return xp.reshape(rsq, ()) if vec else rsq
    if m > n and rank < n and driver != "gelsy" and nan_residues_when_rank_deficient():
        return xp.full(() if vec else (k,), float("nan"), dtype=x_dtype, device=dev)
    return residues_empty(xp, x_dtype, dev)


def residues_empty(xp: Any, dtype: Any, dev: Any) -> Any:
    """SciPy's empty ``residues``: shape (0,), the dtype of ``x`` (complex stays complex)."""
    return xp.empty((0,), dtype=dtype, device=dev)


def apply_over_batch(xp: Any, a: Any, b: Any, func: Any, name: str = "lstsq") -> Any:
    """SciPy's ``_apply_over_batch(('a', 2), ('b', '1|2'))`` decorator, for any namespace.

    Unbatched calls go straight to ``func(a, b)``; otherwise the batch shapes
    broadcast, ``func`` runs on each problem and the outputs are stacked
    (``rank`` as an integer array; ``s`` stays ``None`` when ``func`` gives None).
    """
    b_core = 2 if b.ndim >= 2 else 1
    a_batch = tuple(a.shape[:-2]) if a.ndim >= 2 else ()
    b_batch = tuple(b.shape[:-b_core])
    if a.ndim < 2 or not (a_batch or b_batch):
        return func(a, b)
    batch = _broadcast_shapes(a_batch, b_batch)
    if math.prod(batch) == 0:
        raise ValueError(f"`{name}` does not support zero-size batches.")
    a = xp.broadcast_to(a, (*batch, *a.shape[-2:]))
    b = xp.broadcast_to(b, (*batch, *b.shape[-b_core:]))
    outs = []
    for idx in itertools.product(*(range(d) for d in batch)):
        outs.append(func(a[(*idx, ...)], b[(*idx, ...)]))  # the standard wants the ellipsis
    dev = device(outs[0][0])
    x = xp.reshape(xp.stack([o[0] for o in outs]), (*batch, *outs[0][0].shape))
    res = xp.reshape(xp.stack([o[1] for o in outs]), (*batch, *outs[0][1].shape))
    rank = xp.reshape(xp.asarray([o[2] for o in outs], dtype=xp.int64, device=dev), batch)
    if any(o[3] is None for o in outs):
        s = None
    else:
        s = xp.reshape(xp.stack([o[3] for o in outs]), (*batch, *outs[0][3].shape))
    return x, res, rank, s


def _broadcast_shapes(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    nd = max(len(s) for s in shapes)
    out = []
    for i in range(nd):
        dims = {s[len(s) - nd + i] for s in shapes if len(s) - nd + i >= 0}
        dims.discard(1)
        if len(dims) > 1:
            raise ValueError(f"shape mismatch: batch shapes {shapes} cannot be broadcast")
        out.append(dims.pop() if dims else 1)
    return tuple(out)
