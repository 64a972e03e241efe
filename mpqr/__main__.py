"""Command line: ``python -m mpqr demo`` and ``python -m mpqr bench {gemm,...}``."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="python -m mpqr", description="mpqr command line")
    p.add_argument("command", choices=["demo", "bench"], help="what to run")
    p.add_argument("rest", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    if args.command == "demo":
        from mpqr.tools.demo import main as demo

        return demo(args.rest)
    benches = {"gemm": "mpqr.tools.bench_gemm", "accuracy": "mpqr.tools.bench_accuracy",
               "qr": "mpqr.tools.bench_qr", "lstsq": "mpqr.tools.bench_lstsq",
               "ooc": "mpqr.tools.bench_ooc"}
    if not args.rest or args.rest[0] not in benches:
        p.error(f"bench needs one of {', '.join(benches)}; got {args.rest[:1] or 'nothing'}")
    import importlib

    mod = importlib.import_module(benches[args.rest[0]])
    return mod.main(args.rest[1:])


if __name__ == "__main__":
    sys.exit(main())
