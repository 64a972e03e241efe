"""mpqr.lstsq argument checks that go beyond SciPy's (which would fail obscurely)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg as sla

import mpqr


def test_object_dtype_is_refused():
    with pytest.raises(TypeError, match="`a` must have a numeric dtype, got object"):
        mpqr.lstsq(np.ones((3, 2), dtype=object), np.ones(3))
    with pytest.raises(TypeError, match="`b` must have a numeric dtype, got object"):
        mpqr.lstsq(np.ones((3, 2)), np.ones(3, dtype=object))


def test_cond_must_be_a_number():
    with pytest.raises(TypeError, match="`cond` must be a real number or None, got str 'x'"):
        mpqr.lstsq(np.ones((3, 2)), np.ones(3), cond="x")


def test_bool_is_cast_like_scipy():
    a = np.array([[True, False], [True, True], [False, True]])
    b = np.array([1.0, 2.0, 3.0])
    x = mpqr.lstsq(a, b)[0]
    xs = sla.lstsq(a.astype(np.float64), b)[0]
    np.testing.assert_allclose(x, xs, rtol=25 * np.finfo(np.float64).eps * 10)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), np.float32("nan")])
def test_nan_or_infinite_cond_is_refused_naming_it(bad):
    """A NaN cutoff made LAPACK count no singular value (rank 0, x = 0), an infinite one
    every one or LAPACK's default: each is a ValueError naming the argument, on every
    entry point (in core, out of core, dask, the front ends)."""
    da = pytest.importorskip("dask.array")  # the distributed entry point is one of them
    import mpqr.compat.numpy as mcn
    import mpqr.compat.scipy as mcs

    a, b = np.eye(4, 3), np.ones(4)
    got = repr(float(bad))
    msg = "must be a finite real number or None, got " + got.replace("(", r"\(")
    for call in (lambda: mpqr.lstsq(a, b, cond=bad),
                 lambda: mpqr.lstsq(a, b, bad, lapack_driver="gelsy", refine=None),
                 lambda: mpqr.lstsq(a, b, cond=bad, memory_budget="1MB"),
                 lambda: mpqr.lstsq(da.from_array(a, chunks=(2, 3)), b, cond=bad),
                 lambda: mcs.lstsq(a, b, cond=bad)):
        with pytest.raises(ValueError, match=f"^`cond` {msg}"):
            call()
    with pytest.raises(ValueError, match=f"^`rcond` {msg}"):
        mcn.lstsq(a, b, rcond=bad)
    with pytest.raises(TypeError, match="^`rcond` must be a real number or None, got str"):
        mcn.lstsq(a, b, rcond="1e-3")


def test_negative_cond_follows_the_installed_scipy(monkeypatch):
    """SciPy >= 1.18 raises ``ValueError: Expected rcond >= 0.`` for a negative cond,
    older SciPy reads it as LAPACK's default: mpqr.lstsq does what the installed SciPy
    does, and NumPy's front end (whose rcond=-1 is documented) works under either."""
    import importlib

    import mpqr.compat.numpy as mnp

    rules = importlib.import_module("mpqr.lstsq._scipy_rules")
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((8, 3)), rng.standard_normal(8)
    monkeypatch.setattr(rules, "scipy_1_18_results", lambda: True)
    with pytest.raises(ValueError, match=r"`cond` must be >= 0 or None, got -1.0"):
        mpqr.lstsq(a, b, cond=-1)
    assert mpqr.lstsq(a, b, cond=0.0)[2] == 3
    np.testing.assert_allclose(mnp.lstsq(a, b, rcond=-1)[0],
                               np.linalg.lstsq(a, b, rcond=-1)[0], rtol=1e-12)
    monkeypatch.setattr(rules, "scipy_1_18_results", lambda: False)
    assert mpqr.lstsq(a, b, cond=-1)[2] == 3
