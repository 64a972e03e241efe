"""Helpers shared by the tests: exact references and namespace-aware checks."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

import mpqr._array_api as aa


def to_numpy(x) -> np.ndarray:
    """Host copy of any backend's array."""
    if aa.is_cupy_namespace(aa.array_namespace(x)):
        return x.get()
    return np.asarray(x)


def from_numpy(xp, a: np.ndarray):
    """``a`` as an array of namespace ``xp`` (read-only for the read-only NumPy)."""
    return xp.asarray(a)


def assert_close(actual, desired, *, rtol, atol=0.0, xp=None):
    """Check namespace, dtype and shape first, then values (array-api-extra style)."""
    if xp is not None:
        got_ns = aa.namespace_name(aa.array_namespace(actual))
        want = aa.namespace_name(aa.array_namespace(xp.asarray(0.0)))
        assert got_ns == want, f"namespace {got_ns} != {want}"
    a, d = to_numpy(actual), np.asarray(to_numpy(desired))
    assert a.shape == d.shape, f"shape {a.shape} != {d.shape}"
    np.testing.assert_allclose(a, d, rtol=rtol, atol=atol)


def _two_product(a: np.ndarray, b: np.ndarray):
    """Exact a*b = p + e for float64 arrays (Dekker/Veltkamp, no FMA needed)."""
    p = a * b
    factor = 134217729.0  # 2^27 + 1
    def split(x):
        c = factor * x
        hi = c - (c - x)
        return hi, x - hi
    ah, al = split(a)
    bh, bl = split(b)
    e = ((ah * bh - p) + ah * bl + al * bh) + al * bl
    return p, e


def exact_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Correctly rounded float64 ``a @ b`` (exact products, ``math.fsum``).

    Valid for finite float64 inputs whose products neither overflow nor
    underflow (the tests keep magnitudes in range).
    """
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    m = a.shape[0]
    n = b.shape[1]
    out = np.empty((m, n))
    for j in range(n):
        p, e = _two_product(a, b[:, j][None, :])
        both = np.concatenate([p, e], axis=1)
        for i in range(m):
            out[i, j] = math.fsum(both[i])
    return out


def exact_matmul_fraction(a: np.ndarray, b: np.ndarray) -> list[list[Fraction]]:
    """Exact rational ``a @ b`` for tiny inputs (checks :func:`exact_matmul` itself)."""
    fa = [[Fraction(float(x)) for x in row] for row in a]
    fb = [[Fraction(float(x)) for x in row] for row in b]
    return [[sum((fa[i][t] * fb[t][j] for t in range(len(fb))), Fraction(0))
             for j in range(len(fb[0]))] for i in range(len(fa))]


def rel_error_vs_abs(c: np.ndarray, exact: np.ndarray, a: np.ndarray, b: np.ndarray) -> float:
    """max_ij |c - exact| / (|a| |b|)_ij, the elementwise GEMM error measure."""
    denom = np.abs(np.asarray(a, np.float64)) @ np.abs(np.asarray(b, np.float64))
    err = np.abs(np.asarray(c, np.float64) - exact)
    mask = denom > 0
    return float(np.max(err[mask] / denom[mask])) if mask.any() else 0.0


def assert_rank_deficient_residues(res, ref) -> None:
    """``residues`` of a rank-deficient ``M > N`` lstsq as the installed SciPy gives them:
    empty before 1.18; NaN in the full-rank shape from 1.18 on (its release notes)."""
    from mpqr.lstsq._scipy_rules import nan_residues_when_rank_deficient

    res, ref = to_numpy(res), np.asarray(ref)
    assert nan_residues_when_rank_deficient() == (ref.size != 0)
    if ref.size == 0:
        assert res.shape == (0,)
    else:
        assert res.shape == ref.shape and np.isnan(res).all() and np.isnan(ref).all()


def conditioned_lstsq_problem(m: int, n: int, kappa: float, seed: int):
    """``(A, b)``: an ``m x n`` A with singular values spaced logarithmically from 1 to
    ``1/kappa`` (random singular vectors), and a random ``b``."""
    rng = np.random.default_rng(seed)
    u, _ = np.linalg.qr(rng.standard_normal((m, n)))
    v, _ = np.linalg.qr(rng.standard_normal((n, n)))
    a = (u * np.logspace(0, -np.log10(kappa), n)) @ v.T
    return a, rng.standard_normal(m)


def normal_equation_residual(a, b, x) -> float:
    """``||A^T (b - A x)|| / (||A||^2 ||x||)``: the accuracy measure of lstsq."""
    r = b - a @ x
    # ||A||_2^2 = ||A^T A||_2: an N x N SVD instead of an M x N one
    return np.linalg.norm(a.T @ r) / (np.linalg.norm(a.T @ a, 2) * np.linalg.norm(x))


def exact_matmul_complex(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Correctly rounded complex128 ``a @ b``: each part is one exact real dot product of
    length ``2k`` (``Cr = [Ar, -Ai] @ [Br; Bi]``, ``Ci = [Ar, Ai] @ [Bi; Br]``)."""
    a = np.asarray(a, dtype=np.complex128)
    b = np.asarray(b, dtype=np.complex128)
    re = exact_matmul(np.concatenate([a.real, -a.imag], axis=1),
                      np.concatenate([b.real, b.imag], axis=0))
    im = exact_matmul(np.concatenate([a.real, a.imag], axis=1),
                      np.concatenate([b.imag, b.real], axis=0))
    return re + 1j * im


def part_errors_vs_abs(c: np.ndarray, exact: np.ndarray, a: np.ndarray, b: np.ndarray
                       ) -> tuple[float, float]:
    """(real part, imaginary part) of :func:`rel_error_vs_abs` for complex products."""
    denom = np.abs(np.asarray(a, np.complex128)) @ np.abs(np.asarray(b, np.complex128))
    c = np.asarray(c, np.complex128)
    mask = denom > 0
    return (float(np.max(np.abs(c.real - exact.real)[mask] / denom[mask])),
            float(np.max(np.abs(c.imag - exact.imag)[mask] / denom[mask])))


def triton_cupy():
    """CuPy where a CUDA GPU and Triton are there (the fused Triton kernels' tests),
    else None."""
    try:
        import cupy as cp

        if cp.cuda.runtime.getDeviceCount() < 1:
            return None
    except Exception:
        return None
    from mpqr.backends.cupy import triton_gemm

    return cp if triton_gemm.available() else None
