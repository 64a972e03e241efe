"""PyTorch through the bridge: gradients, tracing, streams and the dtypes NumPy lacks."""

from __future__ import annotations

import numpy as np
import pytest

import mpqr

torch = pytest.importorskip("torch")


def _cuda() -> bool:
    try:
        import cupy

        return torch.cuda.is_available() and cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not _cuda(),
                                                                 reason="no CUDA GPU"))]


def _rand(*shape, dtype=torch.float64, device="cpu", seed=0, grad=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, dtype=dtype, generator=g).to(device)
    return x.requires_grad_(grad)


def _sign_fixed(q, r):
    """Q, R with diag(R) >= 0 (mpqr's convention) from any QR."""
    d = torch.diagonal(r, dim1=-2, dim2=-1)
    s = torch.where(d.real < 0, -1.0, 1.0).to(r.dtype)
    return q * s[..., None, :], r * s[..., :, None]


# --- gradients ---------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
@pytest.mark.parametrize("shape", [(9, 4), (5, 5), (2, 7, 3)])
def test_qr_gradcheck(shape, dtype):
    x = _rand(*shape, dtype=dtype, grad=True)
    assert torch.autograd.gradcheck(lambda x: tuple(mpqr.qr(x, precision="fp64")), (x,), fast_mode=True)
    assert torch.autograd.gradcheck(lambda x: mpqr.qr(x, mode="r", precision="fp64"), (x,), fast_mode=True)


def test_qr_gradcheck_complete_square():
    x = _rand(5, 5, grad=True)
    assert torch.autograd.gradcheck(lambda x: tuple(mpqr.qr(x, mode="complete")), (x,), fast_mode=True)


