"""Where a certified panel's launch spends its time: ``python3 bench/probes/panel_stages.py``.

Compiles variants of ``backends/cupy/kernels/panel_cholqr.cu`` that return after a given stage
of the last thread block (the rest of the launch unchanged) and times each with CUDA
events over 100 launches (float64, n = 32, m = 32 and 16384); the differences between
consecutive stops are the stages' times. Without hardware counters, this is how the
launch is taken apart (METHOD.md: variants that leave a stage out).
"""

from __future__ import annotations

import cupy as cp
from mpqr.backends.cupy import panel_cholqr as k
from panel_kernels import per_launch_us  # the sibling probe's timing (run from bench/probes)

#: (pass, name of the stage that ends here, the source line the return goes before)
STOPS = (
    (1, "grid: tiles, partial Grams, last-block election",
     "  // the last block: G in block order"),
    (1, "partial Grams summed", "  if (pass == 1) {"),
    (1, "Cholesky (one warp)", "    inv_triangular_block<false>(red, x1, scratch, n);"),
    (1, "X1 = R1^-1 (block)", "    FOR_IJ(i, j) {\n      ws[WS_X1"),
    (2, "grid: tiles, partial Grams, last-block election",
     "  // the last block: G in block order"),
    (2, "partial Grams summed", "  if (pass == 1) {"),
    (2, "certificate, R2 (first order or Cholesky)", "  FOR_IJ(i, j) r1[i][j] = ws[WS_R1"),
    (2, "X2 where not first order", "  FOR_IJ(i, j) {  // R = R2 R1"),
    (2, "R = R2 R1", "  load_tile(a, lda, n, n, 0, r1);"),
    (2, "Q's top block", "  if (warp == 0) lu_signed_warp(lu, sv, n);"),
    (2, "signed LU (one warp)", "  inv_triangular_block<false>(lu, red, scratch, n);"),
    (2, "U^-1 and L^-1 (block)", "  FOR_IJ(i, j) {  // P = X2 U^-1"),
)


def variant(src: str, pas: int, anchor: str) -> str:
    assert src.count(anchor) == 1, anchor
    return src.replace(anchor, f"  if (pass == {pas}) return;\n" + anchor)


def timed(mod_src: str, pas: int, m: int, n: int = 32) -> float:
    mod = cp.RawModule(code=mod_src, options=("--std=c++17",),
                       name_expressions=["panel_pass<double>"])
    kern = mod.get_function("panel_pass<double>")
    a = cp.random.default_rng(0).standard_normal((m, n))
    w = cp.empty_like(a)
    cert = cp.zeros(4, cp.int32)
    ws = k._workspace()
    ltop, tau = cp.empty((n, n)), cp.empty(n)
    blocks = max(1, min(k._MAX_BLOCKS, -(-m // k._TILE)))
    args = (a, cp.int64(n), cp.int64(m), cp.int32(n))
    tail = (ws, cert, w, cp.int64(n), ltop, tau)
    k._launch(a, w, cert, ws, ltop, tau)  # X1 and R1 in the workspace for pass 2

    def go():
        kern((blocks,), (256,), (*args, cp.int32(pas), *tail))

    return per_launch_us(go)


def main() -> None:
    src = (k._DIR / "panel_cholqr.cu").read_text()
    for m in (32, 16384):
        for pas in (1, 2):
            prev = 0.0
            for p, name, anchor in STOPS:
                if p != pas:
                    continue
                t = timed(variant(src, pas, anchor), pas, m)
                print(f"m={m} pass {pas}: {t:7.1f} us up to the end of {name} (+{t - prev:.1f})",
                      flush=True)
                prev = t
            t = timed(src, pas, m)
            print(f"m={m} pass {pas}: {t:7.1f} us whole launch (+{t - prev:.1f})", flush=True)


if __name__ == "__main__":
    main()
