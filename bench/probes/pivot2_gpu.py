"""GPU probe: ``qr(pivoting=True)`` by the Gram-resolved greedy order, new against old,
float64, one process: the device pivoted Cholesky's "grid" variant
(``backends/cupy/pstrf.py``: a panel of up to 128 steps a launch over one block a
multiprocessor, one grid barrier a step) against the earlier "rows" variant (32 steps a
launch in one block); the levels ordered between the blocks of one Householder
factorization (``pivoted_gram.householder_levels``: geqrf + ormqr a level, orgqr once)
against a QR of each level's trailing block and a product into Q; cuSOLVER's unpivoted
QR (``cupy.linalg.qr``: geqrf + orgqr) as the baseline. The grid kernel's step latency
options (exchange bookkeeping off thread 0, lean polls, release/acquire fences, the
candidates' columns prefetched into L2, the end read a panel late without a host wait)
all off against all on at every shape, each alone off at 4096^2 (and blocks of >= 64 /
256 rows there), and the pivoted Cholesky alone at 4096^2 with them on and off.

Correctness (PASS/FAIL): the device pivoted Cholesky ("grid", panels 128 and 8, and
"rows") against LAPACK ``dpstrf`` on the host (the stop and the order; exact ties of
identical 2 x 2 blocks in LAPACK's order); the grid barrier never timed out; 0
increases of |diag(R)|, backward error and orthogonality within 8 (m + n) u; the
numerical rank of SciPy's geqp3 at a gap; float32, rank 1, complex at 3000 x 500.
Timings: median of synchronized runs after a warm-up (new x5 or x3, the others x3 or x1
at 16384^2), cuSOLVER in the same process, SciPy geqp3 4096^2 once on the host; then one
warm run of the new route timed by phase (Gram, pivoted Cholesky, the Householder steps,
Q's formation, the repair, the rest).
Writes ``$OUT/pivot2.json``. Run: ``python bench/probes/pivot2_gpu.py``.
"""

from __future__ import annotations

import json
import os
import time
import traceback

import cupy as cp
import numpy as np
import scipy.linalg as sla
from mpqr.backends.cupy import pstrf as cupy_pstrf
from mpqr.backends.cupy.backend import CupyBackend
from mpqr.backends.host.pstrf import lapack_pivoted_cholesky

import mpqr
from mpqr.qr import driver, pivoted_gram, pivoted_route

T0 = time.perf_counter()
BUDGET = 76.0  # seconds: parts that would start later are skipped (the run stays under 90)
OUT = os.environ.get("OUT", "/tmp")
U = 2.0**-53
res: dict = {"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
             "checks": {}, "timings": {}, "stages": {}}


def left() -> float:
    return BUDGET - (time.perf_counter() - T0)


def sync() -> None:
    cp.cuda.Device().synchronize()


def once(fn):
    sync()
    t = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - t


def timed(fn, reps=5):
    first = once(fn)  # warm-up
    reps = max(1, min(reps, int(left() / max(8 * first, 1e-3))))
    ts = [once(fn) for _ in range(reps)]
    return float(np.median(ts)), reps


