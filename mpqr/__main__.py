"""Command line: ``python -m mpqr demo``, ``python -m mpqr warmup`` and
``python -m mpqr bench [TOPIC] ...``.

``python -m mpqr bench`` alone lists the benchmarks; ``python -m mpqr bench TOPIC -h``
shows one's options. Each writes ``--json PATH`` and ``--png PATH``.
"""

from __future__ import annotations

import argparse
import importlib
import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(
        prog="python -m mpqr", description="mpqr command line",
        epilog="demo: factor and solve one problem against SciPy/cuSOLVER; warmup: compile "
        "the GPU kernels ahead; bench: the benchmarks (alone: the list of topics). "
        "`python -m mpqr COMMAND -h` shows a command's options.")
    p.add_argument("command", choices=["demo", "warmup", "bench"], help="what to run")
    p.add_argument("rest", nargs=argparse.REMAINDER, metavar="ARGS",
                   help="the command's own arguments (bench: a TOPIC first)")
    args = p.parse_args(argv)
    if args.command == "demo":
        from mpqr.cli.demo import main as demo

        return demo(args.rest)
    if args.command == "warmup":
        from mpqr.cli.warmup import main as warmup

        return warmup(args.rest)
    # the one registry of benchmarks: topic -> module with main(argv)
    benches = {"gemm": "mpqr.bench.gemm", "qr": "mpqr.bench.qr",
               "lstsq": "mpqr.bench.lstsq", "accuracy": "mpqr.bench.accuracy",
               "dask": "mpqr.bench.dask", "bridge": "mpqr.bench.bridge",
               "ooc": "mpqr.bench.ooc", "arrayapi": "mpqr.bench.arrayapi",
               "frameworks": "mpqr.bench.frameworks", "small": "mpqr.bench.small",
               "memory": "mpqr.bench.memory"}
    if not args.rest:
        print("python -m mpqr bench TOPIC [--json PATH] [--png PATH] ...; topics:")
        for topic, modname in benches.items():
            doc = (importlib.import_module(modname).__doc__ or "").strip().splitlines()
            # plain text on a terminal: no reStructuredText quoting
            print(f"  {topic:<10} {doc[0].replace('``', '') if doc else ''}")
        return 0
    if args.rest[0] not in benches:
        p.error(f"bench needs one of {', '.join(benches)}; got {args.rest[0]!r}")
    return importlib.import_module(benches[args.rest[0]]).main(args.rest[1:])


if __name__ == "__main__":
    sys.exit(main())
