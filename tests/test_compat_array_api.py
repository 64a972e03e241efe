"""mpqr.compat.array_api: namespace(xp) against xp itself, and patch() over every copy of
array-api-compat, array_api_strict, nesting, threads and modules imported inside."""

from __future__ import annotations

import subprocess
import sys
import threading

import array_api_compat
import array_api_compat.numpy as cnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mpqr.compat import array_api as maa

import mpqr

strict = pytest.importorskip("array_api_strict")

NAMESPACES = {"numpy": cnp, "array_api_strict": strict}
DTYPES = ("float32", "float64", "complex64", "complex128")


def _np(x):
    return np.asarray(x) if not isinstance(x, strict._array_object.Array) else \
        np.asarray(x._array)


def _matrix(xp, shape, dtype, seed, nan=False):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(shape)
    if "complex" in dtype:
        a = a + 1j * rng.standard_normal(shape)
    if nan and a.size:
        a.flat[rng.integers(a.size)] = np.nan
    return xp.asarray(a.astype(dtype))


def _outcome(f, *args, **kw):
    try:
        return f(*args, **kw), None
    except Exception as exc:
        return None, exc


def _tol(dtype, m, n, kappa=1.0):
    return 50 * max(m, n, 1) * np.finfo(dtype).eps * kappa


def _routes(trace):
    return [e.data["route"] for e in trace.events if e.kind == "array-api"]


shapes = st.tuples(st.sampled_from([(), (2,)]), st.integers(0, 9), st.integers(0, 9))


@settings(max_examples=60, deadline=None)
@given(lib=st.sampled_from(sorted(NAMESPACES)), dtype=st.sampled_from(DTYPES), shape=shapes,
       seed=st.integers(0, 2**16), nan=st.booleans(),
       func=st.sampled_from(["qr-reduced", "qr-complete", "svd-thin", "svd-full", "svdvals",
                             "pinv", "matrix_rank"]))
def test_namespace_matches_xp(lib, dtype, shape, seed, nan, func):
    xp = NAMESPACES[lib]
    mx = maa.namespace(xp)
    batch, m, n = shape
    a = _matrix(xp, (*batch, m, n), dtype, seed, nan)
    name, _, variant = func.partition("-")
    kw = ({"mode": variant} if name == "qr" else
          {"full_matrices": variant == "full"} if name == "svd" else {})
    ref, ref_exc = _outcome(getattr(xp.linalg, name), a, **kw)
    with mpqr.explain() as trace:
        got, got_exc = _outcome(getattr(mx.linalg, name), a, **kw)
    if ref_exc is not None:  # same error as xp
        assert type(got_exc) is type(ref_exc), (got_exc, ref_exc)
        return
    assert got_exc is None, got_exc
    tall_or_wide = min(m, n) > 0 and max(m, n) >= 2 * min(m, n)
    if not nan and tall_or_wide:
        assert "mpqr" in " ".join(_routes(trace)), _routes(trace)
    assert type(got) is type(ref)
    refs, gots = (ref, got) if isinstance(ref, tuple) else ((ref,), (got,))
    for r, g in zip(refs, gots):
        assert type(g) is type(r) and g.dtype == r.dtype and g.shape == r.shape
        if lib == "array_api_strict":
            assert g.device == r.device
    if nan and a.shape[-1] * a.shape[-2]:  # the namespace's NaN propagation, exactly
        for r, g in zip(refs, gots):
            np.testing.assert_array_equal(_np(g), _np(r))
        return
    an = _np(a)
    if 0 in an.shape:
        for r, g in zip(refs, gots):
            np.testing.assert_array_equal(_np(g), _np(r))
        return
    s_ref = np.linalg.svd(an.astype(np.complex128), compute_uv=False)
    kappa = float(np.max(s_ref[..., 0] / np.maximum(s_ref[..., -1], 1e-300)))
    tol = _tol(dtype, m, n)
    scale = float(np.max(s_ref[..., 0]))
    if name == "qr":
        q, r = (_np(x) for x in got)
        rr = _np(ref[1])
        k = q.shape[-1]
        np.testing.assert_allclose(q @ r, an, atol=tol * scale)
        eye = np.eye(k)
        np.testing.assert_allclose(np.swapaxes(q.conj(), -1, -2) @ q, np.broadcast_to(
            eye, (*q.shape[:-2], k, k)), atol=tol)
        np.testing.assert_array_equal(np.tril(r, -1), 0)
        kk = min(m, n)  # |R| rows agree with xp's up to each row's unit factor
        np.testing.assert_allclose(np.abs(r[..., :kk, :]), np.abs(rr[..., :kk, :]),
                                   atol=tol * scale * kappa)
    elif name in ("svd", "svdvals"):
        s = _np(got[1] if name == "svd" else got)
        np.testing.assert_allclose(s, _np(ref[1] if name == "svd" else ref), atol=tol * scale)
        if name == "svd":
            u, vh = _np(got[0]), _np(got[2])
            k = min(m, n)
            np.testing.assert_allclose((u[..., :, :k] * s[..., None, :]) @ vh[..., :k, :], an,
                                       atol=tol * scale)
            for w in (u, np.swapaxes(vh, -1, -2)):
                c = w.shape[-1]
                np.testing.assert_allclose(np.swapaxes(w.conj(), -1, -2) @ w, np.broadcast_to(
                    np.eye(c), (*w.shape[:-2], c, c)), atol=tol)
    elif name == "pinv":
        np.testing.assert_allclose(_np(got), _np(ref), atol=tol * kappa**2 * np.max(
            np.abs(_np(ref))) + tol * kappa / scale)
    else:
        np.testing.assert_array_equal(_np(got), _np(ref))


