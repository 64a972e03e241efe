"""Batched calls of the SciPy front ends hand their results back as the installed SciPy
does (1.15 on: a list of stacked outputs, a lone output bare, gelsy's ``s`` an object
array of None), with SciPy's shapes and dtypes and, where the result is unique, its
values; compared with SciPy itself on the same input."""

from __future__ import annotations

import itertools

import mpqr.compat.scipy as cs
import numpy as np
import pytest
import scipy.linalg as sla

RNG = np.random.default_rng(11)
A = RNG.standard_normal((2, 5, 3))
CASES = [
    ("qr", (A,), {}), ("qr", (A,), {"mode": "economic"}), ("qr", (A,), {"mode": "r"}),
    ("qr", (A,), {"pivoting": True}), ("qr", (A,), {"mode": "r", "pivoting": True}),
    ("rq", (A,), {}), ("rq", (A,), {"mode": "r"}), ("rq", (A,), {"mode": "economic"}),
    ("qr_multiply", (A, RNG.standard_normal((2, 4, 5))), {}),
    ("qr_multiply", (A, RNG.standard_normal((2, 3, 2))), {"mode": "left"}),
    ("lstsq", (A, RNG.standard_normal((2, 5, 2))), {}),
    ("lstsq", (A, RNG.standard_normal((2, 5, 2))), {"lapack_driver": "gelsy"}),
    # the batch from b alone (a 2-D a)
    ("lstsq", (A[0], RNG.standard_normal((2, 5, 2))), {}),
    ("lstsq", (A[0], RNG.standard_normal((3, 5, 2))), {"lapack_driver": "gelsy"}),
    ("qr_multiply", (A[0], RNG.standard_normal((2, 4, 5))), {}),
    ("qr_multiply", (A[0], RNG.standard_normal((2, 3, 2))), {"mode": "left"}),
]


def _shape_of(out):
    if isinstance(out, (list, tuple)):
        return type(out), [_shape_of(o) for o in out]
    if out is None:
        return None
    return type(out), np.shape(out), np.asarray(out).dtype


@pytest.mark.parametrize("name,args,kwargs", CASES)
def test_batched_results_are_packed_as_scipy_packs_them(name, args, kwargs):
    want = getattr(sla, name)(*args, **kwargs)
    got = getattr(cs, name)(*args, **kwargs)
    assert _shape_of(got) == _shape_of(want)


@pytest.mark.parametrize("kwargs", [{}, {"lapack_driver": "gelsy"}])
def test_batched_lstsq_values_match_scipy(kwargs):
    b = RNG.standard_normal((2, 5, 2))
    want, got = sla.lstsq(A, b, **kwargs), cs.lstsq(A, b, **kwargs)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(got[2], want[2])
    if kwargs and want[3] is None:  # gelsy: no singular values (SciPy >= 1.18)
        assert got[3] is None
    elif kwargs:  # gelsy: no singular values, SciPy before 1.18 stacks its Nones
        assert got[3].tolist() == want[3].tolist() == [None, None]
    else:
        np.testing.assert_allclose(got[3], want[3], rtol=1e-12)
        np.testing.assert_allclose(got[1], want[1], rtol=1e-10)


def test_two_dimensional_calls_keep_scipys_tuples():
    assert type(cs.qr(A[0])) is type(sla.qr(A[0])) is tuple
    assert type(cs.qr(A[0], mode="r")) is type(sla.qr(A[0], mode="r")) is tuple


def test_object_arrays_of_real_numbers_as_scipy_and_numpy_take_them():
    """SciPy's QR functions factor an object array of real numbers as float64 (its lstsq
    refuses object arrays); None, text or complex entries are refused by name, where
    SciPy would make None a NaN. NumPy's lstsq has no object loop: TypeError."""
    import mpqr.compat.numpy as cn

    a = np.array([[1, 2.5], [3, True], [5, np.float32(7)]], dtype=object)
    for name in ("qr", "rq"):
        want, got = getattr(sla, name)(a), getattr(cs, name)(a)
        assert [g.dtype for g in got] == [w.dtype for w in want]
        np.testing.assert_allclose(np.abs(got[0]), np.abs(want[0]), rtol=1e-12, atol=1e-13)
    for bad in (None, "2", 1j):
        a_bad = a.copy()
        a_bad[0, 0] = bad
        with pytest.raises(ValueError, match=r"^object arrays are not supported \(`a`\)$"):
            cs.qr(a_bad)
    with pytest.raises(TypeError) as want:
        np.linalg.lstsq(a, np.ones(3), rcond=None)
    with pytest.raises(TypeError, match=r"`a`\)$") as got:
        cn.lstsq(a, np.ones(3))
    assert str(got.value).startswith(str(want.value))


@pytest.mark.parametrize("name,msg", [("qr", "xpected (at least )?a 2-D array"),
                                      ("rq", "expected matrix")])
