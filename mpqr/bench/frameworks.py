"""``python -m mpqr bench frameworks``: the drop-in patches, patched against unpatched.

In one process, the same call with and without ``mpqr.compat.torch.patch()`` /
``mpqr.compat.cupy.patch()``: torch batched QR (10000 x (256 x 32) float32), torch
lstsq (2^22 x 64 float64), ``cupy.linalg.qr`` (2^22 x 64 float64), and bfloat16
batched QR on torch, which torch's CUDA kernel refuses (``geqrf_cuda`` has no
bfloat16): its baseline is torch's float32 QR of the upcast input, and the accuracy of
the bfloat16 results (``||QR - A|| / ||A||`` and ``||Q^H Q - I||`` in float64, against
the input as rounded) is stated next to the float32 baseline's.

Timing: wall clock around each call with the whole device synchronized before and
after (``torch.cuda.synchronize()`` and CuPy's device), median over ``--repeat``
rounds that alternate the variants, after one warm-up call each; the patch is entered
once outside the timed calls. Without a GPU the CPU tensors are routed
(``devices=("cpu",)``); ``--size tiny`` is the smoke test.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import mpqr
from mpqr.bench._timing import environment, write_json

#: (batch, m, n) of the torch batched QR, rows of the tall problems, per --size
SIZES = {"full": ((10000, 256, 32), 2**22), "small": ((500, 256, 32), 2**16),
         "tiny": ((20, 32, 8), 2**10)}
N_TALL = 64


def _gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def _sync(torch: Any, cupy: Any) -> None:
    if torch is not None and torch.cuda.is_available():
        torch.cuda.synchronize()
    if cupy is not None:
        cupy.cuda.Device().synchronize()


def _time(calls: dict[str, Callable[[], Any]], contexts: dict[str, Any], repeat: int,
          sync: Callable[[], None], max_seconds: float) -> dict[str, float]:
    """Median seconds of each call, each run inside its context (entered once)."""
    times: dict[str, list[float]] = {k: [] for k in calls}
    for name, fn in calls.items():
        with contexts[name]:
            fn()
        sync()
    t_start = time.perf_counter()
    for _ in range(repeat):
        for name, fn in calls.items():
            with contexts[name]:
                sync()
                t0 = time.perf_counter()
                out = fn()
                sync()
                times[name].append(time.perf_counter() - t0)
                del out
        if time.perf_counter() - t_start > max_seconds:
            break
    return {k: statistics.median(v) for k, v in times.items()}


def _same(f: Callable[[], Any]) -> dict[str, Callable[[], Any]]:
    """One call timed both ways: the patch (or its absence) decides where it runs."""
    return {"unpatched": f, "patched": f}


def _routed(trace: Any) -> bool:
    """Whether the traced call went to mpqr (a bench of a kept call would compare
    torch with itself)."""
    return any(e.kind == "compat" and e.data.get("routed") for e in trace.events)


def _qr_errors(torch: Any, a: Any, q: Any, r: Any) -> dict[str, float]:
    a64, q64, r64 = (t.to(torch.float64) for t in (a, q, r))
    eye = torch.eye(q64.shape[-1], dtype=torch.float64, device=q64.device)
    return {"backward error": float((q64 @ r64 - a64).norm() / a64.norm()),
            "orthogonality": float((q64.mH @ q64 - eye).abs().amax())}


def run(size: str, repeat: int, max_seconds: float, precision: str | None) -> dict[str, Any]:
    import contextlib

    import torch

    import mpqr.compat.torch as mct

    gpu = _gpu()
    dev = "cuda" if gpu else "cpu"
    cupy = None
    if gpu:
        try:
            import cupy
        except ImportError:
            cupy = None

    def sync() -> None:
        _sync(torch, cupy)

    patched = {"devices": (dev,)}
    (batch, bm, bn), m_tall = SIZES[size]
    g = torch.Generator(device=dev).manual_seed(0)
    rows: list[dict[str, Any]] = []

    def row(call: str, shape: str, dtype: str, calls: dict[str, Callable[[], Any]],
            ctx: dict[str, Any], **extra: Any) -> dict[str, Any]:
        t = _time(calls, ctx, repeat, sync, max_seconds)
        r = {"call": call, "shape": shape, "dtype": dtype, **extra}
        for k, v in t.items():
            r[f"{k} (ms)"] = v * 1e3
        r["speed-up"] = t["unpatched"] / t["patched"]
        rows.append(r)
        print("  ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                        for k, v in r.items()))
        return r

    def variants() -> dict[str, Any]:
        return {"unpatched": contextlib.nullcontext(),
                "patched": mct.patch(precision, **patched)}

    # torch batched QR, float32
    a = torch.randn(batch, bm, bn, device=dev, generator=g)
    r = row("torch.linalg.qr", f"{batch}x({bm}x{bn})", "float32",
            _same(lambda a=a: torch.linalg.qr(a)), variants())
    with mpqr.explain() as trace, mct.patch(precision, **patched):
        r["patched errors"] = _qr_errors(torch, a, *torch.linalg.qr(a))
    r["routed"] = _routed(trace)
    r["unpatched errors"] = _qr_errors(torch, a, *mct.original("qr")(a))

    # bfloat16 batched QR: torch refuses it on CUDA; baseline: float32 QR of the upcast
    ab = a.to(torch.bfloat16)
    try:
        mct.original("qr")(ab)
        refused = None
    except (RuntimeError, NotImplementedError) as exc:
        refused = f"{type(exc).__name__}: {exc}"[:200]
    r = row("torch.linalg.qr", f"{batch}x({bm}x{bn})", "bfloat16",
            {"unpatched": lambda ab=ab: torch.linalg.qr(ab.float()),
             "patched": lambda ab=ab: torch.linalg.qr(ab)}, variants(),
            unpatched_is="float32 QR of the upcast input" if refused else "torch bfloat16",
            torch_bfloat16=refused or "supported")
    with mpqr.explain() as trace, mct.patch(precision, **patched):
        r["patched errors (bfloat16 Q, R)"] = _qr_errors(torch, ab, *torch.linalg.qr(ab))
    r["unpatched errors (float32 Q, R)"] = _qr_errors(torch, ab, *mct.original("qr")(ab.float()))
    r["routed"] = _routed(trace)
    r["bfloat16 unit roundoff"] = 2.0**-8
    del a, ab

    # torch lstsq, float64 (CUDA's default driver gels; CPU's gelsy)
    at = torch.randn(m_tall, N_TALL, dtype=torch.float64, device=dev, generator=g)
    bt = torch.randn(m_tall, 1, dtype=torch.float64, device=dev, generator=g)
    r = row("torch.linalg.lstsq", f"{m_tall}x{N_TALL}", "float64",
            _same(lambda at=at, bt=bt: torch.linalg.lstsq(at, bt)), variants())
    with mpqr.explain() as trace, mct.patch(precision, **patched):
        xp_ = torch.linalg.lstsq(at, bt).solution
    r["routed"] = _routed(trace)
    xu = mct.original("lstsq")(at, bt).solution
    r["relative difference of solutions"] = float((xp_ - xu).norm() / xu.norm())
    del at, bt

    # cupy.linalg.qr, float64
    if cupy is not None:
        import mpqr.compat.cupy as mcc

        ac = cupy.asarray(np.random.default_rng(0).standard_normal((m_tall, N_TALL)))
        r = row("cupy.linalg.qr", f"{m_tall}x{N_TALL}", "float64",
                _same(lambda ac=ac: cupy.linalg.qr(ac)),
                {"unpatched": contextlib.nullcontext(), "patched": mcc.patch(precision)})
        with mpqr.explain() as trace, mcc.patch(precision):
            q, rr = cupy.linalg.qr(ac)
        r["routed"] = _routed(trace)
        r["patched errors"] = {
            "backward error": float(cupy.linalg.norm(q @ rr - ac) / cupy.linalg.norm(ac)),
            "orthogonality": float(cupy.abs(q.T @ q - cupy.eye(N_TALL)).max())}
        del ac
    else:
        rows.append({"call": "cupy.linalg.qr", "skipped": "no CuPy with a GPU"})
    env = environment(cupy if cupy is not None else np)
    env["torch"] = torch.__version__
    env["torch device"] = torch.cuda.get_device_name() if gpu else "cpu"
    return {"environment": env, "size": size, "mpqr": mpqr.__version__,
            "precision": precision or "auto (default)", "results": rows}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mpqr bench frameworks", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", choices=list(SIZES), default="full",
                   help="full: the sizes above; small/tiny: scaled down (CPU smoke test)")
    p.add_argument("--precision", default=None)
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--max-seconds", type=float, default=60.0,
                   help="time cap of the timed rounds per call")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    payload = run(args.size, args.repeat, args.max_seconds, args.precision)
    write_json(args.json, payload)
    return 0
