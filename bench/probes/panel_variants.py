"""Versions of the one-launch certified panel side by side: resources and time.

``python3 bench/probes/panel_variants.py OUT.json NAME=DIR[:CACHE[:attr]] ...``: each
``DIR`` holds ``panel_cholqr.cu`` and ``panel_fused.cu`` (missing ones are the library's);
``CACHE`` is the launch's cached tiles (``cupy.panel_cholqr.FUSED_CACHE_TILES``, default the
library's), ``attr`` sets the kernel's dynamic shared memory opt-in to the most the library
asks for even where the launch takes less. For each version: the kernel's registers, local
(spilled) and static shared bytes (float32 and float64, the library's ``"block"`` steps);
then, alternated, one panel's GPU time (50 launches on distinct copies behind a spin
kernel, medians of 7) at 8192 / 16384 / 65536 x 32 float32 and 16384 x 32 float64, and
16384 x 32 float32 stopped after each grid barrier (``stop``). First, ``bits``: each
version's one launch on the same panels (m = 33 .. 65536, n = 1 / 17 / 32, float32 and
float64) against the first version's and against its own three launches (``panel_pass``
twice, ``panel_apply``): whether the factors, W, L, tau and the certificate are the same
bits.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import cupy as cp
import numpy as np
from mpqr.backends.cupy import panel_cholqr as k
from mpqr.backends.cupy.modules import KERNELS, ctype

sys.path.insert(0, str(Path(__file__).parent))
from panel_mma import _queued

FILES = ("panel_cholqr.cu", "panel_fused.cu")


def kernel(folder: Path, dtype) -> object:
    text = "".join(((folder / f) if (folder / f).exists() else (KERNELS / f)).read_text()
                   for f in FILES)
    name = f"panel_fused<{ctype(np.dtype(dtype).name)}, 1>"
    mod = cp.RawModule(code=text, options=("--std=c++17",), name_expressions=[name])
    return mod.get_function(name)


def three_launches(folder: Path, dtype):
    """The version's ``panel_pass`` and ``panel_apply`` for ``dtype``."""
    text = "".join(((folder / f) if (folder / f).exists() else (KERNELS / f)).read_text()
                   for f in FILES[:1])
    t = ctype(np.dtype(dtype).name)
    names = [f"panel_pass<{t}>", f"panel_apply<{t}>"]
    mod = cp.RawModule(code=text, options=("--std=c++17",), name_expressions=names)
    return [mod.get_function(nm) for nm in names]


def outputs(run, host, n: int):
    """(A, W, L, tau, certificate) after ``run(a, m, n, bufs)`` on ``host``'s first n
    columns."""
    a = cp.asarray(np.ascontiguousarray(host[:, :n]))
    bufs = (cp.zeros_like(a), k._workspace(), cp.zeros(4, cp.int32),
            cp.zeros((n, n), a.dtype), cp.zeros(n, a.dtype))
    run(a, a.shape[0], n, bufs)
    return [cp.asnumpy(x) for x in (a, bufs[0], bufs[3], bufs[4], bufs[2])]


def one_launch(kern, cache, a, m, n, bufs) -> None:
    w, ws, cert, ltop, tau = bufs
    k.FUSED_CACHE_TILES = cache
    lda = cp.int64(n)
    k._launch_fused(kern, a, lda, m, n, ws, cert, w, lda, ltop, tau)


