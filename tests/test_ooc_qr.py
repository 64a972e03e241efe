"""Out-of-core QR through ``mpqr.qr``: every method, mode and dtype against the in-core
factorization, with ragged last pieces, host outputs and datasets."""

from __future__ import annotations

import numpy as np
import pytest

import mpqr
from mpqr._errors import BreakdownError
from mpqr.ooc import parse_budget
from tests._ooc_support import DEVICES, Dataset, ooc_events, rand
from tests._qr_support import backward_error, geometric, orthogonality, unit_roundoff
from tests.conftest import GPU

TALL = (1101, 12)  # 1101 rows: the last piece is ragged at every budget below
SQUARE = (157, 101)


def _check(a, q, r, q0, r0, prec, dtype):
    """Backward error and orthogonality at the precision's rounding, and the same
    factors as in core up to the rounding amplified by cond(A)."""
    n = a.shape[1]
    u = unit_roundoff(prec, dtype)
    kappa = np.linalg.cond(a)
    assert backward_error(a, q, r) <= 20 * n * u
    assert orthogonality(q) <= 20 * n * u
    tol = 20 * n * u * kappa
    assert np.linalg.norm(r - r0) / np.linalg.norm(r0) <= tol
    assert np.linalg.norm(q - q0) / np.sqrt(n) <= tol


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("method", ["auto", "cholqr2", "shifted-cholqr3", "tsqr"])
@pytest.mark.parametrize("dtype", ["float64", "float32", "complex128"])
def test_tall_matches_in_core(device, method, dtype):
    rng = np.random.default_rng(1)
    a = rand(rng, TALL, dtype)
    a_copy = a.copy()
    q0, r0 = mpqr.qr(a)
    with mpqr.explain() as trace:
        q, r = mpqr.qr(a, method=method, device=device, memory_budget="40KB")
    ev = ooc_events(trace)
    assert len(ev) == 1 and ev[0].data["pieces"] > 3
    assert isinstance(q, np.ndarray) and q.dtype == a.dtype and q.shape == TALL
    _check(a, q, r, q0, r0, "auto", dtype)
    rr = mpqr.qr(a, mode="r", method=method, device=device, memory_budget="40KB")
    assert np.linalg.norm(rr - r0) / np.linalg.norm(r0) <= 20 * 12 * unit_roundoff(
        "auto", dtype) * np.linalg.cond(a)
    np.testing.assert_array_equal(a, a_copy)


@pytest.mark.parametrize("device", DEVICES)
def test_tall_passes_are_counted(device):
    a = np.random.default_rng(2).standard_normal(TALL)
    with mpqr.explain() as t:
        mpqr.qr(a, device=device, memory_budget="40KB")
    with mpqr.explain() as tr:
        mpqr.qr(a, mode="r", device=device, memory_budget="40KB")
    assert ooc_events(t)[0].data["passes"] == {"x": 2}  # the Gram route: R, then Q
    assert ooc_events(tr)[0].data["passes"] == {"x": 1}  # mode="r": one TSQR pass


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float64", "float32", "complex128"])
def test_reduced_in_two_reads_where_certified(device, dtype):
    """cond(A) <= 4 by the eigenvalues of A^H A: R from the first read, Q = A R^-1
    written in the second, with its check ||Q^H Q - I||_F <= 2 n u on the way."""
    from mpqr.ooc.gram_route import ORTH_TOL_N

    a = rand(np.random.default_rng(11), TALL, dtype)
    keep = a.copy()
    src = Dataset(a)
    with mpqr.explain() as trace:
        q, r = mpqr.qr(src, device=device, memory_budget="40KB")
    ev = ooc_events(trace)[0].data
    assert ev["method"] == "gram" and ev["passes"] == {"x": 2} and src.passes == 2
    assert ev["bytes_out"] == a.size * a.itemsize  # Q written once
    check = [e for e in trace.events if e.kind == "check"]
    u = unit_roundoff("auto", dtype)
    assert len(check) == 1 and check[0].data["orthogonality"] <= ORTH_TOL_N * TALL[1] * u
    q0, r0 = mpqr.qr(a)
    _check(a, q, r, q0, r0, "auto", dtype)
    np.testing.assert_array_equal(a, keep)


