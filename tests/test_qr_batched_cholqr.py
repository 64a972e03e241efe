"""``cholqr2-batched`` on the host against LAPACK per member, its certificate, and the
measured table of stack routes that ``method="auto"`` reads (``explain()`` names it)."""

from __future__ import annotations

import numpy as np
import pytest
from mpqr.backends import get_backend

import mpqr
from mpqr.bench.batched_sweep import run_sweep
from mpqr.qr.batched_cholqr import cholqr2_batched
from mpqr.qr.choice import choose_method, stack_table_route


def _ref(a):
    q, r = np.linalg.qr(a.astype(np.float64))
    s = np.where(np.diagonal(r, axis1=-2, axis2=-1) < 0, -1.0, 1.0)
    return q * s[..., None, :], r * s[..., :, None]


def _errors(a, q, r):
    a64 = a.astype(np.float64)
    res = np.linalg.norm(a64 - q.astype(np.float64) @ r, axis=(-2, -1))
    orth = np.linalg.norm(np.swapaxes(q, -1, -2).astype(np.float64) @ q
                          - np.eye(q.shape[-1]), axis=(-2, -1))
    return float((res / np.linalg.norm(a64, axis=(-2, -1))).max()), float(orth.max())


def _ill(m, n, cond, rng):
    u, _ = np.linalg.qr(rng.standard_normal((m, n)))
    v, _ = np.linalg.qr(rng.standard_normal((n, n)))
    return (u * np.logspace(0, -np.log10(cond), n)) @ v.T


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("cond", [1.0, 1e3])  # 1e3: cond_1(R1) > 8, Q1 by substitution
def test_matches_lapack(dtype, cond):
    rng = np.random.default_rng(3)
    a = rng.standard_normal((4, 90, 20))
    if cond > 1:
        a[1] = _ill(90, 20, cond, rng)
    a = a.astype(dtype)
    a0 = a.copy()
    tol = 30 * np.finfo(dtype).eps * 90
    q, r = cholqr2_batched(get_backend(np), a, precision="auto", prec_name="auto")
    assert q.dtype == a.dtype and q.shape == a.shape and r.shape == (4, 20, 20)
    assert np.array_equal(a, a0)
    be, orth = _errors(a, q, r)
    assert be <= tol and orth <= tol
    _, r_ref = _ref(a)
    assert np.abs(r - r_ref).max() <= tol * cond * np.abs(r_ref).max()
    assert np.all(np.diagonal(r, axis1=-2, axis2=-1) > 0)
    assert np.array_equal(np.triu(r), r)
    r_only = mpqr.qr(a, method="cholqr2-batched", mode="r")
    assert np.abs(r_only - r).max() <= tol * cond * np.abs(r).max()


def test_breaks_down_on_a_member_beyond_reach():
    rng = np.random.default_rng(4)
    a = rng.standard_normal((3, 80, 16))
    a[2] = _ill(80, 16, 1e12, rng)
    with pytest.raises(mpqr.BreakdownError, match="cholqr2-batched broke down"):
        mpqr.qr(a, method="cholqr2-batched")
    a[2, :, 3] = 0  # a zero column: no positive definite Gram matrix
    with pytest.raises(mpqr.BreakdownError):
        cholqr2_batched(get_backend(np), a, precision="auto", prec_name="auto")


@pytest.fixture
def gpu_like(monkeypatch):
    """The NumPy backend with the stack attributes of a GPU backend and a table."""
    be = get_backend(np)
    monkeypatch.setattr(type(be), "batched_qr_fused", True)
    monkeypatch.setattr(type(be), "stack_q_products_min_n", 65)
    table = {"float64": {128: {1: "geqrf-wy", 4: "cholqr2-batched"},
                         256: {1: "geqrf", 2: "geqrf-wy", 8: "cholqr2-batched"}}}
    monkeypatch.setattr(type(be), "stack_routes", table)
    monkeypatch.setattr(type(be), "stack_routes_source", "test device, test command")
    return be


