"""What two untried levers of the one-launch certified panel could gain at most, measured.

``python3 bench/probes/cluster_floors.py OUT.json``: on one GPU (sm_90 on),

* ``cluster``: a kernel of 96 blocks of 256 threads in thread-block clusters of 8
  (``__cluster_dims__``) with the panel's static shared memory, empty and with 50 cluster
  barriers (``barrier.cluster`` arrive / wait), 200 launches queued behind a spin kernel:
  a cluster barrier's time, beside the grid barrier's of ``panel_floors.py`` (the sums in
  clusters would trade one grid barrier a pass for cluster barriers);
* ``cluster-sum``: 20 rounds of a sum of eight blocks' 1024-entry partials over distributed
  shared memory (each block its 128 entries from the eight blocks' shared memory, summed in
  rank order, a cluster barrier before and after): a round's time;
* ``steps``: the block's 32 x 32 Cholesky (``chol_block``) as the library has it and as
  an LDL^T factorization's steps (no square root on the chain, one multiplication less),
  one block, cycles: the most a Cholesky without square roots on its chain could gain
  (where the library's still takes them; ``panel_floors.py OTHER_DIR`` otherwise).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import cupy as cp
import numpy as np
from mpqr.backends.cupy.modules import KERNELS

sys.path.insert(0, str(Path(__file__).parent))
from panel_floors import module, queued

CLUSTERS = r"""
#include <cooperative_groups.h>
namespace cg = cooperative_groups;

__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n"
               "barrier.cluster.wait.acquire.aligned;" : : : "memory");
}

template <int BARRIERS>
__global__ void __cluster_dims__(8, 1, 1) __launch_bounds__(256)
cluster_only(double* sink) {
  __shared__ double pad[5 * 32 * 36];
  pad[threadIdx.x] = threadIdx.x;
  for (int b = 0; b < BARRIERS; ++b) cluster_sync();
  if (threadIdx.x == 0 && pad[blockIdx.x & 7] < 0) sink[0] = 1.0;
}

template <int ROUNDS>
__global__ void __cluster_dims__(8, 1, 1) __launch_bounds__(256)
cluster_sum(double* sink) {
  __shared__ double part[1024];
  __shared__ double mine[128];
  __shared__ double pad[3 * 32 * 36];
  cg::cluster_group cluster = cg::this_cluster();
  const unsigned int rank = cluster.block_rank();
  for (int e = threadIdx.x; e < 1024; e += 256) part[e] = e + rank;
  pad[threadIdx.x] = 0.0;
  for (int r = 0; r < ROUNDS; ++r) {
    cluster_sync();  // every block's partial written
    if (threadIdx.x < 128) {
      double s = 0.0;
      for (int b = 0; b < 8; ++b) {
        const double* p = cluster.map_shared_rank(part, b);
        s += p[rank * 128 + threadIdx.x];
      }
      mine[threadIdx.x] = s;
    }
    cluster_sync();  // every block's reads done
  }
  if (threadIdx.x == 0 && mine[blockIdx.x & 127] + pad[3] < -1.0) sink[0] = 1.0;
}
"""

NAMES = ["cluster_only<0>", "cluster_only<50>", "cluster_sum<0>", "cluster_sum<20>"]


def main() -> None:
    out = sys.argv[1]
    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    clock_khz = props["clockRate"]
    rows = []
    mod = cp.RawModule(code=CLUSTERS, options=("--std=c++17",), name_expressions=NAMES)
    sink = cp.zeros(1)
    for name in NAMES:
        kern = mod.get_function(name)
        rows.append({"check": "cluster", "kernel": name,
                     "us": queued(lambda kern=kern: kern((96,), (256,), (sink,)))})
        print(rows[-1], flush=True)
    # the chain without its square root: the library's text with LDL^T's step (the pivot d
    # itself, row k of L^T its row over d, the update by that row times the unscaled
    # column), where the library still takes the square root on its chain
    text = (KERNELS / "panel_fused.cu").read_text()
    changes = (("const double rkk = sqrt(fmax(d, 0.0));", "const double rkk = d;"),
               ("fma(-(gki[e] * rinv), rkj, gil[e])", "fma(-gki[e], rkj, gil[e])"))
    mods = {"library": module(KERNELS)}
    if all(text.count(old) == 1 for old, _ in changes):
        for old, new in changes:
            text = text.replace(old, new)
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "panel_fused.cu").write_text(text)
            mods["no square root"] = module(Path(tmp))
    else:  # LDL^T's steps already: panel_floors.py OTHER_DIR compares another version
        print("the library's Cholesky takes no square root on its chain", flush=True)
    rng = np.random.default_rng(5)
    a = rng.standard_normal((4000, 32))
    g = a.T @ a
    inp = cp.asarray(np.concatenate([g.ravel(), np.eye(32).ravel()]))
    cyc = cp.zeros(4, cp.int64)
    for version, m in mods.items():
        o = cp.zeros(2 * 32 * 32)
        m["steps<0>"]((1,), (256,), (inp, o, cyc, np.int32(200)))
        c = cp.asnumpy(cyc)
        rows.append({"check": "steps", "step": "chol_block", "version": version,
                     "cycles_best": int(c[0]), "us_best": float(c[0]) / clock_khz * 1e3})
        print(rows[-1], flush=True)
    with open(out, "w") as fh:
        json.dump({"device": props["name"].decode(), "sm_clock_khz": clock_khz,
                   "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
