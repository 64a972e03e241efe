"""GPU kernels compiled ahead of their first use, many at once, into CuPy's kernel cache.

A first call on a fresh machine spends most of its time in NVRTC: every CuPy
element-wise kernel and every mpqr kernel is compiled once per machine, one after the
other, as the call reaches it (NVRTC compiles one program at a time in a process). The
kernel list, recorded from a run of the demo (:func:`record`), lets :func:`warm`
compile them in parallel worker processes; the calls that follow load them from CuPy's
on-disk cache (``CUPY_CACHE_DIR``, default ``~/.cupy/kernel_cache``).

Nothing here changes what a kernel computes: a worker calls the function CuPy itself
calls, with the arguments CuPy passed it, so the cache keys (which hash the source, the
options and the compiler's version) are the ones the later calls look up. A list
recorded with another CuPy version only costs the time of its compiles, so :func:`warm`
skips it. mpqr's own kernel sources are stored by file name and read at warm-up time,
so an edited ``.cu`` file never warms a stale copy.

This reaches into CuPy's compiler module (``cupy.cuda.compiler._compile_module_with_cache``,
``cupy._core.core.assemble_cupy_compiler_options``); any change there makes
:func:`warm` report nothing compiled, never a wrong kernel.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import gzip
import inspect
import json
import multiprocessing
import os
import time
from pathlib import Path
from typing import Any

__all__ = ["DEMO_FIRST", "MANIFEST", "Background", "Recorder", "describe", "load", "mark",
           "record", "run_phases", "split", "warm"]

#: the kernel list shipped with mpqr (recorded by ``python -m mpqr warmup --record``)
MANIFEST = Path(__file__).resolve().parent / "data" / "cupy_kernels.json.gz"
_KERNELS = Path(__file__).resolve().parent / "kernels"
# arguments that are the same for every call in one installation (re-made by the worker)
# or that carry no meaning across processes
_DROP = ("source", "options", "cache_dir", "extra_source", "log_stream")


#: the phases the demo compiles before its first table; the rest compiles in the
#: background while the first table runs (:func:`warm`'s ``first``)
DEMO_FIRST = ("demo-qr",)
# the phase new recordings are tagged with (:func:`mark`)
_phase: list[str | None] = [None]


def mark(phase: str | None) -> None:
    """Tag the kernels recorded from now on with ``phase`` (the demo's tables, the other
    routes), so that :func:`warm` can compile a phase's kernels before the others."""
    _phase[0] = phase


def _core() -> Any:
    from cupy._core import core

    return core


def _split_options(options: tuple[str, ...]) -> tuple[str, ...] | None:
    """The options a kernel asked for, without the include paths CuPy adds (they name
    this machine's directories); None where ``options`` is not of CuPy's assembled form."""
    core = _core()
    head = tuple(core._get_cccl_include_options())
    tail = tuple(core.assemble_cupy_compiler_options(("--std=c++11",)))[len(head) + 1:]
    options = tuple(options)
    if options[:len(head)] != head or (tail and options[-len(tail):] != tail):
        return None
    return options[len(head):len(options) - len(tail)]


def _source_entry(source: str) -> dict[str, Any]:
    """mpqr's own sources by file name (read again at warm-up), any other literally. A
    kernel file with others appended to it (``modules.functions(..., after=...)``) is
    stored as the first file and the names of those ``after`` it, so that none of their
    texts is kept stale in the list."""
    texts = {path.name: path.read_text() for path in sorted(_KERNELS.glob("*.cu"))}
    found = [(source.find(text), name) for name, text in texts.items() if text]
    found = [(at, name) for at, name in found if at >= 0]
    if not found:
        return {"source": source}
    at, name = min(found)
    end = at + len(texts[name])
    after = []
    while (nxt := next((n for n, t in texts.items() if t and source.startswith(t, end)),
                       None)) is not None:
        after.append(nxt)
        end += len(texts[nxt])
    entry: dict[str, Any] = {"file": name, "head": source[:at], "tail": source[end:]}
    if after:
        entry["after"] = after
    return entry


def _source_of(entry: dict[str, Any]) -> str:
    if "file" in entry:
        files = (entry["file"], *entry.get("after", ()))
        return entry["head"] + "".join((_KERNELS / f).read_text() for f in files) + \
            entry["tail"]
    return entry["source"]


