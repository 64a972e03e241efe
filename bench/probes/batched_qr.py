"""Batched small-matrix QR kernel: build, check, time against torch.linalg.qr and CuPy.

``PYTHONUNBUFFERED=1 python bench/probes/batched_qr.py [--quick]`` on a GPU machine;
writes ``$OUT/batched_qr.json`` (or ./batched_qr.json).

Checks (fresh random data per seed, outputs poisoned with NaN before the launch so an
unwritten element shows): backward error ``max_b ||A_b - Q_b R_b||_F / ||A_b||_F`` and
orthogonality ``max_b ||I - Q_b^T Q_b||_F / n`` in float64 on the device, R upper
triangular with ``diag(R) >= 0``, R against the float64 host reference (LAPACK, signs
normalised) on sampled members, ``Q^T b`` against the reduced Q's product.
Times: median of CUDA-event-timed calls after a warm-up (full sync), for
``mpqr.qr`` (the whole route), the kernel alone, ``torch.linalg.qr`` and
``cupy.linalg.qr`` (a cuSOLVER call per matrix) in the same process.
"""

from __future__ import annotations

import json
import os
import sys
import time

import cupy as cp
import numpy as np
from mpqr.backends.cupy import batched_qr as K

import mpqr
from mpqr.bench._timing import time_it

TARGETS = [  # (batch, m, n, dtype)
    (8192, 64, 64, "float32"), (4096, 128, 128, "float32"), (65536, 32, 32, "float32"),
    (16384, 64, 64, "float64"), (10000, 256, 32, "float32"), (4096, 96, 96, "float64"),
    (4096, 128, 128, "float64"),
]
SWEEP_N = [8, 16, 32, 64, 128, 256, 512]
SWEEP_RATIO = [1, 2, 4, 8, 16]


class _Poisoned:
    """cupy stand-in whose ``empty`` returns NaN-filled arrays (unwritten -> NaN)."""

    def __getattr__(self, name):
        return getattr(cp, name)

    @staticmethod
    def empty(shape, dtype):
        return cp.full(shape, cp.nan, dtype=dtype)


def timeit(f, reps=5, max_s=4.0):
    return time_it(cp, f, repeat=reps, max_seconds=max_s)


def errors(a, q, r):
    a64, q64, r64 = (x.astype(cp.float64) for x in (a, q, r))
    n = r.shape[-1]
    back = cp.linalg.norm(a64 - q64[..., :, :n] @ r64, axis=(-2, -1)) / \
        cp.linalg.norm(a64, axis=(-2, -1))
    k = q.shape[-1]
    orth = cp.linalg.norm(cp.eye(k) - q64.swapaxes(-1, -2) @ q64, axis=(-2, -1)) / k
    return float(back.max()), float(orth.max())


def check(b, m, n, dt, seed):
    rng = cp.random.default_rng(seed)
    a = rng.standard_normal((b, m, n), dtype=cp.float64).astype(dt)
    a0 = a.copy()
    out = {}
    pc = _Poisoned()
    q, r = K._launch(pc, a, "reduced")
    ok_written = bool(cp.isfinite(q).all() and cp.isfinite(r).all())
    back, orth = errors(a, q, r)
    d = cp.diagonal(r, axis1=-2, axis2=-1)
    tri = bool((cp.tril(r, -1) == 0).all()) and bool((d >= 0).all())
    idx = np.unique(np.linspace(0, b - 1, 16).astype(int))
    ah = cp.asnumpy(a[idx]).astype(np.float64)
    rl = np.linalg.qr(ah, mode="r")
    rl = rl * np.sign(np.diagonal(rl, axis1=-2, axis2=-1))[..., :, None]
    r_err = float(np.max(np.linalg.norm(cp.asnumpy(r[idx]) - rl, axis=(-2, -1))
                        / np.linalg.norm(rl, axis=(-2, -1))))
    qc, rc = K._launch(pc, a, "complete")
    back_c, orth_c = errors(a, qc, rc)
    same_r = float(cp.abs(rc - r).max())
    _, rr = K._launch(pc, a, "r")
    same_rr = float(cp.abs(rr - r).max())
    bb = rng.standard_normal((b, m, 3), dtype=cp.float64).astype(dt)
    c, _ = K._launch(pc, a, "apply", bb)
    ref = q.astype(cp.float64).swapaxes(-1, -2) @ bb.astype(cp.float64)
    qtb = float(cp.abs(c[..., :n, :] - ref).max() / cp.abs(ref).max())
    nrm = float(cp.abs(cp.linalg.norm(c.astype(cp.float64), axis=-2)
                       - cp.linalg.norm(bb.astype(cp.float64), axis=-2)).max())
    out.update(written=ok_written and bool(cp.isfinite(qc).all()) and bool(cp.isfinite(c).all()),
               backward_error=back, orthogonality=orth, triangular_nonneg_diag=tri,
               r_vs_lapack=r_err, complete_backward=back_c, complete_orth=orth_c,
               complete_r_diff=same_r, r_mode_diff=same_rr, qtb_rel_err=qtb,
               qtb_norm_diff=nrm, input_unchanged=bool((a == a0).all()))
    eps = float(np.finfo(dt).eps)
    tol = 50 * eps * max(m, n)
    out["pass"] = bool(out["written"] and tri and back < tol and orth < tol and back_c < tol
                       and orth_c < tol and r_err < 1e3 * tol and same_r == 0 and same_rr == 0
                       and qtb < tol * 10 and out["input_unchanged"])
    return out


