"""``python -m mpqr bench memory``: device memory per call and the largest matrix that fits.

CuPy only. For each row (the tall, square and wide routes at the precisions of the
memory targets) one call of ``mpqr.qr`` and of ``cupy.linalg.qr`` after the pool's cached
blocks are freed: what the pool grew by (the high-water of ``total_bytes`` during the
call less before it, what the pool had to take from the device beyond the input) and the
peak of live bytes the call added (a CuPy memory hook), each a multiple of the input's
bytes; then the same call with the pool limited to the row's target
(:func:`target_multiple`), where the plans hand cached memory back (is it within?).
``MPQR_MEMORY_PLAN`` is read as it is set (``0``: the check before a call is off).
Then, under a pool limit of ``--budget`` bytes, the largest
``n`` of an ``n x n`` matrix each of ``mpqr.qr(precision=...)`` and ``cupy.linalg.qr``
factors, by bisection on ``n`` (multiples of 256). ``--quick``: smaller shapes.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
import traceback
from collections.abc import Iterator
from typing import Any

from mpqr.bench._timing import environment, write_json

__all__ = ["allocation_log", "calls_as_they_run", "largest_n", "main", "measure_call",
           "target_multiple"]

#: (m, n, dtype, precision); the shapes of the targets, and quick ones
ROWS = [(1 << 24, 64, "float64", "auto"), (16384, 16384, "float32", "fp16"),
        (16384, 16384, "float32", "fp32-emulated"), (16384, 16384, "float64", "fp64-emulated"),
        (65536, 8192, "float32", "fp32-emulated")]
QUICK = [(1 << 20, 64, "float64", "auto"), (4096, 4096, "float32", "fp16"),
         (4096, 4096, "float32", "fp32-emulated"), (4096, 4096, "float64", "fp64-emulated"),
         (16384, 2048, "float32", "fp32-emulated")]


def target_multiple(m: int, n: int, precision: str) -> float:
    """The memory target of a row, in multiples of the input's bytes beyond it: tall and
    the fp16 engines' square/wide routes 2.5, the others 3 (docs/memory.md)."""
    return 2.5 if m >= 4 * n or precision in ("fp16", "fp32-emulated") else 3.0


def _hook(cp: Any) -> Any:
    from cupy.cuda import memory_hook

    pool = cp.get_default_memory_pool()

    class Peak(memory_hook.MemoryHook):
        name = "mpqr-peak"

        def __init__(self) -> None:
            self.live = self.peak = 0
            self.pool_peak = pool.total_bytes()
            self.sizes: dict[int, int] = {}

        def alloc_postprocess(self, device_id, mem_size, mem_ptr):
            # a new block from the device: the pool's total is at a high-water mark
            # (blocks handed back during the call lower it again)
            self.pool_peak = max(self.pool_peak, pool.total_bytes())

        def malloc_postprocess(self, device_id, size, mem_size, mem_ptr, pmem_id):
            self.sizes[mem_ptr] = mem_size
            self.live += mem_size
            self.peak = max(self.peak, self.live)

        def free_postprocess(self, device_id, mem_size, mem_ptr, pmem_id):
            self.live -= self.sizes.pop(mem_ptr, mem_size)

    return Peak()


def _origin() -> str:
    """The innermost frames of the library (mpqr and its backends, not its benches) that
    asked for memory."""
    import os
    import traceback as tb

    import mpqr

    root = os.path.dirname(os.path.dirname(os.path.abspath(mpqr.__file__)))
    frames = [f for f in tb.extract_stack(limit=48)[:-2]
              if f.filename.startswith(root) and "bench" not in f.filename[len(root):]
              and "site-packages" not in f.filename]
    return " < ".join(f"{os.path.relpath(f.filename, root)}:{f.lineno} {f.name}"
                      for f in reversed(frames[-4:]))


def allocation_log(cp: Any, fn: Any, a: Any, min_bytes: int = 1 << 20) -> dict[str, Any]:
    """Where the pool's high-water of one call of ``fn(a)`` sits (after a warm-up call):
    the blocks the pool took from the device in order (bytes, the pool's total after,
    origin), and at the high-water the live allocations (bytes, origin) of at least
    ``min_bytes`` and the pool's cached bytes beside them. Bytes as multiples of
    ``a.nbytes`` too. Slow (a stack per allocation): for one call, not for timing. Both
    calls run as they are (:func:`calls_as_they_run`)."""
    with calls_as_they_run():
        return _allocation_log(cp, fn, a, min_bytes)


