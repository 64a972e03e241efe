"""``python -m mpqr bench bridge``: mpqr on PyTorch tensors and JAX arrays.

For every shape: ``mpqr.qr`` and ``mpqr.lstsq`` on the backend's own array (CuPy
on the GPU, NumPy on the CPU), on a PyTorch tensor and on a JAX array holding the
same memory (DLPack views), and the frameworks' own ``torch.linalg.qr`` /
``jax.numpy.linalg.qr`` (``lstsq`` likewise). The bridge's cost is the ratio of a
framework's time to the backend's (1.00 = none).

Timing: wall clock around each call with the whole device synchronized before
and after (every library's streams), median over ``--repeat`` rounds that run the
variants in turn, after one warm-up call each. The same timer serves every
variant, so the ratios compare like with like.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import mpqr
from mpqr.bench._charts import pyplot, save
from mpqr.bench._timing import (
    default_xp,
    environment,
    is_cupy,
    release_pool,
    shapes_or_default,
    write_json,
)

GPU_SHAPES = [(2**24, 32, 1), (2**22, 64, 1), (2**20, 256, 1), (256, 32, 10000)]
CPU_SHAPES = [(2**15, 32, 1), (2**13, 128, 1), (256, 32, 100)]
#: bench columns: (label, library that must be importable)
VARIANTS = ("mpqr-native", "mpqr-torch", "mpqr-jax", "torch.linalg", "jax.numpy.linalg")


def _frameworks(gpu: bool) -> tuple[Any, Any]:
    """torch and jax when importable (JAX with float64 and without preallocation)."""
    # JAX takes 75% of the GPU's memory at start-up otherwise, leaving CuPy little
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    try:
        import torch

        if gpu and not torch.cuda.is_available():
            torch = None
    except ImportError:
        torch = None
    try:
        import jax

        jax.config.update("jax_enable_x64", True)
        if gpu and not any(d.platform in ("gpu", "cuda") for d in jax.devices()):
            jax = None
    except ImportError:
        jax = None
    return torch, jax


def _sync(xp: Any) -> Callable[[], None]:
    def sync() -> None:
        if is_cupy(xp):  # the CPU runs synchronously; JAX's results are waited for
            xp.cuda.Device().synchronize()  # every stream: CuPy's, PyTorch's and JAX's
    return sync


def _views(xp: Any, torch: Any, jax: Any, a: Any) -> dict[str, Any]:
    """``a`` as the backend's array, a torch tensor and a JAX array (one memory)."""
    out = {"mpqr-native": a}
    if torch is not None:
        out["mpqr-torch"] = torch.from_dlpack(a)
    if jax is not None:
        # the GPU: the same memory; the CPU: a copy (JAX's own CPU arrays stay aligned)
        out["mpqr-jax"] = jax.dlpack.from_dlpack(a) if is_cupy(xp) else \
            jax.device_put(a, jax.devices("cpu")[0])
    return out


def _calls(kind: str, arrays: dict[str, Any], rhs: dict[str, Any], torch: Any, jax: Any,
           precision: str | None) -> dict[str, Callable[[], Any]]:
    calls: dict[str, Callable[[], Any]] = {}
    for name, a in arrays.items():
        if kind == "qr":
            calls[name] = lambda a=a: mpqr.qr(a, precision=precision)
        else:
            calls[name] = lambda a=a, b=rhs[name]: mpqr.lstsq(a, b, precision=precision)
    if torch is not None:
        ta, tb = arrays["mpqr-torch"], rhs["mpqr-torch"]
        tb = tb if tb.ndim == ta.ndim else tb[..., None]
        calls["torch.linalg"] = (lambda: torch.linalg.qr(ta)) if kind == "qr" else \
            (lambda: torch.linalg.lstsq(ta, tb))
    if jax is not None:
        jnp = jax.numpy
        ja, jb = arrays["mpqr-jax"], rhs["mpqr-jax"]
        calls["jax.numpy.linalg"] = (lambda: jnp.linalg.qr(ja)) if kind == "qr" else \
            (lambda: jnp.linalg.lstsq(ja, jb))
    if jax is not None:  # JAX dispatches asynchronously: wait for its results
        for name in ("mpqr-jax", "jax.numpy.linalg"):
            if name in calls:
                calls[name] = lambda f=calls[name]: jax.block_until_ready(f())
    return calls


def _method(fn: Callable[[], Any]) -> tuple[str, bool]:
    with mpqr.explain() as trace:
        fn()
    method = next((e.message for e in trace.events if e.kind == "method"), "")
    return method, any(e.kind == "bridge" for e in trace.events)


