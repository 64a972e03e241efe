"""The certified panel's kernels against another version of them, in one process.

``python3 bench/probes/panel_mma.py OUT.json OTHER_DIR [sections] [N ...]``: ``OTHER_DIR``
holds other versions of some of ``backends/cupy/kernels/*.cu`` (the rest are the
library's); each section runs both, alternated. ``PANEL_CACHE_TILES=16,6,...`` (environment)
runs the library's kernels with each ``cupy.panel_cholqr.FUSED_CACHE_TILES`` (the first as
"library", the others as "library-cacheN"). Sections (comma-separated, default all):

* ``check``: the panel (``backend.certified_panel``) by both kernels and by the portable
  steps: the factorization's backward error and orthogonality in float64, the factors'
  difference from the portable steps', the certificate (a NaN entry and a repeated column
  must fail it);
* ``panel``: one panel's GPU time, 50 launches on distinct copies behind a spin kernel (so
  the host's launch cost is hidden), medians of 7;
* ``stages``: the one launch (``ONE_LAUNCH``) stopped after each of its grid barriers (the
  time to it; 0 the whole launch), 16384 x 32, medians of 5 sets of 50 launches;
* ``arch``: the kernels compiled for sm_75 (no FP64 tensor cores: the other branch);
* ``qr``: ``mpqr.qr(method="householder-recursive")`` at fp16 and fp32-emulated (float32)
  and fp64-emulated (float64) at each ``N`` (default 16384 8192), beside
  ``cupy.linalg.qr``; CUDA graphs off (a replay would keep the first version's kernels).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

os.environ["MPQR_GRAPHS"] = "0"

import cupy as cp
import numpy as np
from mpqr.backends import get_backend
from mpqr.backends._base import ArrayAPIBackend
from mpqr.backends.cupy import modules
from mpqr.backends.cupy import panel_cholqr as pc

import mpqr
from mpqr._array_api import array_namespace
from mpqr.bench._timing import release_pool, time_it

B = get_backend(array_namespace(cp.empty(1)))
LIBRARY = modules.KERNELS


def versions(other: str) -> dict[str, tuple[Path, int | None]]:
    """The library's kernel folder (at each cache size asked) and a copy of it with
    ``other``'s files put in."""
    tmp = Path(tempfile.mkdtemp(prefix="panel-kernels-"))
    for f in LIBRARY.iterdir():
        shutil.copy(f, tmp / f.name)
    for f in Path(other).iterdir():
        shutil.copy(f, tmp / f.name)
    caps = [int(c) for c in os.environ.get("PANEL_CACHE_TILES", "").split(",") if c] or [None]
    vers = {"library": (LIBRARY, caps[0])}
    vers.update({f"library-cache{c}": (LIBRARY, c) for c in caps[1:]})
    vers["other"] = (tmp, caps[0])
    return vers


_DEFAULT_CACHE = pc.FUSED_CACHE_TILES


def use(version) -> None:
    folder, cap = version if isinstance(version, tuple) else (version, None)
    pc.FUSED_CACHE_TILES = _DEFAULT_CACHE if cap is None else cap
    if modules.KERNELS != folder:
        modules.KERNELS = folder
        modules.functions.cache_clear()


