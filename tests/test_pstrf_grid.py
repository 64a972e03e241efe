"""The device pivoted Cholesky's "grid" scheme (``backends/cupy/kernels/pstrf.cu``,
``pstrf_grid_*``) step for step in NumPy, against LAPACK ``dpstrf``: a panel of ``nb``
steps with nothing exchanged inside it (pivots by physical row, ties broken by LAPACK's
logical position through ``rho``), the rows and columns its exchanges moved past it
moved into place, the trailing block updated by one rank-``nb`` product. Exact ties
(a matrix of identical 2 x 2 blocks) must come out in LAPACK's order; the device kernel
itself is checked against the same reference in the GPU test below."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from tests.conftest import GPU
from tests.test_qr_pivoted_order import family

gram = importlib.import_module("mpqr.qr.pivoted_gram")


def grid_model(g, tol, nb, rows, lower=False):
    """``(P, k)`` by the kernels' steps; ``rows``: rows a block (only the candidates'
    reduction depends on it, and that reduction's result does not). ``lower``: only
    ``w[i, j]``, ``i >= j``, is kept (the rest NaN here: any read of it shows)."""
    n = g.shape[0]
    w = np.array(g, dtype=np.float64)  # symmetric: the kernel's column-major view
    if lower:
        w[np.triu_indices(n, 1)] = np.nan

    def col(rest, p):  # S[rest, p] through the kept triangle
        return np.where(rest >= p, w[rest, p], w[p, rest]) if lower else w[rest, p]

    perm = np.arange(n)
    stop = tol * np.max(np.diagonal(w))
    lp = np.zeros((nb, n))
    for j0 in range(0, n, nb):
        jend, j2 = min(j0 + nb, n), j0 + nb
        rho = np.arange(n)
        lpos = np.arange(n)  # each block's own rows' positions
        d = np.diagonal(w).copy()
        taken = np.zeros(n, dtype=bool)
        taken[:j0] = True
        moved = []
        for k in range(j0, jend):
            t = k - j0
            cands = []  # (value, position, row): the blocks' candidates
            for r0 in range(j0, n, rows):
                own = np.arange(r0, min(r0 + rows, n))
                own = own[~taken[own]]
                if own.size:
                    best = own[np.lexsort((lpos[own], -d[own]))[0]]
                    cands.append((d[best], lpos[best], best))
            pv, pp, p = max(cands, key=lambda c: (c[0], -c[1]))
            if not pv > stop:
                return perm, k
            q = rho[k]
            lpos[q] = pp
            taken[p] = True
            if pp != k:
                rho[pp] = q
                perm[[k, pp]] = perm[[pp, k]]
                if pp >= j2:
                    moved.append(pp)
            rest = np.flatnonzero(~taken)
            v = (col(rest, p) - lp[:t, rest].T @ lp[:t, p]) / np.sqrt(pv)
            lp[t, rest] = v
            d[rest] -= v * v
        if j2 >= n:
            break
        src = rho[moved]
        lt = lp[:, rho[j2:]]
        if not lower:
            w[j0:, moved] = w[j0:, src]  # columns, then rows (after the columns)
            w[moved, j2:] = w[src, j2:]
            w[j2:, j2:] -= lt.T @ lt
            continue
        b = np.arange(j2, n)
        vals = [col(rho[b], x) for x in src]  # all reads before the writes
        for a, v in zip(moved, vals, strict=True):
            w[np.maximum(a, b), np.minimum(a, b)] = v
        step = -(-(n - j2) // 4)
        for c0 in range(j2, n, step):  # block columns of the lower triangle
            c1 = min(c0 + step, n)
            w[c0:, c0:c1] -= lt[:, c0 - j2:].T @ lt[:, c0 - j2:c1 - j2]
    return perm, n


def _ties(pairs):
    return np.kron(np.eye(pairs), np.array([[2.0, 1.0], [1.0, 2.0]]))


@pytest.mark.parametrize("name,n,nb,rows,lower", [
    ("ties", 48, 4, 7, False), ("ties", 48, 16, 5, False), ("geometric", 90, 8, 13, False),
    ("gaussian", 70, 16, 9, False), ("rank1", 40, 8, 6, False), ("ties", 48, 4, 7, True),
    ("geometric", 90, 8, 13, True), ("gaussian", 70, 16, 9, True)])
def test_grid_scheme_matches_lapack(name, n, nb, rows, lower):
    """The scheme's stop and order are LAPACK dpstrf's: equal pivots (identical 2 x 2
    blocks, every Schur complement the same numbers) in its logical order."""
    from mpqr.backends.host.pstrf import lapack_pivoted_cholesky

    if name == "ties":
        g = _ties(n // 2)
        tol = 1e-12
    else:
        a = family(name, 200, n)
        g = a.T @ a
        tol = gram.resolve_threshold(200, n, 2.0**-53)
    p, k = grid_model(g, tol, nb, rows, lower)
    p2, k2, _ = lapack_pivoted_cholesky(g, tol)
    assert k == k2 and (k < n or name != "rank1")
    np.testing.assert_array_equal(p[:k], p2[:k])
    assert sorted(p.tolist()) == list(range(n))
    if name == "ties":  # the order is not the plain one: the positions decided the ties
        assert list(p2[n // 2:]) != sorted(p2[n // 2:])


@pytest.mark.skipif(not GPU, reason="no CUDA GPU visible")
@pytest.mark.parametrize("name,n,nb,lower,spread", [("ties", 600, 32, False, True),
                                                    ("geometric", 700, 128, False, True),
                                                    ("gaussian", 500, 64, False, True),
                                                    ("rank1", 200, 16, False, True),
                                                    ("geometric", 300, 8, False, True),
                                                    ("ties", 600, 32, True, True),
                                                    ("geometric", 700, 128, True, True),
                                                    ("gaussian", 500, 16, True, True),
                                                    ("ties", 600, 32, False, False),
                                                    ("geometric", 700, 128, False, False)])
@pytest.mark.parametrize("lean", [True, False])
def test_gpu_grid_kernel_matches_lapack(name, n, nb, lower, spread, lean):
    """The "grid" kernel (no silent fallback: the barrier must not time out) against
    LAPACK dpstrf, the step latency options on and off (``spread``: the exchange's
    bookkeeping threads; ``lean``: lean polls, release/acquire fences and the L2
    prefetch together)."""
    import cupy as cp
    from mpqr.backends.cupy import pstrf
    from mpqr.backends.host.pstrf import lapack_pivoted_cholesky

    if name == "ties":
        g = _ties(n // 2)
        tol = 1e-12
    else:
        a = family(name, 1200, n)
        g = a.T @ a
        tol = gram.resolve_threshold(1200, n, 2.0**-53)
    out = pstrf._grid(cp.asarray(g), tol, float(np.max(np.diagonal(g))), nb, lower, spread,
                      lean, lean, lean)
    assert out not in (None, False), "grid barrier timed out" if out is False else "no fit"
    p, k, _ = out
    p2, k2, _ = lapack_pivoted_cholesky(g, tol)
    assert k == k2
    np.testing.assert_array_equal(cp.asnumpy(p)[:k], p2[:k])
    assert sorted(cp.asnumpy(p).tolist()) == list(range(n))


@pytest.mark.skipif(not GPU, reason="no CUDA GPU visible")
@pytest.mark.parametrize("lagged", [True, False])
def test_gpu_grid_end_read_lagged_or_waited(monkeypatch, lagged):
    """The end read from a copy one panel old (or by a wait every few panels): the same
    stop and order as LAPACK dpstrf, the stop inside a middle panel of many."""
    import cupy as cp
    from mpqr.backends.cupy import pstrf
    from mpqr.backends.host.pstrf import lapack_pivoted_cholesky

    monkeypatch.setattr(pstrf, "GRID_ASYNC_CHECK", lagged)
    a = family("geometric", 1200, 700)
    g = a.T @ a
    tol = gram.resolve_threshold(1200, 700, 2.0**-53)
    out = pstrf._grid(cp.asarray(g), tol, float(np.max(np.diagonal(g))), 16)
    assert out not in (None, False)
    p, k, _ = out
    p2, k2, _ = lapack_pivoted_cholesky(g, tol)
    assert k == k2 and 16 < k < 700 - 32
    np.testing.assert_array_equal(cp.asnumpy(p)[:k], p2[:k])
    assert sorted(cp.asnumpy(p).tolist()) == list(range(700))
