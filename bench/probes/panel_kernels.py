"""Time each launch of the certified panel (``kernels/panel_cholqr.cu``) on its own:
``python3 bench/probes/panel_kernels.py [BLOCKS ...]`` (pass 1, pass 2, the rows), CUDA
events over 100 launches each, float64, m = 32, 1024, 4096 and 16384, n = 32 and 8, with
the Gram passes on at most each number of thread blocks given (default: the module's)."""

from __future__ import annotations

import sys

import cupy as cp
from mpqr.backends.cupy import panel_cholqr as k


def launches(m: int, n: int) -> tuple[cp.ndarray, cp.ndarray, dict]:
    """The panel's input, a working copy and one function per launch on that copy."""
    a0 = cp.random.default_rng(0).standard_normal((m, n))
    a = a0.copy()
    w = cp.empty_like(a)
    cert = cp.zeros(4, cp.int32)
    ws = k._workspace()
    ltop = cp.empty((n, n))
    tau = cp.empty(n)
    pass_k, apply_k = k._module("float64")
    blocks = max(1, min(k._MAX_BLOCKS, -(-m // k._TILE)))
    args = (a, cp.int64(n), cp.int64(m), cp.int32(n))
    k._launch(a, w, cert, ws, ltop, tau)
    tail = (ws, cert, w, cp.int64(n), ltop, tau)

    def pass1():
        pass_k((blocks,), (256,), (*args, cp.int32(1), *tail))

    def pass2():
        pass_k((blocks,), (256,), (*args, cp.int32(2), *tail))

    def apply():
        apply_k((max(1, min(528, -(-(m - n) // 32))),), (256,), (*args, ws, w, cp.int64(n)))

    return a0, a, {"pass1": pass1, "pass2": pass2, "apply": apply}


def main() -> None:
    default = k._MAX_BLOCKS
    for blocks in [int(b) for b in sys.argv[1:]] or [default]:
        k._MAX_BLOCKS = blocks
        try:
            timed(blocks)
        finally:
            k._MAX_BLOCKS = default


def timed(blocks: int) -> None:
    for m in (32, 1024, 4096, 16384):
        for n in (32, 8):
            a0, a, fns = launches(m, n)
            for name, fn in fns.items():
                a[...] = a0
                print(f"blocks<={blocks} m={m} n={n} {name}: {per_launch_us(fn):.1f} us",
                      flush=True)


def per_launch_us(fn, launches: int = 100) -> float:
    """Microseconds per call of ``fn`` (one launch), CUDA events over ``launches`` calls
    after one untimed call."""
    fn()
    cp.cuda.Device().synchronize()
    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
    e0.record()
    for _ in range(launches):
        fn()
    e1.record()
    e1.synchronize()
    return cp.cuda.get_elapsed_time(e0, e1) * 1e3 / launches


if __name__ == "__main__":
    main()
