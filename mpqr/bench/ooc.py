"""Out-of-core benchmark: ``python -m mpqr bench ooc [--quick] [--cpu] [--json PATH] [--png PATH]``.

On a GPU all rows run on host (NumPy) matrices with ``device="cuda"`` and a
``memory_budget`` the matrix does not fit:

* ``tall-32GB``: 2^26 x 64 float64, budget 8 GB: ``mode="reduced"`` (Q written into a
  preallocated host array), ``mode="r"`` and ``lstsq`` for two kinds of ``b`` — a good
  fit (``b = A c + 1e-3`` noise, ``|c| ~ 1e3``: the usual regression, ``[A | b]``
  ill-conditioned) and a random ``b`` — each against its host-link floor computed from
  the link rates measured first (pinned host -> device, device -> host, both at once),
  with the reads of ``A`` the trace counted and the first call's time beside the
  repeated call's.
* ``first_call``: each of those calls in a fresh process (the matrices are loaded into
  memory before the clock starts): the first call against the best of the repeated ones,
  with the trace's ``cold-start`` account.
* ``tall-8GB``: 2^24 x 64 float64, budget 2 GB, against ``numpy.linalg.qr`` on the
  machine's cores and ``dask.array.linalg.tsqr`` on CPU chunks.
* ``square-16GB``: 65536^2 float32, budget 4 GB, precisions fp16 and fp32-emulated:
  the out-of-core QR ``method="auto"`` takes against mpqr's in-core QR of the same
  matrix on the device, and (fp16) the other out-of-core variant at the same budget.
* ``staging_sweep`` (only when named in ``--rows``): ``mode="r"`` and lstsq on the tall
  matrix with 8-32 host copy threads per direction and pieces of at most 256 MiB-1 GiB.

The host memcpy rate (pageable -> pinned and back, by thread count; alone and with the
DMA reading pinned memory at the same time, as in the staging) is measured beside
the link's, with the rate of copying straight from page-locked caller memory
(``cudaHostRegister`` of 1 GiB, the copy, unregistering it), and each staged row reports
the rate its host copies reached.

``--cpu``: the tall rows and the first calls on the NumPy backend (``device=None``)
at 2^21 x 64 (``--quick``: 2^18 x 64) with a budget of 1/8 of the matrix, against the
in-core call on the same matrix, and the host memcpy rate by thread count.

Accuracy of every row: backward error ``||A - QR||_F / ||A||_F`` and orthogonality
``||Q^T Q - I||_F / sqrt(n)``, exact (streamed in float64) for the tall rows and
estimated from 8 Gaussian probe vectors (float64 products) for the square ones, beside
the in-core factorization's at the same precision; least squares: the normal-equation
error ``||A^T (b - A x)|| / (||A||_F^2 ||x||)``. ``--quick``: small sizes (a check of
the machinery, not the targets).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from mpqr.bench._charts import pyplot, save
from mpqr.bench._timing import environment, write_json

__all__ = ["main"]

FULL = {"tall_big": (2**26, 64, "8GB"), "tall_mid": (2**24, 64, "2GB"),
        "square": (65536, "4GB")}
QUICK = {"tall_big": (2**22, 64, "512MB"), "tall_mid": (2**21, 64, "128MB"),
         "square": (8192, "64MB")}
#: --cpu: the tall rows on the NumPy backend (a budget of 1/8 of the matrix)
CPU = {"tall_big": (2**21, 64, "128MB")}
CPU_QUICK = {"tall_big": (2**18, 64, "16MB")}
#: the calls of the tall rows and of the first-call section
CALLS = ("reduced", "r", "lstsq good-fit", "lstsq random")
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
    out = {"pinned_h2d_GBps": nb / h2d / 1e9, "pinned_d2h_GBps": nb / d2h / 1e9,
           "pinned_both_GBps": 2 * nb / both / 1e9, "pageable_h2d_GBps": nb / pageable / 1e9}
    # the alternative to the host memcpy: page-lock the caller's memory for the piece in
    # flight (cudaHostRegister), copy from it directly, unlock it
    rt = cp.cuda.runtime
    try:
        def register() -> None:
            rt.hostRegister(page.ctypes.data, nb, 0)
            rt.hostUnregister(page.ctypes.data)

        def registered_copy() -> None:
            rt.hostRegister(page.ctypes.data, nb, 0)
            rt.memcpyAsync(d1.data.ptr, page.ctypes.data, nb, rt.memcpyHostToDevice, s1.ptr)
            s1.synchronize()
            rt.hostUnregister(page.ctypes.data)

        out["register_unregister_GBps"] = nb / rate(register) / 1e9
        out["registered_h2d_GBps"] = nb / rate(registered_copy) / 1e9
    except Exception as exc:  # a driver without host registration: say so
        out["registered_h2d_error"] = str(exc)[:160]
    return out


def _memcpy_rates(dst_in: Any, dst_out: Any, n: int) -> dict[str, Any]:
    """Host memcpy rates (GB/s) by thread count: a pageable array into ``dst_in`` (the
    staging's upload side) and ``dst_out`` back into a pageable array (the download
    side), best of 3, each thread copying its contiguous share."""
    src = np.ones(n)
    back = np.empty(n)
    out: dict[str, Any] = {}
    for k in (1, 4, 8, 12, 16, 24, 32):
        if k > 2 * (os.cpu_count() or 1):
            break
        cuts = [n * i // k for i in range(k + 1)]
        with ThreadPoolExecutor(k) as pool:
            for name, (d, s_) in (("in", (dst_in, src)), ("out", (back, dst_out))):
                best = math.inf
                for _ in range(3):
                    t = time.perf_counter()
                    list(pool.map(lambda i, c=cuts, d=d, s_=s_: np.copyto(
                        d[c[i]:c[i + 1]], s_[c[i]:c[i + 1]]), range(k)))
                    best = min(best, time.perf_counter() - t)
                out[f"{name}_threads_{k}_GBps"] = n * 8 / best / 1e9
    return out


def _memcpy(cp) -> dict[str, Any]:
    """Host memcpy rate (GB/s) between pageable and pinned memory by thread count (1 GiB),
    alone and with the DMA reading another pinned buffer at the same time (what the
    staging does), and the staging's thread count beside them."""
    import threading

    import cupyx

    from mpqr.backends.cupy import staging as cupy_staging

    n = 2**27
    dst = cupyx.empty_pinned((n,), np.float64)
    out = _memcpy_rates(dst, cupyx.empty_pinned((n,), np.float64), n)
    src, busy = np.ones(n), cupyx.empty_pinned((n,), np.float64)
    busy[:] = 0.0
    dev = cp.empty(n)
    stream = cp.cuda.Stream(non_blocking=True)
    def dma(stop: Any, sent: list[int]) -> None:
        while not stop.is_set():
            dev.set(busy, stream=stream)
            stream.synchronize()
            sent[0] += 1

    def copy(cuts: list[int], i: int) -> None:
        np.copyto(dst[cuts[i]:cuts[i + 1]], src[cuts[i]:cuts[i + 1]])

    for k in sorted({16, cupy_staging.HOST_COPY_THREADS}):
        stop, sent = threading.Event(), [0]
        th = threading.Thread(target=dma, args=(stop, sent))
        th.start()
        cuts = [n * i // k for i in range(k + 1)]
        with ThreadPoolExecutor(k) as pool:
            s0, t = sent[0], time.perf_counter()
            for _ in range(4):
                list(pool.map(copy, [cuts] * k, range(k)))
            dt, s1 = time.perf_counter() - t, sent[0]
        stop.set()
        th.join()
        out[f"in_threads_{k}_with_dma_GBps"] = 4 * n * 8 / dt / 1e9
        out[f"dma_beside_{k}_threads_GBps"] = (s1 - s0) * n * 8 / dt / 1e9
    out["staging_threads"] = cupy_staging.HOST_COPY_THREADS
    return out


def _host_matrix(cp, m: int, n: int, dtype: Any, seed: int) -> np.ndarray:
    """Gaussian host matrix, generated in 1 GB pieces (on the device with CuPy; ``cp``
    None: NumPy)."""
    out = np.empty((m, n), dtype=dtype)
    step = max(1, 2**30 // (n * out.itemsize))
    if cp is None:
        rng = np.random.default_rng(seed)
        for r0 in range(0, m, step):
            rng.standard_normal(out[r0:r0 + step].shape, dtype=dtype, out=out[r0:r0 + step])
        return out
    rng = cp.random.default_rng(seed)
    for r0 in range(0, m, step):
        r1 = min(m, r0 + step)
        rng.standard_normal((r1 - r0, n), dtype=dtype).get(out=out[r0:r1])
    return out


def _fit_rhs(cp, a: np.ndarray, seed: int) -> np.ndarray:
    """``b = A c + 1e-3`` noise with ``c ~ 1e3 N(0, 1)``: a good fit, ``|b|`` ~ 1e4 for 64
    columns (streamed, on the device with CuPy)."""
    xp = np if cp is None else cp
    rng = xp.random.default_rng(seed)
    c = 1e3 * rng.standard_normal(a.shape[1])
    b = np.empty(a.shape[0])
    step = 2**22
    for r0 in range(0, a.shape[0], step):
        blk = xp.asarray(a[r0:r0 + step])
        v = blk @ c + 1e-3 * rng.standard_normal(blk.shape[0])
        b[r0:r0 + step] = v if cp is None else v.get()
    return b


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


def _first_and_repeated(fn, repeat: int) -> tuple[float, float, Any]:
    """``(first call, best repeated call, trace of the last)``: the first call of this row
    in this process (the process may have run other rows before)."""

    t0 = time.perf_counter()
    fn()
    first = time.perf_counter() - t0
    best, trace = _timed(fn, repeat, warmup=False)
    return first, best, trace


def _ooc_data(trace) -> dict[str, Any]:
    ev = [e for e in trace.events if e.kind == "out-of-core"]
    if not ev:
        return {}
    d = ev[-1].data
    keys = ("route", "method", "passes", "bytes_in", "bytes_out", "pieces", "overlap",
            "copy_s", "compute_s", "host_copy_s", "wall_s", "piece_rows", "panel_cols",
            "refinement_passes", "setup_s", "setup", "first_piece_s", "median_piece_s")
    out = {k: d[k] for k in keys if k in d}
    out["reads_of_a"] = sum(v for k, v in d.get("passes", {}).items() if k != "Q")
    if d.get("host_copy_s"):
        out["host_copy_GBps"] = (d["bytes_in"] + d["bytes_out"]) / d["host_copy_s"] / 1e9
    cold = [e.data for e in trace.events if e.kind == "cold-start"]
    if cold:
        out["cold_start"] = cold[-1]
    return out


def _tall_accuracy(cp, a: np.ndarray, q: np.ndarray, r: np.ndarray) -> dict[str, float]:
    """Exact backward error and orthogonality, streamed through the device in float64
    (``cp``: CuPy, or NumPy on the host)."""
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
    """``||A^T (b - A x)|| / (||A||_F^2 ||x||)``, streamed through the device in float64
    (``cp``: CuPy), or on the host in extended precision (``cp``: NumPy; float64 rounds
    ``b - A x`` at ``u |b|``, above this measure for a poor fit)."""
    wide = cp.float64 if cp is not np else np.longdouble
    xd = cp.asarray(x, dtype=wide)
    g = cp.zeros(a.shape[1], dtype=wide)
    fro = 0.0
    step = 2**22 if cp is not np else 2**18
    for r0 in range(0, a.shape[0], step):
        ab = cp.asarray(a[r0:r0 + step], dtype=wide)
        g += ab.T @ (cp.asarray(b[r0:r0 + step], dtype=wide) - ab @ xd)
        fro += float(cp.sum(ab**2))
    return float(cp.linalg.norm(cp.asarray(g, dtype=cp.float64))) / (
        fro * float(cp.linalg.norm(cp.asarray(xd, dtype=cp.float64))))


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
           if k not in ("setup", "cold_start", "all_s")}, flush=True)
    return row