@pytest.mark.parametrize("lib", sorted(NAMESPACES))
def test_rank_deficient_rank_and_pinv(lib):
    xp = NAMESPACES[lib]
    a = np.random.default_rng(3).standard_normal((40, 6))
    a[:, 4:] = 0.0  # rank 4, exactly
    x = xp.asarray(a)
    mx = maa.namespace(xp)
    with mpqr.explain() as trace:
        rank, p = mx.linalg.matrix_rank(x), mx.linalg.pinv(x)
        rank_r = mx.linalg.matrix_rank(x, rtol=0.5)
    assert _routes(trace) == ["mpqr.qr + svdvals(R)", "mpqr.svd", "mpqr.qr + svdvals(R)"]
    assert int(rank) == int(xp.linalg.matrix_rank(x)) == 4
    assert int(rank_r) == int(xp.linalg.matrix_rank(x, rtol=0.5))
    np.testing.assert_allclose(_np(p), _np(xp.linalg.pinv(x)), atol=1e-13)


def test_square_svd_stays_native_and_mode_errors_are_xps():
    mx = maa.namespace(cnp)
    a = np.random.default_rng(0).standard_normal((5, 5))
    with mpqr.explain() as trace:
        mx.linalg.svd(a)
    assert _routes(trace) == ["native"]
    for f, kw in ((mx.linalg.qr, {"mode": "r"}), (mx.linalg.svd, {"compute_uv": 1})):
        got, ref = _outcome(f, a, **kw), _outcome(getattr(cnp.linalg, f.__name__), a, **kw)
        assert str(got[1]) == str(ref[1]) or (got[1] is None and ref[1] is None)
    with pytest.raises(type(_outcome(strict.linalg.qr, strict.asarray([1.0, 2.0]))[1])):
        maa.namespace(strict).linalg.qr(strict.asarray([1.0, 2.0]))


def test_lstsq_numpy_namespace():
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((30, 4)), rng.standard_normal((30, 2))
    mx = maa.namespace(cnp)
    with mpqr.explain() as trace:
        got = mx.linalg.lstsq(a, b, None)
    ref = cnp.linalg.lstsq(a, b, None)
    assert "mpqr.lstsq" in _routes(trace)
    for g, r in zip(got, ref):
        np.testing.assert_allclose(g, r, rtol=1e-12, atol=1e-12)
    assert not hasattr(maa.namespace(strict).linalg, "lstsq")


@pytest.mark.parametrize("precision", ["fp32-emulated", "fp16"])
def test_products_through_the_policy_under_an_explicit_precision(precision):
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((3, 20, 30)), rng.standard_normal((30, 10))
    v = rng.standard_normal(30)
    mx = maa.namespace(cnp, precision=precision)
    u = {"fp32-emulated": 2.0**-24, "fp16": 2.0**-11}[precision]
    with mpqr.explain() as trace:
        cases = [(mx.matmul(a, b), np.matmul(a, b)), (mx.linalg.matmul(a, b), a @ b),
                 (mx.matmul(v, b), v @ b), (mx.matmul(a, v), a @ v), (mx.matmul(v, v), v @ v),
                 (mx.tensordot(a, b, axes=1), np.tensordot(a, b, axes=1)),
                 (mx.tensordot(a, a, axes=([1, 2], [1, 2])),
                  np.tensordot(a, a, axes=([1, 2], [1, 2]))),
                 (mx.vecdot(a, a[0]), np.sum(a * a[0], axis=-1)),
                 (mx.vecdot(a + 1j * a, a + 0j, axis=-2), np.sum((a - 1j * a) * a, axis=-2))]
    engines = {g.engine for g in trace.gemms}
    assert engines and not any(e.startswith("native") for e in engines), engines
    assert len([r for r in _routes(trace) if r == "mpqr.policy.gemm"]) == len(cases)
    for got, ref in cases:
        assert got.shape == ref.shape and got.dtype == ref.dtype
        np.testing.assert_allclose(got, ref, atol=8 * 30 * u * 30)
    # "auto" and None: every product native, untouched
    for prec in (None, "auto"):
        assert not hasattr(maa.namespace(cnp, precision=prec).__dict__, "matmul")
        assert "matmul" not in maa.namespace(cnp, precision=prec).__dict__


