"""A module constant's values in the whole QR, alternated in one process.

``python3 bench/probes/flag_ab.py OUT.json MODULE[.CLASS].NAME=V1,V2[,...] [MORE=...]
[--cases N:precision,...] [--mode reduced] [--rounds 3] [--baseline]`` (values as Python
literals, or one list literal ``"[V1, V2]"``; several constants: every combination of
their values; cases default 16384:fp16; float64 input for ``fp64-emulated``, float32
otherwise; ``N`` or ``MxN``): for each case, ``--rounds`` of 4 calls per value (CUDA
events, graphs dropped between values), the medians, backward error and orthogonality in
float64, and whether Q and R are bitwise those of the first value. ``--baseline``: the
case's ``cupy.linalg.qr`` (cuSOLVER) timed in the same rounds.
"""

from __future__ import annotations

import ast
import importlib
import itertools
import json
import sys

import cupy as cp
from graphs_gpu import _ms  # the probe beside this one
from mpqr.backends.cupy import graphs

import mpqr
from mpqr.bench._timing import environment, release_pool


def case_matrix(case: str) -> tuple[int, str, cp.ndarray]:
    """``(n, precision, A)`` of a case ``N:precision`` or ``MxN:precision``: a Gaussian
    matrix (seed 0), float64 for ``fp64-emulated``, float32 otherwise."""
    shape, prec = case.split(":")
    m, _, n = shape.partition("x")
    m, n = int(m), int(n or m)
    dt = cp.float64 if prec == "fp64-emulated" else cp.float32
    return n, prec, cp.random.default_rng(0).standard_normal((m, n), dtype=cp.float64).astype(dt)


def warm_call(case: str):
    """``(A, call)`` of a case (:func:`case_matrix`): ``call()`` factors ``A`` by the
    recursive QR at the case's precision (mode reduced); called once and synchronized."""
    _, prec, a = case_matrix(case)

    def call():
        return mpqr.qr(a, precision=prec, method="householder-recursive")

    call()
    cp.cuda.Device().synchronize()
    return a, call


def owner(target: str):
    """``(object, name)`` of ``MODULE.NAME`` or ``MODULE.CLASS.NAME`` (a class attribute,
    such as a backend's default)."""
    path, _, attr = target.rpartition(".")
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:]:
            obj = getattr(obj, name)
        return obj, attr
    raise ImportError(f"no module in {target!r}")


def _values(spec: str) -> tuple[str, list]:
    target, _, values = spec.partition("=")
    # "[v1, v2]": one list literal (values with commas of their own, such as tuples)
    vals = (ast.literal_eval(values) if values.lstrip().startswith("[")
            else [ast.literal_eval(v) for v in values.split(",")])
    return target, vals


def main(argv):
    opts = ("--cases", "--mode", "--rounds")
    specs = [a for i, a in enumerate(argv[1:], 1)
             if "=" in a and not a.startswith("--") and argv[i - 1] not in opts]
    flags = [_values(s) for s in specs]
    owners = [owner(t) for t, _ in flags]
    # one setting: a tuple of values, one a constant; its key the values' reprs
    settings = list(itertools.product(*(v for _, v in flags)))

    def key(setting):
        return ",".join(repr(v) for v in setting)

    def apply(setting):
        for (mod, attr), v in zip(owners, setting):
            setattr(mod, attr, v)

    cases = ["16384:fp16"]
    if "--cases" in argv:
        cases = argv[argv.index("--cases") + 1].split(",")
    mode = argv[argv.index("--mode") + 1] if "--mode" in argv else "reduced"
    rounds = int(argv[argv.index("--rounds") + 1]) if "--rounds" in argv else 3
    keep = [getattr(mod, attr) for mod, attr in owners]
    rows = []
    for case in cases:
        n, prec, a = case_matrix(case)

        def call(a=a, prec=prec):
            return mpqr.qr(a, precision=prec, method="householder-recursive", mode=mode)

        times = {key(s): [] for s in settings}
        base = []
        for _ in range(rounds):
            for s in settings:
                apply(s)
                graphs.clear()
                call()
                times[key(s)] += _ms(call, 4)
            if "--baseline" in argv:
                apply(keep)
                graphs.clear()
                base += _ms(lambda a=a: cp.linalg.qr(a, mode=mode), 2)
        row = {"case": case, "mode": mode, "flag": " ".join(t for t, _ in flags)}
        if base:
            base.sort()
            row["cusolver_ms"] = base[len(base) // 2]
        first = None
        for s in settings:
            apply(s)
            graphs.clear()
            q, r = call()
            a64, q64, r64 = (x.astype(cp.float64) for x in (a, q, r))
            t = sorted(times[key(s)])
            row[key(s)] = {"ms": t[len(t) // 2], "all": [round(x, 2) for x in t],
                           "backward": float(cp.linalg.norm(q64 @ r64 - a64)
                                             / cp.linalg.norm(a64)),
                           "orth": float(cp.linalg.norm(q64.T @ q64 - cp.eye(n)) / n)}
            if first is None:
                first = (q, r)
            else:
                row[key(s)]["same_bits"] = bool(cp.array_equal(q, first[0])
                                                and cp.array_equal(r, first[1]))
                del q, r
            del a64, q64, r64
        first = None
        apply(keep)
        graphs.clear()
        rows.append(row)
        print(json.dumps(row), flush=True)
        del a
        release_pool(cp)
    with open(argv[0], "w") as fh:
        json.dump({"environment": environment(cp), "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
