"""Out-of-core benchmark: ``python -m mpqr bench ooc [--quick] [--json PATH] [--png PATH]``.

All rows run in one process on host (NumPy) matrices with ``device="cuda"`` and a
``memory_budget`` the matrix does not fit:

* ``tall-32GB``: 2^26 x 64 float64, budget 8 GB: ``mode="reduced"`` (Q written into a
  preallocated host array), ``mode="r"`` and ``lstsq``, each against its host-link
  floor computed from the link rates measured first (pinned host -> device, device ->
  host, both at once).
* ``tall-8GB``: 2^24 x 64 float64, budget 2 GB, against ``numpy.linalg.qr`` on the
  machine's cores and ``dask.array.linalg.tsqr`` on CPU chunks.
* ``square-16GB``: 65536^2 float32, budget 4 GB, precisions fp16 and fp32-emulated:
  recursive out-of-core QR against mpqr's in-core QR of the same matrix on the device,
  and against the blocked (left-looking) out-of-core variant at the same budget.

Accuracy of every row: backward error ``||A - QR||_F / ||A||_F`` and orthogonality
``||Q^T Q - I||_F / sqrt(n)``, exact (streamed in float64) for the tall rows and
estimated from 8 Gaussian probe vectors (float64 products) for the square ones, beside
the in-core factorization's at the same precision. ``--quick``: small sizes (a check of
the machinery, not the targets).
"""

from __future__ import annotations

import argparse
import math
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from mpqr.tools._charts import pyplot, save
from mpqr.tools._timing import environment, write_json

__all__ = ["main"]

FULL = {"tall_big": (2**26, 64, "8GB"), "tall_mid": (2**24, 64, "2GB"),
        "square": (65536, "4GB")}
QUICK = {"tall_big": (2**22, 64, "512MB"), "tall_mid": (2**21, 64, "128MB"),
         "square": (8192, "64MB")}
#: datasheet dense FP16 tensor-core peak (SXM parts) for the "fraction of peak" column
_FP16_PEAK = {"H100": 989e12, "H200": 989e12, "A100": 312e12}


def _link(cp) -> dict[str, float]:
    """Pinned and pageable host<->device rates (GB/s), 1 GiB copies, best of 3."""
    import cupyx

    n = 2**27
    h1, h2 = cupyx.empty_pinned((n,), np.float64), cupyx.empty_pinned((n,), np.float64)
    h1[:] = 1.0
    h2[:] = 2.0
    d1, d2 = cp.empty(n), cp.empty(n)
    page = np.ones(n)
    s1, s2 = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)

    def rate(fn) -> float:
        best = math.inf
        for _ in range(3):
            cp.cuda.Device().synchronize()
            t = time.perf_counter()
            fn()
            cp.cuda.Device().synchronize()
            best = min(best, time.perf_counter() - t)
        return best

    h2d = rate(lambda: d1.set(h1, stream=s1))
    d2h = rate(lambda: d1.get(stream=s1, out=h1))
    both = rate(lambda: (d1.set(h1, stream=s1), d2.get(stream=s2, out=h2)))
    pageable = rate(lambda: d1.set(page))
    nb = n * 8
    return {"pinned_h2d_GBps": nb / h2d / 1e9, "pinned_d2h_GBps": nb / d2h / 1e9,
            "pinned_both_GBps": 2 * nb / both / 1e9, "pageable_h2d_GBps": nb / pageable / 1e9}