@pytest.mark.parametrize("device", DEVICES)
def test_reduced_failed_check_costs_one_pass_over_q(device, monkeypatch):
    from mpqr.ooc import gram_route

    monkeypatch.setattr(gram_route, "ORTH_TOL_N", 0.0)  # no Q passes the check now
    a = np.random.default_rng(12).standard_normal(TALL)
    src = Dataset(a)
    with mpqr.explain() as trace:
        q, r = mpqr.qr(src, device=device, memory_budget="40KB")
    ev = ooc_events(trace)[0].data
    assert ev["method"] == "gram+cholqr2-step" and ev["passes"] == {"x": 2, "Q": 1}
    assert src.passes == 2
    assert any(e.kind == "fallback" and e.data.get("fallback") == "cholqr2-step"
               for e in trace.events)
    q0, r0 = mpqr.qr(a)
    _check(a, q, r, q0, r0, "auto", "float64")


@pytest.mark.parametrize("device", DEVICES)
def test_reduced_uncertified_continues_cholqr2_without_a_lost_read(device):
    a = geometric(np.random.default_rng(13), *TALL, 1e3)
    src = Dataset(a)
    with mpqr.explain() as trace:
        q, r = mpqr.qr(src, device=device, memory_budget="40KB")
    ev = ooc_events(trace)[0].data
    assert ev["method"] == "cholqr2" and ev["passes"] == {"x": 3} and src.passes == 3
    assert any(e.kind == "method" and e.data.get("path") == "cholqr2" for e in trace.events)
    q0, r0 = mpqr.qr(a)
    _check(a, q, r, q0, r0, "auto", "float64")
    # asked for by name, CholQR2 runs as asked (three reads), and so does a low precision
    for kw in ({"method": "cholqr2"}, {"precision": "fp32"}):
        with mpqr.explain() as trace:
            mpqr.qr(a, device=device, memory_budget="40KB", **kw)
        assert ooc_events(trace)[0].data["passes"] == {"x": 3}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("method", ["ooc-recursive", "ooc-blocked"])
@pytest.mark.parametrize(("dtype", "precision"), [
    ("float64", "fp64"), ("float32", "fp32"), ("float32", "fp16"),
    ("float32", "fp32-emulated"), ("float64", "fp64-emulated"), ("complex128", "fp64"),
    ("complex64", "fp32")])
def test_square_matches_in_core(device, method, dtype, precision):
    rng = np.random.default_rng(3)
    a = rand(rng, SQUARE, dtype)
    q0, r0 = mpqr.qr(a, precision=precision)
    with mpqr.explain() as trace:
        q, r = mpqr.qr(a, precision=precision, method=method, device=device,
                       memory_budget="300KB")
    ev = ooc_events(trace)
    assert len(ev) == 1 and ev[0].data["panel_cols"] < SQUARE[1]
    _check(a, q, r, q0, r0, precision, dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_square_auto_is_recursive_and_mode_r(device):
    a = np.random.default_rng(4).standard_normal(SQUARE)
    with mpqr.explain() as trace:
        r = mpqr.qr(a, mode="r", device=device, memory_budget="300KB")
    assert ooc_events(trace)[0].data["method"] == "ooc-recursive"
    r0 = mpqr.qr(a, mode="r")
    assert np.linalg.norm(r - r0) / np.linalg.norm(r0) <= 20 * 101 * 2.0**-53 * \
        np.linalg.cond(a)


@pytest.mark.parametrize("device", DEVICES)
def test_out_memmap_and_dataset(device, tmp_path):
    a = np.random.default_rng(5).standard_normal(TALL)
    src = Dataset(a)
    qm = np.lib.format.open_memmap(tmp_path / "q.npy", mode="w+", dtype=a.dtype, shape=TALL)
    rm = np.empty((12, 12))
    q, r = mpqr.qr(src, out=(qm, rm), device=device, memory_budget="40KB")
    assert q is qm and r is rm
    q0, r0 = mpqr.qr(a)
    _check(a, np.asarray(qm), rm, q0, r0, "auto", "float64")
    r2 = mpqr.qr(np.lib.format.open_memmap(tmp_path / "q.npy", mode="r"), mode="r",
                 device=device, memory_budget="40KB")
    assert orthogonality(qm) <= 20 * 12 * 2.0**-53
    np.testing.assert_allclose(np.abs(np.diag(r2)), 1.0, rtol=1e-12)


@pytest.mark.parametrize("device", DEVICES)
def test_ill_conditioned_falls_back_to_tsqr(device):
    rng = np.random.default_rng(6)
    a = geometric(rng, *TALL, 1e12)
    with mpqr.explain() as trace:
        q, r = mpqr.qr(a, device=device, memory_budget="40KB")
    assert any(e.kind == "fallback" and e.data.get("fallback") == "tsqr" for e in trace.events)
    assert orthogonality(q) <= 20 * 12 * 2.0**-53
    assert backward_error(a, q, r) <= 20 * 12 * 2.0**-53
    with pytest.raises(BreakdownError, match="cholqr2 broke down"):
        mpqr.qr(a, method="cholqr2", device=device, memory_budget="40KB")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [TALL, SQUARE])