def panel_check(rows, vers):
    rng = np.random.default_rng(1)
    for dt in (np.float32, np.float64):
        for m, n in ((33, 32), (100, 32), (3000, 1), (5000, 17), (16384, 32), (40000, 32),
                     (100000, 32)):
            a = cp.asarray(rng.standard_normal((m, n + 5)).astype(dt))
            out = {}
            for which in (*vers, "portable"):
                p, w = a.copy(), cp.zeros_like(a)
                f = B.new_certificate(p)
                if which == "portable":
                    ArrayAPIBackend.certified_panel(B, p[:, 2:2 + n], w[:, 2:2 + n], f)
                else:
                    use(vers[which])
                    B.certified_panel(p[:, 2:2 + n], w[:, 2:2 + n], f)
                out[which] = (p, w, int(f[0]))
            pp, wp, _ = out["portable"]
            po, wo, _ = out["other"]
            for which in vers:
                if which != "other":
                    pl, wl, _ = out[which]
                    rows.append({"check": "bitwise", "kernels": which, "m": m, "n": n,
                                 "dtype": np.dtype(dt).name,
                                 "same_bits": bool(cp.array_equal(pl, po)
                                                   and cp.array_equal(wl, wo))})
                    print(rows[-1], flush=True)
            for which in vers:
                pk, wk, fk = out[which]
                y = cp.tril(pk[:, 2:2 + n].astype(cp.float64), -1) + cp.eye(m, n)
                r = cp.triu(pk[:n, 2:2 + n].astype(cp.float64))
                w64 = wk[:, 2:2 + n].astype(cp.float64)
                a64 = a[:, 2:2 + n].astype(cp.float64)
                # Q R with Q = (I - W Y1^T)[:, :n] (W = Y T): the factorization's residual
                back = float(cp.linalg.norm((cp.eye(m, n) - w64 @ y[:n].T) @ r - a64)
                             / cp.linalg.norm(a64))
                orth = None
                if m <= 20000:
                    full = cp.eye(m) - w64 @ y.T
                    orth = float(cp.linalg.norm(full.T @ full - cp.eye(m)) / np.sqrt(m))
                    del full
                row = {"check": "panel", "kernels": which, "m": m, "n": n,
                       "dtype": np.dtype(dt).name, "fails": fk, "backward": back,
                       "orth": orth,
                       "vs_portable": float(cp.max(cp.abs(pk - pp)) / cp.max(cp.abs(pp))),
                       "w_vs_portable": float(cp.max(cp.abs(wk - wp)) / cp.max(cp.abs(wp))),
                       "others_untouched": bool(cp.all(pk[:, :2] == a[:, :2])
                                                and cp.all(pk[:, 2 + n:] == a[:, 2 + n:]))}
                rows.append(row)
                print(row, flush=True)
    for which, folder in vers.items():
        use(folder)
        for bad in ("nan", "repeated"):
            a = cp.asarray(rng.standard_normal((4096, 32)))
            if bad == "nan":
                a[17, 3] = cp.nan
            else:
                a[:, 20] = a[:, 7]
            f = B.new_certificate(a)
            B.certified_panel(a, None, f)
            rows.append({"check": "certificate", "kernels": which, "input": bad,
                         "fails": int(f[0])})
            print(rows[-1], flush=True)


_SPIN = cp.RawKernel(r"""
extern "C" __global__ void spin(long long cycles) {
  long long t0 = clock64();
  while (clock64() - t0 < cycles) {}
}""", "spin")


def panel_times(rows, vers, reps=7, count=50):
    rng = np.random.default_rng(2)
    for dt in (np.float32, np.float64):
        for m in (8192, 16384, 65536):
            a = cp.asarray(rng.standard_normal((m, 32)).astype(dt))
            copies = [a.copy() for _ in range(count)]
            w = cp.empty_like(a)
            f = B.new_certificate(a)
            got = {k: [] for k in vers}
            for _ in range(reps):
                for which, folder in vers.items():
                    use(folder)
                    B.certified_panel(copies[0], w, f)  # compiled and loaded
                    for c in copies:
                        c[...] = a
                    it = iter(copies)  # each launch on a copy of its own
                    got[which].append(_queued(
                        lambda it=it, w=w, f=f: B.certified_panel(next(it), w, f), count))
            for which, us in got.items():
                row = {"check": "panel-time", "kernels": which, "m": m, "n": 32,
                       "dtype": np.dtype(dt).name, "us": float(np.median(us)),
                       "us_all": us}
                rows.append(row)
                print(row, flush=True)
            del copies


def _queued(fn, count=50):
    """GPU microseconds per call of ``fn`` (``count`` calls behind a spin kernel)."""
    cp.cuda.Device().synchronize()
    _SPIN((1,), (1,), (np.int64(40_000_000),))
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    for _ in range(count):
        fn()
    stop.record()
    stop.synchronize()
    return cp.cuda.get_elapsed_time(start, stop) * 1e3 / count


