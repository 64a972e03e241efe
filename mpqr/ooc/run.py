"""One out-of-core run: the staging, the passes over each host array, the progress bar
and the explain-trace summary (pieces, passes, bytes moved, overlap achieved)."""

from __future__ import annotations

import contextlib
import contextvars
import sys
import time
from collections.abc import Iterator
from typing import Any

from mpqr.ooc.budget import format_bytes
from mpqr.policy import record_event

__all__ = ["PROGRESS_AFTER_S", "Run", "call_started", "collapsed", "progress_bar",
           "reset_cold_start", "take_call_start"]

#: backends whose first out-of-core run in this process has started: the first run pays
#: what later ones reuse (pinned buffers, copy threads, the device's memory pool, kernel
#: compilation and library handles) and its trace says how much
_WARM: set[str] = set()


def reset_cold_start() -> None:
    """Forget which backends have run out of core (the next run reports a cold start)."""
    _WARM.clear()


#: ``(when the public call reached the host-array route, seconds its device backend took
#: to resolve)``: the imports and the device's start-up a first call pays before any piece
_CALL: contextvars.ContextVar[tuple[float, float] | None] = contextvars.ContextVar(
    "mpqr_ooc_call", default=None)


def call_started(t0: float, backend_s: float) -> None:
    """Note that a host-array call began at ``t0`` and resolved its backend in
    ``backend_s`` seconds (read once by :func:`take_call_start`)."""
    _CALL.set((t0, backend_s))


def take_call_start() -> tuple[float, float]:
    """``(start, backend seconds)`` noted by :func:`call_started` for this call (now and
    0 where none was), and forget it."""
    got = _CALL.get()
    _CALL.set(None)
    return got if got is not None else (time.perf_counter(), 0.0)

#: ``progress=None`` shows a bar on an interactive terminal for runs expected to take
#: longer than this (estimated from the bytes to move)
PROGRESS_AFTER_S = 3.0


def progress_bar(progress: Any, total_bytes: float, expected_s: float, what: str) -> Any:
    """A tqdm bar counting bytes moved, or None. ``progress``: True, False or None
    (on for interactive terminals and runs expected to last over a few seconds)."""
    if progress is not None and not isinstance(progress, bool):
        raise TypeError(f"`progress` must be None, True or False, got {progress!r}")
    if progress is False:
        return None
    if progress is None:
        isatty = getattr(sys.stderr, "isatty", None)
        if not (isatty and isatty() and expected_s > PROGRESS_AFTER_S):
            return None
    try:
        from tqdm.auto import tqdm
    except ImportError as exc:
        if progress is None:
            return None
        raise ImportError("progress=True needs tqdm (pip install tqdm, or mpqr[progress])"
                          ) from exc
    return tqdm(total=int(total_bytes), unit="B", unit_scale=True, desc=what, leave=False)


