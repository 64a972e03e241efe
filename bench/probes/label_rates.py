"""Where a square QR's products spend their GPU time, by label, engine and shape.

``python3 bench/probes/label_rates.py OUT.json [N] [precision] [dtype] [method]``
(default 16384, fp64-emulated, float64, auto): one call under ``mpqr.explain`` (each
label's engines), then one call with CUDA events around each policy call of the
recursive route (``ktiles.policy_calls``: its label and the shape of its operands):
milliseconds, flops and TFLOP/s per label and engine, and the shapes of each label's
products. Then, for the most expensive
shapes of the native engines, the same product alone (``cupy.matmul`` on fresh
C-ordered operands) for its rate outside the route.
"""

from __future__ import annotations

import collections
import json
import sys

import cupy as cp
from ktiles import policy_calls  # the probe beside this one

import mpqr


def alone_ms(m, n, k, dtype, reps=5):
    x = cp.random.default_rng(1).standard_normal((m, k)).astype(dtype)
    y = cp.random.default_rng(2).standard_normal((k, n)).astype(dtype)
    cp.matmul(x, y)
    out = []
    for _ in range(reps):
        s, e = cp.cuda.Event(), cp.cuda.Event()
        s.record()
        cp.matmul(x, y)
        e.record()
        e.synchronize()
        out.append(cp.cuda.get_elapsed_time(s, e))
    out.sort()
    return out[len(out) // 2]


def main(argv):
    out = argv[0]
    n = int(argv[1]) if len(argv) > 1 else 16384
    prec = argv[2] if len(argv) > 2 else "fp64-emulated"
    dt = argv[3] if len(argv) > 3 else "float64"
    method = argv[4] if len(argv) > 4 else "auto"
    a = cp.random.default_rng(0).standard_normal((n, n), dtype=cp.float64).astype(dt)

    def call(x):
        return mpqr.qr(x, precision=prec, method=method)

    call(a)
    with mpqr.explain() as trace:
        call(a)
    engines = collections.defaultdict(set)
    for g in trace.gemms:
        engines[g.label].add(g.engine)
    call(a)
    total, times = policy_calls(call, a)
    res = {"n": n, "precision": prec, "dtype": dt, "total_ms": total,
           "decisions": len(trace.gemms), "timed": len(times)}
    by = collections.defaultdict(lambda: {"ms": 0.0, "flops": 0.0, "count": 0,
                                          "shapes": collections.Counter()})
    shape_ms = collections.defaultdict(float)
    for lab, shape, ms in times:
        eng = "/".join(sorted(engines.get(lab, {"?"})))
        key = f"{lab} [{eng}]"
        m_, n_, k_ = shape
        by[key]["ms"] += ms
        by[key]["flops"] += 2.0 * m_ * n_ * k_
        by[key]["count"] += 1
        by[key]["shapes"][f"{m_}x{n_}x{k_}"] += 1
        if eng.startswith("native"):
            shape_ms[shape] += ms
    table = sorted(by.items(), key=lambda kv: -kv[1]["ms"])
    res["by_label"] = {k: {"ms": round(v["ms"], 2), "count": v["count"],
                           "tflops": round(v["flops"] / max(v["ms"], 1e-9) / 1e9, 1),
                           "shapes": dict(v["shapes"].most_common(6))} for k, v in table}
    res["products_ms"] = sum(ms for _, _, ms in times)
    print(f"{n}^2 {dt} {prec}: {total:.1f} ms, products {res['products_ms']:.1f} ms "
          f"({len(times)} calls)", flush=True)
    for k, v in res["by_label"].items():
        print(f"  {k:<44} {v['ms']:8.2f} ms {v['count']:5d}x {v['tflops']:7.1f} TFLOP/s  "
              f"{v['shapes']}", flush=True)
    alone = []
    for shape, ms in sorted(shape_ms.items(), key=lambda kv: -kv[1])[:8]:
        m_, n_, k_ = shape
        t = alone_ms(m_, n_, k_, dt)
        alone.append({"shape": shape, "route_ms_total": ms, "alone_ms": t,
                      "alone_tflops": 2.0 * m_ * n_ * k_ / t / 1e9})
        print(f"  alone {m_}x{n_}x{k_}: {t:.3f} ms ({alone[-1]['alone_tflops']:.1f} TFLOP/s); "
              f"in the route {ms:.2f} ms in all", flush=True)
    res["alone"] = alone
    with open(out, "w") as f:
        json.dump(res, f, indent=1, default=str)


if __name__ == "__main__":
    main(sys.argv[1:])
