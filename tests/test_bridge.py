"""PyTorch tensors and JAX arrays through the bridge, on every device present.

The ``fw`` fixture swaps torch (CPU, CUDA) and JAX (CPU, GPU), each skipped
when absent. The bridge changes nothing in the numerics: every result must
equal, bit for bit, the same call on the backend's own array (NumPy on the CPU,
CuPy on the GPU); results come back in the caller's library, on its device;
inputs are never modified.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import mpqr
from mpqr.qr.driver import METHODS
from tests._qr_support import backward_error, orthogonality
from tests._support import to_numpy

# JAX would otherwise take 75% of the GPU's memory at import, leaving CuPy little
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


def _gpu() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


class Framework:
    """One library on one device: make arrays, read them back, know its own."""

    def __init__(self, name: str, device: str):
        self.name, self.device = name, device
        if name == "torch":
            self.lib = pytest.importorskip("torch")
            if device == "cuda" and not (self.lib.cuda.is_available() and _gpu()):
                pytest.skip("no CUDA GPU visible to torch and CuPy")
        else:
            self.lib = pytest.importorskip("jax")
            self.lib.config.update("jax_enable_x64", True)
            devs = [d for d in self.lib.devices() if d.platform in ("gpu", "cuda")] \
                if device == "gpu" else self.lib.devices("cpu")
            if not devs or (device == "gpu" and not _gpu()):
                pytest.skip("no GPU visible to JAX and CuPy")
            self.dev = devs[0]

    def __repr__(self) -> str:
        return f"{self.name}-{self.device}"

    @property
    def native(self):
        """The namespace whose backend runs the call."""
        if self.device == "cpu":
            return np
        import cupy

        return cupy

    def asarray(self, a: np.ndarray):
        if self.name == "torch":
            return self.lib.asarray(a, device=self.device)
        return self.lib.device_put(a, self.dev)

    def numpy(self, x) -> np.ndarray:
        if self.name == "torch":
            return x.detach().cpu().resolve_conj().numpy()
        return np.asarray(x)

    def check_own(self, x, dtype=None) -> None:
        """``x`` is this library's array on this device (and of ``dtype``'s kind)."""
        if self.name == "torch":
            assert isinstance(x, self.lib.Tensor), type(x)
            assert x.device.type == self.device, x.device
        else:
            assert isinstance(x, self.lib.Array), type(x)
            assert x.devices() == {self.dev}, x.devices()
        if dtype is not None:
            assert str(x.dtype).rpartition(".")[2] == np.dtype(dtype).name, x.dtype


@pytest.fixture(params=["torch-cpu", "torch-cuda", "jax-cpu", "jax-gpu"])
def fw(request):
    name, _, device = request.param.partition("-")
    return Framework(name, device)


def _rand(shape, dtype=np.float64, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        a = a + 1j * rng.standard_normal(shape)
    return a.astype(dtype)


def _same(got, want) -> None:
    """Bit-identical values, shapes and dtypes (the bridge only moves views)."""
    g, w = np.asarray(got), to_numpy(want)
    assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
    np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64, np.complex128])
@pytest.mark.parametrize("shape", [(60, 7), (7, 12), (3, 40, 5)])
@pytest.mark.parametrize("mode", ["reduced", "complete", "r"])
def test_qr_matches_backend(fw, mode, shape, dtype):
    a = _rand(shape, dtype)
    x = fw.asarray(a)
    with mpqr.explain() as trace:
        out = mpqr.qr(x, mode=mode)
    want = mpqr.qr(fw.native.asarray(a), mode=mode)
    if mode == "r":
        fw.check_own(out, dtype)
        _same(fw.numpy(out), want)
    else:
        assert isinstance(out, mpqr.QRResult)
        for got, ref in zip(out, want):
            fw.check_own(got, dtype)
            _same(fw.numpy(got), ref)
    np.testing.assert_array_equal(fw.numpy(x), a)  # input untouched
    bridge = [e for e in trace.events if e.kind == "bridge"]
    assert len(bridge) == 1 and bridge[0].data["framework"] == fw.name
    assert bridge[0].data["backend"] == ("numpy" if fw.device == "cpu" else "cupy")
    assert "no copy" in bridge[0].message


def test_qr_accuracy(fw):
    """Against the definition: backward error and orthogonality at float64's roundoff."""
    a = _rand((500, 30))
    q, r = mpqr.qr(fw.asarray(a), precision="fp64")
    u = 2.0**-53
    assert backward_error(a, fw.numpy(q), fw.numpy(r)) <= 8 * np.sqrt(30) * u
    assert orthogonality(fw.numpy(q)) <= 8 * np.sqrt(500) * u


