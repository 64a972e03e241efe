"""Exactly rank-deficient least squares gets SciPy's answer on every route, never an
exception.

An exactly zero column (or a zero row of a wide matrix) makes an exactly zero pivot
in R, an exactly repeated column a pivot at the rounding level, while the computed
smallest singular value lies at the rounding level, ``~u ||A||``: a cutoff at or
below ``eps`` may count it, as SciPy's gelsd itself does for about one Gaussian
300 x 20 matrix with a zero column in a hundred. Such an R must never reach a
triangular solve (it raised ``LinAlgError: singular matrix`` there).

Each case is compared with SciPy: ``s`` within ``C sqrt(k) u_f ||A||`` of SciPy's
singular values; the rank within that rounding band of the cutoff (a singular
value inside the band may count either way, for SciPy too); where the rank is the
exact one, ``x`` is SciPy's minimum-norm solution (``scipy.linalg.lstsq`` with a
cutoff far from the rounding level) within ``C k u_f kappa (1 + kappa ||r|| /
(||A|| ||x||))``, the perturbation bound of the minimum-norm problem; otherwise
``x`` is finite. ``C = 8`` (docs/guarantees.md); ``u_f``: the unit roundoff of the
factorization.
"""

from __future__ import annotations

import itertools
import warnings

import mpqr.compat.numpy as mcn
import mpqr.compat.scipy as mcs
import numpy as np
import pytest
import scipy.linalg as sla
from _support import from_numpy, to_numpy

import mpqr

C = 8
UNIT = {"fp16": 2.0**-11, "fp32": 2.0**-24, "fp32-emulated": 2.0**-24}


def _u(dtype) -> float:
    return float(np.finfo(np.dtype(dtype)).eps) / 2