def test_product_errors_are_xps():
    mx = maa.namespace(cnp, precision="fp64")
    a = np.ones((3, 4))
    for f, args in ((mx.matmul, (a, a)), (mx.tensordot, (a, a)), (mx.vecdot, (a, np.ones(3)))):
        ref = _outcome(getattr(cnp, f.__name__), *args)[1]
        got = _outcome(f, *args)[1]
        assert type(got) is type(ref) and str(got) == str(ref)


def test_bad_arguments():
    with pytest.raises(ValueError, match="precision"):
        maa.namespace(cnp, precision="fp8")
    with pytest.raises(ValueError, match="precision"):
        maa.patch(precision="fp8")
    with pytest.raises(TypeError, match="`xp` must be an Array API namespace"):
        maa.namespace(np.random)


def _attrs():
    """The patched attributes of every copy of array-api-compat's NumPy namespace and of
    array_api_strict, found in sys.modules (not from a list of paths)."""
    import scipy.linalg  # noqa: F401  (loads SciPy's copy)
    import sklearn.utils._array_api  # noqa: F401  (loads scikit-learn's copy)

    out = {}
    for name, mod in list(sys.modules.items()):
        if name.endswith("array_api_compat.numpy") or name == "array_api_strict":
            for attr in ("qr", "svd", "svdvals", "pinv", "matrix_rank"):
                out[(name, "linalg", attr)] = getattr(mod.linalg, attr)
            for attr in ("matmul", "tensordot", "vecdot"):
                out[(name, "", attr)] = getattr(mod, attr)
    return out


def test_patch_plugs_every_copy_and_restores():
    before = _attrs()
    copies = {k[0] for k in before}
    assert {"array_api_strict", "array_api_compat.numpy"} <= copies and len(copies) >= 3
    with maa.patch():
        inside = _attrs()
        assert set(maa.patched_namespaces()) >= copies
        for key, f in inside.items():
            if key[1] == "linalg":
                assert f is not before[key], key
            else:  # no precision: products untouched
                assert f is before[key], key
        with maa.patch(precision="fp32"):
            assert all(f is not before[k] for k, f in _attrs().items()), "products"
        assert all(f is before[k] for k, f in _attrs().items() if not k[1])
    assert _attrs() == before and not maa.is_patched()


def test_patch_routes_sklearn_style_calls_and_explains():
    a = np.random.default_rng(0).standard_normal((64, 4))
    with mpqr.explain() as trace, maa.patch(precision="fp32-emulated"):
        xp = array_api_compat.array_namespace(a)
        s = xp.linalg.svd(a, full_matrices=False).S
        c = xp.matmul(a.T, a)
    ev = [e for e in trace.events if e.kind == "array-api"]
    assert [e.data["function"] for e in ev] == ["linalg.svd", "matmul"]
    assert "tc-sgemm" in ev[1].data["engines"] and "numpy.matmul" in str(ev[1])
    np.testing.assert_allclose(s, np.linalg.svd(a, compute_uv=False), rtol=1e-5)
    np.testing.assert_allclose(c, a.T @ a, rtol=1e-5)


def test_patch_is_thread_safe_and_per_thread_precision():
    a = np.random.default_rng(0).standard_normal((64, 8))
    before = _attrs()
    errors, engines = [], {}
    barrier = threading.Barrier(4)

    def work(i, prec):
        try:
            with maa.patch(precision=prec), mpqr.explain() as trace:
                barrier.wait()
                for _ in range(5):
                    cnp.matmul(a.T, a)
                    cnp.linalg.qr(a)
                barrier.wait()
            engines[i] = {g.engine for g in trace.gemms if g.label == "array-api matmul"}
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i, p))
               for i, p in enumerate(["fp32-emulated", None, "fp16", None])]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert engines[0] == {"tc-sgemm"} and engines[2] == {"tc-fp16"}
    assert engines[1] == engines[3] == set()  # no precision: native, not through mpqr
    assert _attrs() == before


