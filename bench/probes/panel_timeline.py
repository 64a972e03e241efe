"""Where the one-launch certified panel's time goes inside block 0: ``clock64()`` marks.

``python3 bench/probes/panel_timeline.py OUT.json [M ...]`` compiles
``kernels/panel_fused.cu`` (after ``panel_cholqr.cu``) with a mark after each step of the
n x n work (thread 0 of block 0 writes the SM's cycle counter into a device array; the
marks follow block barriers the kernel already has) and launches it as the library does
(``ONE_LAUNCH`` ``"block"``, the library's grid), 16384 x 32 unless told, float32 and
float64, 200 launches each; prints each step's median cycles and microseconds at the SM
clock CuPy reports. The marks add a few global stores to block 0 only.
``PANEL_KERNELS=DIR`` in the environment takes the two files from ``DIR``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import cupy as cp
import numpy as np
from mpqr.backends.cupy import panel_cholqr as k
from mpqr.backends.cupy.modules import KERNELS, ctype

#: the kernel files' folder (``PANEL_KERNELS`` in the environment, else the library's)
FOLDER = Path(os.environ.get("PANEL_KERNELS", str(KERNELS)))

_BAR = ("    grid_sync(bar, ++k);\n"
        "    if (stop == static_cast<int>(k)) { grid_leave(bar, k); return; }\n")
_SYNC = "\n        __syncthreads();"

# (text of panel_fused.cu, ending at a line's end, after which a mark goes; the mark's offset:
# its index is ``pass * 20 + offset`` inside the pass loop; what ends there)

#: (text of panel_fused.cu ending at a line's end after which a mark goes, offset of the mark,
#: what ends there); a mark's index is ``pass * 20 + offset`` inside the pass loop
MARKS = (
    ("unsigned int k = 0;  // barriers passed", 0, "start"),
    (_BAR + "\n    // ---- phase 2 / 5: G, the partials summed (sum_partials' order) ----", 1,
     "partial Grams + barrier"),
    ("        g_out[idx] = sum_partials(part + idx, PANEL_B * PANEL_B, nb);\n    }\n"
     "    grid_sync(bar, ++k);", 2, "sum + barrier"),
    ("      FOR_IJ(i, j) red[i][j] = __ldcg(&g_out[i * PANEL_B + j]);\n      __syncthreads();",
     3, "G loaded"),
    ("        if (threadIdx.x == 0) fail1 = !ok;" + _SYNC, 4, "Cholesky 1"),
    ("          if (blockIdx.x == 0) ws[WS_X1 + i * PANEL_B + j] = x1[i][j];\n        }", 5,
     "X1 = R1^-1, stored; R1 kept"),
    ("        const double e = dist_identity_sq(red, n, sv);  // ||G2 - I||_F^2", 5,
     "||G2 - I||"),
    ("        __syncthreads();  // every thread's entries of R2 written, fail1 read", 6,
     "Cholesky 2 / first order"),
    ("          r1[i][j] = scratch[i][j];\n        }" + _SYNC, 7, "R1 copied"),
    ("          store_entries_global(q, ws + WS_R);\n        }" + _SYNC, 9,
     "X2 (where not first order), R = R2 R1"),
    ("store_tile(top_v, r1);  // Q's top block (A[:n] X1) X2" + _SYNC, 10, "top tile"),
    ("          store_entries(q, lu);\n        }" + _SYNC, 11, "two tile products"),
    ("          if (warp == 0) lu_signed_warp(lu, sv, n);\n          __syncthreads();\n        }",
     12, "signed LU"),
    ("        if (warp == 1) inv_triangular_warp<true>(lu, r1, nullptr, n);       // L^-1 (into r1)"
     + _SYNC, 13, "U^-1, L^-1"),
    ("              ws[WS_P + entry_row(e) * PANEL_B + entry_col(e)] = q[e];\n          }\n"
     "        }" + _SYNC, 14, "P"),
    ("        t_and_w_top(lu, sv, r1, red, x2, n, wtop);", 15, "T, W's top rows"),
    ("        store_entries(pt, red);", 16, "P T, outputs"),
)


def source() -> str:
    text = (FOLDER / "panel_fused.cu").read_text()
    for anchor, off, _ in MARKS:
        assert text.count(anchor) == 1, anchor[:50]
        idx = "0" if off == 0 else f"pass * 20 + {off}"
        sync = "__syncthreads(); " if off == 5 and "ws[WS_X1" in anchor else ""
        text = text.replace(anchor, anchor + f"\n    {sync}MARK({idx});")
    text = text.replace("  grid_leave(bar, k);\n}", "  MARK(60);\n  grid_leave(bar, k);\n}")
    head = ("__device__ long long panel_dbg[64];\n"
            "#define MARK(i) do { if (blockIdx.x == 0 && threadIdx.x == 0) "
            "panel_dbg[(i)] = clock64(); } while (0)\n")
    return (FOLDER / "panel_cholqr.cu").read_text() + head + text


def main() -> None:
    out = sys.argv[1]
    ms = [int(s) for s in sys.argv[2:]] or [16384]
    clock_hz = cp.cuda.Device().attributes["ClockRate"] * 1e3
    code = source()
    rows = []
    for dt in (np.float32, np.float64):
        name = f"panel_fused<{ctype(np.dtype(dt).name)}, 1>"
        mod = cp.RawModule(code=code, options=("--std=c++17",), name_expressions=[name])
        kern = mod.get_function(name)
        dbg = cp.ndarray((64,), cp.int64, mod.get_global("panel_dbg"))
        for m in ms:
            a = cp.asarray(np.random.default_rng(5).standard_normal((m, 32)).astype(dt))
            work, w = a.copy(), cp.empty_like(a)
            ws, cert = k._workspace(), cp.zeros(4, cp.int32)
            ltop, tau = cp.empty((32, 32), dt), cp.empty(32, dt)
            lda = cp.int64(32)
            samples = []
            for _ in range(200):
                work[...] = a
                dbg[...] = 0
                k._launch_fused(kern, work, lda, m, 32, ws, cert, w, lda, ltop, tau)
                samples.append(cp.asnumpy(dbg))
            s = np.median(np.array(samples, dtype=np.float64), axis=0)
            t0 = s[0]
            steps = []
            prev = t0
            order = [0] + [p * 20 + o for p in (1, 2) for o in range(1, 18)] + [60]
            names = {0: "start", 60: "rows + end", 25: "pass 1: X1 = R1^-1, stored",
                     45: "pass 2: ||G2 - I||"}
            for _, off, what in MARKS:
                if off > 0:
                    for p in (1, 2):
                        names.setdefault(p * 20 + off, f"pass {p}: {what}")
            for i in order[1:]:
                if s[i] == 0:
                    continue
                steps.append({"mark": names.get(i, str(i)), "cycles": float(s[i] - prev),
                              "us": float((s[i] - prev) / clock_hz * 1e6)})
                prev = s[i]
            row = {"dtype": np.dtype(dt).name, "m": m, "clock_mhz": clock_hz / 1e6,
                   "total_us": float((s[60] - t0) / clock_hz * 1e6), "steps": steps,
                   "cert": cp.asnumpy(cert).tolist()}
            rows.append(row)
            print(np.dtype(dt).name, m, f"total {row['total_us']:.1f} us", flush=True)
            for st in steps:
                print(f"   {st['mark']:<40} {st['us']:7.2f} us", flush=True)
    with open(out, "w") as fh:
        json.dump({"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
                   "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