def test_numpy_scalar_gets_scipys_error(name, msg):
    """A NumPy scalar is an array-like as for SciPy: the same ValueError, not a TypeError
    from namespace detection."""
    with pytest.raises(ValueError, match=msg) as theirs:
        getattr(sla, name)(np.float64(1.0))
    with pytest.raises(ValueError, match=msg) as ours:
        getattr(cs, name)(np.float64(1.0))
    assert str(ours.value) == str(theirs.value)


@pytest.mark.parametrize("mode", ["full", "economic", "nope"])
def test_rq_of_a_zero_size_batch_gets_scipys_error(mode):
    """SciPy's batch decorator refuses a zero-size batch before ``rq`` reads ``mode``."""
    a = np.zeros((0, 4, 3))
    with pytest.raises(ValueError) as theirs:
        sla.rq(a, mode=mode)
    with pytest.raises(ValueError, match="^`rq` does not support zero-size batches.$") as ours:
        cs.rq(a, mode=mode)
    assert str(ours.value) == str(theirs.value)


@pytest.mark.parametrize("shape", [(2, 0), (3, 0), (0, 0), (0, 2), (1, 0)])
def test_qr_multiply_of_no_columns_as_scipy(shape):
    """``qr_multiply`` of an ``a`` without columns: where SciPy's LAPACK call refuses the
    empty set of reflectors (any non-empty ``c``) a ``ValueError`` as SciPy's; empty
    ``c``s and ``a`` without rows as SciPy answers them."""
    rng = np.random.default_rng(10)
    m, n = shape
    a = rng.standard_normal(shape)
    cs_ = [rng.standard_normal(m), rng.standard_normal(n), rng.standard_normal((m, 2)),
           rng.standard_normal((2, m)), rng.standard_normal((n, 2)), rng.standard_normal((2, n))]
    for c, mode, kw in itertools.product(cs_, ("left", "right"),
                                         ({}, {"pivoting": True}, {"conjugate": True},
                                          {"overwrite_c": True})):
        try:
            want = sla.qr_multiply(a.copy(), c.copy(), mode=mode, **kw)
        except ValueError:
            with pytest.raises(ValueError):
                cs.qr_multiply(a, c, mode=mode, **kw)
            continue
        got = cs.qr_multiply(a, c, mode=mode, **kw)
        assert [(x.shape, x.dtype) for x in got] == [(x.shape, x.dtype) for x in want]


def test_qr_multiply_edges_as_scipy():
    """``qr_multiply``: with ``overwrite_c`` a left ``c`` holds all M rows of a tall ``a``
    (SciPy's ``min(M, N + overwrite_c (M - N))``), also per matrix of a stack; an empty
    1-D ``c`` comes back in its 2-D form; a zero-size stack is refused before the mode."""
    rng = np.random.default_rng(9)
    a = rng.standard_normal((5, 3))
    for c in (rng.standard_normal(3), rng.standard_normal((3, 2))):
        with pytest.raises(ValueError) as theirs:
            sla.qr_multiply(a, c, mode="left", overwrite_c=True)
        with pytest.raises(ValueError) as ours:
            cs.qr_multiply(a, c, mode="left", overwrite_c=True)
        assert str(ours.value) == str(theirs.value)
    c = rng.standard_normal((5, 2))
    want, got = sla.qr_multiply(a, c.copy(), mode="left", overwrite_c=True), \
        cs.qr_multiply(a, c, mode="left", overwrite_c=True)
    assert got[0].shape == want[0].shape == (5, 2)
    # Q's full columns times c: an orthogonal map (Q's columns past N are any orthonormal
    # completion, so only what it preserves compares), R as SciPy's up to signs
    np.testing.assert_allclose(got[0].T @ got[0], c.T @ c, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np.abs(got[1]), np.abs(want[1]), rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError) as theirs:
        sla.qr_multiply(np.stack([a, a]), rng.standard_normal((2, 3)), mode="left",
                        overwrite_c=True)
    with pytest.raises(ValueError) as ours:
        cs.qr_multiply(np.stack([a, a]), rng.standard_normal((2, 3)), mode="left",
                       overwrite_c=True)
    assert str(ours.value) == str(theirs.value)
    for mode in ("left", "right"):
        want = sla.qr_multiply(np.zeros((0, 3)), np.zeros(0), mode=mode)[0]
        got = cs.qr_multiply(np.zeros((0, 3)), np.zeros(0), mode=mode)[0]
        assert got.shape == want.shape and got.dtype == want.dtype
    for mode in ("left", "nope"):
        with pytest.raises(ValueError) as theirs:
            sla.qr_multiply(np.zeros((0, 4, 3)), np.ones(3), mode=mode)
        with pytest.raises(ValueError,
                           match="^`qr_multiply` does not support zero-size batches.$") as ours:
            cs.qr_multiply(np.zeros((0, 4, 3)), np.ones(3), mode=mode)
        assert str(ours.value) == str(theirs.value)
