"""The Dask bench's rows, the bench's way, on the GPUs of one host (2 x H200: < 90 s).

``python bench/probes/nccl_gpu.py`` runs the rows that ``python -m mpqr bench dask --gpus
2`` reads its targets from, with the bench's own functions (``mpqr.bench.dask``: its
cluster, its matrices, its fresh copy per call, its timing, its error evaluation; not a
copy of them), the placement of every call printed and kept:

* in core on one GPU (the bench's ``_in_core``, this process, GPU 0), and the in-core
  ``qr``'s backward error and orthogonality at the same size (the accuracy the Dask
  rows are checked against); the in-core ``lstsq``'s steps and the products an
  ``lstsq`` pass makes, block by block;
* one worker: ``2^26 x 64`` ``qr`` and ``lstsq`` (first: short, and two targets need it);
* two workers: ``2^26 x 64`` (strong) with the blocks spread evenly, and the same with
  the scheduler's placement of a ``dask.array.random`` array (the bench's earlier way:
  the A/B of the placement, one process, one cluster); weak ``2 x 2^26``; ``lstsq`` weak
  (and strong); ``dask.array.linalg.tsqr`` / ``lstsq`` on the same cluster and chunks;
  one ``2^22 x 64`` float64 block sent from GPU to GPU over the route's NCCL
  communicator (what moving blocks to even out a placement would cost); each ``lstsq``
  once more with its passes timed (``collective.PHASES``).

Checks (PASS/FAIL): each ``qr`` row's backward error and orthogonality within 4x in
core's, its trace's placement even (``imbalance`` 1) where the blocks were spread, each
``lstsq``'s normal-equation residual ``||A^H r|| / (||A||^2 ||x||) <= 10 u``. Targets as
MET / NOT MET. Medians of ``REPEAT`` calls after a warm-up (mpqr), one call after a
warm-up (dask; its round trips and errors are left to the bench). Optional steps (the
strong ``lstsq``, the block sent, the timed passes) are skipped past ``BUDGET_S``.
Writes ``$OUT/nccl.json`` (``OUT`` default ``/tmp``) after each step.

``MPQR_PROBE_CPU=1``: the same steps on CPU workers with NumPy blocks and small shapes
(a smoke test of the script: the scheduler route, no NCCL).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from mpqr.bench import dask as bench  # noqa: E402

CPU = os.environ.get("MPQR_PROBE_CPU") == "1"
GPU = not CPU
N = 64
BLOCK = 2**10 if CPU else 2**22
ROWS = 2**14 if CPU else 2**26  # per worker (weak), and the strong-scaling size
REPEAT = 3 if CPU else 5
REF_REPEAT = 1
BUDGET_S = 68  # optional steps are skipped past this (the probe must stay under 85 s)
U = 2.0**-53
T0 = time.perf_counter()
results: dict = {"cpu_smoke": CPU, "rows": {}, "checks": {}, "errors": {}, "clock_s": {}}


def save() -> None:
    out = os.path.join(os.environ.get("OUT", "/tmp"), "nccl.json")
    with open(out, "w") as f:
        json.dump(results, f, indent=1, default=str)


def clock(label: str) -> float:
    t = time.perf_counter() - T0
    results["clock_s"][label] = round(t, 1)
    return t


def step(name: str, fn, *a, optional: bool = False, **kw):
    """``fn(*a, **kw)``, its failure printed and recorded (the probe goes on); an optional
    step is skipped past the time budget."""
    if optional and time.perf_counter() - T0 > BUDGET_S:
        print(f"[{time.perf_counter() - T0:.0f} s] {name}: skipped (time budget)")
        results["errors"][name] = "skipped: time budget"
        return None
    try:
        out = fn(*a, **kw)
    except Exception:
        results["errors"][name] = traceback.format_exc()
        print(f"[{name}] FAILED:\n{results['errors'][name]}")
        out = None
    print(f"[{clock(name):.0f} s] {name} done")
    save()
    return out


def in_core() -> dict:
    """The bench's in-core rows, and the in-core ``qr``'s errors at the same size."""
    rows = bench._in_core(GPU, ROWS, N, "float64", REPEAT)
    out = {r["what"]: r.get("seconds") for r in rows}
    import mpqr

    xp = bench._module(GPU)
    a = xp.random.default_rng(0).standard_normal((ROWS, N))
    q, r = mpqr.qr(a)
    num = den = 0.0
    for i in range(0, ROWS, BLOCK):  # a block's temporaries at a time
        num += float(xp.sum((a[i:i + BLOCK] - q[i:i + BLOCK] @ r) ** 2))
        den += float(xp.sum(a[i:i + BLOCK] ** 2))
    g = bench._host(q.T @ q)
    import numpy as np

    out["backward_error"] = (num / den) ** 0.5
    out["orthogonality"] = float(np.linalg.norm(g - np.eye(N))) / N
    del q, r
    # where an lstsq's time goes: the in-core call's steps, and the products a worker's
    # passes make, block by block (ms, synchronised, median of 3)
    b = xp.random.default_rng(1).standard_normal((ROWS, 1))
    with mpqr.explain() as tr:
        mpqr.lstsq(a, b, lapack_driver="gelsy", check_finite=False)
    out["lstsq_trace"] = [(e.kind, e.message) for e in tr.events][:12]
    out["products_ms"] = products(xp, a, b)
    print("in core lstsq's steps:", out["lstsq_trace"])
    print("products over the blocks of 2^26 x 64 (ms):", out["products_ms"])
    del a, b
    if GPU:
        xp.get_default_memory_pool().free_all_blocks()
    results["in_core"] = out
    print("in core:", out)
    return out


def products(xp, a, b) -> dict:
    """ms of each product an lstsq pass makes, over ``a``'s ``BLOCK``-row blocks."""
    import statistics

    from mpqr.backends.dask._blocks import block_backend

    from mpqr.bench._timing import sync
    from mpqr.policy import gemm
    from mpqr.qr.gram_blocked import gram

    be = block_backend(a[:1])
    x2 = xp.ones((N, 2))
    blocks = [(a[i:i + BLOCK], b[i:i + BLOCK]) for i in range(0, a.shape[0], BLOCK)]
    cases = {
        "gram A^H A": lambda ai, bi: gram(be, ai, "fp64", "probe-gram"),
        "A^H b": lambda ai, bi: gemm(ai.T, bi, precision="fp64", backend=be),
        "A X (2 columns)": lambda ai, bi: gemm(ai, x2, precision="fp64", backend=be),
        "A^H V (2 columns)": lambda ai, bi: gemm(ai.T, xp.concatenate([bi, bi], axis=1),
                                                 precision="fp64", backend=be),
        "lstsq first pass leaf": lambda ai, bi: _leaf("first", ai, bi),
        "lstsq refine pass leaf": lambda ai, bi: _leaf("refine", ai, bi)}
    out = {}
    for name, fn in cases.items():
        ts = []
        for _ in range(4):
            sync(xp)
            t = time.perf_counter()
            for ai, bi in blocks:
                fn(ai, bi)
            sync(xp)
            ts.append(1e3 * (time.perf_counter() - t))
        out[name] = round(statistics.median(ts[1:]), 2)
    return out


