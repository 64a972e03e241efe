"""Backend plugins: selection by namespace, registration, portable kernels,
and the rule that the core never imports numpy or cupy."""

from __future__ import annotations

import ast
import contextlib
import pathlib

import numpy as np
import pytest
from mpqr.backends import ArrayAPIBackend, get_backend, register_backend

import mpqr
from mpqr._array_api import array_namespace
from tests._support import to_numpy

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_backend_follows_namespace(xp):
    be = get_backend(array_namespace(xp.ones(2)))
    expected = {"numpy": "numpy", "numpy_readonly": "numpy", "cupy": "cupy",
                "array_api_strict": "array-api"}[getattr(xp, "__name__", "numpy")]
    assert be.name == expected


def test_register_backend_plugin():
    xs = pytest.importorskip("array_api_strict")

    class Custom(ArrayAPIBackend):
        name = "custom-strict"

        @classmethod
        def matches(cls, xp):
            return xp is array_namespace(xs.ones(1))

    try:
        register_backend(Custom)
        assert get_backend(array_namespace(xs.ones(1))).name == "custom-strict"
        with mpqr.explain() as tr:
            mpqr.matmul(xs.ones((2, 2)), xs.ones((2, 2)))
        assert tr.gemms[0].engine == "native-fp64"
    finally:
        import mpqr.backends as mb

        mb._registered.remove(Custom)
        mb._cache.clear()
    with pytest.raises(TypeError, match="a backend must subclass mpqr.backends.ArrayAPIBackend"):
        register_backend(object)


def test_fp16_precision_on_backend_without_fp16():
    xs = pytest.importorskip("array_api_strict")
    with pytest.raises(NotImplementedError,
                       match="precision='fp16' needs the tc-fp16 engine, which the array-api "
                             "backend does not provide"):
        mpqr.matmul(xs.ones((2, 2)), xs.ones((2, 2)), precision="fp16")


def test_portable_triangular_solve_and_lu(xp):
    rng = np.random.default_rng(0)
    n = 37
    a = rng.standard_normal((n, n)) + n * np.eye(n)
    b = rng.standard_normal((n, 3))
    generic = ArrayAPIBackend(array_namespace(xp.ones(1)))
    for lower in (True, False):
        t = np.tril(a) if lower else np.triu(a)
        x = to_numpy(generic.solve_triangular(xp.asarray(t), xp.asarray(b), lower=lower))
        # backward error of a triangular solve: |b - T x| <= n u |T||x|
        assert np.all(np.abs(b - t @ x) <= 2 * n * 2.0**-53 * (np.abs(t) @ np.abs(x)))
    l, u = generic.lu_nopivot(xp.asarray(a))
    l, u = to_numpy(l), to_numpy(u)
    assert np.array_equal(np.tril(l), l) and np.allclose(np.diag(l), 1)
    assert np.array_equal(np.triu(u), u)
    assert np.all(np.abs(l @ u - a) <= 4 * n * 2.0**-53 * (np.abs(l) @ np.abs(u)))


def test_exponent_and_ldexp_exact(xp):
    be = get_backend(array_namespace(xp.ones(1)))
    vals = np.array([1.0, 0.75, 2.0**-1074, 2.0**1023 * 1.5, 3.0, 0.0, np.inf, np.nan])
    e = to_numpy(be.exponent(xp.asarray(vals)))
    assert e.tolist() == [0, -1, -1074, 1023, 1, 0, 0, 0]
    x = np.array([1.5, -3.0, 2.0**-1000])
    out = to_numpy(be.ldexp(xp.asarray(x), xp.asarray(np.array([1000, -1070, 1000],
                                                                dtype=np.int32))))
    assert out.tolist() == [1.5 * 2.0**1000, -3.0 * 2.0**-1070, 1.0]


def test_core_never_imports_numpy_or_cupy():
    offenders = []
    for path in (ROOT / "mpqr").rglob("*.py"):
        if path.relative_to(ROOT / "mpqr").parts[0] in ("bench", "cli"):
            continue  # command-line tooling, not the algorithmic core
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for nm in names:
                if nm.split(".")[0] in ("numpy", "cupy", "cupyx", "scipy"):
                    offenders.append(f"{path.relative_to(ROOT)}: {nm}")
    assert offenders == []


def _imports_array_api_compat(path) -> bool:
    """Whether the module's code imports array-api-compat (its docstrings and examples
    may name it: the Array-API front end names the vendored copies it plugs)."""
    import ast

    for node in ast.walk(ast.parse(path.read_text())):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        if any(n.split(".")[0] == "array_api_compat" for n in names):
            return True
    return False


def test_array_api_compat_imported_in_one_place():
    users = [p.relative_to(ROOT).as_posix() for d in ("mpqr", "backends", "compat")
             for p in (ROOT / d).rglob("*.py") if _imports_array_api_compat(p)]
    assert users == ["mpqr/_array_api.py"]