def time_row(b, m, n, dt, reps, base_reps, base_s=30):
    import torch

    rng = cp.random.default_rng(7)
    a = rng.standard_normal((b, m, n), dtype=cp.float64).astype(dt)
    row = {"batch": b, "m": m, "n": n, "dtype": dt}
    with mpqr.explain() as tr:
        q, r = mpqr.qr(a)
    row["route"] = next((e.data.get("method") for e in tr.events if e.kind == "method"), "")
    row["backward_error"], row["orthogonality"] = errors(a, q, r)
    del q, r
    row["mpqr_ms"] = timeit(lambda: mpqr.qr(a), reps) * 1e3
    if K.fits(dt, m, n):
        row["kernel_ms"] = timeit(lambda: K.qr(a), reps) * 1e3
    ta = torch.as_tensor(a, device="cuda")
    try:
        row["torch_ms"] = timeit(lambda: torch.linalg.qr(ta), base_reps, base_s) * 1e3
    except Exception as exc:
        row["torch_error"] = str(exc)
    try:
        row["cupy_ms"] = timeit(lambda: cp.linalg.qr(a), base_reps, base_s) * 1e3
    except Exception as exc:
        row["cupy_error"] = str(exc)
    for k in ("torch", "cupy"):
        if f"{k}_ms" in row:
            row[f"speedup_vs_{k}"] = row[f"{k}_ms"] / row["mpqr_ms"]
    return row


def main():
    quick = "--quick" in sys.argv
    outdir = os.environ.get("OUT", ".")
    dev = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    res = {"device": dev, "checks": [], "targets": [], "sweep": []}
    t0 = time.time()
    for b, m, n in [(64, 8, 8), (64, 32, 32), (33, 64, 64), (17, 100, 40), (16, 128, 128),
                    (16, 256, 32), (9, 96, 96), (9, 256, 128), (8, 1, 1), (8, 37, 5),
                    (8, 256, 64)]:
        for dt in ("float32", "float64"):
            if not K.fits(dt, m, n):
                continue
            for seed in (1, 2):
                try:
                    c = {"batch": b, "m": m, "n": n, "dtype": dt, "seed": seed,
                         **check(b, m, n, dt, seed)}
                except Exception as exc:
                    c = {"batch": b, "m": m, "n": n, "dtype": dt, "error": repr(exc)}
                res["checks"].append(c)
                print("check", b, m, n, dt, seed, c.get("pass"), c.get("error", ""),
                      f"back {c.get('backward_error', 0):.1e} orth {c.get('orthogonality', 0):.1e}")
    print(f"checks done {time.time() - t0:.0f}s")
    for b, m, n, dt in TARGETS:
        try:
            row = time_row(b, m, n, dt, 7, 3)
        except Exception as exc:
            row = {"batch": b, "m": m, "n": n, "dtype": dt, "error": repr(exc)}
        res["targets"].append(row)
        print("target", json.dumps(row))
        json.dump(res, open(os.path.join(outdir, "batched_qr.json"), "w"), indent=1)
    print(f"targets done {time.time() - t0:.0f}s")
    if not quick:
        for n in SWEEP_N:
            for ratio in SWEEP_RATIO:
                m = n * ratio
                b = int(min(256, max(4, 2**21 // (m * n))))
                try:
                    row = time_row(b, m, n, "float32", 5, 2, 8)
                except Exception as exc:
                    row = {"batch": b, "m": m, "n": n, "error": repr(exc)}
                res["sweep"].append(row)
                cp.get_default_memory_pool().free_all_blocks()
                print("sweep", json.dumps(row))
                json.dump(res, open(os.path.join(outdir, "batched_qr.json"), "w"), indent=1)
                if time.time() - t0 > 270:
                    print("time cap")
                    break
            if time.time() - t0 > 270:
                break
    print(f"\n{'shape':>22} {'route':>22} {'mpqr ms':>9} {'kern ms':>9} {'torch ms':>9} "
          f"{'cupy ms':>9} {'x torch':>8} {'x cupy':>8}")
    for row in res["targets"] + res["sweep"]:
        if "error" in row:
            print(row)
            continue
        print(f"{row['batch']:>7}x({row['m']}x{row['n']}) {row['dtype'][-2:]} "
              f"{row['route'][:22]:>22} {row['mpqr_ms']:9.3f} {row.get('kernel_ms', 0):9.3f} "
              f"{row.get('torch_ms', 0):9.2f} {row.get('cupy_ms', 0):9.2f} "
              f"{row.get('speedup_vs_torch', 0):8.1f} {row.get('speedup_vs_cupy', 0):8.1f}")
    print("checks failing:", [c for c in res["checks"] if not c.get("pass")])


if __name__ == "__main__":
    main()