def test_qr_strided_input(fw):
    """Transposed and sliced views go through as views (DLPack carries strides)."""
    a = _rand((40, 30))
    x = fw.asarray(a)
    for view, ref in ((x.T[:, :12], a.T[:, :12]), (x[::2, 1::3], a[::2, 1::3])):
        q, r = mpqr.qr(view)
        want = mpqr.qr(fw.native.asarray(np.ascontiguousarray(ref)))
        np.testing.assert_allclose(fw.numpy(q), to_numpy(want.Q), rtol=0, atol=1e-13)
        np.testing.assert_allclose(fw.numpy(r), to_numpy(want.R), rtol=0, atol=1e-13)
    np.testing.assert_array_equal(fw.numpy(x), a)


@pytest.mark.parametrize("method", sorted(METHODS))
def test_no_method_writes_into_the_view(fw, method):
    """The view shares the caller's memory: no method may use it as workspace unless
    ``overwrite_a=True`` (on the CPU the view is read-only, so a write would raise)."""
    a = _rand((80, 20))
    x = fw.asarray(a)
    mpqr.qr(x, method=method)
    mpqr.lstsq(x, fw.asarray(a[:, 0]))
    np.testing.assert_array_equal(fw.numpy(x), a)


def test_integer_and_half_inputs(fw):
    """mpqr's dtype rules hold through the bridge: integers in float64, float16 in float32."""
    a = np.arange(20).reshape(5, 4) + np.eye(5, 4, dtype=np.int64)
    fw.check_own(mpqr.qr(fw.asarray(a), mode="r"), np.float64)
    fw.check_own(mpqr.qr(fw.asarray(a.astype(np.float16)), mode="r"), np.float32)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex128])
@pytest.mark.parametrize("bshape", [(40,), (40, 3)])
def test_lstsq_matches_backend(fw, bshape, dtype):
    a, b = _rand((40, 6), dtype, 1), _rand(bshape, dtype, 2)
    xa, xb = fw.asarray(a), fw.asarray(b)
    with mpqr.explain() as trace:
        x, res, rank, s = mpqr.lstsq(xa, xb)
        want = mpqr.lstsq(fw.native.asarray(a), fw.native.asarray(b))
    for got, ref in ((x, want[0]), (res, want[1]), (s, want[3])):
        fw.check_own(got)
        _same(fw.numpy(got), ref)
    assert rank == want[2] == 6 and isinstance(rank, int)
    np.testing.assert_array_equal(fw.numpy(xa), a)
    np.testing.assert_array_equal(fw.numpy(xb), b)
    assert any(e.kind == "bridge" for e in trace.events)


def test_lstsq_against_scipy(fw):
    scipy_linalg = pytest.importorskip("scipy.linalg")
    a, b = _rand((50, 5), seed=3), _rand((50, 2), seed=4)
    x, _res, rank, s = mpqr.lstsq(fw.asarray(a), fw.asarray(b))
    xs, _ress, ranks, ss = scipy_linalg.lstsq(a, b)
    # forward error of a backward stable least-squares solver (Higham, ch. 20):
    # u kappa (1 + kappa ||r|| / (||A|| ||x||)) ||x||, with a margin
    kappa, anorm = np.linalg.cond(a), np.linalg.norm(a, 2)
    rnorm = np.linalg.norm(b - a @ xs, axis=0)
    xnorm = np.linalg.norm(xs, axis=0)
    tol = 50 * 2.0**-53 * kappa * (1 + kappa * rnorm / (anorm * xnorm)) * xnorm
    assert np.all(np.abs(fw.numpy(x) - xs) <= tol), (np.abs(fw.numpy(x) - xs).max(0), tol)
    np.testing.assert_allclose(fw.numpy(s), ss, rtol=50 * 5 * 2.0**-53)
    assert rank == ranks