def test_nonfinite_as_in_core(device, shape):
    a = np.random.default_rng(7).standard_normal(shape)
    a[5, 3] = np.nan
    q, r = mpqr.qr(a, device=device, memory_budget="300KB" if shape == SQUARE else "40KB")
    q0, r0 = mpqr.qr(a)
    assert np.isnan(r).any() and np.isnan(r0).any()
    assert np.isnan(q).any() and np.isnan(q0).any()
    with pytest.raises(ValueError, match=r"`x` must not contain infs or NaNs \(check_finite"):
        mpqr.qr(a, device=device, memory_budget="40KB", check_finite=True)


def test_in_core_when_it_fits(monkeypatch):
    a = np.random.default_rng(8).standard_normal(TALL)
    with mpqr.explain() as trace:
        q, r = mpqr.qr(a, memory_budget="1GB")
    assert len(ooc_events(trace, "in-core")) == 1 and not ooc_events(trace)
    q0, r0 = mpqr.qr(a)
    np.testing.assert_array_equal(q, q0)
    np.testing.assert_array_equal(r, r0)
    monkeypatch.setenv("MPQR_MEMORY_BUDGET", "40KB")
    with mpqr.explain() as trace:
        mpqr.qr(a, progress=False)
    assert ooc_events(trace)[0].data["budget"] == 40_000


def test_staging_rows_for_the_in_core_route_fit_a_small_budget():
    """The in-core route stages the whole matrix in row pieces of at most a 16th of the
    budget and MAX_BLOCK_BYTES, whatever the column count (a square matrix's n x n
    terms are no part of it)."""
    from mpqr.ooc.budget import MAX_BLOCK_BYTES, staging_rows

    assert staging_rows(1024, 1024, 4, 16_000_000) == 1_000_000 // 4096
    assert staging_rows(4096, 4096, 4, 256_000_000) == 16_000_000 // 16384
    assert staging_rows(2**26, 64, 8, None) == MAX_BLOCK_BYTES // 512
    assert staging_rows(10, 3, 4, 64) == 1  # below one row: one row at a time
    assert staging_rows(10, 3, 4, 10**9) == 10


@pytest.mark.skipif(not GPU, reason="no CUDA GPU")
def test_in_core_route_with_a_budget_below_the_tall_plans():
    """A 1024 x 1024 float32 host matrix with a 16 MB budget: its in-core working set
    (12.6 MB) fits, so it runs in core; the staging no longer asks for the tall plan's
    n x n terms (33.5 MB) and raises nothing."""
    a = np.random.default_rng(12).standard_normal((1024, 1024)).astype(np.float32)
    with mpqr.explain() as trace:
        q, r = mpqr.qr(a, device="cuda", memory_budget="16MB")
    assert len(ooc_events(trace, "in-core")) == 1
    assert backward_error(a, q, r) <= 20 * 1024 * 2.0**-24