def run(shapes, kinds, *, xp, repeat: int, max_seconds: float, precision: str | None,
        dtype: str = "float64") -> dict[str, Any]:
    torch, jax = _frameworks(is_cupy(xp))
    sync = _sync(xp)
    rng = np.random.default_rng(1)
    rows = []
    for m, n, batch in shapes:
        shape = (m, n) if batch == 1 else (batch, m, n)
        label = f"{m}x{n}" if batch == 1 else f"{batch}x({m}x{n})"
        a = xp.asarray(rng.standard_normal(shape).astype(dtype))
        bshape = (m,) if batch == 1 else (batch, m, 1)
        b = xp.asarray(rng.standard_normal(bshape).astype(dtype))
        arrays, rhs = _views(xp, torch, jax, a), _views(xp, torch, jax, b)
        for kind in ("qr", "lstsq"):
            # lstsq on a stack is a Python loop over its problems (SciPy's batching): opt in
            if kind not in kinds and not (kind == "lstsq" and "lstsq-batched" in kinds):
                continue
            if kind == "lstsq" and batch > 1 and "lstsq-batched" not in kinds:
                continue
            calls = _calls(kind, arrays, rhs, torch, jax, precision)
            row: dict[str, Any] = {"call": kind, "shape": label, "dtype": dtype}
            times: dict[str, list[float]] = {}
            for name, fn in list(calls.items()):
                release_pool(xp)
                try:
                    fn()  # warm-up (compiles kernels, fills pools)
                    sync()
                    times[name] = []
                except Exception as exc:
                    row[f"{name} error"] = f"{type(exc).__name__}: {exc}"[:200]
                    del calls[name]
            t_start = time.perf_counter()
            for _ in range(repeat):
                for name, fn in calls.items():
                    sync()
                    t0 = time.perf_counter()
                    out = fn()
                    sync()
                    times[name].append(time.perf_counter() - t0)
                    del out
                if time.perf_counter() - t_start > max_seconds * len(calls):
                    break
            for name in VARIANTS:
                if times.get(name):
                    row[f"{name} (ms)"] = statistics.median(times[name]) * 1e3
            base = row.get("mpqr-native (ms)")
            for name in ("mpqr-torch", "mpqr-jax"):
                if base and f"{name} (ms)" in row:
                    row[f"{name.removeprefix('mpqr-')} / native"] = row[f"{name} (ms)"] / base
            for fw, own in (("torch", "torch.linalg"), ("jax", "jax.numpy.linalg")):
                if f"{own} (ms)" in row and f"mpqr-{fw} (ms)" in row:
                    row[f"speed-up vs {own}"] = row[f"{own} (ms)"] / row[f"mpqr-{fw} (ms)"]
            row["method"], _ = _method(calls["mpqr-native"])
            for name in ("mpqr-torch", "mpqr-jax"):
                if name in calls:
                    method, bridged = _method(calls[name])
                    if method != row["method"] or not bridged:
                        row[f"{name} method"] = f"{method} (bridge traced: {bridged})"
            rows.append(row)
            print("  ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                            for k, v in row.items() if k != "method"))
        del a, b, arrays, rhs
    env = environment(xp)
    if torch is not None:
        env["torch"] = torch.__version__
    if jax is not None:
        env["jax"] = jax.__version__
    return {"environment": env, "precision": precision or "auto (default)",
            "results": rows}


def plot(payload: dict[str, Any], path: str) -> None:
    plt = pyplot()
    if plt is None:
        return
    rows = payload["results"]
    names = [v for v in VARIANTS if any(f"{v} (ms)" in r for r in rows)]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    w = 0.8 / max(1, len(names))
    x = np.arange(len(rows))
    for i, v in enumerate(names):
        ax.bar(x + i * w, [r.get(f"{v} (ms)", 0.0) for r in rows], w, label=v)
    ax.set_xticks(x + w * (len(names) - 1) / 2,
                  [f"{r['call']} {r['shape']}" for r in rows], rotation=15, fontsize=8)
    ax.set_ylabel("time (ms)")
    ax.set_yscale("log")
    env = payload["environment"]
    ax.set_title(f"mpqr on PyTorch / JAX arrays — {env.get('device')} {env.get('date')}")
    ax.legend(fontsize=8)
    save(fig, path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mpqr bench bridge", description=__doc__)
    p.add_argument("--shapes", default=None,
                   help="comma list of MxN or BxMxN (default: the tall GPU shapes and "
                        "10000x256x32)")
    p.add_argument("--calls", default="qr,lstsq",
                   help="qr, lstsq, lstsq-batched (lstsq on the stacks too: a loop)")
    p.add_argument("--precision", default=None)
    p.add_argument("--dtype", default="float64", choices=["float32", "float64"])
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--max-seconds", type=float, default=20.0,
                   help="time cap per call and shape (per variant)")
    p.add_argument("--json", default=None)
    p.add_argument("--png", default=None)
    p.add_argument("--cpu", action="store_true")
    args = p.parse_args(argv)
    xp = np if args.cpu else default_xp()
    shapes = shapes_or_default(args.shapes, xp, GPU_SHAPES, CPU_SHAPES)
    payload = run(shapes, args.calls.split(","), xp=xp, repeat=args.repeat,
                  max_seconds=args.max_seconds, precision=args.precision, dtype=args.dtype)
    write_json(args.json, payload)
    if args.png:
        plot(payload, args.png)
    return 0