def stage_times(rows, vers, reps=5):
    from mpqr.backends.cupy import panel_cholqr as k

    rng = np.random.default_rng(3)
    for dt in (np.float32, np.float64):
        m = 16384
        a = cp.asarray(rng.standard_normal((m, 32)).astype(dt))
        work, w = a.copy(), cp.empty_like(a)
        ws, cert = k._workspace(), B.new_certificate(a)
        ltop, tau = cp.empty((32, 32), dt), cp.empty(32, dt)
        lda = cp.int64(32)
        got = {}
        for _ in range(reps):
            for which, folder in vers.items():
                use(folder)
                kern = k._fused_kernel(np.dtype(dt).name, k.ONE_LAUNCH)
                args = (work, lda, m, 32, ws, cert, w, lda, ltop, tau)
                for stop in (1, 2, 3, 4, 5, 0):
                    def st(kern=kern, stop=stop, args=args):
                        k._launch_fused(kern, *args, stop=stop)
                    st()
                    # the panel's contents change from launch to launch: the time of
                    # the steps, not of one input's factors
                    got.setdefault((which, stop), []).append(_queued(st))
                    work[...] = a
        for (which, stop), us in got.items():
            rows.append({"check": "stage", "kernels": which, "dtype": np.dtype(dt).name,
                         "m": m, "stop": stop, "us": float(np.median(us))})
            print(rows[-1], flush=True)


def arch_check(rows):
    """The two kernel files compiled for sm_75 (the branch without mma)."""
    text = "".join((LIBRARY / f).read_text() for f in ("panel_cholqr.cu", "panel_fused.cu"))
    names = ["panel_pass<float>", "panel_apply<double>", "panel_fused<double, 1>"]
    try:
        mod = cp.RawModule(code=text, options=("--std=c++17", "-arch=compute_75"),
                           name_expressions=names)
        mod.compile()
        ok, err = True, None
    except Exception as exc:
        ok, err = False, f"{type(exc).__name__}: {exc}"[:2000]
    rows.append({"check": "sm_75 compile", "ok": ok, "error": err})
    print(rows[-1], flush=True)


def errors(a, q, r):
    a64 = a.astype(cp.float64)
    q64, r64 = q.astype(cp.float64), r.astype(cp.float64)
    back = float(cp.linalg.norm(a64 - q64 @ r64) / cp.linalg.norm(a64))
    n = q.shape[1]
    return back, float(cp.linalg.norm(q64.T @ q64 - cp.eye(n)) / n)


def qr_ab(rows, vers, sizes, reps=3):
    for n in sizes:
        for dtype, precs in ((cp.float32, ("fp16", "fp32-emulated")),
                             (cp.float64, ("fp64-emulated",))):
            a = cp.random.default_rng(0).standard_normal((n, n), dtype=cp.float64).astype(dtype)
            t_ref = time_it(cp, lambda a=a: cp.linalg.qr(a), repeat=3, max_seconds=5)
            rows.append({"check": "qr", "n": n, "dtype": np.dtype(dtype).name,
                         "what": "cusolver", "seconds": t_ref})
            print(rows[-1], flush=True)
            release_pool(cp)
            for prec in precs:
                for rep in range(reps):
                    for which, folder in vers.items():
                        use(folder)

                        def call(a=a, prec=prec):
                            return mpqr.qr(a, precision=prec, method="householder-recursive")

                        row = {"check": "qr", "n": n, "dtype": np.dtype(dtype).name,
                               "precision": prec, "kernels": which, "rep": rep}
                        if rep == 0:
                            q, r = call()
                            row["backward"], row["orthogonality"] = errors(a, q, r)
                            del q, r
                        row["seconds"] = time_it(cp, call, repeat=7, max_seconds=8)
                        row["vs_cusolver"] = t_ref / row["seconds"]
                        rows.append(row)
                        print(row, flush=True)
            del a
            release_pool(cp)


def main() -> None:
    out, other = sys.argv[1], sys.argv[2]
    sections = (sys.argv[3].split(",") if len(sys.argv) > 3
                else ["check", "panel", "stages", "arch", "qr"])
    sizes = [int(s) for s in sys.argv[4:]] or [16384, 8192]
    vers = versions(other)
    rows = []
    try:
        if "check" in sections:
            panel_check(rows, vers)
        if "panel" in sections:
            panel_times(rows, vers)
        if "stages" in sections:
            stage_times(rows, vers)
        if "arch" in sections:
            arch_check(rows)
        if "qr" in sections:
            qr_ab(rows, vers, sizes)
    finally:
        use(LIBRARY)
        with open(out, "w") as fh:
            json.dump({"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
                       "other": other, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