def _cases(m, n, dtype="float64"):
    """``(a, b, exact rank)``: a zero column and an exact copy of the next column at every
    position, a zero row at every position (a spread of them for a tall matrix)."""
    rows = range(m) if m <= 12 else range(0, m, m // 6)
    for kind, pos in [*(("zero column", j) for j in range(n)),
                      *(("repeated column", j) for j in range(n)),
                      *(("zero row", i) for i in rows)]:
        rng = np.random.default_rng(pos)
        a = rng.standard_normal((m, n))
        b = rng.standard_normal(m)
        if np.dtype(dtype).kind == "c":
            a = a + 1j * rng.standard_normal((m, n))
            b = b + 1j * rng.standard_normal(m)
        if kind == "zero column":
            a[:, pos] = 0
        elif kind == "repeated column":
            a[:, pos] = a[:, (pos + 1) % n]
        else:
            a[pos, :] = 0
        rank = min(m, n) - (kind != "zero row" or m <= n)
        yield f"{kind} {pos}", a.astype(dtype), b.astype(dtype), rank


def _cuts(cond, dtype):
    """The relative cutoffs SciPy's drivers take for ``cond``: None is ``eps``; ``0.0``
    is ``eps / 2`` for gelsd (LAPACK's EPSILON), none for gelss and gelsy (every
    nonzero singular value counts); negative is ``eps / 2`` for gelsd."""
    eps = 2 * _u(dtype)
    return {None: (eps, eps), 0.0: (0.0, eps / 2), -1.0: (eps / 2, eps / 2)}[cond]


def _check(out, a, b, rank0, cuts, u_f, what):
    """``out`` (mpqr's x, residues, rank, s) against SciPy for ``a`` of exact rank
    ``rank0``; ``cuts``: the lowest and highest relative cutoff the call may take."""
    x, _res, rank, s = out
    x = to_numpy(x)
    assert np.all(np.isfinite(x)), what
    s_ref = sla.svdvals(a.astype(np.complex128 if a.dtype.kind == "c" else np.float64))
    k = min(a.shape)
    s1 = s_ref[0]
    band = C * np.sqrt(k) * u_f * s1
    if s is not None:
        np.testing.assert_allclose(to_numpy(s), s_ref, rtol=0, atol=band, err_msg=what)
    lo_cut, hi_cut = cuts[0] * s1, cuts[1] * s1
    lo, hi = int(np.sum(s_ref > hi_cut + band)), int(np.sum(s_ref > lo_cut - band))
    assert lo <= int(rank) <= hi, (what, int(rank), lo, hi)
    if int(rank) == rank0:
        x_mn, _, r_mn, s_mn = sla.lstsq(a, b, cond=1e-6)  # far from the rounding level
        assert r_mn == rank0, what
        kappa = s_mn[0] / s_mn[rank0 - 1]
        r_norm = np.linalg.norm(b - a.astype(np.complex128) @ x_mn)
        bound = C * k * u_f * kappa * (1 + kappa * r_norm / (s1 * np.linalg.norm(x_mn)))
        err = np.linalg.norm(x - x_mn) / np.linalg.norm(x_mn)
        assert err <= bound, (what, err, bound)


@pytest.mark.parametrize("shape", [(12, 5), (5, 5), (5, 9), (96, 5)],
                         ids=["tall", "square", "wide", "tall-gram"])
def test_exactly_singular_inputs_get_scipys_answer_on_every_backend(xp, shape):
    """Every class and position, both cutoffs, the SVD-less driver too."""
    for (what, a, b, rank0), (cond, driver) in itertools.product(
            _cases(*shape), [(None, "gelsd"), (0.0, "gelsd"), (0.0, "gelsy")]):
        out = mpqr.lstsq(from_numpy(xp, a), from_numpy(xp, b), cond, lapack_driver=driver)
        _check(out, a, b, rank0, _cuts(cond, a.dtype), _u(a.dtype),
               f"{what} cond={cond} {driver}")


@pytest.mark.parametrize("dtype", ["float64", "float32", "complex128"])
def test_exactly_singular_inputs_on_every_precision_and_refinement(dtype):
    """Every precision (its own rank resolution without refinement) and refinement."""
    cases = [c for shape in [(40, 6), (6, 6), (6, 11)] for c in _cases(*shape, dtype)]
    routes = itertools.product(["auto", "fp32", "fp16", "fp32-emulated", "fp64-emulated"],
                               ["auto", "cgls", "ir", None])
    for i, (prec, refine) in enumerate(routes):
        u_f = max(UNIT.get(prec, 0.0), _u(dtype)) if refine is None else _u(dtype)
        driver = ("gelsd", "gelss", "gelsy")[i % 3]
        for what, a, b, rank0 in cases[i % 5::10]:  # a different spread on every route
            for cond in (None, 0.0):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", mpqr.RefinementWarning)
                    out = mpqr.lstsq(a, b, cond, lapack_driver=driver, precision=prec,
                                     refine=refine)
                _check(out, a, b, rank0, _cuts(cond, dtype), u_f,
                       f"{what} {prec} refine={refine} {driver} cond={cond}")


def test_the_reported_matrix_gets_scipys_rank_and_no_exception():
    """300 x 20, a zero column: the smallest singular value SciPy's gelsd sees is at
    rounding level, next to its cut-off (whether it counts it, rank 20 or 19, depends on
    the BLAS build's rounding), so the R that the refinement and the direct solve would
    use has an exactly zero pivot; the answer is gelsd's, from the SVD of R."""
    rng = np.random.default_rng(23)
    a = rng.standard_normal((300, 20))
    a[:, 3] = 0
    b = rng.standard_normal(300)
    s = sla.lstsq(a, b)[3]
    # the case SciPy itself decides by rounding: within 100 u of its cut-off
    assert s[-1] < 100 * np.finfo(a.dtype).eps * s[0]
    for driver in ("gelsd", "gelsy"):
        for refine in ("auto", "cgls", "ir", None):
            out = mpqr.lstsq(a, b, lapack_driver=driver, refine=refine)
            _check(out, a, b, 19, _cuts(None, a.dtype), _u(a.dtype),
                   f"{driver} refine={refine}")


def test_exactly_singular_inputs_out_of_core():
    for what, a, b, rank0 in list(_cases(64, 6))[::2]:
        for cond in (None, 0.0):
            with mpqr.explain() as trace:
                out = mpqr.lstsq(a, b, cond, memory_budget="6KB")
            assert any(e.data.get("route") == "out-of-core" for e in trace.events)
            _check(out, a, b, rank0, _cuts(cond, a.dtype), _u(a.dtype),
                   f"out of core {what} cond={cond}")


@pytest.mark.usefixtures("dask_threads")
def test_exactly_singular_inputs_on_dask():
    da = pytest.importorskip("dask.array")
    cases = list(_cases(64, 6))
    for what, a, b, rank0 in [*cases[1:4], cases[6], cases[12]]:
        for cond, driver in [(None, "gelsd"), (0.0, "gelsy")]:
            out = mpqr.lstsq(da.from_array(a, chunks=(16, 6)), b, cond, lapack_driver=driver)
            _check(tuple(o.compute() if hasattr(o, "compute") else o for o in out), a, b,
                   rank0, _cuts(cond, a.dtype), _u(a.dtype),
                   f"dask {what} cond={cond} {driver}")


def test_exactly_singular_inputs_through_the_front_ends():
    """``compat.scipy`` with SciPy's cutoffs, ``compat.numpy`` with NumPy's (its default
    ``eps * max(M, N)``)."""
    try:  # SciPy >= 1.18 refuses a negative cond; before, LAPACK read it as its default
        sla.lstsq(np.eye(2), np.ones(2), cond=-1.0)
        negative_refused = False
    except ValueError:
        negative_refused = True
    for what, a, b, rank0 in [c for shape in [(12, 5), (5, 9)] for c in _cases(*shape)]:
        for cond in (None, 0.0, -1.0):
            if cond is not None and cond < 0 and negative_refused:
                with pytest.raises(ValueError, match="`cond` must be >= 0"):
                    mcs.lstsq(a, b, cond=cond)
            else:
                _check(mcs.lstsq(a, b, cond=cond), a, b, rank0, _cuts(cond, a.dtype),
                       _u(a.dtype), f"compat.scipy {what} cond={cond}")
            cuts = (_cuts(None, a.dtype)[0] * max(a.shape),) * 2 if cond is None else \
                (_cuts(-1.0, a.dtype))
            _check(mcn.lstsq(a, b, rcond=cond), a, b, rank0, cuts, _u(a.dtype),
                   f"compat.numpy {what} rcond={cond}")