def test_decorator_and_exception_restore():
    before = _attrs()

    @maa.patch()
    def f():
        assert maa.is_patched()
        raise KeyError("x")

    with pytest.raises(KeyError):
        f()
    assert _attrs() == before and not maa.is_patched()


def test_namespace_imported_inside_the_block_is_plugged_and_restored():
    code = """
import sys, array_api_compat
assert "array_api_compat.numpy" not in sys.modules
from mpqr.compat.array_api import patch, patched_namespaces
with patch():
    import array_api_compat.numpy as n
    assert n.linalg.qr.__module__ == "mpqr.compat._xp_functions", n.linalg.qr
    assert "array_api_compat.numpy" in patched_namespaces()
assert n.linalg.qr.__module__ != "mpqr.compat._xp_functions"
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.strip() == "ok", out.stderr[-2000:]


@pytest.mark.parametrize(("lib", "dtype"), [("numpy", "float64"), ("numpy", "complex128"),
                                           ("array_api_strict", "float32")])
def test_blocked_column_mean_matches_xp(monkeypatch, lib, dtype):
    """``mean(x, axis=0)`` of a tall matrix as the sum of row blocks' sums (CuPy's
    namespaces; here the NumPy and strict ones stand in): xp's dtype, shape, keepdims
    and result type, values to the blocked sum's rounding bound ``gamma_(b + q + 2)``
    in units of ``sum |x_i| / m``, NaN propagated per column; every other call (other
    axes, few rows, a wide matrix, 1-D, integers, an F-ordered array) is xp's own."""
    from mpqr.compat import _xp_functions as xf

    xp = NAMESPACES[lib]
    monkeypatch.setattr(xf, "BLOCKED_MEAN", frozenset({lib}))
    mx = maa.namespace(xp)
    m, n = 5000, 7  # four blocks of 1024 rows and 904 more
    a = _matrix(np, (m, n), dtype, 3)
    a[17, 2] = np.nan
    x = xp.asarray(a)
    for axis, keep in ((0, False), ((0,), True), (-2, False)):
        with mpqr.explain() as trace:
            got = mx.mean(x, axis=axis, keepdims=keep)
        ref = xp.mean(x, axis=axis, keepdims=keep)
        assert _routes(trace) == ["sum of row blocks' sums"]
        assert type(got) is type(ref) and got.dtype == ref.dtype and got.shape == ref.shape
        g, r = _np(got).reshape(n), np.mean(a.astype(np.complex128), axis=0)
        assert np.isnan(g[2]) and np.isnan(_np(ref).reshape(n)[2])
        ok = np.arange(n) != 2
        q = m // xf.MEAN_BLOCK
        bound = 2 * (xf.MEAN_BLOCK + q + 2) * np.finfo(dtype).eps / 2
        scale = np.mean(np.abs(a), axis=0)
        assert np.all(np.abs(g - r)[ok] <= bound * scale[ok])
    small = xp.asarray(a[:4000])
    wide = xp.asarray(_matrix(np, (4096, 600), dtype, 4))
    cases = [(x, {"axis": 1}), (x, {"axis": None}), (small, {"axis": 0}), (wide, {"axis": 0}),
             (x[:, 0], {"axis": 0}), (xp.asarray(np.ones((m, 3), dtype=np.int64)), {"axis": 0})]
    if lib == "numpy":
        cases.append((np.asfortranarray(a), {"axis": 0}))
    for v, kw in cases:
        with mpqr.explain() as trace:
            got, err = _outcome(mx.mean, v, **kw)
        ref, ref_err = _outcome(xp.mean, v, **kw)
        assert _routes(trace) == []
        assert type(err) is type(ref_err)
        if err is None:
            np.testing.assert_array_equal(_np(got), _np(ref))


def test_patch_plugs_the_mean_only_where_it_is_blocked(monkeypatch):
    """Under ``patch()`` the NumPy namespace's ``mean`` stays NumPy's (only CuPy's is
    replaced by default); with NumPy listed it is replaced and restored on exit."""
    from mpqr.compat import _xp_functions as xf

    orig = cnp.mean
    with maa.patch():
        assert cnp.mean is orig
    monkeypatch.setattr(xf, "BLOCKED_MEAN", frozenset({"numpy"}))
    with maa.patch():
        assert cnp.mean is not orig
        x = cnp.asarray(np.ones((8192, 4)))
        np.testing.assert_array_equal(cnp.mean(x, axis=0), np.ones(4))
    assert cnp.mean is orig