def _memcpy(cp) -> dict[str, Any]:
    """Host memcpy rate (GB/s) into pinned memory by thread count (1 GiB in 8 MiB-row
    chunks per thread); the staging's thread count is set to the fastest."""
    import cupyx

    from mpqr.backends import cupy_staging

    n = 2**27
    src = np.ones(n)
    dst = cupyx.empty_pinned((n,), np.float64)
    out: dict[str, Any] = {}
    for k in (1, 4, 8, 12, 16):
        cuts = [n * i // k for i in range(k + 1)]
        with ThreadPoolExecutor(k) as pool:
            best = math.inf
            for _ in range(3):
                t = time.perf_counter()
                list(pool.map(lambda i, c=cuts: np.copyto(dst[c[i]:c[i + 1]],
                                                          src[c[i]:c[i + 1]]), range(k)))
                best = min(best, time.perf_counter() - t)
        out[f"threads_{k}_GBps"] = n * 8 / best / 1e9
    best_k = max((1, 4, 8, 12, 16), key=lambda k: out[f"threads_{k}_GBps"])
    cupy_staging.HOST_COPY_THREADS = best_k
    out["staging_threads"] = cupy_staging.HOST_COPY_THREADS
    return out


def _host_matrix(cp, m: int, n: int, dtype: Any, seed: int) -> np.ndarray:
    """Gaussian host matrix, generated on the device in 1 GB pieces."""
    out = np.empty((m, n), dtype=dtype)
    rng = cp.random.default_rng(seed)
    step = max(1, 2**30 // (n * out.itemsize))
    for r0 in range(0, m, step):
        r1 = min(m, r0 + step)
        rng.standard_normal((r1 - r0, n), dtype=dtype).get(out=out[r0:r1])
    return out


def _timed(fn, repeat: int, warmup: bool = True) -> tuple[float, Any]:
    """Best wall time of ``repeat`` calls after one warm-up (pinned pools, page faults
    of the output), with the explain trace of the last call."""
    import mpqr

    if warmup:
        fn()
    best, trace = math.inf, None
    for _ in range(repeat):
        with mpqr.explain() as t:
            t0 = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t0)
        trace = t
    return best, trace


def _ooc_data(trace) -> dict[str, Any]:
    ev = [e for e in trace.events if e.kind == "out-of-core"]
    if not ev:
        return {}
    d = ev[-1].data
    keys = ("route", "method", "passes", "bytes_in", "bytes_out", "pieces", "overlap",
            "copy_s", "compute_s", "host_copy_s", "wall_s", "piece_rows", "panel_cols",
            "refinement_passes")
    return {k: d[k] for k in keys if k in d}


def _tall_accuracy(cp, a: np.ndarray, q: np.ndarray, r: np.ndarray) -> dict[str, float]:
    """Exact backward error and orthogonality, streamed through the device in float64."""
    rd = cp.asarray(r, dtype=cp.float64)
    n = a.shape[1]
    num = den = 0.0
    g = cp.zeros((n, n))
    step = 2**22
    for r0 in range(0, a.shape[0], step):
        ab = cp.asarray(a[r0:r0 + step], dtype=cp.float64)
        qb = cp.asarray(q[r0:r0 + step], dtype=cp.float64)
        num += float(cp.sum((ab - qb @ rd) ** 2))
        den += float(cp.sum(ab**2))
        g += qb.T @ qb
    return {"backward_error": math.sqrt(num / den),
            "orthogonality": float(cp.linalg.norm(g - cp.eye(n))) / math.sqrt(n)}


def _ne_error(cp, a: np.ndarray, b: np.ndarray, x: np.ndarray) -> float:
    """``||A^T (b - A x)|| / (||A||_F^2 ||x||)``, streamed through the device in float64."""
    xd = cp.asarray(x, dtype=cp.float64)
    g = cp.zeros(a.shape[1])
    fro = 0.0
    for r0 in range(0, a.shape[0], 2**22):
        ab = cp.asarray(a[r0:r0 + 2**22], dtype=cp.float64)
        g += ab.T @ (cp.asarray(b[r0:r0 + 2**22], dtype=cp.float64) - ab @ xd)
        fro += float(cp.sum(ab**2))
    return float(cp.linalg.norm(g)) / (fro * float(cp.linalg.norm(xd)))


def _probe_accuracy(cp, a_dev, q, r, probes: int = 8) -> dict[str, float]:
    """Backward error and orthogonality estimated from Gaussian probes (E||Ev||^2 =
    ||E||_F^2), every product in float64 by row blocks."""
    rng = cp.random.default_rng(7)
    n = a_dev.shape[1]
    qd = q if isinstance(q, cp.ndarray) else None
    rdv = r if isinstance(r, cp.ndarray) else cp.asarray(r)

    def mv(x, v, rows=8192):  # float64 x @ v, x float32 on the device or host
        out = []
        for r0 in range(0, x.shape[0], rows):
            blk = x[r0:r0 + rows]
            out.append(cp.asarray(blk, dtype=cp.float64) @ v)
        return cp.concatenate(out)

    def mtv(x, v, rows=8192):
        acc = cp.zeros((x.shape[1], v.shape[1]))
        for r0 in range(0, x.shape[0], rows):
            acc += cp.asarray(x[r0:r0 + rows], dtype=cp.float64).T @ v[r0:r0 + rows]
        return acc

    qq = qd if qd is not None else q
    v = rng.standard_normal((n, probes))
    av = mv(a_dev, v)
    e = av - mv(qq, mv(rdv, v))
    qv = mv(qq, v)
    o = mtv(qq, qv) - v
    return {"backward_error": float(cp.linalg.norm(e) / cp.linalg.norm(av)),
            "orthogonality": float(cp.linalg.norm(o) / cp.linalg.norm(v))}


def _row(name: str, **kw: Any) -> dict[str, Any]:
    row = {"row": name, **kw}
    t, floor = row.get("time_s"), row.get("floor_s")
    if t and floor:
        row["x_floor"] = t / floor
    print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()
           if k not in ("passes",)}, flush=True)
    return row