class Recorder:
    """Records the arguments of every CuPy kernel compilation while active."""

    def __init__(self) -> None:
        self.entries: list[dict[str, Any]] = []
        self.skipped = 0
        self._seen: set[str] = set()

    @contextlib.contextmanager
    def active(self):
        from cupy.cuda import compiler

        inner = compiler._compile_module_with_cache
        sig = inspect.signature(inner)
        headers = _core()._get_header_source()

        def wrapped(*args: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            out = inner(*args, **kw)
            self._add(sig.bind(*args, **kw).arguments, time.perf_counter() - t0, headers)
            return out

        compiler._compile_module_with_cache = wrapped
        try:
            yield self
        finally:
            compiler._compile_module_with_cache = inner

    def _add(self, arguments: dict[str, Any], seconds: float, headers: str) -> None:
        options = _split_options(tuple(arguments.get("options") or ()))
        if options is None or arguments.get("extra_source") != headers or \
                arguments.get("log_stream") is not None:
            self.skipped += 1
            return
        rest = {k: (list(v) if isinstance(v, tuple) else v) for k, v in arguments.items()
                if k not in _DROP}
        entry = {**_source_entry(arguments["source"]), "options": list(options),
                 "kwargs": rest, "seconds": round(seconds, 4), "phase": _phase[0]}
        key = json.dumps({k: v for k, v in entry.items() if k not in ("seconds", "phase")},
                         sort_keys=True)
        if key not in self._seen:
            self._seen.add(key)
            self.entries.append(entry)

    def save(self, path: str | os.PathLike) -> None:
        import cupy

        payload = {"cupy": cupy.__version__, "entries": self.entries}
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(path, "wt", encoding="utf-8") as f:
            json.dump(payload, f, indent=0)


@contextlib.contextmanager
def record():
    """``with record() as rec: ...``: the kernels compiled in the block, in ``rec.entries``."""
    with Recorder().active() as rec:
        yield rec


def load(path: str | os.PathLike = MANIFEST) -> dict[str, Any]:
    """The recorded kernel list: ``{"cupy": version, "entries": [...]}``."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def _compile(entry: dict[str, Any]) -> float:
    """In a worker: compile one recorded kernel into the cache (a cache hit costs a read)."""
    from cupy.cuda import compiler

    core = _core()
    kw = {k: (tuple(v) if isinstance(v, list) else v) for k, v in entry["kwargs"].items()}
    options = core.assemble_cupy_compiler_options(tuple(entry["options"]))
    t0 = time.perf_counter()
    compiler._compile_module_with_cache(_source_of(entry), options,
                                        extra_source=core._get_header_source(), **kw)
    return time.perf_counter() - t0


def warm(path: str | os.PathLike = MANIFEST, processes: int | None = None,
         first: tuple[str, ...] | None = None, prebuilt: bool = True) -> dict[str, Any]:
    """Compile the recorded kernels in ``processes`` worker processes (default: the CPU
    count, at most 16); return what was done: ``kernels``, ``processes``, ``seconds``,
    ``compile_seconds`` (summed over the workers), ``failed`` and ``skipped`` (a reason,
    where nothing was compiled). With ``prebuilt``, the kernels mpqr ships compiled for
    this platform (:mod:`.prebuilt`) are installed first (``prebuilt``: how many) and
    only the others compile. With ``first``, only the kernels of those phases are
    waited for; the others keep compiling in the background: ``background``, a
    :class:`Background` (None when nothing is left)."""
    t0 = time.perf_counter()
    out: dict[str, Any] = {"kernels": 0, "processes": 0, "compile_seconds": 0.0,
                           "failed": 0, "skipped": None, "background": None,
                           "prebuilt": 0, "prebuilt_seconds": 0.0, "prebuilt_platform": None}
    try:
        import cupy
    except ImportError:
        out["skipped"] = "CuPy is not installed"
        return {**out, "seconds": time.perf_counter() - t0}
    try:
        visible = cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no driver: CuPy raises its CUDARuntimeError
        visible = False
    if not visible:
        out["skipped"] = "no CUDA GPU visible"
        return {**out, "seconds": time.perf_counter() - t0}
    try:
        manifest = load(path)
    except (OSError, ValueError) as exc:  # gzip.BadGzipFile is an OSError
        out["skipped"] = f"no usable kernel list ({type(exc).__name__}: {exc})"
        return {**out, "seconds": time.perf_counter() - t0}
    if manifest.get("cupy") != cupy.__version__:
        out["skipped"] = (f"the kernel list was recorded with CuPy {manifest.get('cupy')}, "
                          f"this is CuPy {cupy.__version__}: kernels compile on first use")
        return {**out, "seconds": time.perf_counter() - t0}
    entries = manifest["entries"]
    if prebuilt:  # the platform's compiled kernels, where mpqr ships them
        from mpqr.backends.cupy.prebuilt import install

        pre = install([{**e, "text": _source_of(e)} for e in entries])
        out["prebuilt"], out["prebuilt_seconds"] = len(pre["installed"]), pre["seconds"]
        out["prebuilt_platform"] = pre["platform"]
        entries = [e for i, e in enumerate(entries) if i not in pre["installed"]]
    now, later = split(entries, first)
    if not now and not later:
        return {**out, "seconds": time.perf_counter() - t0}
    procs = max(1, min(processes or min(os.cpu_count() or 1, 16), len(now) + len(later)))
    ctx = multiprocessing.get_context("spawn")  # a forked CUDA context is unusable
    pool = cf.ProcessPoolExecutor(procs, mp_context=ctx)
    out["background"] = run_phases(now, later, pool, _compile, out)
    out["processes"] = procs
    out["seconds"] = time.perf_counter() - t0
    return out


def describe(done: dict) -> str:
    """One line on what :func:`warm` did."""
    if done["skipped"]:
        return f"GPU kernels not compiled ahead: {done['skipped']}"
    pre = ""
    if done.get("prebuilt"):
        pre = (f"{done['prebuilt']} GPU kernels installed from mpqr's prebuilt set "
               f"({done['prebuilt_platform']}) in {done['prebuilt_seconds']:.1f} s")
        if not done["processes"]:
            return pre
        pre += "; "
    failed = f", {done['failed']} failed (they compile on first use)" if done["failed"] else ""
    later = done.get("background")
    later = f"; {len(later)} more compiling in the background" if later else ""
    return (f"{pre}{done['kernels']} GPU kernels ready in {done['seconds']:.1f} s "
            f"({done['processes']} processes, {done['compile_seconds']:.1f} s of compiles"
            f"{failed}){later}")


def split(entries: list[dict[str, Any]], first: tuple[str, ...] | None
          ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(now, later)``: the kernels of the phases in ``first`` (all with ``first=None``,
    and any untagged one: a list recorded without phases is compiled whole), the
    costliest first so that the last to finish is a short one; then the others, phase
    by phase in recorded order (the demo's next table before the other routes), each
    phase the costliest first."""
    # phases in the order they were recorded: the demo's next table is compiled first
    rank = {p: i for i, p in enumerate(dict.fromkeys(e.get("phase") for e in entries))}

    def costly(e: dict[str, Any]) -> float:
        return -e.get("seconds", 0.0)

    def in_turn(e: dict[str, Any]) -> tuple[int, float]:
        return rank[e.get("phase")], costly(e)

    now = [e for e in entries if first is None or e.get("phase") is None
           or e.get("phase") in first]
    later = [e for e in entries if not (first is None or e.get("phase") is None
                                        or e.get("phase") in first)]
    return sorted(now, key=costly), sorted(later, key=in_turn)


class Background:
    """The kernels :func:`warm` left compiling after it returned."""

    def __init__(self, pool: Any, futures: list[Any]) -> None:
        self.pool, self.futures = pool, futures

    def __len__(self) -> int:
        return len(self.futures)

    def pending(self) -> int:
        return sum(not f.done() for f in self.futures)

    def cancel(self) -> None:
        """Drop the kernels not started yet (they compile on first use) and let the
        worker processes go once their current compile ends; the caller does not wait."""
        self.pool.shutdown(wait=False, cancel_futures=True)


def run_phases(now: list[Any], later: list[Any], pool: Any, compile_one: Any,
               out: dict[str, Any]) -> Background | None:
    """Compile ``now`` on ``pool`` and wait for it (counting into ``out``), then queue
    ``later`` and return without waiting: a :class:`Background`, or None (the pool shut
    down) when there is nothing later."""
    futures = [pool.submit(compile_one, e) for e in now]
    for fut in cf.as_completed(futures):
        try:
            out["compile_seconds"] += fut.result()
            out["kernels"] += 1
        except Exception:  # a kernel that fails here compiles (and reports) on use
            out["failed"] += 1
    if not later:
        pool.shutdown(wait=True)
        return None
    return Background(pool, [pool.submit(compile_one, e) for e in later])
