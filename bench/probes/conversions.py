"""The engines' conversion passes alone: milliseconds and bytes moved per second.

``python3 bench/probes/conversions.py OUT.json [MxN ...]`` (default 16384x8192
65536x8192; float32 input): the fp16 split (high part alone; the three parts) by CuPy's
elementwise kernel, the tile kernel and the row-run kernel, shifts by rows and by
columns, beside a plain device copy of the input; medians of 20 calls (CUDA events).
Then in-place ``ldexp`` and scaling by a row's factors and ``c -= unscale(p)``, by the
one-pass kernels and by CuPy's elementwise ones; the split of a transposed view by the
elementwise kernel and the tile kernel, the maxima along a strided axis, the widening
with ``ldexp``. Bytes counted: each input read once, each output written once.
"""

from __future__ import annotations

import json
import sys

import cupy as cp
from mpqr.backends import get_backend
from mpqr.backends.cupy import engine_kernels as ek

from mpqr.bench._timing import environment


def _ms(fn, reps=20):
    fn()
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    out = []
    for _ in range(reps):
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        out.append(cp.cuda.get_elapsed_time(start, stop))
    return sorted(out)[len(out) // 2]


SETTINGS = {"elementwise": (False, False), "tiles": (True, False), "rows": (False, True)}


def _by_line_passes(be, x, y, m, n):
    """In-place ``ldexp`` and scaling by a row's factors, and ``c -= unscale(p)``, each by
    its one-pass kernel and by CuPy's elementwise kernel (the flag off)."""
    rng = cp.random.default_rng(1)
    e = rng.integers(-3, 4, size=(m, 1), dtype=cp.int32)
    f = cp.where(rng.random((m, 1)) < 0.5, -1.0, 1.0).astype(cp.float32)
    cs = rng.integers(-3, 4, size=(1, n), dtype=cp.int32)
    out = []
    passes = (("ldexp", "FAST_LDEXP", 8, lambda: be.ldexp_in_place(y, e)),
              ("scale", "FAST_SCALE", 8, lambda: be.mul_in_place(y, f)),
              ("unscale_sub", "FAST_UNSCALE_INTO", 12,
               lambda: be.unscale_into(y, x, e, cs, subtract=True)))
    for name, flag, nbytes, fn in passes:
        keep = getattr(ek, flag)
        for on in (False, True):
            setattr(ek, flag, on)
            cp.copyto(y, x)
            ms = _ms(fn)
            out.append({"shape": [m, n], "pass": name, "kernel": "one-pass" if on else
                        "elementwise", "ms": ms, "TB/s": nbytes * m * n / ms / 1e9})
            print(json.dumps(out[-1]), flush=True)
        setattr(ek, flag, keep)
    return out


def _transposed_passes(be, x, m, n):
    """The split of a transposed view (parts contiguous along its rows) by the
    elementwise kernel and the tile kernel; the maxima along a
    strided axis (the shifts' reduction); the float32 -> float64 widening with ``ldexp``
    in one pass against the two."""
    out = []
    xt = x[:, : n - 64].T  # (n - 64) x m, contiguous along axis 0: a column block's W^T
    k, mm = xt.shape
    hi, hf, lo = (cp.empty((k, mm), dtype=cp.float16) for _ in range(3))
    s = be.pow2_shift(xt, -1, 14)
    keep = ek.FAST_SPLIT
    for name, fast in (("elementwise", False), ("tiles", "transposed")):
        ek.FAST_SPLIT = fast
        for parts in (1, 3):
            def fn(parts=parts):
                ek.split_fp16(xt, s, hi, *((hf, lo) if parts == 3 else ()))
            ms = _ms(fn)
            out.append({"shape": [k, mm], "pass": f"split{parts}-transposed", "kernel": name,
                        "ms": ms, "TB/s": (4 + 2 * parts) * k * mm / ms / 1e9})
            print(json.dumps(out[-1]), flush=True)
    ek.FAST_SPLIT = keep
    for arr, ax, label in ((x, 0, "C, down columns"), (x[:, :32], 0, "32 columns"),
                           (xt, 1, "transposed, along rows")):
        ms = _ms(lambda arr=arr, ax=ax: ek.max_abs_finite(arr, ax))
        out.append({"shape": list(arr.shape), "pass": "strided max", "case": label, "ms": ms,
                    "TB/s": arr.size * 4 / ms / 1e9})
        print(json.dumps(out[-1]), flush=True)
    e = cp.zeros((m, 1), dtype=cp.int32)
    for label, fn in (("one pass", lambda: be.ldexp_wide(x, e)),
                      ("astype + ldexp", lambda: be.ldexp(x.astype(cp.float64), e))):
        ms = _ms(fn)
        out.append({"shape": [m, n], "pass": "widen+ldexp", "kernel": label, "ms": ms,
                    "TB/s": 12 * m * n / ms / 1e9})
        print(json.dumps(out[-1]), flush=True)
    return out


def main(argv):
    shapes = [tuple(int(v) for v in s.split("x")) for s in argv[1:]] or \
        [(16384, 8192), (65536, 8192)]
    be = get_backend(cp)
    rows = []
    keep = ek.FAST_SPLIT, ek.FAST_SPLIT_ROWS
    for m, n in shapes:
        x = cp.random.default_rng(0).standard_normal((m, n), dtype=cp.float32)
        hi, hf, lo = (cp.empty((m, n), dtype=cp.float16) for _ in range(3))
        y = cp.empty_like(x)
        ms = _ms(lambda x=x, y=y: cp.copyto(y, x))
        rows.append({"shape": [m, n], "pass": "copy", "ms": ms, "TB/s": 8 * m * n / ms / 1e9})
        print(json.dumps(rows[-1]), flush=True)
        for axis in (-1, 0):
            s = be.pow2_shift(x, axis, 14)
            for name, (tiles, by_rows) in SETTINGS.items():
                ek.FAST_SPLIT, ek.FAST_SPLIT_ROWS = tiles, by_rows
                for parts in (1, 3):
                    if parts == 1:
                        def fn(x=x, s=s, hi=hi):
                            ek.split_fp16(x, s, hi)
                    else:
                        def fn(x=x, s=s, hi=hi, hf=hf, lo=lo):
                            ek.split_fp16(x, s, hi, hf, lo)
                    ms = _ms(fn)
                    rows.append({"shape": [m, n], "pass": f"split{parts}", "shift_axis": axis,
                                 "kernel": name, "ms": ms,
                                 "TB/s": (4 + 2 * parts) * m * n / ms / 1e9})
                    print(json.dumps(rows[-1]), flush=True)
        ek.FAST_SPLIT, ek.FAST_SPLIT_ROWS = keep
        rows += _by_line_passes(be, x, y, m, n)
        rows += _transposed_passes(be, x, m, n)
        del x, hi, hf, lo, y
        cp.get_default_memory_pool().free_all_blocks()
    with open(argv[0], "w") as fh:
        json.dump({"environment": environment(cp), "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