def bench_tall_big(cp, m: int, n: int, budget: str, link: dict, repeat: int) -> list[dict]:
    import mpqr

    a = _host_matrix(cp, m, n, np.float64, 1)
    b = _host_matrix(cp, m, 1, np.float64, 2)[:, 0]
    q = np.empty_like(a)
    nb = a.nbytes
    h2d, d2h, both = (link["pinned_h2d_GBps"] * 1e9, link["pinned_d2h_GBps"] * 1e9,
                      link["pinned_both_GBps"] * 1e9)
    rows = []
    kw = dict(device="cuda", memory_budget=budget, progress=False)
    got: list[Any] = []
    t, tr = _timed(lambda: got.append(mpqr.qr(a, out=(q, None), **kw)), repeat)
    d = _ooc_data(tr)
    reads = d.get("passes", {}).get("x", 3)
    floor2 = max(2 * nb / h2d, nb / d2h, 3 * nb / both)  # A read twice, Q written once
    floor_alg = max(reads * nb / h2d, nb / d2h, (reads + 1) * nb / both)
    r = got[-1].R
    got.clear()
    acc = _tall_accuracy(cp, a, q, r)
    ref_rows = min(m, 2**24)
    ad = cp.asarray(a[:ref_rows])
    q0, r0 = mpqr.qr(ad)
    ref = _tall_accuracy(cp, a[:ref_rows], q0.get(), r0.get())
    ad = q0 = r0 = None
    cp.get_default_memory_pool().free_all_blocks()
    rows.append(_row("tall-32GB reduced", shape=[m, n], dtype="float64", budget=budget,
                     mode="reduced", time_s=t, floor_s=floor2, floor_algorithm_s=floor_alg,
                     target=1.3, met=t <= 1.3 * floor2, accuracy=acc,
                     in_core_accuracy={**ref, "rows": ref_rows}, **d))
    t, tr = _timed(lambda: mpqr.qr(a, mode="r", **kw), repeat)
    rows.append(_row("tall-32GB mode r", shape=[m, n], dtype="float64", budget=budget,
                     mode="r", time_s=t, floor_s=nb / h2d, target=1.3,
                     met=t <= 1.3 * nb / h2d, **_ooc_data(tr)))
    t, tr = _timed(lambda: got.append(mpqr.lstsq(a, b, **kw)), repeat)
    d = _ooc_data(tr)
    passes = 1 + d.get("refinement_passes", 0)
    floor = passes * (nb + b.nbytes) / h2d
    x = got[-1][0]
    got.clear()
    x0 = mpqr.lstsq(cp.asarray(a[:ref_rows]), cp.asarray(b[:ref_rows]))[0].get()
    rows.append(_row("tall-32GB lstsq", shape=[m, n], dtype="float64", budget=budget,
                     mode="lstsq", time_s=t, floor_s=floor, target=1.3,
                     met=t <= 1.3 * floor, passes_over_a=passes,
                     accuracy={"normal_equation_error": _ne_error(cp, a, b, x)},
                     in_core_accuracy={"normal_equation_error": _ne_error(
                         cp, a[:ref_rows], b[:ref_rows], x0), "rows": ref_rows}, **d))
    return rows


