#!/usr/bin/env bash
# Session 3 run c: kernel attributes of the right solve, and where the rest of the tall QR goes.
set -u
export PYTHONUNBUFFERED=1
which nsys ncu 2>&1 | head -3
python3 - <<'PY'
import cupy as cp, numpy as np
from mpqr.backends import cupy_right_solve as rs
for dt in ("float64", "float32"):
    for n in (32, 64):
        f = rs._kernel(dt, n, rs._rows(n, np.dtype(dt)))
        print(dt, n, "rows", rs._rows(n, np.dtype(dt)), "regs", f.num_regs, "local", f.local_size_bytes,
              "smem", f.shared_size_bytes, "maxthr", f.max_threads_per_block)
PY
CUDA_LAUNCH_BLOCKING=1 timeout 100 python3 bench/profile_call.py qr 16777216x32 fp64 2>&1 | grep -v "^$" | head -28 | cut -c1-150