def test_lstsq_batched(fw):
    a, b = _rand((4, 30, 5), seed=5), _rand((4, 30, 2), seed=6)
    x, _res, rank, _s = mpqr.lstsq(fw.asarray(a), fw.asarray(b))
    want = mpqr.lstsq(fw.native.asarray(a), fw.native.asarray(b))
    _same(fw.numpy(x), want[0])
    fw.check_own(rank)
    _same(fw.numpy(rank), want[2])


def test_matmul_orth_svd(fw):
    a, b = _rand((30, 8), seed=7), _rand((8, 5), seed=8)
    c = mpqr.matmul(fw.asarray(a), fw.asarray(b), precision="fp64")
    fw.check_own(c, np.float64)
    _same(fw.numpy(c), mpqr.matmul(fw.native.asarray(a), fw.native.asarray(b),
                                   precision="fp64"))
    q = mpqr.orth(fw.asarray(a))
    fw.check_own(q, np.float64)
    _same(fw.numpy(q), mpqr.orth(fw.native.asarray(a)))
    for got, ref in zip(mpqr.svd(fw.asarray(a)), mpqr.svd(fw.native.asarray(a))):
        fw.check_own(got)
        _same(fw.numpy(got), ref)


def test_mixed_libraries_refused(fw):
    a = _rand((10, 3))
    with pytest.raises(TypeError, match=r"arrays from different libraries cannot be mixed "
                       r"\(`a` is \w+, `b` is numpy\)"):
        mpqr.lstsq(fw.asarray(a), a[:, 0])


def test_bad_arguments_keep_their_messages(fw):
    x = fw.asarray(_rand((6, 3)))
    with pytest.raises(ValueError, match="`mode` must be one of"):
        mpqr.qr(x, mode="full")
    with pytest.raises(ValueError, match=r"`x` must be 2-D or a stack of matrices, got ndim=1"):
        mpqr.qr(fw.asarray(_rand((6,))))
    with pytest.raises(ValueError, match="array must not contain infs or NaNs"):
        mpqr.lstsq(fw.asarray(np.full((6, 3), np.nan)), fw.asarray(np.ones(6)))


def test_nan_propagates(fw):
    a = _rand((20, 4))
    a[3, 2] = np.nan
    _q, r = mpqr.qr(fw.asarray(a))
    assert np.isnan(fw.numpy(r)).any()


def test_bench_rows_render_into_the_frameworks_page(tmp_path):
    """`python -m mpqr bench bridge` JSON becomes the table of "From PyTorch / JAX"."""
    import json

    from mpqr.bench import render_results as rr

    env = {"device": "Test GPU", "date": "2026-01-02", "torch": "2.13.0", "jax": "0.10.2"}
    row = {"call": "qr", "shape": "4194304x64", "dtype": "float64", "mpqr-native (ms)": 5.0,
           "mpqr-torch (ms)": 5.1, "mpqr-jax (ms)": 5.2, "torch.linalg (ms)": 80.0,
           "torch / native": 1.02, "jax / native": 1.04, "speed-up vs torch.linalg": 15.7,
           "method": "qr: cholqr2 (...)"}
    (tmp_path / "bridge_test.json").write_text(json.dumps({"environment": env,
                                                           "results": [row]}))
    text = rr.render_bridge(tmp_path)
    assert "Measured on **Test GPU**, 2026-01-02" in text and "torch 2.13.0" in text
    head = text.splitlines()[4]
    assert head.startswith("| call | shape | dtype | mpqr-native (ms) | mpqr-torch (ms) | "
                           "torch / native | mpqr-jax (ms) | jax / native |"), head
    assert "| qr | 4194304x64 | float64 | 5 | 5.1 | 1.02 | 5.2 | 1.04 | 80 | 15.7 |" in text
    assert "No bridge results" in rr.render_bridge(tmp_path / "none")


def test_non_arrays_get_the_functions_own_message(fw):
    with pytest.raises(TypeError, match=r"`b` must be an array of an Array API library "
                       r"\(NumPy, CuPy, \.\.\.\), got builtins\.list"):
        mpqr.lstsq(fw.asarray(_rand((4, 2))), [1.0, 2.0, 3.0, 4.0])
