"""GPU tests of the library QR route with fused layout steps (``backends/cupy/geqrf.py``).

It runs the same cuSOLVER ``geqrf``/``orgqr`` as ``cupy.linalg.qr`` on the same numbers,
only with its own copies into and out of cuSOLVER's column-major layout and ``diag(R)``
made non-negative in them: so its Q and R must be CuPy's, with the signs of R's rows and
Q's columns flipped where CuPy's ``r_ii < 0``, to a few roundings at most (bitwise where
cuSOLVER is deterministic for the two workspace sizes), for every mode, both real dtypes
and row-major, column-major and strided inputs; and the inputs stay untouched.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import GPU

if not GPU:
    pytest.skip("no CUDA GPU visible", allow_module_level=True)
import cupy as cp
from mpqr.backends.cupy import geqrf as cupy_geqrf

import mpqr


def _cupy_normalised(a, mode):
    if mode == "r":
        r = cp.linalg.qr(a, mode="r")
        q = None
    else:
        q, r = cp.linalg.qr(a, mode=mode)
    n = a.shape[1]
    s = cp.where(cp.diagonal(r[:n, :n]) < 0, -1.0, 1.0).astype(a.dtype)
    r = r[:n] * s[:, None]
    if q is not None:
        q = q.copy()
        q[:, :n] *= s[None, :]
    return q, r


def _inputs(dtype):
    rng = np.random.default_rng(3)
    yield "c-order", cp.asarray(rng.standard_normal((300, 70)).astype(dtype))
    yield "f-order", cp.asfortranarray(cp.asarray(rng.standard_normal((257, 257))
                                                  .astype(dtype)))
    base = cp.asarray(rng.standard_normal((800, 90)).astype(dtype))
    yield "strided rows", base[::3, 5:80]
    yield "one column", cp.asarray(rng.standard_normal((1000, 1)).astype(dtype))
    yield "tall 2^17 rows", cp.asarray(rng.standard_normal((2**17, 33)).astype(dtype))


@pytest.mark.parametrize("mode", ["reduced", "complete", "r"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fused_route_gives_cupys_factors_with_positive_diagonal(dtype, mode):
    eps = np.finfo(dtype).eps
    for name, a in _inputs(dtype):
        if mode == "complete" and a.shape[0] > 4096:
            continue
        a0 = a.copy()
        q, r = cupy_geqrf.qr(a, mode)
        assert cp.array_equal(a, a0), name
        qc, rc = _cupy_normalised(a, mode)
        n = a.shape[1]
        assert r.shape == (n, n) and bool(cp.all(cp.diagonal(r) >= 0)), name
        assert bool(cp.all(cp.tril(r, -1) == 0)), name
        tol = 8 * eps * float(cp.abs(rc).max())
        assert float(cp.abs(r - rc).max()) <= tol, name
        if mode == "r":
            assert q is None
            continue
        assert q.shape == qc.shape, name
        assert float(cp.abs(q - qc).max()) <= 8 * eps, name
        qn, rn, an = (cp.asnumpy(x).astype(np.float64) for x in (q[:, :n], r, a))
        assert np.linalg.norm(an - qn @ rn) <= 4 * np.sqrt(n) * eps * np.linalg.norm(an)


def test_mpqr_geqrf_route_takes_it_and_keeps_the_contract():
    """``qr(method="geqrf")`` on CuPy: diag(R) >= 0, signs not normalised a second time
    (one check), Q R = A; complex inputs keep CuPy's own route."""
    rng = np.random.default_rng(4)
    a = cp.asarray(rng.standard_normal((500, 200)))
    q, r = mpqr.qr(a, method="geqrf")
    assert bool(cp.all(cp.diagonal(r) >= 0))
    assert float(cp.linalg.norm(a - q @ r)) <= 20 * 2.0**-53 * float(cp.linalg.norm(a))
    z = a + 1j * cp.asarray(rng.standard_normal((500, 200)))
    assert not cupy_geqrf.supports(z)
    qz, rz = mpqr.qr(z, method="geqrf")
    assert float(cp.linalg.norm(z - qz @ rz)) <= 20 * 2.0**-53 * float(cp.linalg.norm(z))
    d = cp.diagonal(rz)
    assert bool(cp.all(d.real >= 0)) and float(cp.abs(d.imag).max()) == 0.0
