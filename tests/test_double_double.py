"""Double-double arithmetic (``mpqr.lstsq.double_double``), the backends' double-double
Gram update, and the one-pass out-of-core least squares built on them: against exact
rational arithmetic and extended-precision references."""

from __future__ import annotations

import warnings
from fractions import Fraction

import numpy as np
import pytest
from mpqr.backends import get_backend

import mpqr
from mpqr.lstsq import double_double as dd
from tests._ooc_support import DEVICES, Dataset, one_pass_lstsq, ooc_events, rand  # noqa: F401

UNIT = 2.0**-53


def _exact_gram(w):
    w = [[Fraction(float(v)) for v in row] for row in np.asarray(w)]
    n = len(w[0])
    return [[sum(row[i] * row[j] for row in w) for j in range(n)] for i in range(n)]


def _dd_error(hi, lo, exact):
    """Largest ``|hi + lo - exact| / sum |terms|`` (exact: Fractions), on the host."""
    hi, lo = np.asarray(hi), np.asarray(lo)
    n = hi.shape[0]
    return max(abs(Fraction(float(hi[i, j])) + Fraction(float(lo[i, j])) - exact[i][j])
               for i in range(n) for j in range(n))


@pytest.mark.parametrize("seed", [0, 1])
def test_two_sum_and_two_prod_are_exact(seed):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(200) * 2.0 ** rng.integers(-60, 60, 200)
    b = rng.standard_normal(200) * 2.0 ** rng.integers(-60, 60, 200)
    s, e = dd.two_sum(np, a, b)
    p, f = dd.two_prod(np, a, b)
    for i in range(200):
        x, y = Fraction(float(a[i])), Fraction(float(b[i]))
        assert Fraction(float(s[i])) + Fraction(float(e[i])) == x + y
        assert Fraction(float(p[i])) + Fraction(float(f[i])) == x * y


def test_gram_update_on_each_backend(xp):
    """``acc + W^T W`` in double-double: error ~ rows * 2^-104 of the entries' magnitude
    (float64 GEMM: ~rows * 2^-53), on rows whose scales span 2^+-40 (cancellation)."""
    backend = get_backend(xp)
    rng = np.random.default_rng(3)
    h, n, k = 700, 7, 2
    w = rng.standard_normal((h, n + k)) * 2.0 ** rng.integers(-40, 40, (h, 1))
    w[::2] *= -1
    acc0 = np.stack([np.eye(n + k), np.full((n + k, n + k), 2.0**-60)])
    acc = backend.gram_dd_update(xp.asarray(w[:, :n]), xp.asarray(w[:, n:]), xp.asarray(acc0))
    acc = np.asarray(acc.get() if hasattr(acc, "get") else acc)
    exact = _exact_gram(w)
    for i in range(n + k):
        for j in range(n + k):
            exact[i][j] += Fraction(float(acc0[0, i, j])) + Fraction(float(acc0[1, i, j]))
    scale = float(np.max(np.abs(w).T @ np.abs(w)))
    err = _dd_error(acc[0], acc[1], exact)
    assert float(err) <= 4 * h * 2.0**-104 * scale
    assert np.array_equal(acc[0], acc[0].T) and np.array_equal(acc[1], acc[1].T)
    # float64 itself is far from it (the test would pass with a plain GEMM otherwise)
    plain = w.T @ w
    assert max(abs(Fraction(float(plain[i, j])) - exact[i][j] + Fraction(float(acc0[0, i, j]))
                   + Fraction(float(acc0[1, i, j])))
               for i in range(n + k) for j in range(n + k)) > 1e6 * err


def test_matvec_and_dot_rows():
    rng = np.random.default_rng(4)
    g = rng.standard_normal((6, 6))
    gl = g * 2.0**-60 * rng.standard_normal((6, 6))
    x = rng.standard_normal((6, 2))
    h, lo = dd.matvec(np, (g, gl), x)
    for i in range(6):
        for c in range(2):
            ex = sum((Fraction(float(g[i, j])) + Fraction(float(gl[i, j]))) *
                     Fraction(float(x[j, c])) for j in range(6))
            assert abs(Fraction(float(h[i, c])) + Fraction(float(lo[i, c])) - ex) <= \
                Fraction(2.0**-100) * sum(abs(Fraction(float(g[i, j]) * float(x[j, c])))
                                          for j in range(6))
    d = dd.dot_rows(np, x, (h, lo))
    for c in range(2):
        ex = sum(Fraction(float(x[i, c])) * (Fraction(float(h[i, c])) +
                                             Fraction(float(lo[i, c]))) for i in range(6))
        assert abs(Fraction(float(d[0][c])) + Fraction(float(d[1][c])) - ex) <= \
            Fraction(2.0**-100) * sum(abs(Fraction(float(x[i, c] * h[i, c])))
                                      for i in range(6))


def _ne_residual(a, b, x):
    aw = a.astype(np.longdouble)
    r = b.astype(np.longdouble) - aw @ x.astype(np.longdouble)
    return float(np.linalg.norm((aw.T @ r).astype(np.float64)) /
                 (np.linalg.norm(a, 2) ** 2 * np.linalg.norm(x)))