def test_parse_budget():
    assert parse_budget("2GB") == 2 * 10**9
    assert parse_budget("512MiB") == 512 * 2**20
    assert parse_budget(" 1.5 kb ") == 1500
    assert parse_budget(4096) == 4096
    for bad in ("2 parsecs", "-1GB", "", 0, -5):
        with pytest.raises(ValueError, match="memory_budget"):
            parse_budget(bad)
    with pytest.raises(TypeError, match="memory_budget"):
        parse_budget(True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("method", ["ooc-recursive", "ooc-blocked"])
def test_square_both_chunk_routes(device, method, monkeypatch):
    """Column chunks of A2 kept on the device and streamed twice both give the in-core
    factors (a 601 x 100 matrix at 300 KB takes both)."""
    from mpqr.ooc import square

    seen = set()
    orig = square._Square._chunk

    def spy(self, j0, h, a0, a1, resident):
        seen.add(resident)
        return orig(self, j0, h, a0, a1, resident)

    monkeypatch.setattr(square._Square, "_chunk", spy)
    a = np.random.default_rng(9).standard_normal((601, 100))
    q0, r0 = mpqr.qr(a)
    q, r = mpqr.qr(a, method=method, device=device, memory_budget="300KB")
    _check(a, q, r, q0, r0, "fp64", "float64")
    if method == "ooc-recursive":
        assert seen == {True, False}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("method", ["ooc-recursive", "ooc-blocked"])
def test_square_ill_conditioned_stays_orthogonal(device, method):
    """Each projection between panels is done twice: orthogonality at the rounding level
    for cond(A) = 1e6 (one Gram-Schmidt projection would leave ~cond(A) u = 1e-10)."""
    a = geometric(np.random.default_rng(10), *SQUARE, 1e6)
    q, r = mpqr.qr(a, precision="fp64", method=method, device=device, memory_budget="300KB")
    u = 2.0**-53
    assert orthogonality(q) <= 20 * SQUARE[1] * u
    assert backward_error(a, q, r) <= 20 * SQUARE[1] * u


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("method", ["ooc-recursive", "ooc-blocked"])
def test_square_deep_recursion_stays_orthogonal(device, method):
    """Four levels of recursion (leaves of at most 32 of 256 columns), cond(A) = 1e10: a
    right half's second projection is against every earlier column, not only its left
    sibling's. Gram-Schmidt twice keeps ``||I - Q^T Q||_2 <= c u``, so ``||I - Q^T Q||_F /
    n <= c u / sqrt(n)``; reorthogonalising against the sibling alone left 1.8e-13 here
    (1600 u)."""
    n = 256
    a = geometric(np.random.default_rng(11), 600, n, 1e10)
    with mpqr.explain() as trace:
        q, r = mpqr.qr(a, precision="fp64", method=method, device=device,
                       memory_budget="700KB")
    assert ooc_events(trace)[0].data["panel_cols"] <= 32
    u = 2.0**-53
    assert orthogonality(q) <= 10 * np.sqrt(n) * u
    assert backward_error(a, q, r) <= 20 * n * u


@pytest.mark.parametrize("device", DEVICES)
def test_cold_start_is_reported_by_the_first_call_only(device, monkeypatch):
    """The first out-of-core call of a process says in its trace what it paid (staging
    set-up, the first piece's extra time); later calls reuse it and say nothing."""
    from mpqr.ooc import run

    monkeypatch.setattr(run, "_WARM", set())
    a = np.random.default_rng(14).standard_normal(TALL)
    traces = []
    for _ in range(2):
        with mpqr.explain() as trace:
            mpqr.qr(a, mode="r", device=device, memory_budget="40KB")
        traces.append(trace)
    cold = [[e for e in t.events if e.kind == "cold-start"] for t in traces]
    assert len(cold[0]) == 1 and not cold[1]
    d = cold[0][0].data
    assert d["setup_s"] >= 0 and d["first_piece_s"] > 0 and d["median_piece_s"] > 0
    assert d["first_piece_extra_s"] == max(0.0, d["first_piece_s"] - d["median_piece_s"])
    # from the call to the first piece: the backend's resolution and the staging within
    assert d["before_run_s"] >= d["backend_s"] > 0 and d["before_run_s"] >= d["setup_s"]
    assert d["cold_start_s"] == d["before_run_s"] + d["first_piece_extra_s"]
    for t in traces:  # every call reports its own lead-in, set-up and first piece
        ev = ooc_events(t)[0].data
        assert {"before_run_s", "backend_s", "setup_s", "setup", "first_piece_s",
                "median_piece_s"} <= set(ev)