def bench_tall_mid(cp, m: int, n: int, budget: str, repeat: int, save: Any) -> list[dict]:
    import mpqr

    a = _host_matrix(cp, m, n, np.float64, 3)
    q = np.empty_like(a)
    got: list[Any] = []
    t, tr = _timed(lambda: got.append(mpqr.qr(a, out=(q, None), device="cuda",
                                              memory_budget=budget, progress=False)), repeat)
    d = _ooc_data(tr)
    r = got[-1].R
    acc = _tall_accuracy(cp, a, q, r)
    ad = cp.asarray(a)
    q0, r0 = mpqr.qr(ad)
    ref = _tall_accuracy(cp, a, q0.get(), r0.get())
    ad = q0 = r0 = None
    cp.get_default_memory_pool().free_all_blocks()
    row = {"shape": [m, n], "dtype": "float64", "budget": budget, "mode": "reduced",
           "time_s": t, "target": 20.0, "accuracy": acc, "in_core_accuracy": ref, **d}
    save([{"row": "tall-8GB reduced vs CPU (partial)", **row}])
    try:
        import dask
        import dask.array as da

        x = da.from_array(a, chunks=(max(n, m // 64), n))
        t0 = time.perf_counter()
        qd, rd = da.linalg.tsqr(x)
        dask.compute(qd, rd, scheduler="threads")
        row["dask_tsqr_s"] = time.perf_counter() - t0
        row["speedup_vs_dask"] = row["dask_tsqr_s"] / t
    except ImportError:
        row["dask_tsqr_s"] = None
    save([{"row": "tall-8GB reduced vs CPU (partial)", **row}])
    t0 = time.perf_counter()
    np.linalg.qr(a)
    row["numpy_s"] = time.perf_counter() - t0
    row["speedup_vs_numpy"] = row["numpy_s"] / t
    best_cpu = min(v for v in (row["numpy_s"], row["dask_tsqr_s"]) if v is not None)
    row["met"] = best_cpu / t >= 20.0
    return [_row("tall-8GB reduced vs CPU", **row)]


def bench_square(cp, n: int, budget: str, repeat: int) -> list[dict]:
    import mpqr

    a = _host_matrix(cp, n, n, np.float32, 4)
    q = np.empty_like(a)
    rows = []
    peak = next((v for k, v in _FP16_PEAK.items()
                 if k in cp.cuda.runtime.getDeviceProperties(0)["name"].decode()), None)
    flops = 2.0 * n**3  # Gram-Schmidt: 2 m n^2 (m = n)
    for prec in ("fp16", "fp32-emulated"):
        # in core on the same matrix where it fits the device; else on the largest
        # leading square block that does (multiple of 4096), its time scaled by the
        # flop ratio (n / n_in)^3
        t_in, ref, n_in = None, {}, n
        while n_in >= 4096 and t_in is None:
            cp.get_default_memory_pool().free_all_blocks()
            try:
                ad = cp.asarray(a[:n_in, :n_in])
                got = []
                t_in, _ = _timed(lambda ad=ad, prec=prec, got=got: got.append(
                    mpqr.qr(ad, precision=prec)), 1)
                ref = {**_probe_accuracy(cp, ad, got[-1].Q, got[-1].R), "n": n_in}
            except MemoryError as exc:  # does not fit this device
                ref = {"error_at_n": n_in, "error": str(exc)[:160]}
                n_in = int(n_in / 2**0.5) // 4096 * 4096
            ad, got = None, []
        t_in_scaled = None if t_in is None else t_in * (n / n_in) ** 3
        cp.get_default_memory_pool().free_all_blocks()
        ad = cp.asarray(a)
        res = {}
        for method in ("ooc-recursive", "ooc-blocked")[:2 if prec == "fp16" else 1]:
            # warm-up (pinned buffers, kernels) on a small matrix at the same budget
            mpqr.qr(a[: n // 8, : n // 8], precision=prec, method=method, device="cuda",
                    memory_budget=budget, progress=False)
            got = []
            t, tr = _timed(lambda prec=prec, method=method, got=got: got.append(mpqr.qr(
                a, out=(q, None), precision=prec, method=method, device="cuda",
                memory_budget=budget, progress=False)), 1, warmup=False)
            acc = _probe_accuracy(cp, ad, q, got[-1].R) if method == "ooc-recursive" \
                else None
            got.clear()
            res[method] = (t, tr, acc)
        ad = None
        cp.get_default_memory_pool().free_all_blocks()
        t_rec, tr, acc = res["ooc-recursive"]
        t_blk = res["ooc-blocked"][0] if "ooc-blocked" in res else None
        d = _ooc_data(tr)
        d.pop("method", None)
        rows.append(_row(f"square-16GB {prec}", shape=[n, n], dtype="float32", budget=budget,
                         precision=prec, method="ooc-recursive", time_s=t_rec,
                         in_core_s=t_in_scaled, in_core_n=n_in, in_core_measured_s=t_in,
                         fraction_of_in_core=None if t_in is None else t_in_scaled / t_rec,
                         target=0.7, met=t_in is not None and t_in_scaled / t_rec >= 0.7,
                         blocked_s=t_blk,
                         speedup_vs_blocked=None if t_blk is None else t_blk / t_rec,
                         target_vs_blocked=1.5,
                         met_vs_blocked=t_blk is not None and t_blk / t_rec >= 1.5,
                         tflops=flops / t_rec / 1e12,
                         fraction_of_fp16_peak=None if peak is None else flops / t_rec / peak,
                         accuracy=acc, in_core_accuracy=ref, **d,
                         blocked=_ooc_data(res["ooc-blocked"][1]) if t_blk else None))
    return rows


def plot(payload: dict[str, Any], path: str) -> None:
    plt = pyplot()
    if plt is None:
        return
    labels, got, want = [], [], []
    for r in payload["rows"]:
        if "x_floor" in r:
            labels.append(f"{r['row']}\n(time / link floor, target <= {r['target']})")
            got.append(r["x_floor"])
            want.append(r["target"])
        if "speedup_vs_numpy" in r or "speedup_vs_dask" in r:
            cpu = min(v for v in (r.get("numpy_s"), r.get("dask_tsqr_s")) if v)
            labels.append(f"{r['row']}\n(best CPU / mpqr, target >= 20)")
            got.append(cpu / r["time_s"])
            want.append(20.0)
        if r.get("fraction_of_in_core") is not None:
            labels.append(f"{r['row']}\n(in-core / out-of-core, target >= 0.7)")
            got.append(r["fraction_of_in_core"])
            want.append(0.7)
        if r.get("speedup_vs_blocked") is not None:
            labels.append(f"{r['row']}\n(blocked / recursive, target >= 1.5)")
            got.append(r["speedup_vs_blocked"])
            want.append(1.5)
    fig, ax = plt.subplots(figsize=(10, 0.8 + 0.7 * len(labels)))
    y = np.arange(len(labels))
    ax.barh(y, got, color="tab:blue", label="measured")
    ax.scatter(want, y, color="k", marker="|", s=400, label="target")
    ax.set_yticks(y, labels, fontsize=7)
    ax.set_xscale("log")
    env = payload["environment"]
    ax.set_title(f"mpqr out of core — {env.get('device')} {env.get('date')}")
    ax.legend(fontsize=8)
    save(fig, path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mpqr bench ooc", description=__doc__)
    p.add_argument("--quick", action="store_true", help="small sizes: a machinery check")
    p.add_argument("--rows", default="tall_big,tall_mid,square")
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--json", default=None)
    p.add_argument("--png", default=None)
    p.add_argument("--merge", default=None,
                   help="a JSON of an earlier run on this machine whose rows are kept (the "
                        "sections of one run must fit a 10-minute device limit)")
    args = p.parse_args(argv)
    import cupy as cp

    sizes = QUICK if args.quick else FULL
    link = _link(cp)
    link["memcpy"] = _memcpy(cp)
    print(link, flush=True)
    rows: list[dict] = []
    payload = {"environment": {**environment(cp), "link": link, "quick": args.quick},
               "rows": rows}
    if args.merge:
        import json
        import pathlib

        earlier = json.loads(pathlib.Path(args.merge).read_text())
        payload["earlier_run"] = {"environment": earlier["environment"], "file": args.merge}
        rows += [{**r, "run": "earlier"} for r in earlier["rows"]
                 if not r["row"].startswith("square")]  # square rows are measured again
    want = args.rows.split(",")
    def save(partial: list[dict]) -> None:  # partial runs keep what they measured
        write_json(args.json, {**payload, "rows": rows + partial})

    for name, fn in (("tall_big", lambda: bench_tall_big(cp, *sizes["tall_big"], link,
                                                         args.repeat)),
                     ("square", lambda: bench_square(cp, *sizes["square"], args.repeat)),
                     ("tall_mid", lambda: bench_tall_mid(cp, *sizes["tall_mid"], args.repeat,
                                                         save))):
        if name in want:
            rows += fn()
            save([])
    if args.png:
        plot(payload, args.png)
    return 0
