"""``python -m mpqr warmup``: compile the GPU kernels of mpqr's common routes ahead of
their first use, in parallel processes, into CuPy's kernel cache.

A fresh machine otherwise compiles them one at a time as the first calls reach them
(tens of seconds on the first ``qr`` and ``lstsq``). Run it once per machine (a
container build, say); the cache is CuPy's own (``CUPY_CACHE_DIR``). ``--record``
re-makes the kernel list mpqr ships: it runs the demo and the routes the demo does not
take (out of core, ill-conditioned tall matrices, column pivoting; small sizes, the
column counts that select kernel variants) with an empty cache and stores every
compilation's arguments (run it on a GPU machine after a kernel or route changes);
``--pack`` then compiles that list and stores the binaries for the machine's platform,
which a later warm-up on the same platform installs instead of compiling.
"""

from __future__ import annotations

import argparse
import os
import tempfile

from mpqr.backends.cupy.warmup import describe

__all__ = ["describe", "main"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mpqr warmup", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--processes", type=int, default=None,
                   help="worker processes (default: the CPU count, at most 16)")
    p.add_argument("--record", metavar="PATH", default=None,
                   help="run the demo with an empty kernel cache and write the kernel list "
                        "it compiled to PATH (gzipped JSON)")
    p.add_argument("--pack", metavar="PATH", default=None,
                   help="compile every kernel of the shipped list into an empty cache and "
                        "store the binaries for this platform in PATH (the prebuilt set "
                        "mpqr ships: backends/cupy/data/cupy_kernels_prebuilt.bin.gz)")
    p.add_argument("--no-prebuilt", action="store_true",
                   help="compile every kernel, even those mpqr ships compiled for this "
                        "platform")
    args = p.parse_args(argv)
    if args.pack:
        from mpqr.backends.cupy.prebuilt import pack
        from mpqr.backends.cupy.warmup import _source_of, load

        entries = [{**e, "text": _source_of(e)} for e in load()["entries"]]
        got = pack(args.pack, entries, processes=args.processes)
        print(f"packed {got['kernels']} kernels ({got['failed']} failed), "
              f"{got['bytes'] / 1e6:.1f} MB of binaries, {got['file_bytes'] / 1e6:.1f} MB "
              f"compressed, to {args.pack}")
        return 0
    if args.record:
        # an empty cache, so that every kernel is compiled (and timed) while recorded
        os.environ["CUPY_CACHE_DIR"] = tempfile.mkdtemp(prefix="mpqr-kernels-")
        from mpqr.backends.cupy.warmup import mark, record
        from mpqr.cli.demo import main as demo

        with record() as rec:
            demo(["--no-warmup"])  # tags its kernels with its tables' phases
            mark("routes")
            _routes()
            mark(None)
        rec.save(args.record)
        total = sum(e["seconds"] for e in rec.entries)
        print(f"recorded {len(rec.entries)} kernels ({total:.1f} s of compiles; "
              f"{rec.skipped} not recordable) to {args.record}")
        return 0
    try:
        import cupy  # noqa: F401
    except ImportError:
        print("no CuPy: nothing to compile (mpqr's NumPy backend compiles nothing)")
        return 0
    from mpqr.backends.cupy.warmup import warm

    done = warm(processes=args.processes, prebuilt=not args.no_prebuilt)
    print(describe(done))
    return 0


def _routes() -> None:
    """Small calls on the routes the demo does not take, so that their kernels are in
    the recorded list: out of core (``qr`` with ``Q`` and ``mode="r"``, ``lstsq`` for a
    good fit and for a random ``b``), tall and ill-conditioned, and column pivoting, at
    32 and 64 columns (the fused kernels' variants)."""
    import cupy as cp
    import numpy as np

    import mpqr

    rng = np.random.default_rng(0)
    m = 2**16
    for n in (32, 64):
        a = rng.standard_normal((m, n))
        fit = a @ rng.standard_normal(n) + 1e-3 * rng.standard_normal(m)
        kw = dict(device="cuda", memory_budget="4MB", progress=False)
        mpqr.qr(a, **kw)
        mpqr.qr(a, mode="r", **kw)
        for b in (fit, rng.standard_normal(m)):
            mpqr.lstsq(a, b, **kw)
        u, _ = np.linalg.qr(a)
        v, _ = np.linalg.qr(rng.standard_normal((n, n)))
        ill = cp.asarray((u * np.logspace(0, -12, n)) @ v.T)
        mpqr.qr(ill)
        mpqr.lstsq(ill, cp.asarray(fit))
    mpqr.qr(cp.asarray(rng.standard_normal((1024, 1024))), pivoting=True)
