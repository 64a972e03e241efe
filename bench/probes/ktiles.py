"""The tiled and lean plans against the fast plan: stretches of k in the fp16 engines'
products (``policy.K_TILES``), tiles sized for the one-kernel ``tc-sgemm``
(``policy.FUSED_TILES``), the scratch caps (``memory_plan.SPLIT_FRACTION``,
``LEAN_SPLIT_FRACTION``), the lean Q's column blocks (``LEAN_Q_BLOCK``) and W's block
column (``LEAN_PARTS``). For each
configuration: the pool's high-water beyond the input (``mpqr.bench.memory.measure_call``),
the time (CUDA events, medians of 3 in two alternated rounds, one process), R's largest
difference from the fast plan's, the backward error and orthogonality (float64 checks),
and the GPU time of each product label of one call (CUDA events around each policy call:
where the time goes).

``python bench/probes/ktiles.py`` writes ``$OUT/ktiles.json``.
"""

import collections
import functools
import sys

import cupy as cp
from plan_caps import run_rows, time_configs  # the probe beside this one

import mpqr
import mpqr.policy.policy as pol
from mpqr.bench._timing import release_pool
from mpqr.bench.memory import measure_call
from mpqr.qr import householder_recursive as hr
from mpqr.qr import memory_plan as mp

BASE = (mp.PLANS, mp.SPLIT_FRACTION, mp.LEAN_SPLIT_FRACTION, pol.K_TILES, pol.FUSED_TILES,
        hr.LEAN_Q_BLOCK, hr.LEAN_PARTS)
#: (plans, SPLIT_FRACTION, LEAN_SPLIT_FRACTION, K_TILES, FUSED_TILES, LEAN_Q_BLOCK,
#: LEAN_PARTS)
CONFIGS = {
    "fast": (("fast",), *BASE[1:]),
    "lean-p4": (("lean",), *BASE[1:6], 4),
    "lean-p3": (("lean",), *BASE[1:6], 3),
    "lean-p2": (("lean",), *BASE[1:6], 2),
}
#: the Ozaki engine's rows (the lean plan is its default at 16384^2)
CONFIGS_FP64 = {
    "lean-p4": (("lean",), *BASE[1:6], 4),
    "lean-p3": (("lean",), *BASE[1:6], 3),
    "lean-p2": (("lean",), *BASE[1:6], 2),
}
#: modules whose policy calls are timed by label
MODULES = ("mpqr.qr.householder_recursive", "mpqr.qr._kernels", "mpqr.qr.panel_blocked")


def _set(plans, split, lean_split, k_tiles, fused, q_block, parts):
    mp.PLANS, mp.SPLIT_FRACTION, mp.LEAN_SPLIT_FRACTION = plans, split, lean_split
    pol.K_TILES, pol.FUSED_TILES = k_tiles, fused
    hr.LEAN_Q_BLOCK = mp.LEAN_Q_BLOCK = q_block
    hr.LEAN_PARTS = mp.LEAN_PARTS = parts


def _errors(a, q, r):
    a64, q64, r64 = (x.astype(cp.float64) for x in (a, q, r))
    be = float(cp.linalg.norm(q64 @ r64 - a64) / cp.linalg.norm(a64))
    orth = float(cp.linalg.norm(q64.T @ q64 - cp.eye(q.shape[1])))
    return be, orth


def policy_calls(call, a):
    """``(total_ms, [(label, (m, n, k), ms)])``: one call of ``call(a)`` with CUDA events
    around each policy call of :data:`MODULES` (the shape of its two operands)."""
    events = []

    def wrap(fn, first):
        @functools.wraps(fn)
        def timed(*args, **kw):
            x, y = args[first], args[first + 1]  # gemm(a, b); gemm_sub/gemm_into(c, a, b)
            e0, e1 = cp.cuda.Event(), cp.cuda.Event()
            e0.record()
            out = fn(*args, **kw)
            e1.record()
            events.append((kw.get("label", "?"), (x.shape[-2], y.shape[-1], x.shape[-1]),
                           e0, e1))
            return out
        return timed

    saved = []
    for name in MODULES:
        mod = sys.modules[name]
        for fn in ("gemm", "gemm_sub", "gemm_into"):
            if hasattr(mod, fn):
                saved.append((mod, fn, getattr(mod, fn)))
                setattr(mod, fn, wrap(getattr(mod, fn), 0 if fn == "gemm" else 1))
    try:
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record()
        res = call(a)
        e1.record()
        e1.synchronize()
    finally:
        for mod, fn, orig in saved:
            setattr(mod, fn, orig)
    del res
    return cp.cuda.get_elapsed_time(e0, e1), [(label, shape, cp.cuda.get_elapsed_time(s, e))
                                               for label, shape, s, e in events]


def label_times(call, a):
    """GPU milliseconds per product label of one call (events around each policy call)."""
    total, events = policy_calls(call, a)
    out = collections.defaultdict(float)
    count = collections.Counter()
    for label, _, ms in events:
        out[label] += ms
        count[label] += 1
    top = {k: (round(v, 2), count[k]) for k, v in sorted(out.items(), key=lambda kv: -kv[1])}
    return {"total_ms": total, "by_label": top,
            "outside_ms": total - sum(out.values())}


def row(m, n, dtype, prec):
    a = cp.random.default_rng(0).standard_normal((m, n), dtype=cp.float64).astype(dtype)

    def call(x):
        return mpqr.qr(x, precision=prec, method="householder-recursive")

    out = {"m": m, "n": n, "dtype": dtype, "precision": prec}
    ref = None
    configs = CONFIGS_FP64 if prec == "fp64-emulated" else CONFIGS
    for k, c in configs.items():
        _set(*c)
        got, (q, r) = measure_call(cp, call, a, keep=True)
        out[f"{k}_pool_multiple"] = got["pool_multiple"]
        out[f"{k}_peak_live_multiple"] = got["peak_live_multiple"]
        q, r = cp.asarray(q), cp.asarray(r)
        if ref is None:
            ref = r
        out[f"{k}_r_max_rel_diff"] = float(abs(r - ref).max() / abs(ref).max())
        out[f"{k}_backward"], out[f"{k}_orth"] = _errors(a, q, r)
        del q, r
        release_pool(cp)
        out[f"{k}_labels"] = label_times(call, a)
        release_pool(cp)
    time_configs(out, call, a, configs, lambda c: _set(*c), 2)
    _set(*BASE)
    print({k: v for k, v in out.items() if not k.endswith("_labels")}, flush=True)
    return out


def main():
    shapes = [(16384, 16384, "float64", "fp64-emulated"),
              (16384, 16384, "float32", "fp32-emulated"),
              (65536, 8192, "float32", "fp32-emulated"),
              (16384, 16384, "float32", "fp16")]
    if len(sys.argv) > 1:
        shapes = shapes[:int(sys.argv[1])]
    return run_rows(shapes, row, functools.partial(_set, *BASE), "ktiles.json")


if __name__ == "__main__":
    sys.exit(main())
