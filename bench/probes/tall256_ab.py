"""A/B on one GPU at 2^20 x 256 float64 ``auto``: the Gram products by column halves
(``gram_block`` 128 against the backend's 256) and the blocked substitution right-looking
from 256 columns (``RIGHT_LOOKING_MIN_N``), at cond 1, 1e12 and 1e15, timed as ``bench
qr`` times (CUDA events, medians of 5), the variants alternated in one process beside
``cupy.linalg.qr``; every variant's result checked (orthogonality, backward error).

``python bench/probes/tall256_ab.py`` writes ``$OUT/tall256_ab.json``.
"""

import json
import os
import statistics
import sys
from pathlib import Path

import cupy as cp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ill_conditioned import matrix, qr_errors
from mpqr.backends.cupy.backend import CupyBackend

import mpqr
from mpqr.bench._timing import release_pool, time_it
from mpqr.qr import cholqr

BASE = (CupyBackend.gram_block, cholqr.RIGHT_LOOKING_MIN_N)
VARIANTS = {"base": BASE, "gram128": (128, BASE[1]), "right256": (BASE[0], 256),
            "both": (128, 256)}


def _set(v):
    CupyBackend.gram_block, cholqr.RIGHT_LOOKING_MIN_N = v


#: ``TALL_AB_VARIANTS=base,gram128`` picks variants; ``TALL_AB_ROUNDS`` the alternations
PICK = [v for v in os.environ.get("TALL_AB_VARIANTS", ",".join(VARIANTS)).split(",") if v]
ROUNDS = int(os.environ.get("TALL_AB_ROUNDS", "3"))


def row(cond):
    a = matrix(2**20, 256, cond)
    out = {"cond": cond, "cusolver_ms": time_it(cp, lambda: cp.linalg.qr(a), repeat=3) * 1e3}
    variants = {k: VARIANTS[k] for k in PICK}
    times = {k: [] for k in variants}
    for k, v in variants.items():
        _set(v)
        q, r = mpqr.qr(a)
        orth, back = qr_errors(a, q, r)
        del q, r
        out[f"{k}_orth"], out[f"{k}_backward"] = orth, back
        out[f"{k}_status"] = "PASS" if orth <= 1e-15 and back <= 2e-15 else "FAIL"
    release_pool(cp)
    for _ in range(ROUNDS):
        for k, v in variants.items():
            _set(v)
            times[k].append(time_it(cp, lambda: mpqr.qr(a), repeat=5))
    _set(BASE)
    for k, t in times.items():
        out[f"{k}_ms"] = statistics.median(t) * 1e3
        out[f"{k}_speedup"] = out["cusolver_ms"] / out[f"{k}_ms"]
    return out


def main():
    res = []
    for cond in (1.0, 1e12, 1e15):
        try:
            res.append(row(cond))
        except Exception as exc:  # one row's failure does not stop the rest
            import traceback

            traceback.print_exc()
            res.append({"cond": cond, "error": repr(exc)})
        print({k: (round(v, 3) if isinstance(v, float) and k.endswith(("ms", "speedup"))
                   else v) for k, v in res[-1].items()}, flush=True)
        release_pool(cp)
    with open(os.path.join(os.environ.get("OUT", "/tmp"), "tall256_ab.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