def _tall_call(a: np.ndarray, b_fit: np.ndarray, b_rand: np.ndarray, q: np.ndarray,
               call: str, kw: dict[str, Any]) -> Any:
    """The function that makes one of :data:`CALLS` on the host matrices."""
    import mpqr

    if call == "reduced":
        return lambda: mpqr.qr(a, out=(q, None), **kw)
    if call == "r":
        return lambda: mpqr.qr(a, mode="r", **kw)
    b = b_fit if call == "lstsq good-fit" else b_rand
    return lambda: mpqr.lstsq(a, b, **kw)


def bench_tall_big(cp, m: int, n: int, budget: str, link: dict | None, repeat: int
                   ) -> list[dict]:
    """The tall rows (``cp`` None: on the NumPy backend, against the in-core calls)."""
    import mpqr

    a = _host_matrix(cp, m, n, np.float64, 1)
    b_fit = _fit_rhs(cp, a, 2)
    b_rand = _host_matrix(cp, m, 1, np.float64, 3)[:, 0]
    q = np.empty_like(a)
    q[...] = 0.0  # the output's pages exist before any call (the calls write into it)
    nb = a.nbytes
    xp = np if cp is None else cp
    gpu = cp is not None
    label = f"tall-{nb / 1e9:.3g}GB" if gpu else f"tall-cpu {m}x{n}"
    kw = dict(device="cuda" if gpu else None, memory_budget=budget, progress=False)
    ref_rows = min(m, 2**24)
    rows = []
    for call in CALLS:
        got: list[Any] = []
        fn = _tall_call(a, b_fit, b_rand, q, call, kw)
        first, t, tr = _first_and_repeated(lambda fn=fn, got=got: got.append(fn()), repeat)
        d = _ooc_data(tr)
        row: dict[str, Any] = {"shape": [m, n], "dtype": "float64", "budget": budget,
                               "call": call, "time_s": t, "first_call_s": first,
                               "first_over_repeated": first / t, **d}
        if call in ("reduced", "r"):
            r = got[-1] if call == "r" else got[-1].R
            if call == "reduced":
                row["accuracy"] = _tall_accuracy(xp, a, q, r)
        else:
            b = b_fit if call == "lstsq good-fit" else b_rand
            row["accuracy"] = {"normal_equation_error": _ne_error(xp, a, b, got[-1][0])}
        got.clear()
        if gpu:
            h2d, d2h, both = (link["pinned_h2d_GBps"] * 1e9, link["pinned_d2h_GBps"] * 1e9,
                              link["pinned_both_GBps"] * 1e9)
            if call == "reduced":  # A read twice, Q written once
                floor, target = max(2 * nb / h2d, nb / d2h, 3 * nb / both), 1.6
            elif call == "r":
                floor, target = nb / h2d, 1.2
            else:  # lstsq against the one-read floor of [A | b]
                floor, target = (nb + b_fit.nbytes) / h2d, 2.2
            row.update(floor_s=floor, target=target, met=t <= target * floor)
            ad = cp.asarray(a[:ref_rows])
            if call == "reduced":
                q0, r0 = mpqr.qr(ad)
                row["in_core_accuracy"] = {**_tall_accuracy(cp, a[:ref_rows], q0.get(),
                                                            r0.get()), "rows": ref_rows}
                q0 = r0 = None
            elif call != "r":
                b = b_fit if call == "lstsq good-fit" else b_rand
                x0 = mpqr.lstsq(ad, cp.asarray(b[:ref_rows]))[0].get()
                row["in_core_accuracy"] = {"normal_equation_error": _ne_error(
                    cp, a[:ref_rows], b[:ref_rows], x0), "rows": ref_rows}
            ad = None
            cp.get_default_memory_pool().free_all_blocks()
        else:  # the same call in core on the same matrix
            kw_in = dict(kw, memory_budget=None)
            fn_in = _tall_call(a, b_fit, b_rand, q, call, kw_in)
            got = []
            t_in, _ = _timed(lambda fn_in=fn_in, got=got: got.append(fn_in()), repeat)
            row["in_core_s"] = t_in
            row["x_in_core"] = t / t_in
            if call == "reduced":
                row["in_core_accuracy"] = _tall_accuracy(np, a, got[-1].Q, got[-1].R)
            elif call != "r":
                b = b_fit if call == "lstsq good-fit" else b_rand
                row["in_core_accuracy"] = {"normal_equation_error": _ne_error(
                    np, a, b, got[-1][0])}
            got.clear()
        rows.append(_row(f"{label} {call}", **row))
    return rows


