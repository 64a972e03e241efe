"""QR test helpers: matrices with prescribed singular values, and error measures
computed in higher precision than the factorization under test."""

from __future__ import annotations

import numpy as np

from tests._support import exact_matmul, to_numpy

#: unit roundoff of each precision setting (the engine's, before the dtype's)
UNIT_ROUNDOFF = {"fp64": 2.0**-53, "fp64-emulated": 2.0**-53, "auto": 2.0**-53,
                 "fp32": 2.0**-24, "fp32-emulated": 2.0**-24, "fp16": 2.0**-11}

_LONG = np.finfo(np.longdouble).eps < 1e-18  # x87 80-bit or quad: enough headroom


def unit_roundoff(precision: str, dtype) -> float:
    """The larger of the precision's and the input dtype's unit roundoff."""
    u_dtype = 2.0**-24 if np.dtype(dtype) in (np.float32, np.complex64) else 2.0**-53
    return max(UNIT_ROUNDOFF[precision], u_dtype)


def hp_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` with far more than float64 accuracy (returned as longdouble or float64)."""
    if np.iscomplexobj(a) or np.iscomplexobj(b):
        return np.matmul(a.astype(np.clongdouble), b.astype(np.clongdouble))
    if _LONG:
        return np.matmul(a.astype(np.longdouble), b.astype(np.longdouble))
    return exact_matmul(a, b)


def backward_error(a, q, r) -> float:
    """``||A - Q R||_F / ||A||_F`` with the residual formed in extended precision."""
    a, q, r = (np.asarray(to_numpy(v)) for v in (a, q, r))
    if a.ndim > 2:
        return max(backward_error(a[i], q[i], r[i]) for i in np.ndindex(*a.shape[:-2]))
    res = a.astype(np.clongdouble if np.iscomplexobj(a) else np.longdouble) - hp_matmul(q, r)
    return float(np.linalg.norm(np.asarray(res, dtype=np.complex128 if np.iscomplexobj(res)
                                           else np.float64)) / np.linalg.norm(a))


def orthogonality(q) -> float:
    """``||I - Q^H Q||_F / n`` in extended precision."""
    q = np.asarray(to_numpy(q))
    if q.ndim > 2:
        return max(orthogonality(q[i]) for i in np.ndindex(*q.shape[:-2]))
    n = q.shape[-1]
    g = hp_matmul(q.conj().T, q) - np.eye(n)
    return float(np.linalg.norm(np.asarray(g, dtype=np.complex128 if np.iscomplexobj(g)
                                           else np.float64))) / max(n, 1)


def with_singular_values(rng, m: int, n: int, s: np.ndarray) -> np.ndarray:
    """``U diag(s) V^T`` with Haar-random orthonormal U (m x n) and V (n x n)."""
    u, _ = np.linalg.qr(rng.standard_normal((m, n)))
    v, _ = np.linalg.qr(rng.standard_normal((n, n)))
    return (u * s) @ v.T


def geometric(rng, m: int, n: int, cond: float) -> np.ndarray:
    return with_singular_values(rng, m, n, cond ** (-np.arange(n) / max(n - 1, 1)))


def arithmetic(rng, m: int, n: int, cond: float) -> np.ndarray:
    return with_singular_values(rng, m, n, 1 - (1 - 1 / cond) * np.arange(n) / max(n - 1, 1))


def inflate_second_gram(monkeypatch, a, factor: float = 3.0) -> None:
    """Make CholQR2's second Gram matrix ``factor`` times too large (``||G2 - I||_F =
    (factor - 1) sqrt(n)``), through either of its routes (the stored Q1's ``gram`` or the
    fused ``right_solve_gram`` of ``a``'s backend), so that its certificate fails."""
    import sys

    from mpqr.backends import get_backend

    cholqr_mod = sys.modules["mpqr.qr.cholqr"]
    real_gram = cholqr_mod.gram
    calls = []

    def bad_second_gram(backend, x, precision, label):
        g = real_gram(backend, x, precision, label)
        calls.append(label)
        return g * factor if len(calls) == 2 else g

    be_type = type(get_backend(sys.modules["mpqr._array_api"].array_namespace(a)))
    real_fused = be_type.right_solve_gram
    monkeypatch.setattr(cholqr_mod, "gram", bad_second_gram)
    monkeypatch.setattr(be_type, "right_solve_gram",
                        lambda self, x, r: real_fused(self, x, r) * factor)


def two_leaf_case(xp, monkeypatch, precision: str):
    """``(a, ax, backend)``: a 384 x 256 matrix whose recursive QR has two 128-wide leaves
    (``MAX_LEAVES`` set to 2), skipping precisions the backend has no engines for."""
    import importlib

    import pytest
    from mpqr.backends import get_backend

    from mpqr._array_api import array_namespace
    from tests._support import from_numpy

    a = np.random.default_rng(13).standard_normal((384, 256))
    ax = from_numpy(xp, a)
    backend = get_backend(array_namespace(ax))
    if precision in ("fp16", "fp32-emulated") and "fp16" not in backend.capabilities:
        pytest.skip(f"{precision} needs a float16 GEMM engine")
    monkeypatch.setattr(importlib.import_module("mpqr.qr.householder_recursive"),
                        "MAX_LEAVES", 2)
    return a, ax, backend
