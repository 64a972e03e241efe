"""mpqr.compat.cupy against ``cupy.linalg`` itself on the same inputs (GPU only), and the
torch front end on CUDA tensors against torch's own CUDA kernels.

Run on a GPU machine with ``python -m pytest -q -n 0 tests/test_compat_cupy.py``.
"""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from tests.conftest import GPU

if not GPU:
    pytest.skip("no CUDA GPU visible", allow_module_level=True)

import cupy
import mpqr.compat.cupy as mcc

import mpqr

ORIG = {n: mcc.original(n) for n in ("qr", "lstsq", "svd")}
DTYPES = ("float32", "float64", "complex64", "complex128")
SHAPES = [(1, 1), (5, 3), (3, 5), (64, 8), (200, 16), (4, 30, 6), (2, 3, 7, 5)]


def _routed(trace, name):
    return sum(1 for e in trace.events if e.kind == "compat" and e.data.get("routed")
               and e.data.get("function") == name)


def _rand(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    if dtype.startswith("complex"):
        x = x + 1j * rng.standard_normal(shape)
    return cupy.asarray(x.astype(dtype))


def _tol(a, power=1):
    """``20 max(m, n) u kappa**power``: QR and SVD differ by u kappa, least-squares
    solutions (and their residues) by u kappa**2 (a nonzero residual's term)."""
    s = np.linalg.svd(cupy.asnumpy(a).astype(np.complex128), compute_uv=False)
    kappa = float((s[..., 0] / s[..., -1]).max())
    return 20 * max(a.shape[-2:]) * np.finfo(a.dtype).eps * kappa ** power


def _close(x, y, tol):
    x, y = cupy.asnumpy(x), cupy.asnumpy(y)
    scale = max(1.0, float(np.abs(y).max())) if y.size else 1.0
    err = float(np.abs(x - y).max()) if x.size else 0.0
    assert err <= tol * scale, (err, tol * scale)


def _layout(got, want):
    assert type(got) is type(want)
    if isinstance(want, tuple):
        for g, w in zip(got, want):
            _layout(g, w)
    elif isinstance(want, cupy.ndarray):
        assert got.shape == want.shape and got.dtype == want.dtype
    else:
        assert type(got) is type(want) and got == want


@pytest.mark.parametrize("dtype", DTYPES)
def test_qr_every_mode_against_cupy(dtype):
    for shape in SHAPES:
        a = _rand(shape, dtype)
        k = min(shape[-2:])
        for mode in ("reduced", "complete", "r"):
            want = ORIG["qr"](a, mode=mode)
            with mpqr.explain() as trace, mcc.patch():
                got = cupy.linalg.qr(a, mode=mode)
            _layout(got, want)
            assert _routed(trace, "qr") == 1
            r, rw = (got, want) if mode == "r" else (got[1], want[1])
            d = cupy.diagonal(rw[..., :k, :k], axis1=-2, axis2=-1)
            ph = cupy.where(d == 0, 1, d / cupy.abs(d))
            _close(r[..., :k, :], ph.conj()[..., None] * rw[..., :k, :], _tol(a))
            if mode != "r":
                _close(got[0] @ got[1], a, _tol(a))


@pytest.mark.parametrize("dtype", DTYPES)
def test_lstsq_against_cupy(dtype):
    for (m, n) in [(1, 1), (6, 3), (3, 6), (300, 12)]:
        a = _rand((m, n), dtype, 1)
        for b in (_rand((m,), dtype, 2), _rand((m, 3), dtype, 3)):
            for rcond in (None, -1, 1e-3):
                want = ORIG["lstsq"](a, b, rcond=rcond)
                with mpqr.explain() as trace, mcc.patch():
                    got = cupy.linalg.lstsq(a, b, rcond=rcond)
                assert _routed(trace, "lstsq") == 1
                _layout(got, want)
                tol = _tol(a, power=2)
                for g, w in zip(got, want):
                    if isinstance(w, cupy.ndarray):
                        _close(g, w, tol)
    # rank deficient: the rank and no residuals, as CuPy
    a = _rand((20, 4), "float64", 4)
    a[:, 3] = a[:, 0]
    b = _rand((20,), "float64", 5)
    want = ORIG["lstsq"](a, b, rcond=None)
    with mcc.patch():
        got = cupy.linalg.lstsq(a, b, rcond=None)
    _layout(got, want)
    assert int(got[2]) == int(want[2]) == 3
    _close(got[0], want[0], 1e-10)


@pytest.mark.parametrize("dtype", DTYPES)
def test_svd_against_cupy(dtype):
    for shape in [(64, 8), (8, 64), (3, 100, 10)]:
        a = _rand(shape, dtype, 6)
        want = ORIG["svd"](a, full_matrices=False)
        with mpqr.explain() as trace, mcc.patch():
            got = cupy.linalg.svd(a, full_matrices=False)
            s = cupy.linalg.svd(a, full_matrices=False, compute_uv=False)
            full = cupy.linalg.svd(a)
        assert _routed(trace, "svd") == 2
        _layout(got, want)
        _layout(full, ORIG["svd"](a))
        _close(got[1], want[1], _tol(a))
        _close(s, want[1], _tol(a))
        u, sv, vh = got
        _close((u * sv[..., None, :].astype(u.dtype)) @ vh, a, _tol(a))


def test_kept_paths_errors_and_imports():
    a = _rand((6, 3), "float64")
    bad = [lambda: cupy.linalg.qr(a[0]), lambda: cupy.linalg.qr(a, mode="bogus"),
           lambda: cupy.linalg.lstsq(a, a[:4])]
    theirs = []
    for f in bad:
        with pytest.raises(Exception) as exc:
            f()
        theirs.append(exc.value)
    prog = types.ModuleType("cupy_user_program")
    exec("from cupy.linalg import qr\n", prog.__dict__)
    sys.modules["cupy_user_program"] = prog
    try:
        with mpqr.explain() as trace, mcc.patch():
            assert prog.qr is mcc.qr and cupy.linalg.qr is mcc.qr
            prog.qr(a)
            cupy.linalg.qr(a, mode="raw")  # cuSOLVER's reflectors: CuPy's path
            with pytest.raises(TypeError, match="float16"):  # CuPy's own refusal, kept
                cupy.linalg.qr(a.astype("float16"))
            cupy.linalg.qr(cupy.zeros((0, 3)))
            for f, exc in zip(bad, theirs):
                with pytest.raises(type(exc)) as ours:
                    f()
                assert str(ours.value) == str(exc)
        assert _routed(trace, "qr") == 1
        assert prog.qr is ORIG["qr"] and cupy.linalg.qr is ORIG["qr"]
    finally:
        del sys.modules["cupy_user_program"]


def test_mpqr_inside_the_patch_reaches_cupy():
    """mpqr's CuPy backend calls cupy.linalg.qr/svd itself (method="geqrf", the small
    SVD of the QR-SVD): under the patch those reach CuPy, not mpqr again."""
    a = _rand((512, 64), "float64", 7)
    with mpqr.explain() as trace, mcc.patch(svd_min_aspect=1):
        q, r = mpqr.qr(a, method="geqrf")
        _u, s, _vh = cupy.linalg.svd(a, full_matrices=False)
    assert _routed(trace, "qr") == 0 and _routed(trace, "svd") == 1
    _close(q @ r, a, _tol(a))
    _close(s, np.linalg.svd(cupy.asnumpy(a), compute_uv=False), _tol(a))


def test_torch_cuda_tensors_against_torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    import mpqr.compat.torch as mct

    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(64, 256, 32, device="cuda", generator=g)
    b = torch.randn(4096, 16, dtype=torch.float64, device="cuda", generator=g)
    y = torch.randn(4096, 2, dtype=torch.float64, device="cuda", generator=g)
    with mpqr.explain() as trace, mct.patch():
        q, r = torch.linalg.qr(a)
        sol = torch.linalg.lstsq(b, y)
        qb, rb = torch.linalg.qr(a.bfloat16())
        s = torch.linalg.svdvals(b)
    assert _routed(trace, "qr") == 2 and _routed(trace, "lstsq") == 1
    want = mct.original("lstsq")(b, y)
    for f in ("solution", "residuals", "rank", "singular_values"):
        gw, ww = getattr(sol, f), getattr(want, f)
        assert gw.shape == ww.shape and gw.dtype == ww.dtype and gw.device == ww.device
    assert float((sol.solution - want.solution).abs().max()) < 1e-10
    assert float((q @ r - a).abs().max()) < 1e-4 and qb.dtype == torch.bfloat16
    assert float((qb.float() @ rb.float() - a).norm() / a.norm()) < 0.05
    assert float((s - mct.original("svdvals")(b)).abs().max()) < 1e-10
