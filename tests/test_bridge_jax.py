"""JAX through the bridge: gradients under jax.grad, and clear errors under jit/vmap."""

from __future__ import annotations

import os

import numpy as np
import pytest

import mpqr

# JAX would otherwise take 75% of the GPU's memory at import, leaving CuPy little
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
jnp = jax.numpy
check_grads = pytest.importorskip("jax.test_util").check_grads


def _rand(*shape, dtype=np.float64, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        a = a + 1j * rng.standard_normal(shape)
    return jnp.asarray(a.astype(dtype))


def _sign_fixed(q, r):
    s = jnp.where(jnp.real(jnp.diagonal(r, axis1=-2, axis2=-1)) < 0, -1.0, 1.0).astype(r.dtype)
    return q * s[..., None, :], r * s[..., :, None]


@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
@pytest.mark.parametrize("shape", [(9, 4), (5, 5), (2, 7, 3)])
def test_qr_vjp(shape, dtype):
    """Reverse mode against finite differences (jax.test_util.check_grads)."""
    x = _rand(*shape, dtype=dtype)
    check_grads(lambda x: tuple(mpqr.qr(x, precision="fp64")), (x,), order=1, modes=("rev",))
    check_grads(lambda x: mpqr.qr(x, mode="r"), (x,), order=1, modes=("rev",))


def test_qr_gradient_matches_jnp_linalg_qr():
    x, w = _rand(40, 6), _rand(40, 6, seed=1)

    def loss(qr):
        def f(x):
            q, r = _sign_fixed(*qr(x))
            return jnp.sum(q * w) + jnp.sum(r**2)
        return f

    got = jax.grad(loss(lambda x: tuple(mpqr.qr(x, precision="fp64"))))(x)
    want = jax.grad(loss(jnp.linalg.qr))(x)
    tol = 100 * np.linalg.cond(np.asarray(x)) * 2.0**-53 * float(jnp.abs(want).max())
    assert got.dtype == x.dtype
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=tol)


@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
@pytest.mark.parametrize("bshape", [(9,), (9, 2)])
def test_lstsq_vjp(bshape, dtype):
    a, b = _rand(9, 4, dtype=dtype), _rand(*bshape, dtype=dtype, seed=1)
    check_grads(lambda a, b: mpqr.lstsq(a, b)[:2], (a, b), order=1, modes=("rev",))


def test_lstsq_gradient_matches_jnp():
    a, b = _rand(30, 5), _rand(30, 2, seed=1)
    got = jax.grad(lambda a, b: mpqr.lstsq(a, b)[0].sum(), argnums=(0, 1))(a, b)
    want = jax.grad(lambda a, b: jnp.linalg.lstsq(a, b)[0].sum(), argnums=(0, 1))(a, b)
    tol = 100 * np.linalg.cond(np.asarray(a)) ** 2 * 2.0**-53
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
def test_matmul_vjp(dtype):
    a, b = _rand(6, 4, dtype=dtype), _rand(4, 3, dtype=dtype, seed=1)
    check_grads(lambda a, b: mpqr.matmul(a, b, precision="fp64"), (a, b), order=1,
                modes=("rev",))


def test_rank_and_s_are_returned_under_grad():
    a, b = _rand(12, 3), _rand(12, seed=1)

    def f(a):
        x, res, rank, s = mpqr.lstsq(a, b)
        assert rank == 3 and s.shape == (3,)
        return jnp.sum(x) + res

    assert jax.grad(f)(a).shape == (12, 3)


@pytest.mark.parametrize("transform, tracer", [
    (jax.jit, "DynamicJaxprTracer"),
    (jax.vmap, "BatchTracer"),
    (lambda f: jax.jit(jax.grad(lambda x: f(x).sum())), "DynamicJaxprTracer"),
])
def test_transformations_get_a_clear_error(transform, tracer):
    x = _rand(3, 8, 4) if tracer == "BatchTracer" else _rand(8, 4)
    with pytest.raises(TypeError, match=rf"mpqr.qr cannot be traced by JAX: `x` is a {tracer} "
                       r"\(inside jax.jit, jax.vmap, forward-mode differentiation or another "
                       r"transformation\)\. mpqr runs its own kernels on concrete arrays"):
        transform(lambda x: mpqr.qr(x).R)(x)


def test_no_gradient_is_said():
    with pytest.raises(TypeError, match=r"mpqr.orth cannot be traced by JAX: `x` is a "
                       r"\w+Tracer .*or jax.grad: it has no gradient"):
        jax.grad(lambda x: mpqr.orth(x).sum())(_rand(8, 4))
    with pytest.raises(TypeError, match=r"the gradient of mpqr.qr is implemented for m >= n"):
        jax.grad(lambda x: mpqr.qr(x).R.sum())(_rand(3, 8))


def test_overwrite_is_ignored_for_immutable_arrays():
    x = _rand(30, 5)
    before = np.array(x)
    mpqr.qr(x, method="householder-tiled", overwrite_a=True)
    np.testing.assert_array_equal(np.asarray(x), before)
