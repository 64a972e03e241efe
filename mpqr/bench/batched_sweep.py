"""``python -m mpqr bench qr --shapes batched --sweep``: stacks of ``m x n`` matrices over
``n = 8 .. 512`` and ``m / n = 1 .. 16``, float32 and float64, ``mpqr.qr`` (reduced)
against ``cupy.linalg.qr`` and ``torch.linalg.qr`` in the same process.

Each stack holds about :data:`TARGET_BYTES` of data (the batch is
``TARGET_BYTES // (m n itemsize)``, capped at :data:`MAX_BATCH` and at least 2; each row
says its batch and bytes). ``mpqr.qr`` is timed as the median of ``repeat`` calls after a
warm-up. The baselines loop over members (cuSOLVER per matrix), so they are timed once
on a leading slice of :data:`BASE_MEMBERS` members first; where that extrapolates to at
most ``full_seconds`` for the whole stack they are timed on the whole stack (median of
up to 3), else the slice's time scaled to the batch is reported (``*_scaled_from``
says from how many members). Every row carries the ratios, mpqr's route (the explain
trace's method) and the worst member's backward error and orthogonality (float64, on
up to 64 members), and ``pass``: both within ``30 eps m``.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

import mpqr

__all__ = ["BASE_MEMBERS", "MAX_BATCH", "RATIOS", "SWEEP_N", "TARGET_BYTES", "batch_for",
           "run_sweep", "sweep_shapes"]

#: member widths and height-to-width ratios of the sweep
SWEEP_N = (8, 16, 32, 64, 128, 256, 512)
RATIOS = (1, 2, 4, 8, 16)
#: bytes of a stack (its batch is chosen to hold about this much) and the batch cap
TARGET_BYTES = 64 << 20
MAX_BATCH = 65536
#: members of the leading slice the looping baselines are first timed on
BASE_MEMBERS = 16


def batch_for(m: int, n: int, itemsize: int, target: int = TARGET_BYTES,
              cap: int = MAX_BATCH) -> int:
    """Members of a stack of ``m x n`` matrices holding about ``target`` bytes (2 to
    ``cap``)."""
    return int(max(2, min(cap, target // (m * n * itemsize))))


def sweep_shapes(ns=SWEEP_N, ratios=RATIOS) -> list[tuple[int, int]]:
    """``(m, n)`` of the sweep."""
    return [(n * k, n) for n in ns for k in ratios]


def _sync(xp) -> None:
    if hasattr(xp, "cuda"):
        xp.cuda.Device().synchronize()


def _median(xp, fn, reps: int) -> float:
    fn()
    _sync(xp)
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        _sync(xp)
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def _baseline(xp, fn, a, batch: int, full_seconds: float) -> tuple[float, int]:
    """``(seconds for the whole stack, members actually timed)``."""
    sub = min(batch, BASE_MEMBERS)
    fn(a[:2])
    _sync(xp)
    t0 = time.perf_counter()
    fn(a[:sub])
    _sync(xp)
    t_sub = time.perf_counter() - t0
    if t_sub * batch / sub > full_seconds:
        return t_sub * batch / sub, sub
    reps = max(1, min(3, int(full_seconds / max(t_sub * batch / sub, 1e-6))))
    return _median(xp, lambda: fn(a), reps), batch


def _errors(xp, a, q, r) -> tuple[float, float]:
    k = min(a.shape[0], 64)
    a64, q64, r64 = (x[:k].astype(xp.float64) for x in (a, q, r))
    n = r.shape[-1]
    res = xp.linalg.norm((a64 - q64 @ r64).reshape(k, -1), axis=-1)
    res = res / xp.linalg.norm(a64.reshape(k, -1), axis=-1)
    g = xp.swapaxes(q64, -1, -2) @ q64 - xp.eye(n)
    orth = xp.linalg.norm(g.reshape(k, -1), axis=-1) / n
    return float(res.max()), float(orth.max())


def _data(xp, rng, shape, dt):
    """A Gaussian stack made on the device where the namespace has a generator (the
    host's 64 MB of normals cost more than the row's timings), else on the host."""
    gen = getattr(getattr(xp, "random", None), "standard_normal", None)
    if xp is not np and gen is not None:
        return gen(shape).astype(dt)
    return xp.asarray(rng.standard_normal(shape).astype(dt))


def run_sweep(xp, *, shapes=None, dtypes=("float32", "float64"), target: int = TARGET_BYTES,
              cap: int = MAX_BATCH, repeat: int = 5, full_seconds: float = 1.0,
              torch_too: bool = True, deadline: float | None = None,
              budget_s: float | None = None, log=print) -> dict[str, Any]:
    """Rows of the sweep (see the module docstring); ``deadline``: seconds after which
    the remaining shapes are skipped (listed under ``skipped``). ``budget_s``: the whole
    sweep within about this many seconds: each row gets the time left shared among the
    rows left, the looping baselines are timed on the whole stack only where that fits
    a quarter of the row's share (else scaled from their leading slice, as the row
    says), and rows still left at ``budget_s`` are skipped."""
    torch = None
    if torch_too:
        try:
            import torch
        except ImportError:
            torch = None
    rows, skipped = [], []
    t_start = time.perf_counter()
    rng = np.random.default_rng(0)
    if xp is not np and hasattr(xp, "random") and hasattr(xp.random, "seed"):
        xp.random.seed(0)
    todo = [(dt, m, n) for dt in dtypes for m, n in (shapes or sweep_shapes())]
    stop = min(x for x in (deadline, budget_s, math.inf) if x is not None)
    for idx, (dt, m, n) in enumerate(todo):
        elapsed = time.perf_counter() - t_start
        if elapsed > stop:
            skipped.append(f"{m}x{n} {dt}")
            continue
        row_full = full_seconds
        if budget_s is not None:
            row_full = min(full_seconds, (budget_s - elapsed) / (len(todo) - idx) / 4)
        itemsize = np.dtype(dt).itemsize
        batch = batch_for(m, n, itemsize, target, cap)
        label = f"{batch}x({m}x{n}) {dt}"
        row: dict[str, Any] = {"shape": label, "m": m, "n": n, "batch": batch,
                               "dtype": dt, "bytes": batch * m * n * itemsize}
        try:
            a = _data(xp, rng, (batch, m, n), dt)
            with mpqr.explain() as tr:
                out = mpqr.qr(a)
            row["route"] = next((e.data.get("method", e.message) for e in tr.events
                                 if e.kind == "method"), "")
            row["fallback"] = [e.message for e in tr.events if e.kind == "fallback"]
            be, orth = _errors(xp, a, out.Q, out.R)
            del out
            tol = 30 * float(np.finfo(dt).eps) * m
            row.update(backward_error_worst_member=be, orthogonality_worst_member=orth,
                       **{"pass": be <= tol and orth <= tol})
            row["mpqr_ms"] = 1e3 * _median(xp, lambda a=a: mpqr.qr(a), repeat)
            t, k = _baseline(xp, lambda x: xp.linalg.qr(x), a, batch, row_full)
            row.update(cupy_ms=1e3 * t, cupy_scaled_from=k,
                       x_cupy=1e3 * t / row["mpqr_ms"])
            if torch is not None:
                try:
                    ta = torch.as_tensor(a, device="cuda")
                    t, k = _baseline(xp, lambda x: torch.linalg.qr(x), ta, batch, row_full)
                    row.update(torch_ms=1e3 * t, torch_scaled_from=k,
                               x_torch=1e3 * t / row["mpqr_ms"])
                    del ta
                except Exception as exc:  # the row keeps mpqr's and CuPy's numbers
                    row["torch_error"] = f"{type(exc).__name__}: {exc}"
            del a
        except Exception as exc:  # one shape's failure does not end the sweep
            row["error"] = f"{type(exc).__name__}: {exc}"
        rows.append(row)
        if hasattr(xp, "get_default_memory_pool"):
            xp.get_default_memory_pool().free_all_blocks()
        if "error" in row:
            log(f"{label:>26} error {row['error']}")
            continue
        tx = f" torch x{row['x_torch']:8.2f}" if "x_torch" in row else ""
        log(f"{label:>26} mpqr {row['mpqr_ms']:9.3f} ms  cupy x{row['x_cupy']:8.2f}{tx}"
            f"  err {row['backward_error_worst_member']:.1e} orth "
            f"{row['orthogonality_worst_member']:.1e}  {row['route']}")
    slowest = min((r["x_cupy"] for r in rows if "x_cupy" in r), default=math.nan)
    slowest_t = min((r["x_torch"] for r in rows if "x_torch" in r), default=math.nan)
    return {"target_bytes": target, "max_batch": cap, "repeat": repeat,
            "base_members": BASE_MEMBERS, "full_seconds": full_seconds,
            "budget_s": budget_s, "seconds": time.perf_counter() - t_start,
            "batch_rule": "batch = target_bytes // (m n itemsize), capped at max_batch, "
                          "at least 2",
            "slowest_x_cupy": slowest, "slowest_x_torch": slowest_t, "rows": rows,
            "skipped": skipped}