def _leaf(which, a, b):
    from mpqr.backends.dask import _blocks

    if which == "first":
        return _blocks.lstsq_leaf(("fp64", "fp64", False), a, b)
    import numpy as np

    return _blocks.residual_leaf((np.ones((N, 2)), 1, "fp64", 0, 0, True), a, b)


def phases(client, x, label: str) -> None:
    """One ``lstsq`` (the bench's b, gelsy) with each worker's passes synchronised and
    timed (``collective.PHASES``)."""
    from mpqr.backends.dask import collective

    import mpqr

    b = bench._run(client, x.map_blocks(bench._rhs_block, drop_axis=1, dtype=x.dtype,
                                        meta=x._meta.reshape((0,))))[0]
    collective.PHASES = True
    try:
        with mpqr.explain() as tr:
            mpqr.lstsq(x, b, lapack_driver="gelsy", check_finite=False)
    finally:
        collective.PHASES = False
    ev = [e.data for e in tr.events if e.kind == "dask-collective"]
    ph = ev[0].get("phases_ms") if ev else None
    results.setdefault("lstsq_phases_ms", {})[label] = {
        "passes": ev[0].get("passes") if ev else None, "phases": ph,
        "events": [(e.kind, e.message) for e in tr.events][:10]}
    print(f"{label} lstsq passes (ms, synchronised): {ph}")


def qr_row(client, label: str, m: int, placement: str, reference: bool) -> None:
    x = bench._placed(client, GPU, m, N, BLOCK, "float64", placement)
    row = {"shape": f"{m}x{N}", "placement": placement,
           **bench._qr_pair(client, x, REPEAT, reference=reference, ref_repeat=REF_REPEAT,
                            ref_checks=False)}
    del x
    results["rows"][label] = row
    rt = row["round_trips"]
    print(f"{label}: qr {1e3 * row['mpqr_s']:.1f} ms, mode=r {1e3 * row['mpqr_r_s']:.1f} ms; "
          f"placement {row['blocks_per_worker']}, calls "
          f"{[c['blocks_per_worker'] for c in row['calls']['mpqr']]}, trace imbalance "
          f"{rt.get('imbalance')} bodies {rt.get('bodies_ms')} ms; timeline "
          f"{rt.get('timeline_ms')}; dask tsqr {row.get('dask_tsqr_s')} "
          f"{row.get('dask_error', '')} {row.get('dask_tsqr_half', '')}")
    core = results.get("in_core") or {}
    ok = (row["backward_error"] <= 4 * core.get("backward_error", 1e-16)
          and row["orthogonality"] <= 4 * core.get("orthogonality", 1e-16))
    if placement == "even" and "imbalance" in rt:
        ok = ok and rt["imbalance"] == 1.0
    results["checks"][label] = {"pass": bool(ok), "backward": row["backward_error"],
                                "orthogonality": row["orthogonality"],
                                "imbalance": rt.get("imbalance")}
    print(f"check {label}: {'PASS' if ok else 'FAIL'}  backward {row['backward_error']:.2e} "
          f"orth {row['orthogonality']:.2e} (in core {core.get('backward_error', 0):.2e} / "
          f"{core.get('orthogonality', 0):.2e})")


