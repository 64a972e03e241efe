"""The Gram route of lstsq (mpqr/lstsq/gram.py): taken only for tall, well-conditioned,
full-rank problems at the working precision, with SciPy's answers and singular values
within the error bound the route's docstring derives; declined (and traced) otherwise.

Singular values are checked against matrices built with known ones,
``|s_i - sigma_i| <= 10 (sqrt(M) u cond/2 + N u) sigma_1``: the Gram matrix's
rounding (``sqrt(M) u ||A||^2``, probabilistic) divided by ``2 sigma_i``, plus the
rounding of forming A; the factor 10 is margin.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg as sla
from mpqr.backends import get_backend

import mpqr
from mpqr._array_api import array_namespace
from mpqr.lstsq.gram import (
    GRAM_COND_MAX,
    GRAM_EIG_MAX_N,
    INVERSE_MARGIN,
    inverse_certificate,
    norm2_estimate,
)
from tests._support import to_numpy

pytestmark = pytest.mark.usefixtures("general_lstsq_route")  # the general route's steps



def _problem(m, n, sigma, dtype, seed, complex_=False):
    rng = np.random.default_rng(seed)

    def rand(*shape):
        z = rng.standard_normal(shape)
        return z + 1j * rng.standard_normal(shape) if complex_ else z
    u, _ = np.linalg.qr(rand(m, n))
    v, _ = np.linalg.qr(rand(n, n))
    a = ((u * sigma) @ v.conj().T).astype(dtype)
    return a, rand(m, 2).astype(dtype)


def _paths(trace):
    return [e.data.get("path") for e in trace.events if e.kind == "method"]


def _metric(a, b, x):
    # in complex128 only where an operand is complex (a real 8480 x 520 A^H A in
    # complex arithmetic took ~1 s a call on a 2-core CI host)
    wide = np.result_type(*(np.asarray(t).dtype for t in (a, b, x)), np.float64)
    wide = np.complex128 if np.dtype(wide).kind == "c" else np.float64
    a, b, x = (np.asarray(t, dtype=wide) for t in (a, b, x))
    r = b - a @ x
    # ||A||_2^2 = ||A^H A||_2: the SVD of N x N, not of M x N
    return np.linalg.norm(a.conj().T @ r) / (np.linalg.norm(a.conj().T @ a, 2)
                                             * np.linalg.norm(x))


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.complex128, np.complex64])
@pytest.mark.parametrize("driver", [None, "gelsy"])
@pytest.mark.parametrize("n", [24, 160])  # CuPy: n x n steps on the host / on the GPU
def test_gram_route_matches_scipy(xp, dtype, driver, n):
    if xp.__name__.startswith("array_api_strict") and np.dtype(dtype).kind == "c":
        pytest.skip("array-api-strict: complex lstsq runs on the host path elsewhere")
    m = 16 * n + 256
    sigma = np.linspace(3.0, 1.0, n)  # cond 3 <= GRAM_COND_MAX
    a, b = _problem(m, n, sigma, dtype, seed=1, complex_=np.dtype(dtype).kind == "c")
    a0, b0 = a.copy(), b.copy()
    with mpqr.explain() as trace:
        x, res, rank, s = mpqr.lstsq(xp.asarray(a), xp.asarray(b), lapack_driver=driver)
    assert "gram" in _paths(trace)
    np.testing.assert_array_equal(a, a0)
    np.testing.assert_array_equal(b, b0)
    ref = sla.lstsq(a, b, lapack_driver=driver)
    assert rank == ref[2] == n
    x = to_numpy(x)
    assert x.dtype == ref[0].dtype
    for j in range(2):
        assert _metric(a, b[:, j], x[:, j]) <= 10 * max(_metric(a, b[:, j], ref[0][:, j]),
                                                        np.finfo(dtype).eps)
    u = np.finfo(dtype).eps / 2
    if driver == "gelsy":
        assert s is None and to_numpy(res).shape == (0,)
        return
    s = to_numpy(s)
    assert s.dtype == ref[3].dtype and s.shape == (n,)
    tol = 10 * (np.sqrt(m) * u * GRAM_COND_MAX / 2 + n * u) * sigma[0]
    assert np.max(np.abs(s - sigma)) <= tol
    rtol = 10 * np.sqrt(m) * u * GRAM_COND_MAX
    np.testing.assert_allclose(to_numpy(res), ref[1], rtol=rtol)


def test_gram_route_underdetermined(xp):
    n, m = 480, 20  # A is 20 x 480: the route runs on A^H
    a, _ = _problem(n, m, np.linspace(2.0, 1.0, m), np.float64, seed=2)
    a = a.T.copy()
    b = np.random.default_rng(3).standard_normal(m)
    with mpqr.explain() as trace:
        x, res, rank, s = mpqr.lstsq(xp.asarray(a), xp.asarray(b))
    assert "gram" in _paths(trace)
    ref = sla.lstsq(a, b)
    u = np.finfo(np.float64).eps / 2
    # minimum-norm solution: x lies in range(A^T); compare with SciPy's
    np.testing.assert_allclose(to_numpy(x), ref[0], rtol=0, atol=100 * np.sqrt(n) * u
                               * np.linalg.norm(ref[0]))
    assert rank == m and to_numpy(res).shape == (0,)
    np.testing.assert_allclose(to_numpy(s), ref[3], rtol=0,
                               atol=10 * np.sqrt(n) * u * GRAM_COND_MAX * ref[3][0])


@pytest.mark.parametrize("case", ["ill-conditioned", "cutoff", "wide-aspect", "underflow",
                                  "overflow"])
def test_gram_route_declined(xp, case):
    m, n = 640, 24
    sigma = np.linspace(3.0, 1.0, n)
    cond = None
    if case == "ill-conditioned":
        sigma = np.logspace(0, -3, n)
    elif case == "cutoff":  # every sigma_i > 0.35 sigma_1, but the cutoff is 0.5
        cond = 0.5
    elif case == "wide-aspect":
        m = 15 * n
    a, b = _problem(m, n, sigma, np.float64, seed=4)
    if case in ("underflow", "overflow"):
        # squared column norms 2^-1400 (underflow) or 2^1200 (overflow) in the Gram matrix;
        # unscaled, CGLS's products A^H r underflowed to 0 and x = 0 was returned
        e = -700 if case == "underflow" else 600
        a, b = a * 2.0**e, b * 2.0**e
    with mpqr.explain() as trace:
        x, _res, rank, s = mpqr.lstsq(xp.asarray(a), xp.asarray(b), cond=cond)
    paths = _paths(trace)
    assert "gram" not in paths
    if case != "wide-aspect":  # the route was tried and its refusal is traced
        assert "qr" in paths
    scaled = [e for e in trace.events if e.kind == "scale"]
    assert bool(scaled) == (case in ("underflow", "overflow"))
    ref = sla.lstsq(a, b, cond=cond)
    assert rank == ref[2]
    u = np.finfo(np.float64).eps / 2
    np.testing.assert_allclose(to_numpy(s), ref[3], rtol=0,
                               atol=10 * np.sqrt(m) * n * u * ref[3][0])
    kappa = ref[3][0] / ref[3][rank - 1]
    tol = 25 * np.finfo(np.float64).eps * kappa**2
    np.testing.assert_allclose(to_numpy(x), ref[0], rtol=0, atol=tol * np.abs(ref[0]).max())


def test_gram_route_nonfinite_a_is_never_finite(xp):
    a, b = _problem(640, 24, np.linspace(3.0, 1.0, 24), np.float64, seed=5)
    a[7, 3] = np.inf
    with mpqr.explain() as trace, pytest.raises(mpqr.LinAlgError, match="NaN or Inf"):
        mpqr.lstsq(xp.asarray(a), xp.asarray(b), check_finite=False)
    assert "gram" not in _paths(trace)


def test_gram_route_only_at_working_precision(xp):
    """The Gram route needs a working-precision Gram matrix (SciPy's singular values).
    At fp32-emulated a tall-skinny problem is factored in the input's own precision
    anyway (traced), so the route may run, on native fp64 products only."""
    if xp.__name__.startswith("array_api_strict"):
        pytest.skip("array-api-strict has no fp32-emulated engine")
    a, b = _problem(640, 24, np.linspace(3.0, 1.0, 24), np.float64, seed=6)
    with mpqr.explain() as trace:
        x = mpqr.lstsq(xp.asarray(a), xp.asarray(b), precision="fp32-emulated")[0]
    (ev,) = [e for e in trace.events if e.kind == "precision"]
    assert ev.message == ("lstsq: precision='fp32-emulated' on a tall-skinny 640x24 matrix: "
                          "its QR runs in the input's own, at least as accurate precision "
                          "(fp64), which sets the resolution of the rank decisions")
    assert "gram" in _paths(trace)
    assert {g.engine for g in trace.gemms} == {"native-fp64"}
    assert _metric(a, b, to_numpy(x)) <= 10 * _metric(a, b, sla.lstsq(a, b)[0])


@pytest.mark.parametrize("kind", ["gaussian", "geometric", "complex", "rank1", "zero",
                                  "huge", "tiny"])
def test_norm2_estimate_is_a_close_lower_bound(xp, kind):
    """Power iteration on G = A^H A (through G^2): never above ||A||_2 (beyond rounding)
    and within the factor 2 the rank certificates allow (they take 2 est as the upper
    bound); at ||A|| = 2^+-300, where G^2 would over- or underflow unscaled."""
    if xp.__name__.startswith("array_api_strict") and kind == "complex":
        pytest.skip("array-api-strict: complex products run on the host path elsewhere")
    rng = np.random.default_rng(11)
    m, n = 400, 60
    if kind == "gaussian":
        a = rng.standard_normal((m, n))
    elif kind == "geometric":
        a, _ = _problem(m, n, np.logspace(0, -8, n), np.float64, seed=3)
    elif kind == "complex":
        a = rng.standard_normal((m, n)) + 1j * rng.standard_normal((m, n))
    elif kind == "rank1":
        a = np.outer(rng.standard_normal(m), rng.standard_normal(n))
    elif kind in ("huge", "tiny"):
        a = rng.standard_normal((m, n)) * 2.0 ** (300 if kind == "huge" else -300)
    else:
        a = np.zeros((m, n))
    g = a.conj().T @ a
    gx = xp.asarray(g)
    est = norm2_estimate(lambda x, y: x @ y, get_backend(array_namespace(gx)), gx)
    true = np.linalg.norm(a, 2)
    if kind == "zero":
        assert est == 0.0
        return
    u = 2.0**-53
    assert true / 2 <= est <= true * (1 + 10 * n * u)


def test_norm2_estimate_float32_subnormal_gram(xp):
    """float32 A at 2^-70: G's diagonal is subnormal (about 2^-131), where scaling by
    2^-e with e = exponent(max G_ii) would overflow float32; the clamped scale keeps the
    estimate a lower bound within 2x (up to G's subnormal rounding, 2^-149 absolute)."""
    a = (np.random.default_rng(12).standard_normal((400, 20)) * 2.0**-70).astype(np.float32)
    g = a.T @ a
    assert np.max(np.diag(g)) < np.finfo(np.float32).smallest_normal
    gx = xp.asarray(g)
    est = norm2_estimate(lambda x, y: x @ y, get_backend(array_namespace(gx)), gx)
    true = np.linalg.norm(a.astype(np.float64), 2)
    if xp.__name__.startswith("cupy") and est == 0.0:
        # CuPy's kernels flush float32 subnormals to zero (measured on an H100): G reads
        # as zero, and 0.0 is what every caller takes as "no certificate"
        return
    assert true / 2 <= est <= true * (1 + 1e-3)


def test_inverse_certificate_proves_sigma_min(xp):
    """sigma_min(R) >= 1 / ||R^-1||_F: certified exactly when tau is below that (with the
    1% margin for the computed inverse), the returned norm within n u cond(R) of the
    exact inverse's; a NaN in R never certifies."""
    rng = np.random.default_rng(21)
    n = 50
    r = np.linalg.qr(rng.standard_normal((200, n)) @ np.diag(np.logspace(0, -3, n)))[1]
    exact_inv = sla.solve_triangular(r, np.eye(n))
    fro = np.linalg.norm(exact_inv)
    assert 1 / fro <= np.linalg.svd(r, compute_uv=False)[-1]
    be = get_backend(array_namespace(xp.asarray(0.0)))
    got = inverse_certificate(be, xp.asarray(r), 0.99 / (INVERSE_MARGIN * fro))
    assert got == pytest.approx(fro, rel=10 * n * np.linalg.cond(r) * 2.0**-53)
    assert inverse_certificate(be, xp.asarray(r), 1.001 / (INVERSE_MARGIN * fro)) is None
    bad = r.copy()
    bad[3, 7] = np.nan
    assert inverse_certificate(be, xp.asarray(bad), 0.0) is None


@pytest.mark.parametrize("n", [40, 520])  # decided by the eigenvalues / by the Cholesky test
@pytest.mark.parametrize("kappa", [1e2, 3e3])
def test_gram_route_without_s_takes_moderate_condition(xp, n, kappa):
    """gelsy returns no singular values: the route then only needs CGLS to converge
    (cond(A) <= GRAM_COND_MAX_NO_S) and the rank to be certain; SciPy's accuracy, and a
    default-driver call on the same A still declines (its s would be inaccurate)."""
    if n > 40 and xp.__name__ != "numpy":
        pytest.skip("one backend for the large Cholesky-test case (the same code path)")
    m = 16 * n + 160
    a, b = _problem(m, n, np.logspace(0, -np.log10(kappa), n), np.float64, seed=6)
    with mpqr.explain() as trace:
        x, res, rank, s = mpqr.lstsq(xp.asarray(a), xp.asarray(b), lapack_driver="gelsy")
    assert "gram" in _paths(trace) and s is None and rank == n
    if n > GRAM_EIG_MAX_N:
        # spectrum 1..1/kappa: 1/||R^-1||_F is 1.3e-3 (kappa 100) and 5.8e-5 (kappa 3000)
        # against tau = ||A|| / 1e4: the explicit inverse certifies only the first
        how = "||R^-1||_F bound" if kappa < 1e3 else "Cholesky test"
        msg = next(e.message for e in trace.events if e.kind == "method")
        assert msg.endswith(f", {how})"), msg
    refine = next(e for e in trace.events if e.kind == "refine")
    assert refine.data["converged"] and refine.data["iterations"] <= 4
    ref = sla.lstsq(a, b, lapack_driver="gelsy")
    x = to_numpy(x)
    for j in range(2):
        assert _metric(a, b[:, j], x[:, j]) <= 10 * max(_metric(a, b[:, j], ref[0][:, j]),
                                                        np.finfo(np.float64).eps)
    np.testing.assert_allclose(to_numpy(res), ref[1], rtol=10 * np.sqrt(m) * 2.0**-53)
    if n == 40:
        with mpqr.explain() as trace:
            mpqr.lstsq(xp.asarray(a), xp.asarray(b))
        assert "gram" not in _paths(trace)


def test_gram_route_without_s_declines_beyond_its_bounds(xp):
    # cond 1e6 > GRAM_COND_MAX_NO_S; float32 at M = 20000: sigma_min/sigma_max = 0.01 is
    # below sqrt(2 (M + N) u), where G's rounding could hide the rank
    m, n = 2000, 40
    a, b = _problem(m, n, np.logspace(0, -6, n), np.float64, seed=7)
    with mpqr.explain() as trace:
        x = mpqr.lstsq(xp.asarray(a), xp.asarray(b), lapack_driver="gelsy")[0]
    msgs = [e.message for e in trace.events if e.kind == "method"]
    assert any(msg.startswith("lstsq: Gram route declined (cond(A) = 1e+06 > 10000)")
               for msg in msgs)
    ref = sla.lstsq(a, b, lapack_driver="gelsy")[0]
    assert _metric(a, b[:, 0], to_numpy(x)[:, 0]) <= 10 * _metric(a, b[:, 0], ref[:, 0])
    a32, b32 = _problem(20000, 20, np.logspace(0, -2, 20), np.float32, seed=8)
    with mpqr.explain() as trace:
        mpqr.lstsq(xp.asarray(a32), xp.asarray(b32), lapack_driver="gelsy")
    floor = np.sqrt(2 * 20020 * 2.0**-24)
    assert (f"lstsq: Gram route declined (sigma_min/sigma_max = 0.01 <= sqrt(2 (M + N) u) = "
            f"{floor:.3g}, the rounding of A^H A); QR route") in \
        [e.message for e in trace.events if e.kind == "method"]


def test_declined_gram_matrix_starts_the_qr_routes_cholqr2(xp):
    """cond(A) = 100 > 4 with the default driver: the Gram route declines, and its G is
    CholQR2's first Gram matrix in the QR route (one pass over A fewer, traced); the
    answer is SciPy's as before."""
    m, n = 5300, 200  # above 2^20 elements: qr(auto) takes CholQR2, not geqrf
    a, b = _problem(m, n, np.logspace(0, -2, n), np.float64, seed=9)
    with mpqr.explain() as trace:
        x, res, rank, s = mpqr.lstsq(xp.asarray(a), xp.asarray(b))
    kinds = [e.kind for e in trace.events]
    assert "gram-reuse" in kinds and "gram" not in _paths(trace)
    assert sum(g.label == "cholqr2-gram" for g in trace.gemms) == 1  # the second pass only
    ref = sla.lstsq(a, b)
    u = 2.0**-53
    assert rank == ref[2] == n
    np.testing.assert_allclose(to_numpy(s), ref[3], rtol=0, atol=10 * np.sqrt(m) * n * u
                               * ref[3][0])
    np.testing.assert_allclose(to_numpy(res), ref[1], rtol=10 * np.sqrt(m) * u)
    x = to_numpy(x)
    for j in range(2):
        assert _metric(a, b[:, j], x[:, j]) <= 10 * max(_metric(a, b[:, j], ref[0][:, j]), u)


def test_gram_reuse_needs_the_same_array_and_precision(xp):
    from mpqr.qr.cholqr import cholqr2, reuse_first_gram

    a, _ = _problem(3000, 20, np.linspace(2.0, 1.0, 20), np.float64, seed=10)
    x, other = xp.asarray(a), xp.asarray(a.copy())
    ns = array_namespace(x)
    be = get_backend(ns)
    g = be.small(ns.matmul(ns.matrix_transpose(x), x))
    with mpqr.explain() as trace, reuse_first_gram(x, *g):
        cholqr2(be, other, precision="auto", prec_name="auto")
    assert "gram-reuse" not in [e.kind for e in trace.events]
    # fp64 products on float32 input: the Gram route ran fp32 products, so no reuse
    a32, b32 = _problem(60000, 20, np.logspace(0, -1.5, 20), np.float32, seed=11)  # > 2^20
    with mpqr.explain() as trace:
        mpqr.lstsq(xp.asarray(a32), xp.asarray(b32), precision="fp64")
    assert "gram-reuse" not in [e.kind for e in trace.events]