def _allocation_log(cp: Any, fn: Any, a: Any, min_bytes: int) -> dict[str, Any]:
    from cupy.cuda import memory_hook

    pool = cp.get_default_memory_pool()
    res = fn(a)
    del res
    cp.cuda.Device().synchronize()
    pool.free_all_blocks()
    base = pool.total_bytes()

    class Log(memory_hook.MemoryHook):
        name = "mpqr-log"

        def __init__(self) -> None:
            self.live: dict[int, tuple[int, str]] = {}
            self.new: list[tuple[int, int, str]] = []
            self.high = base
            self.at_high: dict[str, Any] = {}
            self.live_peak = 0
            self.live_bytes = 0

        def alloc_postprocess(self, device_id, mem_size, mem_ptr):
            total = pool.total_bytes()
            self.new.append((mem_size, total - base, _origin()))
            if total > self.high:
                self.high = total
                self.at_high = {"pool": total - base, "used": pool.used_bytes() - base,
                                "cached": total - pool.used_bytes(),
                                "free_blocks": pool.n_free_blocks(),
                                "request": (mem_size, _origin()),
                                "live": sorted(((sz, org) for sz, org in self.live.values()
                                                if sz >= min_bytes), reverse=True)}

        def malloc_postprocess(self, device_id, size, mem_size, mem_ptr, pmem_id):
            self.live[mem_ptr] = (mem_size, _origin() if mem_size >= min_bytes else "")
            self.live_bytes += mem_size
            self.live_peak = max(self.live_peak, self.live_bytes)

        def free_postprocess(self, device_id, mem_size, mem_ptr, pmem_id):
            sz, _ = self.live.pop(mem_ptr, (mem_size, ""))
            self.live_bytes -= sz

    log = Log()
    with log:
        res = fn(a)
        cp.cuda.Device().synchronize()
    del res
    pool.free_all_blocks()
    x = a.nbytes
    at = log.at_high
    return {"pool_multiple": (log.high - base) / x, "live_peak_multiple": log.live_peak / x,
            "at_high": {**{k: (v / x if k in ("pool", "used", "cached") else v)
                           for k, v in at.items() if k != "live"},
                        "live": [(sz / x, org) for sz, org in at.get("live", [])]},
            "new_blocks": [(sz / x, tot / x, org) for sz, tot, org in log.new]}


@contextlib.contextmanager
def calls_as_they_run() -> Iterator[None]:
    """Repeated calls run as they are inside (``MPQR_GRAPHS=0``, restored after): a
    replayed call runs from a CUDA graph's memory pool of its own, and the second call of
    a shape is its capture, neither of which the default pool counts."""
    old = os.environ.get("MPQR_GRAPHS")
    os.environ["MPQR_GRAPHS"] = "0"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("MPQR_GRAPHS", None)
        else:
            os.environ["MPQR_GRAPHS"] = old


def measure_call(cp: Any, fn: Any, a: Any, keep: bool = False,
                 budget: float | None = None) -> Any:
    """Pool growth and live-bytes peak of ``fn(a)`` beyond the input, as multiples of
    ``a.nbytes``, and its seconds (one call, after a warm-up call, both run as they are:
    :func:`calls_as_they_run`); with ``keep``, a pair of that and the call's result (of
    the warm-up call, held outside the count). With ``budget``, both calls run with the
    pool limited to the input and ``budget`` times its bytes beyond it (``"fits"``:
    whether the measured one ran within them; the warm-up call takes the same plan, so
    that its first-use costs are not measured)."""
    with calls_as_they_run():
        return _measure_call(cp, fn, a, keep, budget)


def _measure_call(cp: Any, fn: Any, a: Any, keep: bool, budget: float | None) -> Any:
    pool = cp.get_default_memory_pool()
    if budget is not None:
        pool.free_all_blocks()
        pool.set_limit(size=pool.total_bytes() + int(budget * a.nbytes))
    try:
        res = fn(a)
    except MemoryError:
        if budget is None:
            raise
        res = ()
    finally:
        if budget is not None:
            pool.set_limit(size=0)
    if keep:  # off the device while the call is measured
        kept = [x.get() if hasattr(x, "get") else x for x in res]
    del res
    cp.cuda.Device().synchronize()
    pool.free_all_blocks()
    base = pool.total_bytes()  # the input
    hook = _hook(cp)
    fits = True
    if budget is not None:
        pool.set_limit(size=base + int(budget * a.nbytes))
    t0 = time.perf_counter()
    try:
        with hook:
            res = fn(a)
            cp.cuda.Device().synchronize()
        del res
    except MemoryError:
        if budget is None:
            raise
        fits = False
    finally:
        if budget is not None:
            pool.set_limit(size=0)
    dt = time.perf_counter() - t0
    high = max(pool.total_bytes(), hook.pool_peak)
    pool.free_all_blocks()
    got = {"pool_multiple": (high - base) / a.nbytes, "peak_live_multiple": hook.peak / a.nbytes,
           "seconds": dt}
    if budget is not None:
        got.update(budget_multiple=budget, fits=fits)
    return (got, kept) if keep else got