def bench_staging_sweep(cp, m: int, n: int, budget: str, repeat: int) -> list[dict]:
    """The host side of the staging: copy threads per direction x largest piece, for the
    one-read call (``mode="r"``) and lstsq, each the best of ``repeat`` after a warm-up."""
    from mpqr.backends.cupy import staging as cupy_staging
    from mpqr.ooc import budget as budget_mod

    a = _host_matrix(cp, m, n, np.float64, 1)
    b_fit = _fit_rhs(cp, a, 2)
    kw = dict(device="cuda", memory_budget=budget, progress=False)
    keep = cupy_staging.HOST_COPY_THREADS, budget_mod.MAX_BLOCK_BYTES
    rows = []
    try:
        for threads in (8, 16, 24, 32):
            if threads > 2 * (os.cpu_count() or 1):
                break
            for block_mib in (256, 512, 1024):
                cupy_staging.HOST_COPY_THREADS = threads
                budget_mod.MAX_BLOCK_BYTES = block_mib * 2**20
                for call in ("r", "lstsq good-fit"):
                    fn = _tall_call(a, b_fit, b_fit, None, call, kw)
                    t, tr = _timed(fn, repeat)
                    rows.append(_row(f"staging {call} threads={threads} piece<={block_mib}MiB",
                                     call=call, threads=threads, max_block_mib=block_mib,
                                     time_s=t, **_ooc_data(tr)))
    finally:
        cupy_staging.HOST_COPY_THREADS, budget_mod.MAX_BLOCK_BYTES = keep
    return rows


