"""A real client: scikit-learn's LinearRegression under mpqr.compat.scipy.patch()."""

from __future__ import annotations

import mpqr.compat.scipy as mcs
import numpy as np
import pytest

import mpqr

linear_model = pytest.importorskip("sklearn.linear_model")


@pytest.mark.parametrize("rank_deficient", [False, True])
def test_linear_regression_same_fit(rank_deficient):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((200, 6))
    if rank_deficient:
        X[:, 5] = X[:, 0] - 2 * X[:, 1]
    y = X @ rng.standard_normal(6) + 0.1 * rng.standard_normal(200)
    ref = linear_model.LinearRegression().fit(X, y)
    with mpqr.explain() as trace, mcs.patch():
        got = linear_model.LinearRegression().fit(X, y)
    assert any(e.message.startswith("lstsq") for e in trace.events), "mpqr did not run"
    assert got.rank_ == ref.rank_ == (5 if rank_deficient else 6)
    s = ref.singular_
    tol = 25 * np.finfo(np.float64).eps * s[0] / s[ref.rank_ - 1]
    np.testing.assert_allclose(got.singular_, s, atol=25 * np.finfo(np.float64).eps * s[0])
    np.testing.assert_allclose(got.coef_, ref.coef_, rtol=tol, atol=tol * np.abs(ref.coef_).max())
    np.testing.assert_allclose(got.intercept_, ref.intercept_, atol=tol * np.abs(ref.coef_).max())