def largest_n(cp: Any, fn: Any, dtype: str, budget: int, lo: int = 256, step: int = 256
              ) -> int:
    """Largest multiple of ``step`` whose ``n x n`` matrix ``fn`` factors with the pool
    capped at ``budget`` bytes (input included)."""
    pool = cp.get_default_memory_pool()
    item = cp.dtype(dtype).itemsize

    def fits(n: int) -> bool:
        pool.free_all_blocks()
        pool.set_limit(size=0)
        a = cp.random.default_rng(0).standard_normal((n, n), dtype=cp.float64).astype(dtype)
        pool.free_all_blocks()  # the float64 draw's block: not counted against the budget
        pool.set_limit(size=budget)
        try:
            res = fn(a)
            cp.cuda.Device().synchronize()
            del res
            return True
        except MemoryError:
            return False
        finally:
            del a
            pool.set_limit(size=0)
            pool.free_all_blocks()

    hi = int((budget / item) ** 0.5) // step * step  # the input alone fills the budget
    lo_ok = lo if fits(lo) else 0
    while hi - lo_ok > step:
        mid = (lo_ok + hi) // 2 // step * step
        if mid <= lo_ok:
            break
        if fits(mid):
            lo_ok = mid
        else:
            hi = mid
    return lo_ok


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mpqr bench memory", description=__doc__)
    p.add_argument("--json", help="write the results here")
    p.add_argument("--png", help="(no chart for this topic)")
    p.add_argument("--quick", action="store_true", help="smaller shapes")
    p.add_argument("--budget", type=float, default=2 * 2**30,
                   help="pool limit in bytes for the largest-n bisection (default 2 GiB)")
    p.add_argument("--no-largest", action="store_true", help="skip the bisection")
    args = p.parse_args(argv)
    try:
        import cupy as cp
    except ImportError:
        print("bench memory needs CuPy and a CUDA device")
        return 1
    import mpqr

    out: dict[str, Any] = {"environment": environment(cp), "rows": [], "largest": []}
    print(f"{'call':<34} {'mpqr pool':>9} {'peak':>6} {'cupy pool':>9} {'peak':>6}")
    for m, n, dt, prec in (QUICK if args.quick else ROWS):
        try:
            a = cp.random.default_rng(0).standard_normal((m, n), dtype=cp.float64).astype(dt)

            def call(x, pr=prec):
                return mpqr.qr(x, precision=pr)

            mine = measure_call(cp, call, a)
            # the same call where memory is short: the pool limited to the target's budget
            tight = measure_call(cp, call, a, budget=target_multiple(m, n, prec))
            lib = measure_call(cp, lambda x: cp.linalg.qr(x), a)
            del a
            row = dict(m=m, n=n, dtype=dt, precision=prec, mpqr=mine, mpqr_tight=tight,
                       cupy=lib)
            out["rows"].append(row)
            print(f"{m} x {n} {dt} {prec:<14} {mine['pool_multiple']:>8.2f}x "
                  f"{mine['peak_live_multiple']:>5.2f}x {lib['pool_multiple']:>8.2f}x "
                  f"{lib['peak_live_multiple']:>5.2f}x | within {tight['budget_multiple']}x: "
                  f"{'fits' if tight['fits'] else 'DOES NOT FIT'}, pool "
                  f"{tight['pool_multiple']:.2f}x", flush=True)
        except Exception:
            traceback.print_exc()
        cp.get_default_memory_pool().free_all_blocks()
    if not args.no_largest:
        budget = int(args.budget)
        for dt, prec in (("float32", "fp32-emulated"), ("float64", "fp64-emulated")):
            try:
                mine = largest_n(cp, lambda x, pr=prec: mpqr.qr(x, precision=pr), dt, budget)
                lib = largest_n(cp, lambda x: cp.linalg.qr(x), dt, budget)
                out["largest"].append(dict(dtype=dt, precision=prec, budget=budget,
                                           mpqr=mine, cupy=lib, ratio=mine / max(lib, 1)))
                print(f"largest n under {budget:,} bytes, {dt} {prec}: mpqr {mine}, "
                      f"cupy.linalg.qr {lib} ({mine / max(lib, 1):.2f}x)", flush=True)
            except Exception:
                traceback.print_exc()
    if args.json:
        write_json(args.json, out)
    return 0
