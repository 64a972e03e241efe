"""Square QR's device memory against its speed on one GPU: the fast plan (whole products)
against the tiled plan (the engines' scratch capped at a fraction of the input's bytes:
``memory_plan.SPLIT_FRACTION`` for the fp16 engines, ``OZAKI_FRACTION`` for the Ozaki
engine) at several fractions, and the lean plan. For each: the pool's high-water beyond
the input as a multiple of its bytes (``mpqr.bench.memory.measure_call``), the time (CUDA
events, medians of 3, the configurations alternated in two rounds in one process; three
with ``PLAN_CAPS_LEAN=1``, below) and
whether R is bitwise the fast plan's (tiles change no bit; the lean route is another
order of operations).

``python bench/probes/plan_caps.py`` writes ``$OUT/plan_caps.json``.
"""

import functools
import os
import statistics
import sys

import cupy as cp

import mpqr
from mpqr.bench._timing import environment, release_pool, time_it, write_json
from mpqr.bench.memory import measure_call
from mpqr.qr import memory_plan as mp

BASE = (mp.PLANS, mp.SPLIT_FRACTION, mp.OZAKI_FRACTION, mp.LEAN_OZAKI_FRACTION)
#: ``PLAN_CAPS_LEAN=1``: the fast plan against the lean plan at several Ozaki caps
#: (``LEAN_OZAKI_FRACTION``), float64 ``fp64-emulated`` rows only
LEAN_SWEEP = os.environ.get("PLAN_CAPS_LEAN") == "1"


def _set(plans, split=BASE[1], ozaki=BASE[2], lean_ozaki=BASE[3]):
    mp.PLANS, mp.SPLIT_FRACTION, mp.OZAKI_FRACTION, mp.LEAN_OZAKI_FRACTION = \
        plans, split, ozaki, lean_ozaki


def configs(prec):
    if LEAN_SWEEP:
        return {"fast": (("fast",),), **{f"lean{f}": (("lean",), BASE[1], BASE[2], f)
                                         for f in (0.35, 0.6, 1.0)}}
    out = {"fast": (("fast",),), "lean": (("lean",),)}
    fracs = (1.0, 0.5, 0.25) if prec == "fp64-emulated" else (1.0, 0.5, 0.3)
    for f in fracs:
        out[f"tiled{f}"] = (("tiled",), f, f) if prec == "fp64-emulated" else \
            (("tiled",), f, BASE[2])
    return out


def row(m, n, dtype, prec):
    a = cp.random.default_rng(0).standard_normal((m, n), dtype=cp.float64).astype(dtype)

    def call(x):
        return mpqr.qr(x, precision=prec, method="householder-recursive")

    out = {"m": m, "n": n, "dtype": dtype, "precision": prec}
    cfg = configs(prec)
    ref = None
    for k, c in cfg.items():
        _set(*c)
        got, (q, r) = measure_call(cp, call, a, keep=True)
        out[f"{k}_pool_multiple"] = got["pool_multiple"]
        out[f"{k}_peak_live_multiple"] = got["peak_live_multiple"]
        if ref is None:
            ref = r
        out[f"{k}_r_bitwise_fast"] = bool((r == ref).all())
        out[f"{k}_r_max_rel_diff"] = float(abs(r - ref).max() / abs(ref).max())
        del q, r
        release_pool(cp)
    time_configs(out, call, a, cfg, lambda c: _set(*c), 3 if LEAN_SWEEP else 2)
    _set(*BASE)
    print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in out.items()},
          flush=True)
    return out


def main():
    shapes = [(16384, 16384, "float64", "fp64-emulated"),
              (16384, 16384, "float32", "fp32-emulated"),
              (16384, 16384, "float32", "fp16"),
              (65536, 8192, "float32", "fp32-emulated"),
              (8192, 8192, "float64", "fp64-emulated")]
    if LEAN_SWEEP:
        shapes = [(16384, 16384, "float64", "fp64-emulated"),
                  (12288, 12288, "float64", "fp64-emulated"),
                  (8192, 8192, "float64", "fp64-emulated")]
    return run_rows(shapes, row, functools.partial(_set, *BASE), "plan_caps.json")


def time_configs(out, call, a, cfg, apply, rounds):
    """``out[k + "_ms"]``: the median of ``rounds`` medians of 3 calls of ``call(a)`` with
    each configuration ``apply(cfg[k])``, alternated; ``out[k + "_vs_" + first]`` against
    the first configuration's."""
    times = {k: [] for k in cfg}
    for _ in range(rounds):
        for k, c in cfg.items():
            apply(c)
            times[k].append(time_it(cp, functools.partial(call, a), repeat=3))
            release_pool(cp)
    first = next(iter(cfg))
    for k, t in times.items():
        out[f"{k}_ms"] = statistics.median(t) * 1e3
        out[f"{k}_vs_{first}"] = out[f"{k}_ms"] / (statistics.median(times[first]) * 1e3)


def run_rows(shapes, row, reset, name):
    """``row(m, n, dtype, precision)`` for each shape, a failure recorded (its knobs put
    back by ``reset()``) while the other rows still run; ``$OUT/name`` written after each."""
    rows = []
    for m, n, dt, prec in shapes:
        try:
            rows.append(row(m, n, dt, prec))
        except Exception as exc:  # recorded; the other rows still run
            rows.append({"m": m, "n": n, "dtype": dt, "precision": prec,
                         "error": f"{type(exc).__name__}: {exc}"[:300]})
            reset()
            release_pool(cp)
        write_json(os.path.join(os.environ.get("OUT", "."), name),
                   {"environment": environment(cp), "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
