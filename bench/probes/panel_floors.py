"""What bounds the one-launch certified panel's phases: each step measured alone.

``python3 bench/probes/panel_floors.py OUT.json [OTHER_DIR]``: on one GPU,

* ``op``: one thread's dependent chain of 256 of an operation (float64 square root,
  division, both, an FMA; a shared-memory load, a warp shuffle, a block barrier of 256
  threads), cycles each (each with the loop's own add);
* ``steps``: block 0's n x n work of the panel alone, one block, 32 x 32: the Cholesky and
  signed LU by the whole block (``chol_block``, ``lu_signed_block``, the library's) and
  by one warp's loops (``chol_warp``, ``lu_signed_warp``), ``inv_triangular_warp``,
  ``t_and_w_top``; cycles
  and microseconds at the SM clock; with ``OTHER_DIR`` (another ``panel_cholqr.cu`` /
  ``panel_fused.cu``) its steps too, and whether both give the same bits;
* ``grid``: a kernel of 96 blocks of 256 threads with the panel's static shared memory,
  empty and with 6 / 50 grid barriers (the panel's ``grid_sync``), 200 launches queued
  behind a spin kernel: the launch's and a barrier's time;
* ``read``: one pass of 96 blocks over a 16384 x 32 float32 panel (each thread its
  entries of every tile, summed): the memory floor of a Gram pass at the panel's grid.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import cupy as cp
import numpy as np
from mpqr.backends.cupy.modules import KERNELS

FILES = ("panel_cholqr.cu", "panel_fused.cu")


def kernel_text(folder: Path) -> str:
    return "".join(((folder / f) if (folder / f).exists() else (KERNELS / f)).read_text()
                   for f in FILES)

OPS = r"""
template <int OP>
__global__ void op_chain(double x0, double* out, long long* cyc) {
  __shared__ double sh[64];
  sh[threadIdx.x & 63] = x0 + threadIdx.x;
  __syncthreads();
  double x = x0;
  long long t0 = clock64();
#pragma unroll 1
  for (int i = 0; i < 256; ++i) {
    if (OP == 0) x = sqrt(x) + 1.0;
    if (OP == 1) x = 1.0 / x + 1.0;
    if (OP == 2) x = 1.0 / sqrt(x) + 1.0;
    if (OP == 3) x = 1.0 / x + sqrt(x);
    if (OP == 4) x = x * 0.999 + 1.0;
    if (OP == 5) x = fma(x, 0.999, 1.0);
    if (OP == 6) x = sh[(static_cast<int>(x) + i) & 63];
    if (OP == 7) x = __shfl_sync(0xffffffffu, x, (i + 1) & 31) + 1.0;
    if (OP == 8) { __syncthreads(); x = x + 1.0; }
  }
  long long t1 = clock64();
  if (threadIdx.x == 0) { out[0] = x; cyc[0] = t1 - t0; }
}

// block 0's steps alone: STEP 0 chol_block, 1 lu_signed_block, 2 the upper inverse by one
// warp, 3 t_and_w_top, 4 chol_warp, 5 lu_signed_warp; each rep loads the input first (not
// timed)
template <int STEP>
__global__ void steps(const double* in, double* out, long long* cyc, int reps) {
  __shared__ Mat g[PANEL_B];
  __shared__ Mat x[PANEL_B];
  __shared__ Mat y[PANEL_B];
  __shared__ Mat z[PANEL_B];
  __shared__ double sv[PANEL_B];
  long long best = 1LL << 62, total = 0;
  double wtop[TILE_ENTRIES];
  for (int r = 0; r < reps; ++r) {
    FOR_IJ(i, j) {
      g[i][j] = in[i * PANEL_B + j];
      y[i][j] = in[PANEL_B * PANEL_B + i * PANEL_B + j];
    }
    if (threadIdx.x < PANEL_B) sv[threadIdx.x] = (threadIdx.x & 1) ? 1.0 : -1.0;
    __syncthreads();
    const long long t0 = clock64();
    if (STEP == 0) chol_block(g, PANEL_B);
    if (STEP == 1) lu_signed_block(g, sv, PANEL_B);
    if (STEP == 2) { if (threadIdx.x < 32) inv_triangular_warp<false>(g, x, z[0], PANEL_B); }
#ifndef PANEL_FLOORS_OTHER
    if (STEP == 3) t_and_w_top(g, sv, y, x, z, PANEL_B, wtop);
#endif
    if (STEP == 4 && threadIdx.x < 32) chol_warp(g, PANEL_B);
    if (STEP == 5 && threadIdx.x < 32) lu_signed_warp(g, sv, PANEL_B);
    __syncthreads();
    const long long t1 = clock64();
    best = min(best, t1 - t0);
    total += t1 - t0;
  }
  const Mat* res = (STEP == 2 || STEP == 3) ? x : g;
  FOR_IJ(i, j) out[i * PANEL_B + j] = res[i][j];
  if (STEP == 3) {
    for (int e = 0; e < TILE_ENTRIES; ++e)
      out[PANEL_B * PANEL_B + entry_row(e) * PANEL_B + entry_col(e)] = wtop[e];
  }
  if (threadIdx.x == 0) { cyc[0] = best; cyc[1] = total / reps; }
}