def _child(argv: list[str]) -> int:
    """One call in a fresh process: ``--child CALL DIR DEVICE BUDGET REPEAT``; prints one
    JSON line with the first call's time and the best of the repeated ones."""
    call, folder, device, budget, repeat = argv
    folder = pathlib.Path(folder)
    # in memory before the clock starts, as a caller's arrays would be
    a = np.array(np.load(folder / "a.npy", mmap_mode="r"))
    b_fit = np.array(np.load(folder / "b_fit.npy", mmap_mode="r"))
    b_rand = np.array(np.load(folder / "b_rand.npy", mmap_mode="r"))
    q = np.zeros_like(a) if call == "reduced" else None
    import mpqr

    kw = dict(device=None if device == "cpu" else device, memory_budget=budget,
              progress=False)
    fn = _tall_call(a, b_fit, b_rand, q, call, kw)
    times, data = [], {}
    for i in range(1 + int(repeat)):
        with mpqr.explain() as tr:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        if i == 0:
            data = _ooc_data(tr)
    print(json.dumps({"call": call, "first_call_s": times[0],
                      "repeated_s": min(times[1:]), "all_s": times, **data}, default=str))
    return 0


def bench_first_call(cp, m: int, n: int, budget: str, repeat: int) -> list[dict]:
    """Each tall call in a fresh process: first call against the repeated ones."""
    a = _host_matrix(cp, m, n, np.float64, 1)
    b_fit = _fit_rhs(cp, a, 2)
    b_rand = _host_matrix(cp, m, 1, np.float64, 3)[:, 0]
    shm = pathlib.Path("/dev/shm")
    rows = []
    with tempfile.TemporaryDirectory(dir=shm if shm.is_dir() else None) as tmp:
        for name, arr in (("a", a), ("b_fit", b_fit), ("b_rand", b_rand)):
            np.save(pathlib.Path(tmp) / f"{name}.npy", arr)
        del a, b_fit, b_rand
        for call in CALLS:
            cmd = [sys.executable, "-m", "mpqr.bench.ooc", "--child", call, tmp,
                   "cpu" if cp is None else "cuda", budget, str(repeat)]
            out = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if out.returncode:
                rows.append(_row(f"first call {call}", error=out.stderr[-600:]))
                continue
            d = json.loads(out.stdout.strip().splitlines()[-1])
            d.pop("call", None)
            rows.append(_row(f"first call {call}", shape=[m, n], budget=budget,
                             fresh_process=True, first_over_repeated=d["first_call_s"] /
                             d["repeated_s"], target=1.3,
                             met=d["first_call_s"] <= 1.3 * d["repeated_s"], **d))
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
    q.fill(0.0)  # its pages touched now: not by whichever method runs first
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
        from mpqr.ooc.driver import SQUARE_AUTO

        other = "ooc-recursive" if SQUARE_AUTO == "ooc-blocked" else "ooc-blocked"
        for method in (SQUARE_AUTO, other)[:2 if prec == "fp16" else 1]:
            # warm-up (pinned buffers, kernels) on a small matrix at the same budget
            mpqr.qr(a[: n // 8, : n // 8], precision=prec, method=method, device="cuda",
                    memory_budget=budget, progress=False)
            got = []
            t, tr = _timed(lambda prec=prec, method=method, got=got: got.append(mpqr.qr(
                a, out=(q, None), precision=prec, method=method, device="cuda",
                memory_budget=budget, progress=False)), 1, warmup=False)
            acc = _probe_accuracy(cp, ad, q, got[-1].R)
            got.clear()
            res[method] = (t, tr, acc)
        ad = None
        cp.get_default_memory_pool().free_all_blocks()
        t_main, tr, acc = res[SQUARE_AUTO]
        t_other = res[other][0] if other in res else None
        d = _ooc_data(tr)
        d.pop("method", None)
        rows.append(_row(f"square-16GB {prec}", shape=[n, n], dtype="float32", budget=budget,
                         precision=prec, method=SQUARE_AUTO, time_s=t_main,
                         in_core_s=t_in_scaled, in_core_n=n_in, in_core_measured_s=t_in,
                         fraction_of_in_core=None if t_in is None else t_in_scaled / t_main,
                         target=0.7, met=t_in is not None and t_in_scaled / t_main >= 0.7,
                         tflops=flops / t_main / 1e12,
                         fraction_of_fp16_peak=None if peak is None else flops / t_main / peak,
                         accuracy=acc, in_core_accuracy=ref, **d,
                         other_method=other if t_other else None, other_s=t_other,
                         other=({**_ooc_data(res[other][1]), "accuracy": res[other][2]}
                                if t_other else None)))
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
        if r.get("fresh_process") and r.get("first_over_repeated"):
            labels.append(f"{r['row']}\n(first / repeated call, fresh process, target <= 1.3)")
            got.append(r["first_over_repeated"])
            want.append(1.3)
        if r.get("x_in_core") is not None:
            labels.append(f"{r['row']}\n(out of core / in core, same matrix)")
            got.append(r["x_in_core"])
            want.append(1.0)
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
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--child"]:
        return _child(argv[1:])
    p = argparse.ArgumentParser(prog="python -m mpqr bench ooc", description=__doc__)
    p.add_argument("--quick", action="store_true", help="small sizes: a machinery check")
    p.add_argument("--cpu", action="store_true",
                   help="the tall rows and first calls on the NumPy backend (no GPU)")
    p.add_argument("--rows", default=None,
                   help="sections, comma-separated: tall_big, first_call, tall_mid, square, "
                        "staging_sweep (default: all but staging_sweep on a GPU; "
                        "tall_big,first_call with --cpu)")
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--json", default=None)
    p.add_argument("--png", default=None)
    p.add_argument("--merge", default=None,
                   help="a JSON of an earlier run on this machine whose rows are kept (the "
                        "sections of one run must fit a 10-minute device limit)")
    args = p.parse_args(argv)
    if args.cpu:
        cp = None
        sizes = CPU_QUICK if args.quick else CPU
        n = 2**26
        link = {"memcpy": _memcpy_rates(np.empty(n), np.ones(n), n),
                "cpu_count": os.cpu_count()}
        env = environment(np)
    else:
        import cupy as cp

        sizes = QUICK if args.quick else FULL
        link = _link(cp)
        link["memcpy"] = _memcpy(cp)
        env = environment(cp)
    print(link, flush=True)
    rows: list[dict] = []
    payload = {"environment": {**env, "link": link, "quick": args.quick, "cpu": args.cpu},
               "rows": rows}
    if args.merge:
        earlier = json.loads(pathlib.Path(args.merge).read_text())
        payload["earlier_run"] = {"environment": earlier["environment"], "file": args.merge}
        rows += [{**r, "run": "earlier"} for r in earlier["rows"]
                 if not r["row"].startswith("square")]  # square rows are measured again
    want = (args.rows or ("tall_big,first_call" if args.cpu else
                          "tall_big,first_call,tall_mid,square")).split(",")

    def save(partial: list[dict]) -> None:  # partial runs keep what they measured
        write_json(args.json, {**payload, "rows": rows + partial})

    sections = {
        "tall_big": lambda: bench_tall_big(cp, *sizes["tall_big"], link, args.repeat),
        "first_call": lambda: bench_first_call(cp, *sizes["tall_big"], args.repeat),
        "staging_sweep": lambda: bench_staging_sweep(cp, *sizes["tall_big"], args.repeat),
        "square": lambda: bench_square(cp, *sizes["square"], args.repeat),
        "tall_mid": lambda: bench_tall_mid(cp, *sizes["tall_mid"], args.repeat, save)}
    for name in want:
        if name not in sections or (args.cpu and name not in ("tall_big", "first_call")):
            p.error(f"--rows: unknown or GPU-only section {name!r}")
    for name, fn in sections.items():
        if name in want:
            rows += fn()
            save([])
    if args.png:
        plot(payload, args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
