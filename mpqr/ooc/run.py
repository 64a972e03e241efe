"""One out-of-core run: the staging, the passes over each host array, the progress bar
and the explain-trace summary (pieces, passes, bytes moved, overlap achieved)."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from typing import Any

from mpqr.ooc.budget import format_bytes
from mpqr.policy import record_event

__all__ = ["PROGRESS_AFTER_S", "Run", "collapsed", "progress_bar"]

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

    def __init__(self, backend: Any, staging: Any, bar: Any, what: str):
        self.backend, self.st, self.bar, self.what = backend, staging, bar, what
        self.passes: dict[str, int] = {}
        self.t0 = time.perf_counter()

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
            yield region, blk
            self._tick((region[1] - region[0]) * (region[3] - region[2]) * src.itemsize)

    def over_multi(self, items: list[list[tuple[Any, tuple[int, int, int, int]]]], name: str
                   ) -> Iterator[list[Any]]:
        """One pass over several regions per step (all loaded into one staging slot)."""
        self.passes[name] = self.passes.get(name, 0) + 1
        for blks, item in zip(self.st.stream_multi(items), items):
            yield blks
            self._tick(sum((r[1] - r[0]) * (r[3] - r[2]) * s.itemsize for s, r in item))

    def store(self, dst: Any, region: tuple[int, int, int, int], block: Any) -> None:
        self.st.store(dst, region, block)
        self._tick((region[1] - region[0]) * (region[3] - region[2]) * dst.itemsize)

    def finish(self, message: str, unit: str = "passes", **data: Any) -> dict[str, Any]:
        """Flush the stores and record the summary event (``unit``: what a counted
        stream is, a full pass or a streamed range)."""
        self.st.flush()
        s = self.st.summary()
        ov = s["overlap"]
        passes = ", ".join(f"{v} over {k}" for k, v in self.passes.items())
        record_event("out-of-core", f"{self.what}: {message}; {unit}: {passes}; moved "
                     f"{format_bytes(s['bytes_in'])} to the device and "
                     f"{format_bytes(s['bytes_out'])} back in {s['pieces']} pieces "
                     f"({s['staging']} staging), {s['wall_s']:.3g} s"
                     + (f", pipeline stages (host copies, transfers, compute) {ov:.0%} "
                        "overlapped" if ov is not None else ""),
                     passes=dict(self.passes), **s, **data)
        return s

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