@pytest.mark.usefixtures("one_pass_lstsq")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("noise", [1e-9, 1e3])
def test_one_pass_lstsq(device, dtype, noise):
    """cond(A) ~ 1.3: one pass over ``[a | b]`` (the inputs' own read count), the
    normal-equation residual at the working precision's floor without a second pass, and
    residues that keep their relative accuracy for a near-exact fit (``||b||^2 - ...`` in
    double-double: no cancellation of ``||b||^2``); float32 data widened for the pass, the
    results in float32 and the residues those of the float32 ``x``."""
    rng = np.random.default_rng(6)
    m, n = 2400, 12
    a = rand(rng, (m, n), dtype)
    b = (a @ (1e3 * rng.standard_normal((n, 2))) +
         noise * rng.standard_normal((m, 2))).astype(dtype)
    da, db = Dataset(a), Dataset(b)
    with mpqr.explain() as trace:
        x, res, rank, s = mpqr.lstsq(da, db, device=device, memory_budget="40KB")
    ev = ooc_events(trace)[0].data
    assert ev["method"] == "gram-dd" and ev["refinement_passes"] == 0
    assert da.passes == db.passes == 1
    assert any(g.engine == "double-double" and g.label == "lstsq:gram-dd"
               for g in trace.gemms)
    assert rank == n and x.dtype == res.dtype == s.dtype == np.dtype(dtype)
    u = float(np.finfo(np.dtype(dtype)).eps) / 2
    for j in range(2):
        assert _ne_residual(a, b[:, j], x[:, j]) <= 2 * np.sqrt(m) * u
    r = b.astype(np.longdouble) - a.astype(np.longdouble) @ x.astype(np.longdouble)
    exact = np.sum(r * r, axis=0).astype(np.float64)
    # double-double: ||b||^2 ~ 1e11 m against ||r||^2 ~ 1e-18 m (float64, noise 1e-9)
    np.testing.assert_allclose(res, exact, rtol=1e-6 if dtype == "float64" else 1e-5)
    np.testing.assert_allclose(s, np.linalg.svd(a.astype(np.float64), compute_uv=False),
                               rtol=100 * u)


@pytest.mark.usefixtures("one_pass_lstsq")
@pytest.mark.parametrize("device", DEVICES)
def test_one_pass_lstsq_falls_back_to_passes_below_its_reach(device):
    """A ``tol`` no float64 solution meets: the corrections from the double-double Gram
    matrix stop, and refinement passes over ``[a | b]`` follow (the fallback path; how
    they end at such a ``tol`` is the refinement's own matter)."""
    rng = np.random.default_rng(7)
    a = rand(rng, (1500, 8), "float64")
    b = rng.standard_normal(1500)
    with mpqr.explain() as trace, warnings.catch_warnings():
        warnings.simplefilter("ignore", mpqr.RefinementWarning)
        x, _res, rank, _s = mpqr.lstsq(a, b, device=device, memory_budget="40KB",
                                       tol=1e-30, refine="cgls", maxiter=2)
    assert any(e.kind == "fallback" and e.data.get("path") == "refine" for e in trace.events)
    assert ooc_events(trace)[0].data["refinement_passes"] >= 1
    x0 = np.linalg.lstsq(a, b, rcond=None)[0]
    assert rank == 8 and np.linalg.norm(x - x0) <= 100 * UNIT * np.linalg.norm(x0)


@pytest.mark.usefixtures("one_pass_lstsq")
@pytest.mark.parametrize("device", DEVICES)
def test_one_pass_lstsq_edge_cases_as_in_core(device):
    """``b`` with no columns, ``b = 0`` and an exact fit: the shapes, dtypes and values of
    the in-core call (the exact fit's residue is the computed ``x``'s own, tiny)."""
    rng = np.random.default_rng(9)
    a = rand(rng, (1200, 8), "float64")
    for b in (np.zeros((1200, 0)), np.zeros((1200, 2)), a @ np.ones(8)):
        with mpqr.explain() as trace:
            got = mpqr.lstsq(a, b, device=device, memory_budget="40KB")
        assert ooc_events(trace)[0].data["method"] == "gram-dd"
        want = mpqr.lstsq(a, b)
        for g, w in zip(got, want):
            if isinstance(w, np.ndarray):
                assert g.shape == w.shape and g.dtype == w.dtype
        assert got[2] == want[2] == 8
        if b.size:
            x0 = np.linalg.lstsq(a, b, rcond=None)[0]
            assert np.abs(got[0] - x0).max() <= 20 * 8 * UNIT * max(1.0, np.abs(x0).max())
            assert np.all(np.asarray(got[1]) <= 1e-20 * (1 + np.sum(b * b)))


@pytest.mark.usefixtures("one_pass_lstsq")
@pytest.mark.parametrize("device", DEVICES)
def test_float32_pieces_widened_a_sub_block_at_a_time(device, monkeypatch):
    """float32 pieces go to the double-double Gram matrix widened in sub-blocks (bounded
    device memory); the result does not depend on where the sub-blocks end."""
    from mpqr.ooc import lstsq as ooc_lstsq

    rng = np.random.default_rng(12)
    a = rand(rng, (1500, 6), "float32")
    b = rng.standard_normal(1500).astype(np.float32)
    whole = mpqr.lstsq(a, b, device=device, memory_budget="40KB")
    monkeypatch.setattr(ooc_lstsq, "_WIDEN_ROWS", 7)
    with mpqr.explain() as trace:
        parts = mpqr.lstsq(a, b, device=device, memory_budget="40KB")
    assert ooc_events(trace)[0].data["method"] == "gram-dd"
    np.testing.assert_array_equal(parts[0], whole[0])
    np.testing.assert_array_equal(parts[3], whole[3])
    np.testing.assert_allclose(parts[1], whole[1], rtol=1e-6)