class Run:
    """Counts passes and bytes of one out-of-core call; closes its staging and bar."""

    def __init__(self, backend: Any, staging: Any, bar: Any, what: str,
                 call: tuple[float, float] | None = None):
        """``call``: ``(start, backend seconds)`` of the public call, for the time spent
        before the first piece (default: what :func:`call_started` noted)."""
        self.backend, self.st, self.bar, self.what = backend, staging, bar, what
        call = take_call_start() if call is None else call
        self.passes: dict[str, int] = {}
        self.t0 = time.perf_counter()
        #: host seconds the caller spent on each piece (between receiving it and asking
        #: for the next): first launches (kernel compilation, handles) show in the first
        self.piece_s: list[float] = []
        #: seconds from the public call to this run (validation, backend, budget, plan,
        #: staging set-up), and the backend's share
        self.lead_in = {"before_run_s": self.t0 - call[0], "backend_s": call[1]}
        self.cold = backend.name not in _WARM
        _WARM.add(backend.name)

    def _tick(self, nbytes: int) -> None:
        if self.bar is not None:
            if self.bar.n + nbytes > self.bar.total:
                self.bar.total = self.bar.n + nbytes
            self.bar.update(nbytes)

    def over(self, src: Any, regions: list[tuple[int, int, int, int]], name: str
             ) -> Iterator[tuple[tuple[int, int, int, int], Any]]:
        """One pass over ``src``'s ``regions``: ``(region, device block)`` in order."""
        self.passes[name] = self.passes.get(name, 0) + 1
        # the staging's generator first: zip then resumes it after the last block (a
        # device staging marks the block's slot free only when asked for the next)
        for blk, region in zip(self.st.stream(src, regions), regions):
            t = time.perf_counter()
            yield region, blk
            self.piece_s.append(time.perf_counter() - t)
            self._tick((region[1] - region[0]) * (region[3] - region[2]) * src.itemsize)

    def over_multi(self, items: list[list[tuple[Any, tuple[int, int, int, int]]]], name: str
                   ) -> Iterator[list[Any]]:
        """One pass over several regions per step (all loaded into one staging slot)."""
        self.passes[name] = self.passes.get(name, 0) + 1
        for blks, item in zip(self.st.stream_multi(items), items):
            t = time.perf_counter()
            yield blks
            self.piece_s.append(time.perf_counter() - t)
            self._tick(sum((r[1] - r[0]) * (r[3] - r[2]) * s.itemsize for s, r in item))

    def store(self, dst: Any, region: tuple[int, int, int, int], block: Any,
              add: bool = False) -> None:
        """``dst[region] = block`` (``+=`` with ``add``), completed by ``flush``."""
        self.st.store(dst, region, block, add=add)
        self._tick((region[1] - region[0]) * (region[3] - region[2]) * dst.itemsize)

    def finish(self, message: str, unit: str = "passes", **data: Any) -> dict[str, Any]:
        """Flush the stores and record the summary event (``unit``: what a counted
        stream is, a full pass or a streamed range)."""
        self.st.flush()
        s = self.st.summary()
        s.update(self._first_piece())
        s.update(self.lead_in)
        if self.cold:
            self._cold_start(s)
        ov = s["overlap"]
        passes = ", ".join(f"{v} over {k}" for k, v in self.passes.items())
        # a backend computing in host memory copies pieces on the host; no device
        where = "into host working pieces" if self.backend.device_memory_free() is None \
            else "to the device"
        record_event("out-of-core", f"{self.what}: {message}; {unit}: {passes}; moved "
                     f"{format_bytes(s['bytes_in'])} {where} and "
                     f"{format_bytes(s['bytes_out'])} back in {s['pieces']} pieces "
                     f"({s['staging']} staging), {s['wall_s']:.3g} s"
                     + (f", pipeline stages (host copies, transfers, compute) {ov:.0%} "
                        "overlapped" if ov is not None else ""),
                     passes=dict(self.passes), **s, **data)
        return s

    def _first_piece(self) -> dict[str, float]:
        """The first piece's host time against the median of the others."""
        if not self.piece_s:
            return {}
        rest = sorted(self.piece_s[1:]) or self.piece_s[:1]
        return {"first_piece_s": self.piece_s[0], "median_piece_s": rest[len(rest) // 2]}

    def _cold_start(self, s: dict[str, Any]) -> None:
        """The trace's account of what the first run in this process paid."""
        first, med = s.get("first_piece_s", 0.0), s.get("median_piece_s", 0.0)
        extra = max(0.0, first - med)
        parts = ", ".join(f"{k.removesuffix('_s').replace('_', ' ')} {v:.3g} s"
                          for k, v in s["setup"].items())
        before = s["before_run_s"]
        record_event("cold-start", f"{self.what}: the first out-of-core call on "
                     f"{self.backend.name} in this process: {before:.3g} s from the call to "
                     f"the first piece (the device backend {s['backend_s']:.3g} s: imports, "
                     f"the device's start-up; the staging {s['setup_s']:.3g} s"
                     + (f": {parts}" if parts else "") + "; the budget and the plan), then "
                     f"the first piece took {first:.3g} s against a median of {med:.3g} s "
                     f"(+{extra:.3g} s: first launches, i.e. kernel compilation or loading, "
                     "library handles, the memory pool's growth); later calls reuse all of "
                     "it", setup_s=s["setup_s"], setup=dict(s["setup"]), first_piece_s=first,
                     median_piece_s=med, first_piece_extra_s=extra, before_run_s=before,
                     backend_s=s["backend_s"], cold_start_s=before + extra)

    def close(self) -> None:
        try:
            self.st.close()
        finally:
            if self.bar is not None:
                self.bar.close()


@contextlib.contextmanager
def collapsed(what: str) -> Iterator[None]:
    """Within the block, repeated events (one per piece's in-core call) reach the active
    traces once each, with their count; GEMM decisions pass through unchanged."""
    from mpqr.policy.trace import Event, Trace, _active

    outer = _active.get()
    if not outer:
        yield
        return
    inner = Trace()
    token = _active.set((inner,))
    try:
        yield
    finally:
        _active.reset(token)
        counts: dict[str, list[Any]] = {}
        for rec in inner.records:
            if isinstance(rec, Event):
                key = f"{rec.kind}: {rec.message}"
                if key in counts:
                    counts[key][1] += 1
                    continue
                counts[key] = [rec, 1]
                rec = None
            if rec is not None:
                for t in outer:
                    t.records.append(rec)
        for rec, n in counts.values():
            record_event(rec.kind, f"{what} ({n} x): {rec.message}", **rec.data)
