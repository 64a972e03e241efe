"""Leaf panels by certified CholQR2 and Householder reconstruction
(``mpqr/qr/panel_cholqr.py``): the recursive QR keeps its accuracy with them, a panel
outside CholQR2's reach falls back to ``geqrf`` visibly, and NaN stays NaN.

The route is on for CuPy (``cholqr_panel_min_width = 128``) and off for the NumPy
reference; these tests turn it on for every backend with a narrow width, so CI runs
the same core code the GPU runs on its 512-wide leaves."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
from mpqr.backends import get_backend

import mpqr
from mpqr._array_api import array_namespace
from tests._qr_support import backward_error, orthogonality, unit_roundoff
from tests._support import from_numpy, to_numpy

recursive = importlib.import_module("mpqr.qr.householder_recursive")
panel_cholqr = importlib.import_module("mpqr.qr.panel_cholqr")

M, N = 768, 256  # leaf width 32 at n = 256: 8 leaves, the last 544 x 32


@pytest.fixture
def route_on(xp, monkeypatch):
    """The backend of ``xp`` with the CholQR leaf route on from 32 columns."""
    backend = get_backend(array_namespace(xp.asarray(0.0)))
    monkeypatch.setattr(type(backend), "cholqr_panel_min_width", 32)
    return backend


def _counts(trace):
    grams = sum(g.label == "panel-cholqr-gram" for g in trace.gemms)
    fallbacks = [e for e in trace.events if e.kind == "panel-fallback"]
    return grams, fallbacks


@pytest.mark.parametrize("precision, dtype", [
    ("fp64", np.float64), ("fp32", np.float32), ("fp16", np.float32),
    ("fp32-emulated", np.float32), ("fp64-emulated", np.float64)])
def test_cholqr_leaves_keep_householder_accuracy(xp, route_on, precision, dtype):
    if precision in ("fp16", "fp32-emulated") and "fp16" not in route_on.capabilities:
        pytest.skip(f"{route_on.name} has no float16 GEMM")
    a = np.random.default_rng(3).standard_normal((M, N)).astype(dtype)
    ax = from_numpy(xp, a)
    with mpqr.explain() as trace:
        q, r = mpqr.qr(ax, precision=precision, method="householder-recursive")
    grams, fallbacks = _counts(trace)
    assert grams == 2 * (N // recursive.leaf_width(N)) and not fallbacks  # every leaf
    u = unit_roundoff(precision, dtype)
    # the bounds of the geqrf leaves (test_qr_panels.test_wide_leaves_keep_householder_accuracy)
    assert backward_error(a, q, r) <= 2 * np.sqrt(N) * u
    assert orthogonality(q) <= np.sqrt(N) * max(u / 4, unit_roundoff("fp32", dtype))
    np.testing.assert_array_equal(to_numpy(ax), a)  # the input is untouched


def test_r_matches_the_geqrf_leaves_up_to_row_signs(xp, route_on, monkeypatch):
    """R is unique up to the signs of its rows: the two leaf routes agree to
    ``cond(A) u`` (here cond = 10)."""
    from tests._qr_support import geometric

    a = geometric(np.random.default_rng(4), M, N, 10.0)
    ax = from_numpy(xp, a)
    r1 = to_numpy(mpqr.qr(ax, mode="r", method="householder-recursive"))
    monkeypatch.setattr(type(route_on), "cholqr_panel_min_width", None)
    r0 = to_numpy(mpqr.qr(ax, mode="r", method="householder-recursive"))
    signs = np.sign(np.diag(r1)) * np.sign(np.diag(r0))
    rel = np.linalg.norm(r1 - signs[:, None] * r0) / np.linalg.norm(r0)
    assert rel <= 10 * np.sqrt(N) * 10.0 * 2.0**-53, rel


@pytest.mark.parametrize("precision, dtype", [("fp64", np.float64),
                                              ("fp32-emulated", np.float32)])
def test_a_panel_beyond_cholqr2_falls_back_to_geqrf_visibly(xp, route_on, precision, dtype):
    """Pairs of columns 1e-9 apart make every leaf panel's condition ~1e9, beyond
    CholQR2 at either precision: each leaf goes to geqrf, the trace says so, and the
    factorization keeps its accuracy."""
    if precision == "fp32-emulated" and "fp16" not in route_on.capabilities:
        pytest.skip(f"{route_on.name} has no float16 GEMM")
    rng = np.random.default_rng(5)
    a = rng.standard_normal((M, N))
    a[:, 1::2] = a[:, ::2] + 1e-9 * rng.standard_normal((M, N // 2))
    a = a.astype(dtype)
    with mpqr.explain() as trace:
        q, r = mpqr.qr(from_numpy(xp, a), precision=precision, method="householder-recursive")
    _, fallbacks = _counts(trace)
    assert len(fallbacks) == N // recursive.leaf_width(N)
    assert fallbacks[0].message.startswith(f"{M} x 32 leaf panel: CholQR2 declined (")
    assert fallbacks[0].message.endswith("); geqrf instead")
    u = unit_roundoff(precision, dtype)
    assert backward_error(a, q, r) <= 2 * np.sqrt(N) * u
    assert orthogonality(q) <= np.sqrt(N) * u


def test_a_rank_deficient_panel_falls_back_and_the_rest_do_not(xp, route_on):
    a = np.random.default_rng(6).standard_normal((M, N))
    a[:, 100] = a[:, 3]  # after the first leaves' reflectors column 100 is ~0
    with mpqr.explain() as trace:
        q, r = mpqr.qr(from_numpy(xp, a), method="householder-recursive")
    grams, fallbacks = _counts(trace)
    assert len(fallbacks) == 1 and "96 leaf panel" not in fallbacks[0].message
    assert grams >= 2 * (N // 32 - 1)
    assert backward_error(a, q, r) <= 2 * np.sqrt(N) * 2.0**-53
    assert orthogonality(q) <= np.sqrt(N) * 2.0**-53


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nan_inf_in_a_panel_never_give_a_finite_looking_qr(xp, route_on, bad):
    a = np.random.default_rng(7).standard_normal((M, N))
    a[500, 200] = bad
    with mpqr.explain() as trace, np.errstate(invalid="ignore", over="ignore"):
        q, r = mpqr.qr(from_numpy(xp, a), method="householder-recursive")
    q, r = to_numpy(q), to_numpy(r)
    assert np.isnan(q).any() or np.isnan(r).any()
    assert _counts(trace)[1]  # the panel holding it declined CholQR2


def test_the_route_takes_only_wide_tall_real_2d_panels(monkeypatch):
    backend = get_backend(array_namespace(np.zeros(1)))
    takes = panel_cholqr.takes_cholqr_panel
    assert backend.cholqr_panel_min_width is None  # off on the host (LAPACK geqrf)
    assert not takes(backend, np.zeros((4096, 512)))
    monkeypatch.setattr(type(backend), "cholqr_panel_min_width", 128)
    assert takes(backend, np.zeros((512, 128)))
    assert not takes(backend, np.zeros((511, 128)))  # under 4x as tall
    assert not takes(backend, np.zeros((4096, 127)))  # narrower than the width
    assert not takes(backend, np.zeros((2, 4096, 512)))  # stacks keep geqrf
    assert not takes(backend, np.zeros((4096, 512), dtype=np.complex128))