def test_table_buckets(gpu_like, monkeypatch):
    f64 = np.float64
    assert stack_table_route(gpu_like, f64, 300, 70)[0] == "cholqr2-batched"  # n < 128: 128
    assert stack_table_route(gpu_like, f64, 300, 100)[0] == "geqrf-wy"  # m/n 3 -> 1
    assert stack_table_route(gpu_like, f64, 300, 300)[0] == "geqrf"
    assert stack_table_route(gpu_like, f64, 2000, 300)[0] == "geqrf-wy"  # m/n 6.7 -> 2
    assert stack_table_route(gpu_like, f64, 9000, 1000)[0] == "cholqr2-batched"
    assert stack_table_route(gpu_like, f64, 600, 130, complete=True)[0] == "geqrf-wy"
    assert stack_table_route(gpu_like, f64, 100, 300) is None  # wide members
    assert stack_table_route(gpu_like, np.float32, 600, 130) is None  # no row
    m, why = choose_method(gpu_like, "auto", f64, 600, 130, batch=3)
    assert m == "cholqr2-batched" and "test device, test command" in why
    assert "n >= 128, m/n >= 4" in why
    assert choose_method(gpu_like, "auto", f64, 600, 130, batch=3, complete=True)[0] == \
        "geqrf-wy"
    assert choose_method(gpu_like, "auto", f64, 300, 300, batch=3)[0] == "geqrf"
    monkeypatch.setattr(type(gpu_like), "stack_library_max_batch", 4)
    m, why = choose_method(gpu_like, "auto", f64, 600, 130, batch=4)
    assert m == "geqrf" and "at most 4 members" in why and "test device" in why
    assert choose_method(gpu_like, "auto", f64, 600, 130, batch=5)[0] == "cholqr2-batched"
    monkeypatch.setattr(type(gpu_like), "stack_library_max_batch", None)
    # single matrices and fp16 requests never read it
    assert choose_method(gpu_like, "auto", f64, 600, 130)[0] != "cholqr2-batched"
    assert choose_method(gpu_like, "fp32", f64, 600, 130, batch=3)[0] != "cholqr2-batched"


def test_auto_falls_back_to_geqrf_wy(gpu_like):
    rng = np.random.default_rng(5)
    a = rng.standard_normal((2, 280, 66))
    with mpqr.explain() as ex:
        q, r = mpqr.qr(a)
    assert [e.data["method"] for e in ex.events if e.kind == "method"] == ["cholqr2-batched"]
    assert not [e for e in ex.events if e.kind == "fallback"]
    assert max(_errors(a, q, r)) <= 30 * np.finfo(float).eps * 280
    a[1] = _ill(280, 66, 1e12, rng)
    with mpqr.explain() as ex:
        q, r = mpqr.qr(a)
    falls = [e.data for e in ex.events if e.kind == "fallback"]
    assert [f["fallback"] for f in falls] == ["geqrf-wy"]
    assert max(_errors(a, q, r)) <= 30 * np.finfo(float).eps * 280
    gpu_like.stack_routes["float64"][128][1] = "cholqr2-batched"
    b = a[:, :260, :]  # past the fused kernel's 256 rows
    with mpqr.explain() as ex:
        q, r = mpqr.qr(b, mode="complete")  # complete Q: geqrf-wy, never the thin route
    assert [e.data["method"] for e in ex.events if e.kind == "method"] == ["geqrf-wy"]
    assert q.shape == (2, 260, 260) and np.abs(q @ r - b).max() <= 1e-13


def test_sweep_budget_skips_and_reports():
    out = run_sweep(np, shapes=[(16, 8), (32, 8)], dtypes=("float64",), target=1 << 14,
                    repeat=1, torch_too=False, budget_s=1)
    assert [r["shape"] for r in out["rows"]] == ["16x(16x8) float64", "8x(32x8) float64"]
    assert all(r["pass"] and r["x_cupy"] > 0 for r in out["rows"])
    out = run_sweep(np, shapes=[(16, 8)], dtypes=("float64",), target=1 << 14,
                    torch_too=False, budget_s=0)
    assert out["rows"] == [] and out["skipped"] == ["16x8 float64"]
