"""Staging between host arrays and the device: the "host stream" of the out-of-core
driver.

A staging object moves ranges of host arrays (:class:`mpqr.backends.host.HostArray`)
to device arrays and back, and counts what it moved:

* ``stream(src, regions)`` yields each region of ``src`` as a device array, in order;
  a yielded block is valid until the next one is requested (its buffer is reused).
* ``store(dst, region, block, add=False)`` writes a device block into ``dst`` (adds it
  with ``add``); it may complete later, and always before ``flush()`` or ``close()``
  return.
* ``close()`` releases buffers, threads and streams; also on an exception.

:class:`SyncStaging` is the synchronous staging of host-memory backends (NumPy): the
"device" is the host, a block is a fresh copy (the input is never written). The CuPy
backend stages through pinned ring buffers on separate copy streams
(:mod:`mpqr.backends.cupy.staging`).
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Iterable, Iterator
from typing import Any

__all__ = ["OPEN", "Staging", "SyncStaging"]

#: stagings not yet closed (tests check that interrupted runs release theirs)
OPEN: weakref.WeakSet = weakref.WeakSet()

Region = tuple[int, int, int, int]


class Staging:
    """Shared bookkeeping: bytes moved, pieces, copy and compute time, wall time."""

    kind = "synchronous"

    def __init__(self, backend: Any, dtype: Any, block_elems: int, nbuf: int = 1):
        self.backend, self.dtype = backend, dtype
        self.block_elems, self.nbuf = int(block_elems), int(nbuf)
        self.bytes_in = self.bytes_out = 0
        self.pieces = 0
        self.copy_s = 0.0  # time the copies took (may overlap compute)
        self.compute_s = 0.0  # time the work on the staged blocks took (where measured)
        self.t0 = time.perf_counter()
        self.closed = False
        #: what setting up took (buffers, streams, threads), and its parts by name; a
        #: part paid during the run (a buffer allocated on first use) is added there
        self.setup_s = 0.0
        self.setup: dict[str, float] = {}
        OPEN.add(self)

    def stream(self, src: Any, regions: Iterable[Region]) -> Iterator[Any]:
        raise NotImplementedError

    def stream_multi(self, items: Iterable[list[tuple[Any, Region]]]) -> Iterator[list[Any]]:
        raise NotImplementedError

    def load(self, src: Any, region: Region) -> Any:
        """One region as a device array of its own (not a reused buffer)."""
        raise NotImplementedError

    def store(self, dst: Any, region: Region, block: Any, add: bool = False) -> None:
        raise NotImplementedError

    def flush(self) -> None:
        """Wait until every ``store`` has reached its host array."""

    def close(self) -> None:
        self.closed = True
        OPEN.discard(self)

    def summary(self) -> dict[str, Any]:
        wall = time.perf_counter() - self.t0
        overlap = self.overlap(wall)
        return {"staging": self.kind, "bytes_in": self.bytes_in, "bytes_out": self.bytes_out,
                "pieces": self.pieces, "copy_s": self.copy_s, "compute_s": self.compute_s,
                "wall_s": wall, "overlap": overlap, "setup_s": self.setup_s,
                "setup": dict(self.setup)}

    def overlap(self, wall: float) -> float | None:
        """Fraction of the copy time hidden behind other work (None: not measured)."""
        return None

    def __enter__(self) -> Staging:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SyncStaging(Staging):
    """Host-memory backends: blocks are copies, stores are immediate."""

    def _read(self, src: Any, region: Region) -> Any:
        t = time.perf_counter()
        r0, r1, c0, c1 = region
        blk = src.read(r0, r1, c0, c1)
        self.bytes_in += blk.nbytes
        self.copy_s += time.perf_counter() - t
        self.pieces += 1
        return blk

    def stream(self, src: Any, regions: Iterable[Region]) -> Iterator[Any]:
        for region in regions:
            yield self._read(src, region)

    def stream_multi(self, items: Iterable[list[tuple[Any, Region]]]) -> Iterator[list[Any]]:
        """Like :meth:`stream`, several regions per step (one piece)."""
        for item in items:
            blks = [self._read(src, region) for src, region in item]
            self.pieces -= len(blks) - 1
            yield blks

    def load(self, src: Any, region: Region) -> Any:
        return self._read(src, region)

    def store(self, dst: Any, region: Region, block: Any, add: bool = False) -> None:
        t = time.perf_counter()
        r0, r1, c0, c1 = region
        dst.write(r0, r1, c0, c1, block, add=add)
        self.bytes_out += (r1 - r0) * (c1 - c0) * dst.itemsize
        self.copy_s += time.perf_counter() - t