template <int BARRIERS>
__global__ void __launch_bounds__(PANEL_THREADS) grid_only(int* cert, double* sink) {
  __shared__ Mat pad[5 * PANEL_B];
  unsigned int* bar = reinterpret_cast<unsigned int*>(cert + 1);
  pad[threadIdx.x >> 5][threadIdx.x & 31] = threadIdx.x;
  unsigned int k = 0;
  for (int b = 0; b < BARRIERS; ++b) grid_sync(bar, ++k);
  if (BARRIERS > 0) grid_leave(bar, k);
  if (threadIdx.x == 0 && pad[blockIdx.x & 7][3] < 0) sink[0] = 1.0;
}

__global__ void __launch_bounds__(PANEL_THREADS)
read_pass(const float* a, long long m, double* sink) {
  double acc = 0.0;
  const long long stride = (long long)gridDim.x * PANEL_B;
  float v[TILE_ENTRIES * 8];
  int t = 0;
  for (long long row0 = (long long)blockIdx.x * PANEL_B; row0 < m; row0 += stride, ++t) {
    if (t == 8) break;
#pragma unroll
    for (int e = 0; e < TILE_ENTRIES; ++e) {
      const long long row = row0 + (threadIdx.x >> 5) + 8 * e;
      v[t * TILE_ENTRIES + e] = row < m ? a[row * PANEL_B + (threadIdx.x & 31)] : 0.f;
    }
  }
#pragma unroll
  for (int u = 0; u < TILE_ENTRIES * 8; ++u) acc += v[u];
  if (acc == 12345.678) sink[0] = acc;
}
"""

NAMES = ["op_chain<0>", "op_chain<1>", "op_chain<2>", "op_chain<3>", "op_chain<4>",
         "op_chain<5>", "op_chain<6>", "op_chain<7>", "op_chain<8>",
         "steps<0>", "steps<1>", "steps<2>", "steps<3>", "steps<4>", "steps<5>",
         "grid_only<0>", "grid_only<6>", "grid_only<50>", "read_pass"]
OP_LABELS = ["sqrt", "1/x", "1/sqrt", "1/x + sqrt", "mul + add", "fma",
             "shared load", "shuffle", "__syncthreads (256 threads)"]
STEP_LABELS = ["chol_block", "lu_signed_block", "inv_triangular_warp (upper)",
               "t_and_w_top", "chol_warp", "lu_signed_warp"]

_SPIN = cp.RawKernel(r"""
extern "C" __global__ void spin(long long cycles) {
  long long t0 = clock64();
  while (clock64() - t0 < cycles) {}
}""", "spin")


def module(folder: Path, other: bool = False):
    """The probe's kernels over ``folder``'s panel kernels (``other``: without the steps
    the library's files have and another version may not, ``t_and_w_top``)."""
    head = "#define PANEL_FLOORS_OTHER\n" if other else ""
    mod = cp.RawModule(code=head + kernel_text(folder) + OPS,
                       options=("--std=c++17",), name_expressions=NAMES)
    return {n: mod.get_function(n) for n in NAMES}


def queued(fn, count=200, reps=7) -> float:
    """Microseconds a call, ``count`` calls queued behind a spin kernel, median of reps."""
    ts = []
    for _ in range(reps):
        s, e = cp.cuda.Event(), cp.cuda.Event()
        _SPIN((1,), (1,), (np.int64(20_000_000),))
        s.record()
        for _ in range(count):
            fn()
        e.record()
        e.synchronize()
        ts.append(cp.cuda.get_elapsed_time(s, e) * 1e3 / count)
    return float(np.median(ts))


def main() -> None:
    out = sys.argv[1]
    dev = cp.cuda.Device()
    clock_khz = cp.cuda.runtime.getDeviceProperties(dev.id)["clockRate"]
    rows = []
    mods = {"library": module(KERNELS)}
    if len(sys.argv) > 2:
        mods["other"] = module(Path(sys.argv[2]), other=True)
    k = mods["library"]
    res, cyc = cp.zeros(4, cp.float64), cp.zeros(4, cp.int64)
    for op, label in enumerate(OP_LABELS):
        best = []
        for _ in range(5):
            k[f"op_chain<{op}>"]((1,), (256 if op == 8 else 32,), (np.float64(1.7), res, cyc))
            best.append(int(cyc[0]))
        rows.append({"check": "op", "op": label, "cycles_each": min(best) / 256})
        print(rows[-1], flush=True)

    rng = np.random.default_rng(5)
    a = rng.standard_normal((4000, 32))
    q, _ = np.linalg.qr(a)
    gram = a.T @ a
    lu_in = q[:32] @ np.diag(rng.choice([-1.0, 1.0], 32))
    linv = np.linalg.inv(np.tril(rng.standard_normal((32, 32)) * 0.1, -1) + np.eye(32))
    upper = np.linalg.cholesky(gram).T
    inputs = {0: (gram, linv), 1: (lu_in, linv), 2: (upper, linv), 3: (lu_in, linv),
              4: (gram, linv), 5: (lu_in, linv)}
    got = {}
    for step, label in enumerate(STEP_LABELS):
        g, y = inputs[step]
        inp = cp.asarray(np.concatenate([g.ravel(), y.ravel()]))
        for version, mod in mods.items():
            o = cp.zeros(2 * 32 * 32)
            mod[f"steps<{step}>"]((1,), (256,), (inp, o, cyc, np.int32(200)))
            c = cp.asnumpy(cyc)
            got[step, version] = cp.asnumpy(o)
            rows.append({"check": "steps", "step": label, "version": version,
                         "cycles_best": int(c[0]), "cycles_mean": int(c[1]),
                         "us_best": float(c[0]) / clock_khz * 1e3})
            print(rows[-1], flush=True)
        if "other" in mods:
            rows.append({"check": "steps-same-bits", "step": label,
                         "same": bool(np.array_equal(got[step, "library"], got[step, "other"]))})
            print(rows[-1], flush=True)
    for step, block in ((4, 0), (5, 1)):  # the forms give the block's bits
        rows.append({"check": "forms-same-bits", "step": STEP_LABELS[step],
                     "same": bool(np.array_equal(got[step, "library"], got[block, "library"]))})
        print(rows[-1], flush=True)

    cert, sink = cp.zeros(4, cp.int32), cp.zeros(1)
    for nbar in (0, 6, 50):
        kern = k[f"grid_only<{nbar}>"]
        rows.append({"check": "grid", "barriers": nbar,
                     "us": queued(lambda kern=kern: kern((96,), (256,), (cert, sink)))})
        print(rows[-1], flush=True)
    assert int(cert[1]) == 0
    panel = cp.asarray(rng.standard_normal((16384, 32)).astype(np.float32))
    rp = k["read_pass"]
    rows.append({"check": "read", "m": 16384, "blocks": 96,
                 "us": queued(lambda: rp((96,), (256,), (panel, np.int64(16384), sink)))})
    print(rows[-1], flush=True)
    with open(out, "w") as fh:
        json.dump({"device": cp.cuda.runtime.getDeviceProperties(dev.id)["name"].decode(),
                   "sm_clock_khz": clock_khz, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
