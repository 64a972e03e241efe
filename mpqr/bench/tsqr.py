"""Timing of the TSQR panel kernels against cuSOLVER (``cupy.linalg.qr``).

``python -m mpqr.bench.tsqr`` prints, per shape and dtype, the median
time of ``tsqr`` (both level-0 strategies) and of ``cupy.linalg.qr`` over
fresh random data, CUDA-event timed after a warm-up, with the achieved
fraction of the memory floor (read A once + write Q once at the device's
copy bandwidth) and the backward error / orthogonality of one run.
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np

__all__ = ["main"]

SHAPES = [(2**24, 32), (2**22, 64), (2**20, 256), (10000, 256, 32)]


def _time(cp, fn, make, repeats):
    fn(make())  # warm-up (compiles the kernels)
    times = []
    for _ in range(repeats):
        a = make()
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        fn(a)
        stop.record()
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop) * 1e-3)
        del a
    return statistics.median(times)


def _copy_bandwidth(cp, nbytes):
    x = cp.empty(nbytes // 8, dtype=cp.float64)
    y = cp.empty_like(x)
    t = _time(cp, lambda a: y.__setitem__(Ellipsis, a), lambda: x, 5)
    return 2 * x.nbytes / t


def _errors(cp, a, q, r):
    """Backward error and orthogonality, float64 on the device (fine for a benchmark)."""
    a64, q64, r64 = (x.astype(cp.float64) for x in (a, q, r))
    back = float(cp.linalg.norm(a64 - q64 @ r64) / cp.linalg.norm(a64))
    n = a.shape[-1]
    qtq = cp.swapaxes(q64, -1, -2) @ q64
    orth = float(cp.linalg.norm(qtq - cp.eye(n)))
    return back, orth


def _stack_qr(cp):
    def run(a):
        try:
            return cp.linalg.qr(a)  # batched where CuPy supports it
        except Exception:
            return [cp.linalg.qr(x) for x in a]

    return run


def main(argv=None) -> None:
    import cupy as cp

    from mpqr.backends.cupy.tsqr import MAX_N, tsqr

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--dtypes", default="float64,float32")
    p.add_argument("--no-cusolver", action="store_true", help="skip the cupy.linalg.qr baseline")
    args = p.parse_args(argv)
    bw = _copy_bandwidth(cp, 1 << 30)
    print(f"device copy bandwidth (read+write): {bw / 1e12:.2f} TB/s")
    rng = cp.random.default_rng(0)
    for dtype in args.dtypes.split(","):
        dt = np.dtype(dtype)
        for shape in SHAPES:
            n = shape[-1]
            floor = 2 * np.prod(shape) * dt.itemsize / bw

            def make(shape=shape, dt=dt):
                return rng.standard_normal(shape, dtype=dt)

            line = f"{dtype:8s} {'x'.join(map(str, shape)):>14s}  floor {floor * 1e3:8.3f} ms"
            if n <= MAX_N:
                for rec in (True, False):
                    t = _time(cp, lambda a, rec=rec: tsqr(a, recompute=rec), make, args.repeats)
                    line += f" | tsqr(recompute={rec!s:5s}) {t * 1e3:8.3f} ms ({floor / t:4.0%})"
                a = make()
                back, orth = _errors(cp, a, *tsqr(a))
                line += f" | err {back:.1e} orth {orth:.1e}"
                del a
            else:
                line += " | tsqr: n > MAX_N (qr_panel falls back to cuSOLVER)"
            if not args.no_cusolver:
                if len(shape) == 2:
                    t = _time(cp, cp.linalg.qr, make, max(3, args.repeats // 2))
                else:
                    t = _time(cp, _stack_qr(cp), make, 1)
                line += f" | cupy.linalg.qr {t * 1e3:9.3f} ms"
            print(line, flush=True)
            cp.get_default_memory_pool().free_all_blocks()


if __name__ == "__main__":
    main()