@pytest.mark.parametrize("device", DEVICES)
def test_qr_gradient_matches_torch(device):
    """Same gradients as torch.linalg.qr's backward (signs fixed to mpqr's convention)."""
    x = _rand(40, 6, device=device, grad=True)
    w = _rand(40, 6, device=device, seed=1)

    def loss(q, r):
        return (q * w).sum() + (r**2).sum()

    loss(*mpqr.qr(x, precision="fp64")).backward()
    got, x.grad = x.grad, None
    loss(*_sign_fixed(*torch.linalg.qr(x))).backward()
    # both are the exact gradient up to rounding: kappa(A) u-sized differences
    tol = 100 * torch.linalg.cond(x.detach()).item() * 2.0**-53 * x.grad.abs().max().item()
    assert got.dtype == x.dtype and got.device == x.device
    torch.testing.assert_close(got, x.grad, rtol=0, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
@pytest.mark.parametrize("bshape", [(9,), (9, 2)])
def test_lstsq_gradcheck(bshape, dtype):
    a = _rand(9, 4, dtype=dtype, grad=True)
    b = _rand(*bshape, dtype=dtype, seed=1, grad=True)
    # x and residues are differentiable; rank and s are not
    assert torch.autograd.gradcheck(lambda a, b: mpqr.lstsq(a, b)[:2], (a, b), fast_mode=True)


@pytest.mark.parametrize("device", DEVICES)
def test_lstsq_gradient_matches_torch(device):
    a = _rand(30, 5, device=device, grad=True)
    b = _rand(30, 2, device=device, seed=1, grad=True)
    mpqr.lstsq(a, b)[0].sum().backward()
    ga, gb = a.grad, b.grad
    a.grad = b.grad = None
    # torch's CPU/CUDA lstsq drivers need a full-rank tall a, as here
    torch.linalg.lstsq(a, b).solution.sum().backward()
    kappa = torch.linalg.cond(a.detach()).item()
    tol = 100 * kappa**2 * 2.0**-53
    torch.testing.assert_close(ga, a.grad, rtol=tol, atol=tol)
    torch.testing.assert_close(gb, b.grad, rtol=tol, atol=tol)


def test_lstsq_gradient_rank_deficient_raises():
    a = _rand(8, 3)
    a = torch.cat([a, a[:, :1]], dim=1).requires_grad_(True)
    x = mpqr.lstsq(a, _rand(8, seed=1))[0]
    with pytest.raises(RuntimeError, match=r"needs `a` of full column rank; it has rank 3 < 4"):
        x.sum().backward()


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_matmul_gradcheck(dtype):
    a, b = _rand(6, 4, dtype=dtype, grad=True), _rand(4, 3, dtype=dtype, seed=1, grad=True)
    assert torch.autograd.gradcheck(lambda a, b: mpqr.matmul(a, b, precision="fp64"), (a, b), fast_mode=True)


def test_float32_gradient_keeps_dtype():
    x = _rand(12, 3, dtype=torch.float32, grad=True)
    mpqr.qr(x).R.sum().backward()
    assert x.grad.dtype == torch.float32


@pytest.mark.parametrize("call, message", [
    (lambda: mpqr.qr(_rand(3, 5, grad=True)),
     r"the gradient of mpqr.qr is implemented for m >= n with mode 'reduced' or 'r' \(or "
     r"'complete' when square\); got shape \(3, 5\), mode 'reduced'; `x` requires grad\. To "
     r"compute without gradients pass x\.detach\(\) or call mpqr\.qr under torch\.no_grad\(\)"),
    (lambda: mpqr.qr(_rand(7, 3, grad=True), mode="complete"),
     r"got shape \(7, 3\), mode 'complete'"),
    (lambda: mpqr.orth(_rand(7, 3, grad=True)),
     r"mpqr.orth has no gradient; `x` requires grad\. To compute without gradients pass "
     r"x\.detach\(\)"),
    (lambda: mpqr.lstsq(_rand(3, 5, grad=True), _rand(3)),
     r"implemented for M >= N \(overdetermined or square\); got `a` of shape \(3, 5\); `a` "
     r"requires grad"),
    (lambda: mpqr.lstsq(_rand(2, 6, 3, grad=True), _rand(2, 6, 1, grad=True)),
     r"implemented for 2-D `a` and 1-D or 2-D `b`; got shapes \(2, 6, 3\) and \(2, 6, 1\); "
     r"`a`, `b` require grad\. To compute without gradients pass a\.detach\(\), b\.detach\(\)"),
])
def test_unsupported_gradients_say_how_to_detach(call, message):
    with pytest.raises(NotImplementedError, match=message):
        call()


def test_no_grad_and_detach_run_without_gradients():
    x = _rand(7, 3, grad=True)
    with torch.no_grad():
        q = mpqr.orth(x)
    assert not q.requires_grad
    assert not mpqr.orth(x.detach()).requires_grad


# --- tracing -----------------------------------------------------------------------

def test_torch_compile_runs_it_opaquely():
    x = _rand(20, 3)

    @torch.compile(backend="eager")
    def f(x):
        q, r = mpqr.qr(2 * x)
        return q.sum() + r.sum()

    q, r = mpqr.qr(2 * x)
    assert f(x).item() == (q.sum() + r.sum()).item()


def test_torch_compile_with_gradients():
    x = _rand(20, 3, grad=True)
    torch.compile(lambda x: mpqr.qr(x).R.sum(), backend="eager")(x).backward()
    got, x.grad = x.grad, None
    mpqr.qr(x).R.sum().backward()
    torch.testing.assert_close(got, x.grad, rtol=0, atol=0)


@pytest.mark.parametrize("trace, what", [
    (lambda f, x: __import__("torch.fx.experimental.proxy_tensor").fx.experimental
     .proxy_tensor.make_fx(f)(x), "a tensor being traced into a graph"),
    (lambda f, x: torch.func.vmap(f)(x[None]), "a tensor inside a torch.func transform"),
    (lambda f, x: f(torch.empty(x.shape, device="meta")), "a tensor without data"),
])
def test_tracers_get_a_clear_error(trace, what):
    with pytest.raises(TypeError, match=rf"mpqr.qr cannot be traced by PyTorch: `x` is {what}"):
        trace(lambda x: mpqr.qr(x).R, _rand(6, 3))


# --- views, dtypes, devices ----------------------------------------------------------

def test_cpu_view_is_read_only_for_the_call():
    """A stray write into the NumPy view would raise instead of changing the tensor."""
    from mpqr.backends.bridges import torch as bridge_torch

    seen = {}

    def spy(x, **kw):
        seen["writeable"] = x.flags.writeable
        return mpqr.qr(x, **kw)

    x = _rand(10, 3)
    bridge_torch.run("qr", spy, (x,), ("x",), {"mode": "r"})
    assert seen["writeable"] is False
    bridge_torch.run("qr", spy, (x,), ("x",), {"mode": "r", "overwrite_a": True})
    assert seen["writeable"] is True


def test_overwrite_a_may_use_the_tensor():
    a = _rand(50, 8)
    x = a.clone()
    q, r = mpqr.qr(x, method="householder-tiled", overwrite_a=True)
    torch.testing.assert_close(q @ r, a, rtol=0, atol=50 * 8 * 2.0**-53 * a.norm().item())


@pytest.mark.parametrize("device", DEVICES)
def test_bfloat16_and_conjugate_views_are_copied_and_said(device):
    x = _rand(16, 4, device=device).to(torch.bfloat16)
    with mpqr.explain() as trace:
        r = mpqr.qr(x, mode="r")
    assert r.dtype == torch.float32 and r.device == x.device
    assert "copied: `x` bfloat16 to float32" in str(trace)
    torch.testing.assert_close(r, mpqr.qr(x.float(), mode="r"), rtol=0, atol=0)
    z = _rand(16, 4, dtype=torch.complex128, device=device)
    with mpqr.explain() as trace:
        r = mpqr.qr(z.conj(), mode="r")
    assert "copied: `x` conjugate view resolved" in str(trace)
    torch.testing.assert_close(r, mpqr.qr(z.conj().resolve_conj(), mode="r"), rtol=0, atol=0)
    assert z.is_conj() is False and z.conj().is_conj()


def test_sparse_tensors_are_refused():
    with pytest.raises(TypeError, match=r"`x` must be a dense tensor, got layout "
                       r"torch.sparse_coo; convert it with .to_dense\(\)"):
        mpqr.qr(_rand(4, 3).to_sparse())


@pytest.mark.skipif(not _cuda(), reason="no CUDA GPU")
def test_devices_must_match():
    with pytest.raises(ValueError, match=r"arrays must be on one device, got `a` on cpu, "
                       r"`b` on cuda:0"):
        mpqr.lstsq(_rand(6, 3), _rand(6, device="cuda"))


@pytest.mark.skipif(not _cuda(), reason="no CUDA GPU")
def test_runs_on_the_callers_stream():
    """The call is ordered after pending work on the caller's (non-default) stream and
    its results are ready for the work queued after it there, with no synchronization."""
    import cupy

    seen = {}
    from mpqr.backends.bridges import torch as bridge_torch

    def spy(x, **kw):
        seen["stream"] = cupy.cuda.get_current_stream().ptr
        return mpqr.qr(x, **kw)

    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        big = torch.randn(4096, 4096, device="cuda", dtype=torch.float64)
        a = (big @ big)[:, :64] / 4096  # still running when mpqr is called
        q, r = bridge_torch.run("qr", spy, (a,), ("x",), {})
        err = torch.linalg.norm(q @ r - a) / torch.linalg.norm(a)  # queued after it
    s.synchronize()
    assert seen["stream"] == s.cuda_stream
    assert err.item() <= 8 * 64**0.5 * 2.0**-53
    _q2, r2 = mpqr.qr(cupy.asarray(a))  # same result as CuPy's own call
    np.testing.assert_array_equal(r.cpu().numpy(), r2.get())