def three_launches_run(kerns, a, m, n, bufs) -> None:
    w, ws, cert, ltop, tau = bufs
    pass_k, apply_k = kerns
    blocks = max(1, min(k._MAX_BLOCKS, -(-m // k._TILE)))
    args = (a, cp.int64(n), cp.int64(m), cp.int32(n))
    for p in (1, 2):
        pass_k((blocks,), (k._THREADS,), (*args, cp.int32(p), ws, cert, w, cp.int64(n), ltop,
                                          tau))
    if m > n:
        ab = max(1, min(4 * 132, -(-(m - n) // k._TILE)))
        apply_k((ab,), (k._THREADS,), (*args, ws, w, cp.int64(n)))


def same(x, y) -> bool:
    return all(np.array_equal(u, v, equal_nan=True) for u, v in zip(x, y))


def bits(kerns, versions) -> list[dict]:
    """Each version's one launch against the first version's and its own three launches."""
    rows = []
    rng = np.random.default_rng(5)
    names = list(versions)
    for dt in (np.float32, np.float64):
        dn = np.dtype(dt).name
        threes = {nm: three_launches(v["dir"], dt) for nm, v in versions.items()}
        for m in (33, 100, 4097, 16384, 65536):
            host = rng.standard_normal((m, 32)).astype(dt)
            for n in (1, 17, 32):
                got = {}
                for nm in names:
                    one = functools.partial(one_launch, kerns[nm, dn], versions[nm]["cache"])
                    got[nm] = outputs(one, host, n)
                    three = functools.partial(three_launches_run, threes[nm])
                    rows.append({"check": "bits", "version": nm, "dtype": dn, "m": m, "n": n,
                                 "same_as_first": same(got[nm], got[names[0]]),
                                 "same_as_three_launches": same(got[nm],
                                                                outputs(three, host, n))})
                    if not (rows[-1]["same_as_first"] and rows[-1]["same_as_three_launches"]):
                        print(rows[-1], flush=True)
    print("bits:", {nm: (all(r["same_as_first"] for r in rows if r["version"] == nm),
                         all(r["same_as_three_launches"] for r in rows if r["version"] == nm))
                    for nm in names}, flush=True)
    return rows


def times(launch, versions, host, stages: bool) -> list[dict]:
    """Each version's panel time on ``host`` (alternated), and its stages if asked."""
    a = cp.asarray(host)
    copies = [a.copy() for _ in range(50)]
    bufs = (cp.empty_like(a), k._workspace(), cp.zeros(4, cp.int32),
            cp.empty((32, 32), a.dtype), cp.empty(32, a.dtype))
    got = {n: [] for n in versions}
    stops = {}
    for _ in range(7):
        for name in versions:
            for c in copies:
                c[...] = a
            it = iter(copies)
            got[name].append(_queued(lambda: launch(name, next(it), bufs)))  # noqa: B023
            for stop in (1, 2, 3, 4, 5) if stages else ():
                stops.setdefault((name, stop), []).append(
                    _queued(lambda: launch(name, copies[0], bufs, stop)))  # noqa: B023
    rows = []
    m, dt = a.shape[0], a.dtype.name
    for name, us in got.items():
        rows.append({"check": "panel-time", "version": name, "dtype": dt, "m": m,
                     "us": float(np.median(us)), "us_all": us})
        print({k_: v_ for k_, v_ in rows[-1].items() if k_ != "us_all"}, flush=True)
    for (name, stop), us in stops.items():
        rows.append({"check": "stage", "version": name, "dtype": dt, "m": m, "stop": stop,
                     "us": float(np.median(us))})
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    out = sys.argv[1]
    versions = {}
    for spec in sys.argv[2:]:
        name, _, rest = spec.partition("=")
        parts = rest.split(":")
        cap = int(parts[1]) if len(parts) > 1 and parts[1] else k.FUSED_CACHE_TILES
        versions[name] = {"dir": Path(parts[0]), "cache": cap,
                          "attr": len(parts) > 2 and parts[2] == "attr"}
    rows = []
    kerns = {}
    for name, v in versions.items():
        for dt in (np.float32, np.float64):
            kern = kernel(v["dir"], dt)
            if v["attr"]:
                kern.max_dynamic_shared_size_bytes = k.FUSED_CACHE_TILES * k._TILE_BYTES
            kerns[name, np.dtype(dt).name] = kern
            rows.append({"check": "resources", "version": name, "dtype": np.dtype(dt).name,
                         "registers": kern.num_regs, "local_bytes": kern.local_size_bytes,
                         "static_shared": kern.shared_size_bytes})
            print(rows[-1], flush=True)

    rows += bits(kerns, versions)

    def launch(name, work, bufs, stop=0):
        w, ws, cert, ltop, tau = bufs
        k.FUSED_CACHE_TILES = versions[name]["cache"]
        lda = cp.int64(work.shape[1])
        k._launch_fused(kerns[name, work.dtype.name], work, lda, work.shape[0], 32, ws,
                        cert, w, lda, ltop, tau, stop=stop)

    rng = np.random.default_rng(2)
    for dt, m in ((np.float32, 8192), (np.float32, 16384), (np.float32, 65536),
                  (np.float64, 16384)):
        rows += times(launch, versions, rng.standard_normal((m, 32)).astype(dt),
                      stages=(dt, m) == (np.float32, 16384))
    with open(out, "w") as fh:
        json.dump({"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
                   "versions": {n: {**v, "dir": str(v["dir"])} for n, v in versions.items()},
                   "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
