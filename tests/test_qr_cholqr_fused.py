"""CholQR2 without storing ``Q1 = A R1^-1`` (narrow float64 inputs, every backend).

The fused route must be the stored route's arithmetic: the same R and Q up to the
Gram matrix's summation order (bitwise on NumPy, whose portable
``right_solve_gram`` forms Q1), CholQR2's error bounds against an
extended-precision reference, the same certificate, and an explain trace that
says which route ran.
"""

from __future__ import annotations

import numpy as np
import pytest
from mpqr.backends import get_backend

import mpqr
from mpqr._array_api import array_namespace
from tests._qr_support import backward_error, geometric, orthogonality
from tests._support import to_numpy

U64 = 2.0**-53


def _events(trace, kind):
    return [e for e in trace.events if e.kind == kind]


@pytest.mark.parametrize(("m", "n"), [(1037, 1), (1037, 7), (2000, 20), (4096, 32)])
def test_fused_route_runs_and_meets_cholqr2_bounds(xp, m, n):
    a = geometric(np.random.default_rng(n), m, n, 1e5)
    with mpqr.explain() as tr:
        q, r = mpqr.qr(xp.asarray(a), method="cholqr2", precision="fp64")
    assert len(_events(tr, "fused-solve")) == 1
    grams = [d for d in tr.gemms if d.label == "cholqr2-gram"]
    assert [d.engine for d in grams] == ["native-fp64", "native-fp64"]
    assert q.dtype == xp.float64 and q.shape == (m, n) and r.shape == (n, n)
    # CholQR2 (cond(A) << u^-1/2): O(u) orthogonality and backward error
    assert orthogonality(q) <= 8 * np.sqrt(n) * U64
    assert backward_error(a, q, r) <= 8 * np.sqrt(n) * U64
    rh = to_numpy(r)
    assert np.array_equal(rh, np.triu(rh))


@pytest.mark.parametrize("mode", ["reduced", "r"])
def test_fused_route_gives_the_stored_routes_factors(xp, monkeypatch, mode):
    a = xp.asarray(geometric(np.random.default_rng(5), 3000, 16, 1e6))
    out = mpqr.qr(a, method="cholqr2", precision="fp64", mode=mode)
    monkeypatch.setattr(type(get_backend(array_namespace(a))), "fused_cholqr_max_n", None)
    with mpqr.explain() as tr:
        ref = mpqr.qr(a, method="cholqr2", precision="fp64", mode=mode)
    assert not _events(tr, "fused-solve")
    got, want = ((out,), (ref,)) if mode == "r" else (out, ref)
    for x, y in zip(got, want, strict=True):
        x, y = to_numpy(x), to_numpy(y)
        if xp.__name__.startswith("cupy"):  # the Gram sums run in another order there
            # R2 moves by O(u) relative to R2 ~ I, so R and Q by O(u cond(R2)) = O(u)
            scale = np.abs(y).max(axis=0, keepdims=True)
            assert np.all(np.abs(x - y) <= 64 * 16 * U64 * scale)
        else:
            np.testing.assert_array_equal(x, y)


def test_no_fusion_for_float32_wide_or_non_native_gram(xp):
    rng = np.random.default_rng(2)
    cases = [(xp.asarray(rng.standard_normal((600, 8)), dtype=xp.float32), "fp32"),
             (xp.asarray(rng.standard_normal((600, 33))), "fp64")]
    for a, prec in cases:
        with mpqr.explain() as tr:
            mpqr.qr(a, method="cholqr2", precision=prec)
        assert not _events(tr, "fused-solve")
    with mpqr.gemm_options(engine="ozaki-int8"), mpqr.explain() as tr:
        try:
            mpqr.qr(xp.asarray(rng.standard_normal((600, 8))), method="cholqr2",
                    precision="fp64-emulated")
        except NotImplementedError as exc:  # a backend without the INT8 engine refuses it
            assert str(exc).startswith("engine 'ozaki-int8' is not available on the")
    assert not _events(tr, "fused-solve")
    assert all(d.engine == "ozaki-int8" for d in tr.gemms if d.label == "cholqr2-gram")


def test_fused_route_raises_on_non_finite_input_and_leaves_it_alone(xp):
    a = geometric(np.random.default_rng(7), 500, 16, 10.0)
    a[123, 4] = np.nan
    x = xp.asarray(a)
    before = to_numpy(x).copy()
    with pytest.raises(mpqr.BreakdownError, match=r"^cholqr2 broke down: the Gram matrix "
                       r"x\^H x is not finite \(x holds NaN or Inf\)"):
        mpqr.qr(x, method="cholqr2", precision="fp64")
    np.testing.assert_array_equal(to_numpy(x), before)


def test_fused_gemm_records_only_the_engine_it_runs():
    be = get_backend(array_namespace(np.zeros(1)))
    with mpqr.explain() as tr:
        assert mpqr.policy.fused_gemm(be, np.float64, (8, 8, 1000), engine="native-fp64",
                                      precision="fp64", label="x")
        assert not mpqr.policy.fused_gemm(be, np.float64, (8, 8, 1000), engine="native-fp32",
                                          precision="fp64", label="y")
    assert [(d.label, d.engine, d.shape) for d in tr.gemms] == [("x", "native-fp64",
                                                                 (8, 8, 1000))]