def matrix(kind, m, n, seed=0):
    rs = cp.random.RandomState(seed)
    if kind == "random":
        return rs.standard_normal((m, n))
    k = min(m, n)
    u = cp.linalg.qr(rs.standard_normal((m, k)))[0]
    v = cp.linalg.qr(rs.standard_normal((n, k)))[0]
    s = cp.logspace(0, -12, k) if kind == "geometric" else \
        cp.concatenate([cp.logspace(0, -3, k // 4), cp.zeros(k - k // 4)])
    a = (u * s) @ v.T
    if kind == "gap":
        a += 1e-10 * rs.standard_normal((m, n))
    return a


def part(label, fn, need=0.0):
    if left() <= need:
        print(f"{label}: SKIPPED (time budget)")
        res["checks"].setdefault("skipped", []).append(label)
        return
    try:
        fn()
    except Exception:
        print(f"{label}: FAIL (exception)")
        traceback.print_exc()
        res["checks"][label] = {"pass": False, "error": traceback.format_exc()[-800:]}
    finally:  # what is done so far, should a later part run past the time limit
        with open(os.path.join(OUT, "pivot2.json"), "w") as f:
            json.dump(res, f, indent=1, default=str)


DEFAULTS = {"spread": cupy_pstrf.GRID_SPREAD, "lean": cupy_pstrf.GRID_LEAN_POLL,
            "acq_rel": cupy_pstrf.GRID_ACQ_REL, "lagged": cupy_pstrf.GRID_ASYNC_CHECK,
            "prefetch": cupy_pstrf.GRID_PREFETCH, "rows": cupy_pstrf.GRID_ROWS}


def use(variant, levels=True, lower=False, **grid):
    """The pivoted Cholesky's variant; ``levels``: one Householder factorization with the
    levels ordered between its blocks (else a QR of each level's trailing block);
    ``lower``: the "grid" kernel keeps only the lower triangle; ``grid``: the grid
    kernel's step latency options (``spread``, ``lean``, ``acq_rel``, ``prefetch``,
    ``lagged``) and ``rows`` (the fewest rows a block), the module defaults where not
    given."""
    o = {**DEFAULTS, **grid}
    cupy_pstrf.VARIANT = variant
    cupy_pstrf.GRID_LOWER = lower
    cupy_pstrf.GRID_SPREAD = o["spread"]
    cupy_pstrf.GRID_LEAN_POLL = o["lean"]
    cupy_pstrf.GRID_ACQ_REL = o["acq_rel"]
    cupy_pstrf.GRID_PREFETCH = o["prefetch"]
    cupy_pstrf.GRID_ASYNC_CHECK = o["lagged"]
    cupy_pstrf.GRID_ROWS = o["rows"]
    pivoted_gram.HOUSEHOLDER_LEVELS = levels
    CupyBackend.qrcp_exact_route = "gram"


PREVIOUS = {"spread": False, "lean": False, "acq_rel": False, "prefetch": False,
            "lagged": False}
CONFIGS = {"new (grid pstrf, one factorization)": (("grid", True), {}),
           "before: step latency as before": (("grid", True), PREVIOUS),
           "grid pstrf, level QRs": (("grid", False), {}),
           "old (rows pstrf, level QRs)": (("rows", False), {}),
           "new, pstrf on the lower triangle": (("grid", True, True), {}),
           # 4096^2 only: each latency option alone off, the blocks' fewest rows
           "new, exchange on thread 0": (("grid", True), {"spread": False}),
           "new, full polls": (("grid", True), {"lean": False}),
           "new, sequentially consistent fences": (("grid", True), {"acq_rel": False}),
           "new, no prefetch": (("grid", True), {"prefetch": False}),
           "new, end waited every 2nd panel": (("grid", True), {"lagged": False}),
           "new, blocks >= 64 rows": (("grid", True), {"rows": 64}),
           "new, blocks >= 256 rows": (("grid", True), {"rows": 256})}
SMALL_ONLY = ("new, exchange on thread 0", "new, full polls",
              "new, sequentially consistent fences", "new, no prefetch",
              "new, end waited every 2nd panel",
              "new, blocks >= 64 rows", "new, blocks >= 256 rows")


def run_qr(a):
    with mpqr.explain() as tr:
        q, r, p = mpqr.qr(a, pivoting=True)
    piv = [e.message for e in tr.events if e.kind == "pivot"]
    return q, r, p, piv


def check(a, q, r, p):
    d = cp.abs(cp.diagonal(r))
    inc = int(cp.sum(d[1:] > d[:-1]))
    m, n = a.shape
    be = float(cp.linalg.norm(a[:, p] - q @ r) / cp.linalg.norm(a))
    k = q.shape[1]
    orth = float(cp.linalg.norm(q.T @ q - cp.eye(k)))
    tol = 8 * (m + n) * U
    return {"increases": inc, "backward": be, "orth": orth,
            "pass": inc == 0 and be <= tol and orth <= tol}


class Stages:
    """Synchronized time of each phase of the Gram route (wrappers, one run); the
    library QR counts only outside the unpivoted QR of A P (the later levels')."""

    def __init__(self):
        self.t = {}
        self._orig = {}
        self.in_run = 0

    def _wrap(self, owner, name, key, skip_in_run=False, marks_run=False):
        fn = getattr(owner, name)
        self._orig[(owner, name)] = fn

        def w(*args, **kw):
            if skip_in_run and self.in_run:
                return fn(*args, **kw)
            sync()
            t = time.perf_counter()
            self.in_run += marks_run
            try:
                out = fn(*args, **kw)
            finally:
                self.in_run -= marks_run
            sync()
            k = key(self.t, kw) if callable(key) else key
            self.t[k] = self.t.get(k, 0.0) + time.perf_counter() - t
            return out
        setattr(owner, name, w)

    def __enter__(self):
        self._wrap(pivoted_gram, "gram", "Gram (all levels)")
        self._wrap(CupyBackend, "pivoted_cholesky", "pstrf (all levels)")
        self._wrap(pivoted_gram, "gram_order",
                   lambda t, kw: "order level 1" if "order level 1" not in t
                   else "order levels 2+")
        self._wrap(driver, "run", "QR of A P (unpivoted)", marks_run=True)
        self._wrap(CupyBackend, "library_qr", "levels 2+: QR of T P2", skip_in_run=True)
        # the Gram matrix of a native engine is a product (policy.gram: None)
        self._wrap(pivoted_gram, "gemm", lambda t, kw: "Gram (all levels)" if
                   kw.get("label") == "qrcp-gram" else "levels 2+: Q update", skip_in_run=True)
        self._wrap(CupyBackend, "householder_workspace", "workspace A P (column-major)")
        self._wrap(CupyBackend, "householder_steps", "Householder steps (geqrf + ormqr)")
        self._wrap(CupyBackend, "householder_q", "Q formation (orgqr)")
        self._wrap(pivoted_route, "repair_diagonal", "repair")
        self._wrap(pivoted_route, "gram_qrcp", "gram_qrcp")
        return self

    def __exit__(self, *exc):
        for (owner, name), fn in self._orig.items():
            setattr(owner, name, fn)


def ties(pairs):
    return np.kron(np.eye(pairs), np.array([[2.0, 1.0], [1.0, 2.0]]))


def pstrf_check():
    """Device pstrf against LAPACK dpstrf: the stop k and the order P[:k]."""
    rows = {}
    ok = True
    cases = [("ties", 0, 1200), ("geometric", 600, 300), ("random", 1500, 1000),
             ("geometric", 3000, 2048)]
    for kind, m, n in cases:
        if kind == "ties":
            g = cp.asarray(ties(n // 2))
            theta = 1e-12
        else:
            a = matrix(kind, m, n, seed=7)
            g = a.T @ a
            g = (g + g.T) / 2
            theta = pivoted_gram.resolve_threshold(m, n, U)
        ph, kh, _ = lapack_pivoted_cholesky(cp.asnumpy(g), theta)
        for variant, nb in (("grid", 128), ("grid", 8), ("grid-lower", 128), ("rows", 32)):
            was = cupy_pstrf._grid_failed
            cupy_pstrf.GRID_LOWER = variant == "grid-lower"
            pd, kd, _ = cupy_pstrf.pivoted_cholesky(g, theta, panel=nb,
                                                    variant=variant.split("-")[0])
            cupy_pstrf.GRID_LOWER = False
            fell = cupy_pstrf._grid_failed and not was
            pd = cp.asnumpy(pd)
            same = int(np.argmax(np.r_[pd[:min(kd, kh)] != ph[:min(kd, kh)], True]))
            # near the stop the pivots' squared norms are known to ~1/RESOLVE relative:
            # near-ties there may go either way (3000 x 2048 geometric: the last 9 of 1069)
            need = min(kd, kh) if kind in ("ties", "random") else 0.98 * min(kd, kh)
            good = abs(kd - kh) <= (0 if kind == "ties" else 1) and same >= need and \
                sorted(pd.tolist()) == list(range(n)) and not fell
            ok &= good
            rows[f"{kind} {m}x{n} {variant} nb={nb}"] = {
                "k_device": kd, "k_lapack": kh, "same_prefix": same, "pass": good,
                "grid_fell_back": fell}
            print(f"pstrf {variant} nb={nb} {kind} G of {n}: device k {kd}, LAPACK k {kh}, "
                  f"same order for the first {same}{' (GRID FELL BACK)' if fell else ''}: "
                  f"{'PASS' if good else 'FAIL'}")
    res["checks"]["pstrf_vs_lapack"] = {"rows": rows, "pass": ok}


def pstrf_ab(kind, n):
    """The pivoted Cholesky alone, old against new, on G = A^T A."""
    def go():
        a = matrix(kind, n, n, seed=3)
        g = a.T @ a
        g = (g + g.T) / 2
        del a
        theta = pivoted_gram.resolve_threshold(n, n, U)
        row = {}
        for variant in ("grid", "grid-before", "grid-lower", "rows"):
            reps = 1 if variant == "rows" else 3
            use("grid", **(PREVIOUS if variant == "grid-before" else {}))
            cupy_pstrf.GRID_LOWER = variant == "grid-lower"
            row[variant] = timed(lambda v=variant: cupy_pstrf.pivoted_cholesky(
                g, theta, variant=v.split("-")[0]), reps=reps)
        use("grid")
        k = cupy_pstrf.pivoted_cholesky(g, theta)[1]
        res["timings"][f"pstrf {kind} G of {n}"] = {**row, "steps": k}
        print(f"pstrf alone, {kind} G of {n} ({k} steps): grid {row['grid'][0] * 1e3:.1f} ms,"
              f" grid with the step latency as before {row['grid-before'][0] * 1e3:.1f} ms,"
              f" grid-lower {row['grid-lower'][0] * 1e3:.1f} ms, rows "
              f"{row['rows'][0] * 1e3:.1f} ms ({row['rows'][0] / row['grid'][0]:.2f}x)")
    part(f"pstrf A/B {kind} {n}", go, need=8.0)


def shape_case(kind, m, n, geqp3=False, reps=5, others=3, need=0.0):
    def go():
        a = matrix(kind, m, n)
        key = f"{kind} {m}x{n}"
        row = {}
        for i, (label, (cfg, grid)) in enumerate(CONFIGS.items()):
            if label in SMALL_ONLY and max(m, n) > 4096:
                continue
            use(*cfg, **grid)
            row[label] = timed(lambda: mpqr.qr(a, pivoting=True),
                               reps if i == 0 else others)
            if i == 0:
                row["cusolver geqrf+orgqr"] = timed(lambda: cp.linalg.qr(a), reps)
        use("grid")
        with Stages() as st:
            sync()
            t = time.perf_counter()
            q, r, p, piv = run_qr(a)
            sync()
            total = time.perf_counter() - t
        stages = {k: v * 1e3 for k, v in st.t.items()}
        stages["total (one staged run)"] = total * 1e3
        named = ("order level 1", "order levels 2+", "QR of A P (unpivoted)",
                 "levels 2+: QR of T P2", "levels 2+: Q update", "repair",
                 "workspace A P (column-major)", "Householder steps (geqrf + ormqr)",
                 "Q formation (orgqr)")
        stages["rest (copies, permutations, checks)"] = total * 1e3 - sum(
            stages.get(k, 0.0) for k in named)
        c = check(a, q, r, p)
        c.update(pivot_events=piv, grid_fell_back=cupy_pstrf._grid_failed)
        c["pass"] = c["pass"] and not cupy_pstrf._grid_failed
        if geqp3:
            ah = cp.asnumpy(a)
            t = time.perf_counter()
            _r2, p2 = sla.qr(ah, pivoting=True, mode="r")
            row["scipy geqp3 (host, once)"] = (time.perf_counter() - t, 1)
            ph = cp.asnumpy(p)
            c["same_P_as_geqp3_fraction"] = float(np.mean(ph == p2))
        res["checks"][key] = c
        res["stages"][key] = stages
        res["timings"][key] = row
        base = row["cusolver geqrf+orgqr"][0]
        new = row["new (grid pstrf, one factorization)"][0]
        print(f"{key}: {'PASS' if c['pass'] else 'FAIL'} inc {c['increases']} "
              f"be {c['backward']:.1e} orth {c['orth']:.1e}; {piv}")
        print(f"{key}: " + ", ".join(f"{k} {v[0] * 1e3:.1f} ms (x{v[1]}, {v[0] / base:.2f}x)"
                                     for k, v in row.items())
              + f"; old/new {row['old (rows pstrf, level QRs)'][0] / new:.2f}x"
              + f"; before/new {row['before: step latency as before'][0] / new:.2f}x"
              + (f"; geqp3/new {row['scipy geqp3 (host, once)'][0] / new:.1f}x"
                 if geqp3 else ""))
        print(f"{key} phases (new, one staged run, ms): " +
              ", ".join(f"{k} {v:.1f}" for k, v in stages.items()))
        del q, r, p
    part(f"{kind} {m}x{n}", go, need)


def gap_rank():
    use("grid")
    a = matrix("gap", 2048, 1024, seed=4)
    q, r, p, piv = run_qr(a)
    c = check(a, q, r, p)
    d = cp.asnumpy(cp.abs(cp.diagonal(r)))
    d2 = np.abs(np.diagonal(sla.qr(cp.asnumpy(a), pivoting=True, mode="r")[0]))
    rk, rk2 = int(np.sum(d > 1e-7 * d[0])), int(np.sum(d2 > 1e-7 * d2[0]))
    c.update(rank=rk, rank_geqp3=rk2, pivot_events=piv)
    c["pass"] = c["pass"] and rk == rk2
    res["checks"]["gap_rank_2048x1024"] = c
    print(f"rank at a gap 2048x1024 (rank 256 + 1e-10): {'PASS' if c['pass'] else 'FAIL'} "
          f"{rk} vs geqp3 {rk2}, {piv}")


def small_families():
    """float32, rank 1, complex (host zpstrf) through the route, 3000 x 500."""
    use("grid")
    rows = {}
    ok = True
    for kind, dt in (("geometric", cp.float32), ("rank1", cp.float64),
                     ("geometric", cp.complex128)):
        if kind == "rank1":
            rs = cp.random.RandomState(2)
            a = cp.outer(rs.standard_normal(3000), rs.standard_normal(500))
        else:
            a = matrix("geometric", 3000, 500, seed=5).astype(dt)
            if dt == cp.complex128:
                a = a + 1j * matrix("geometric", 3000, 500, seed=6)
        q, r, p, piv = run_qr(a)
        d = cp.abs(cp.diagonal(r))
        inc = int(cp.sum(d[1:] > d[:-1]))
        u = 2.0**-24 if dt == cp.float32 else U
        be = float(cp.linalg.norm(a[:, p] - q @ r) / cp.linalg.norm(a))
        orth = float(cp.linalg.norm(q.conj().T @ q - cp.eye(q.shape[1])))
        good = inc == 0 and be <= 8 * 3500 * u and orth <= 8 * 3500 * u
        ok &= good
        rows[f"{kind} {cp.dtype(dt).name}"] = {"increases": inc, "backward": be, "orth": orth,
                                               "pivot_events": piv, "pass": good}
        print(f"3000x500 {kind} {cp.dtype(dt).name}: {'PASS' if good else 'FAIL'} inc {inc} "
              f"be {be:.1e} orth {orth:.1e}; {piv}")
    res["checks"]["families 3000x500"] = {"rows": rows, "pass": ok}


def warm_up():
    """The kernels' first compilation (both variants), outside every timed run."""
    t = time.perf_counter()
    a = matrix("geometric", 1024, 600, seed=1)
    for cfg, grid in CONFIGS.values():
        use(*cfg, **grid)
        mpqr.qr(a, pivoting=True)
    cp.linalg.qr(a)
    sync()
    res["timings"]["warm-up (compilation)"] = time.perf_counter() - t
    print(f"warm-up: {time.perf_counter() - t:.1f} s")


part("warm-up", warm_up)
# the shapes first: a device fault in a later part (it ends the CUDA context) leaves them
shape_case("geometric", 4096, 4096, geqp3=True)
pstrf_ab("geometric", 4096)
shape_case("geometric", 16384, 16384, reps=3, others=1, need=22.0)
part("gap_rank", gap_rank, need=3.0)
part("families 3000x500", small_families, need=3.0)
shape_case("geometric", 65536, 4096, reps=3, others=1, need=10.0)
part("pstrf_vs_lapack", pstrf_check, need=6.0)
shape_case("geometric", 8192, 8192, reps=3, others=1, need=8.0)
pstrf_ab("geometric", 16384)
pstrf_ab("random", 4096)
ok = all(v.get("pass", True) for v in res["checks"].values() if isinstance(v, dict))
res["grid_fell_back"] = cupy_pstrf._grid_failed
print("ALL PASS" if ok else "SOME FAIL", f"({time.perf_counter() - T0:.0f} s)")
with open(os.path.join(OUT, "pivot2.json"), "w") as f:
    json.dump(res, f, indent=1, default=str)