def lstsq_row(client, label: str, m: int, reference: bool) -> None:
    x = bench._placed(client, GPU, m, N, BLOCK, "float64", "even")
    row = {"workers": len(client.scheduler_info()["workers"]),
           **bench._lstsq(client, x, GPU, REPEAT, reference, ref_repeat=REF_REPEAT,
                          ref_checks=False)}
    if GPU:
        step(f"{label} phases", phases, client, x, label, optional=True)
    del x
    results["rows"][label] = row
    rt = row["round_trips"]
    print(f"{label}: lstsq {1e3 * row['mpqr_s']:.1f} ms (gelsd {1e3 * row['mpqr_gelsd_s']:.1f},"
          f" qr {1e3 * row['mpqr_qr_s']:.1f}); passes {rt.get('collective_passes')}, "
          f"all-reduces {rt.get('collectives')}, bodies {rt.get('bodies_ms')} ms, timeline "
          f"{rt.get('timeline_ms')}; dask lstsq {row.get('dask_lstsq_s')} "
          f"{row.get('dask_error', '')}")
    res = row.get("mpqr_normal_eq_residual", float("inf"))
    ok = res <= 10 * U
    results["checks"][label] = {"pass": bool(ok), "normal_eq_residual": res,
                                "dask": row.get("dask_normal_eq_residual")}
    print(f"check {label}: {'PASS' if ok else 'FAIL'}  normal-equation residual {res:.2e}"
          f" (dask {row.get('dask_normal_eq_residual')})")