def test_gpu_backend_keeps_host_blas_on_one_thread_during_a_call():
    # the CuPy backend's host work is n x n steps, where BLAS thread wake-ups dominate;
    # its host_blas_scope is the shared helper, which needs no GPU, so this runs in CI
    threadpoolctl = pytest.importorskip("threadpoolctl")
    from mpqr.backends.host.blas import one_thread as _host_blas_one_thread

    def blas_threads():
        return [i["num_threads"] for i in threadpoolctl.threadpool_info()
                if i["user_api"] == "blas"]

    # two threads first (tests/conftest.py may have limited a pytest-xdist worker to one)
    with threadpoolctl.threadpool_limits(2, user_api="blas"):
        before = blas_threads()
        if max(before) < 2:
            pytest.skip(f"host BLAS runs at most {max(before)} thread here")
        with _host_blas_one_thread():
            assert blas_threads() and set(blas_threads()) == {1}
        assert blas_threads() == before
        # the direct form the small least squares use around R's SVD, nested too
        from mpqr.backends.host.blas import OneThread

        with OneThread():
            assert set(blas_threads()) == {1}
            with OneThread():
                assert set(blas_threads()) == {1}
            assert set(blas_threads()) == {1}
        assert blas_threads() == before


def test_device_errors_enters_the_backends_host_blas_scope():
    from mpqr._gpu_errors import device_errors

    seen = []

    class Fake:
        @contextlib.contextmanager
        def host_blas_scope(self):
            seen.append("in")
            yield
            seen.append("out")

    with device_errors(Fake(), "mpqr.qr"):
        assert seen == ["in"]
    assert seen == ["in", "out"]


@pytest.mark.parametrize("shape", [(5, 3), (70_000, 1), (200_003, 2), (0, 2)])
@pytest.mark.parametrize("dtype", ["float64", "float32", "complex128"])
def test_column_norms_and_sumsq(xp, shape, dtype):
    """Squared column norms and column norms on every backend (on CuPy, the chunked
    reduction of tall arrays past 65536 rows, with a row tail) against exact sums of
    the float64 values; relative error within the summation bound ``m u``."""
    rng = np.random.default_rng(7)
    v0 = rng.standard_normal(shape)
    if dtype.startswith("complex"):
        v0 = v0 + 1j * rng.standard_normal(shape)
    v0 = v0.astype(dtype)
    be = get_backend(array_namespace(xp.ones(1)))
    v = xp.asarray(v0)
    exact = np.sum(np.abs(v0.astype(np.complex128)) ** 2, axis=0).real
    u = float(np.finfo(np.dtype(dtype)).eps) / 2
    tol = (shape[0] + 2) * u * exact + 1e-300
    got = to_numpy(be.column_sumsq(v))
    assert got.shape == (shape[1],) and got.dtype == np.finfo(np.dtype(dtype)).dtype
    assert np.all(np.abs(got - exact) <= tol), (got, exact)
    norms = to_numpy(be.column_norms(v))
    assert np.all(np.abs(norms - np.sqrt(exact)) <= tol / np.maximum(np.sqrt(exact), 1e-300))


@pytest.mark.skip_xp_backend("numpy_readonly", reason="writes into its argument")
@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (4, 4), (1, 1), (6, 1), (0, 4), (2, 4, 3)])
def test_add_identity_adds_one_to_the_diagonal_in_place(xp, shape):
    be = get_backend(array_namespace(xp.asarray(1.0)))
    want = np.arange(float(np.prod(shape))).reshape(shape)
    x = xp.asarray(want.copy())
    k = min(shape[-2:])
    want[..., range(k), range(k)] += 1
    be.add_identity(x)
    np.testing.assert_array_equal(to_numpy(x), want)
    if len(shape) == 2 and k:  # a column block of a wider array: not contiguous
        base = xp.zeros((shape[0], shape[1] + 3))
        view = base[:, 1:shape[1] + 1]
        be.add_identity(view)
        got = to_numpy(base)
        ref = np.zeros((shape[0], shape[1] + 3))
        ref[range(k), [i + 1 for i in range(k)]] = 1
        np.testing.assert_array_equal(got, ref)


def test_small_lapack_calls_run_the_host_blas_on_one_thread():
    """Up to ONE_THREAD_MAX_ELEMENTS the host BLAS runs on one thread, beyond it on the
    library's own count; both restored after."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    from mpqr.backends.host.blas import ONE_THREAD_MAX_ELEMENTS, small_lapack

    def blas_threads():
        return [i["num_threads"] for i in threadpoolctl.threadpool_info()
                if i["user_api"] == "blas"]

    before = blas_threads()
    if not before:
        pytest.skip("no BLAS found by threadpoolctl")
    with small_lapack(ONE_THREAD_MAX_ELEMENTS):
        assert set(blas_threads()) == {1}
    assert blas_threads() == before
    with small_lapack(ONE_THREAD_MAX_ELEMENTS + 1):
        assert blas_threads() == before
