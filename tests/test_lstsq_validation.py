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