def _send_body(comm, blocks, rows, n, reps):
    """Rank 0 sends a ``rows x n`` float64 block to rank 1 over NCCL, ``reps`` times;
    the mean ms (device synchronised around each)."""
    import cupy
    from cupy.cuda import nccl

    buf = cupy.ones((rows, n)) if comm.rank == 0 else cupy.empty((rows, n))
    stream = cupy.cuda.get_current_stream().ptr
    ts = []
    for _ in range(reps + 1):
        cupy.cuda.Device().synchronize()
        t = time.perf_counter()
        if comm.rank == 0:
            comm.comm.send(buf.data.ptr, buf.size, nccl.NCCL_FLOAT64, 1, stream)
        elif comm.rank == 1:
            comm.comm.recv(buf.data.ptr, buf.size, nccl.NCCL_FLOAT64, 0, stream)
        cupy.cuda.Device().synchronize()
        ts.append(1e3 * (time.perf_counter() - t))
    ok = comm.rank != 1 or bool(cupy.all(buf == 1))
    return {"rank": comm.rank, "ms": sorted(ts[1:])[len(ts[1:]) // 2], "ok": ok}, []


def block_send(client) -> None:
    from mpqr.backends.dask import _launch, collective

    h = collective.communicator(client, "nccl")
    work = {w: ([], []) for w in h.ranks}
    res = _launch.launch(client, h.cid, _send_body, work, (BLOCK, N, 3), 60)
    ms = max(v["ms"] for v in res.values())
    gb = BLOCK * N * 8 / 1e9
    results["block_send"] = {"block": f"{BLOCK}x{N}", "ms": ms, "GB_per_s": gb / ms * 1e3,
                             "received_intact": all(v["ok"] for v in res.values())}
    print(f"one {BLOCK}x{N} float64 block GPU -> GPU over NCCL: {ms:.2f} ms "
          f"({gb / ms * 1e3:.0f} GB/s), intact {results['block_send']['received_intact']}")


def with_cluster(k: int, fn) -> None:
    from distributed import Client

    with bench._cluster(k if GPU else None, k) as cluster, Client(cluster) as client:
        client.register_plugin(bench.RoundTrips())
        print(f"[{time.perf_counter() - T0:.0f} s] cluster of {k} up ({bench._cluster_kind()})")
        fn(client)


def two(client) -> None:
    step("2 workers, 2^26, even", qr_row, client, "2 workers, 2^26, even", ROWS, "even", True)
    step("2 workers, 2^26, scheduler's placement", qr_row, client,
         "2 workers, 2^26, scheduler's placement", ROWS, "scheduler", False)
    step("2 workers, 2 x 2^26, even", qr_row, client, "2 workers, 2 x 2^26, even", 2 * ROWS,
         "even", True)
    step("lstsq 2 workers, 2 x 2^26", lstsq_row, client, "lstsq 2 workers, 2 x 2^26",
         2 * ROWS, True)
    step("lstsq 2 workers, 2^26", lstsq_row, client, "lstsq 2 workers, 2^26", ROWS, False,
         optional=True)
    if GPU:
        step("block send", block_send, client, optional=True)


def one(client) -> None:
    step("1 worker, 2^26, even", qr_row, client, "1 worker, 2^26, even", ROWS, "even", False)
    step("lstsq 1 worker, 2^26", lstsq_row, client, "lstsq 1 worker, 2^26", ROWS, False)
    targets()  # so far (written again at the end)


def targets() -> None:
    core = results.get("in_core") or {}
    rows = results["rows"]

    def get(label, key):
        return (rows.get(label) or {}).get(key)

    def ratio(a, b):
        return a / b if a and b else None

    t = {"2 workers <= 0.6x in core": (ratio(get("2 workers, 2^26, even", "mpqr_s"),
                                             core.get("qr")), 0.6, "le"),
         "1 worker <= 1.2x in core": (ratio(get("1 worker, 2^26, even", "mpqr_s"),
                                            core.get("qr")), 1.2, "le"),
         "weak scaling 1 -> 2 <= 1.1": (ratio(get("2 workers, 2 x 2^26, even", "mpqr_s"),
                                              get("1 worker, 2^26, even", "mpqr_s")), 1.1,
                                        "le"),
         ">= 20x dask tsqr (2 workers, 2^26)": (get("2 workers, 2^26, even", "speedup"), 20,
                                                "ge"),
         ">= 20x dask tsqr (2 workers, 2 x 2^26)": (get("2 workers, 2 x 2^26, even",
                                                        "speedup"), 20, "ge"),
         ">= 20x dask lstsq (2 workers, 2 x 2^26)": (get("lstsq 2 workers, 2 x 2^26",
                                                         "speedup"), 20, "ge")}
    results["targets"] = {}
    for name, (v, lim, how) in t.items():
        met = None if v is None else (v <= lim if how == "le" else v >= lim)
        results["targets"][name] = {"value": v, "met": met}
        print(f"target {name}: {'n/a' if v is None else f'{v:.3f}'} "
              f"{'MET' if met else 'NOT MET' if met is not None else ''}")
    info = {"scheduler's placement / even (2 workers, 2^26, qr)": ratio(
        get("2 workers, 2^26, scheduler's placement", "mpqr_s"),
        get("2 workers, 2^26, even", "mpqr_s")),
        "lstsq 1 worker / in core": ratio(get("lstsq 1 worker, 2^26", "mpqr_s"),
                                          core.get("lstsq")),
        "lstsq 2 workers, 2^26 / in core": ratio(get("lstsq 2 workers, 2^26", "mpqr_s"),
                                                 core.get("lstsq")),
        "lstsq weak scaling 1 -> 2": ratio(get("lstsq 2 workers, 2 x 2^26", "mpqr_s"),
                                           get("lstsq 1 worker, 2^26", "mpqr_s"))}
    results["ratios"] = info
    for k, v in info.items():
        print(f"{k}: {'n/a' if v is None else f'{v:.3f}'}")


def main() -> None:
    import dask

    if GPU:
        import cupy
        from mpqr.backends.dask import collective

        results["nccl"] = collective.nccl_available() or "loaded"
        results["device"] = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
        results["gpus"] = cupy.cuda.runtime.getDeviceCount()
        print("NCCL:", results["nccl"], "| GPUs:", results["gpus"], results["device"])
    dask.config.set({"mpqr.dask.route": "auto"})
    # the workers import this tree's mpqr wherever the probe is started from
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT,
                                                             os.environ.get("PYTHONPATH")]))
    step("in core", in_core)
    # the one-worker rows first (short, and needed by two targets); the optional steps
    # of the two-worker cluster last, within the time budget
    step("cluster of 1", with_cluster, 1, one)
    if min(2, results.get("gpus", 2)) >= 2:
        step("cluster of 2", with_cluster, 2, two)
    targets()
    fails = [k for k, v in results["checks"].items() if not v["pass"]]
    print(f"checks: {len(results['checks']) - len(fails)} PASS, {len(fails)} FAIL {fails}")
    results["total_s"] = time.perf_counter() - T0
    save()
    print(f"wrote {os.path.join(os.environ.get('OUT', '/tmp'), 'nccl.json')} "
          f"({results['total_s']:.0f} s)")


if __name__ == "__main__":
    main()
