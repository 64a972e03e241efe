"""Pinned, ring-buffered staging between host arrays and a CUDA device (CuPy).

Pageable host memory crosses the link at a fraction of pinned memory's rate (H100:
~7 GB/s against ~51 GB/s each way, ~84 GB/s both ways at once), and pinning a whole
input costs as much as copying it. So each block goes host array -> pinned slot (a
multi-threaded memcpy) -> device slot (an async copy on its own stream), ``nbuf``
slots deep, while the compute stream works on an earlier block; results go back the
same way on a second copy stream. Only ``nbuf + nout`` blocks are ever pinned.

What a first call pays is paid once per process: the copy threads are shared by all
stagings (created on first use), pinned slots are allocated on their first use in the
copy threads (so the first slot's copy overlaps the next slots' allocation) and return
to this process's pool of page-locked buffers at ``close()``, where the next call finds
them; the device ring comes from CuPy's memory pool the same way. ``setup`` times each
part. A slot is anonymous memory touched by the copy threads and then page-locked
(``cudaHostRegister``), five to ten times faster than ``cudaHostAlloc``.

The host side is bound by the host's memory bandwidth, not by the link: each staged
byte is read and written by the memcpy and read again by the DMA (three bytes of DRAM
traffic), so on a host whose DRAM sustains ~120 GB/s the staging delivers ~35 GB/s of
the link's ~55 (H200 host, 16 cores: ``python -m mpqr bench ooc`` reports both).

Events order everything: the compute stream waits for a slot's upload, the upload
into a slot waits until the compute stream is done with its previous block, and the
download waits until the block is computed. The same events time the copies and the
compute, from which :meth:`CupyStaging.overlap` reports how much copy time was hidden.
"""

from __future__ import annotations

import contextlib
import mmap
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from mpqr.backends.host.staging import Staging

__all__ = ["HOST_COPY_THREADS", "PINNED_POOL_BYTES", "CupyStaging", "release_pinned"]

#: host memcpy threads per direction: beside a DMA reading pinned memory, 24 threads
#: copy 39 GB/s and 16 threads 34 (alone, 16 copy fastest: 45-49 GB/s); H200 host, 16
#: cores (`python -m mpqr bench ooc`: link.memcpy, `in_threads_*_with_dma_GBps`)
HOST_COPY_THREADS = 24

#: the least a host copy thread is given (64 rows of 64 float64 columns)
_CHUNK_BYTES = 32 * 2**10

#: free page-locked buffers the pool keeps for the next staging, in bytes; beyond it
#: the smallest are unregistered and released
PINNED_POOL_BYTES = 8 * 2**30

#: thread pools shared by every staging of this process, by (role, threads)
_POOLS: dict[tuple[str, int], ThreadPoolExecutor] = {}
_POOLS_LOCK = threading.Lock()


def _pool(role: str, threads: int) -> tuple[ThreadPoolExecutor, float]:
    """The process's pool for ``role`` (made on first use) and the seconds making it took."""
    with _POOLS_LOCK:
        pool = _POOLS.get((role, threads))
        if pool is not None:
            return pool, 0.0
        t = time.perf_counter()
        pool = ThreadPoolExecutor(threads, thread_name_prefix=f"mpqr-{role}")
        # start the workers now, not on the first copy
        for f in [pool.submit(time.sleep, 0) for _ in range(threads)]:
            f.result()
        _POOLS[(role, threads)] = pool
        return pool, time.perf_counter() - t


class _Locked:
    """A page-locked host buffer: anonymous (page-aligned) memory, touched in parallel
    by the copy threads, then registered with the driver. 512 MiB took 40 ms (touch 23 +
    register 18) against 200-550 ms by ``cudaHostAlloc``, and the DMA reads it at the
    same rate (H200 host)."""

    def __init__(self, nbytes: int, touch: Any):
        import cupy as cp

        self.nbytes = int(nbytes)
        self.mm = mmap.mmap(-1, self.nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        # transparent huge pages where the host allows them (fewer faults)
        with contextlib.suppress(AttributeError, OSError):
            self.mm.madvise(mmap.MADV_HUGEPAGE)
        self.bytes = np.frombuffer(self.mm, dtype=np.uint8)
        touch(self.bytes)
        self.ptr = self.bytes.ctypes.data
        cp.cuda.runtime.hostRegister(self.ptr, self.nbytes, 0)
        self.registered = True

    def view(self, dtype: Any, count: int) -> Any:
        return self.bytes[:count * np.dtype(dtype).itemsize].view(dtype)

    def release(self) -> None:
        import cupy as cp

        if self.registered:
            self.registered = False
            with contextlib.suppress(Exception):  # at interpreter exit the context may be gone
                cp.cuda.runtime.hostUnregister(self.ptr)


#: free page-locked buffers of this process, smallest first
_LOCKED: list[_Locked] = []
_LOCKED_LOCK = threading.Lock()


def _take_locked(nbytes: int) -> _Locked | None:
    """The smallest free page-locked buffer of at least ``nbytes``, or None."""
    with _LOCKED_LOCK:
        for i, buf in enumerate(_LOCKED):
            if buf.nbytes >= nbytes:
                return _LOCKED.pop(i)
    return None


def _give_locked(bufs: list[_Locked]) -> None:
    """Back to the pool; beyond :data:`PINNED_POOL_BYTES` free, the smallest go."""
    drop = []
    with _LOCKED_LOCK:
        _LOCKED.extend(bufs)
        _LOCKED.sort(key=lambda b: b.nbytes)
        while _LOCKED and sum(b.nbytes for b in _LOCKED) > PINNED_POOL_BYTES:
            drop.append(_LOCKED.pop(0))
    for b in drop:
        b.release()


def release_pinned() -> int:
    """Unregister and free the page-locked buffers the stagings of this process keep
    for later calls; returns the bytes released."""
    with _LOCKED_LOCK:
        bufs, _LOCKED[:] = list(_LOCKED), []
    for b in bufs:
        b.release()
    return sum(b.nbytes for b in bufs)


class CupyStaging(Staging):
    kind = "pinned"

    def __init__(self, backend: Any, dtype: Any, block_elems: int, nbuf: int = 3,
                 nout: int = 2):
        super().__init__(backend, dtype, block_elems, max(1, nbuf))
        import cupy as cp

        self.cp = cp
        self.dev_id = cp.cuda.Device().id
        self.dtype = np.dtype(dtype)
        self.pending: list[Any] = []
        self._loads: list[Any] = []  # uploads submitted to the shared loader thread
        t = time.perf_counter()
        self.s_in = cp.cuda.Stream(non_blocking=True)
        self.s_out = cp.cuda.Stream(non_blocking=True)
        self.setup["streams_s"] = time.perf_counter() - t
        self._mems: list[Any] = []  # CuPy pinned allocations (where registering fails)
        self._locked: list[_Locked] = []
        self.setup["pinned_first_use_s"] = 0.0  # grows as slots are first used, in the copy threads
        # pinned slots are allocated on first use (in _load / _store)
        self.pin_in: list[Any] = [None] * self.nbuf
        self.pin_out: list[Any] = [None] * max(1, nout)
        try:
            t = time.perf_counter()
            self.dev_in = [cp.empty(self.block_elems, dtype=self.dtype)
                           for _ in range(self.nbuf)]
            self.setup["device_ring_s"] = time.perf_counter() - t
        except BaseException:
            self.close()
            raise
        self.h2d_done: list[Any] = [None] * self.nbuf
        self.consumed: list[Any] = [None] * self.nbuf
        self.free_out: queue.Queue[int] = queue.Queue()
        for i in range(len(self.pin_out)):
            self.free_out.put(i)
        # uploads and downloads copy on host threads of their own: neither waits for the
        # other; the pools are the process's (made by the first staging)
        made = 0.0
        self.copies, dt = _pool("memcpy", HOST_COPY_THREADS)
        made += dt
        self.copies_out, dt = _pool("memcpy-out", HOST_COPY_THREADS)
        made += dt
        self.loader, dt = _pool("h2d", 1)
        made += dt
        self.writer, dt = _pool("d2h", len(self.pin_out))
        self.setup["threads_s"] = made + dt
        self.copy_events: list[tuple[Any, Any]] = []
        self.compute_events: list[tuple[Any, Any]] = []
        self.host_copy_s = 0.0
        self.setup_s = time.perf_counter() - self.t0

    def _pinned(self, pool: Any) -> Any:
        """A pinned slot: a free buffer of this process's pool, else a new page-locked
        one touched by ``pool``'s threads (CuPy's ``cudaHostAlloc`` where the driver
        cannot register host memory)."""
        t = time.perf_counter()
        nbytes = self.block_elems * self.dtype.itemsize
        buf = _take_locked(nbytes)
        if buf is None:
            try:
                buf = _Locked(nbytes, lambda b: self._par(
                    lambda lo, hi: b[lo * 4096:hi * 4096].fill(0), -(-b.size // 4096), pool,
                    row_bytes=4096))
            except Exception:  # no host registration on this driver: CuPy's allocator
                buf = None
        if buf is not None:
            self._locked.append(buf)
            out = buf.view(self.dtype, self.block_elems)
        else:
            mem = self.cp.cuda.alloc_pinned_memory(nbytes)
            self._mems.append(mem)
            out = np.ndarray((self.block_elems,), dtype=self.dtype, buffer=mem)
        self.setup["pinned_first_use_s"] += time.perf_counter() - t
        return out

    def _slot(self, bufs: list[Any], i: int, pool: Any) -> Any:
        """Pinned slot ``i`` of ``bufs``, allocated on its first use (the pool of
        page-locked buffers hands back the previous call's)."""
        if bufs[i] is None:
            bufs[i] = self._pinned(pool)
        return bufs[i]

    # --- host side copies -------------------------------------------------------
    def _par(self, fn: Any, rows: int, pool: Any = None, row_bytes: int = 512) -> None:
        """Run ``fn(a, b)`` over row chunks ``[a, b)`` on the memcpy threads, at least
        :data:`_CHUNK_BYTES` a chunk (by bytes, not rows: a few wide rows of a square
        matrix's column block still take every thread)."""
        k = max(1, min(HOST_COPY_THREADS, rows, rows * row_bytes // _CHUNK_BYTES))
        cuts = [rows * i // k for i in range(k + 1)]
        pool = pool or self.copies
        futs = [pool.submit(fn, cuts[i], cuts[i + 1]) for i in range(k)]
        for f in futs:
            f.result()

    def _host_read(self, src: Any, region: tuple[int, int, int, int], pin: Any) -> None:
        r0, r1, c0, c1 = region
        t = time.perf_counter()
        if isinstance(src.x, np.ndarray):  # memmaps too; other datasets: one reader
            self._par(lambda a, b: src.read(r0 + a, r0 + b, c0, c1, into=pin[a:b]), r1 - r0,
                      row_bytes=(c1 - c0) * pin.itemsize)
        else:
            src.read(r0, r1, c0, c1, into=pin)
        self.host_copy_s += time.perf_counter() - t

    def _host_write(self, dst: Any, region: tuple[int, int, int, int], pin: Any,
                    add: bool = False) -> None:
        r0, r1, c0, c1 = region
        t = time.perf_counter()
        if isinstance(dst.x, np.ndarray):
            self._par(lambda a, b: dst.write(r0 + a, r0 + b, c0, c1, pin[a:b], add=add),
                      r1 - r0, self.copies_out, row_bytes=(c1 - c0) * pin.itemsize)
        else:  # h5py/zarr: one writer (their chunks are not thread-safe to share)
            dst.write(r0, r1, c0, c1, pin, add=add)
        self.host_copy_s += time.perf_counter() - t

    # --- uploads ------------------------------------------------------------------
    def _load(self, parts: list[tuple[Any, tuple[int, int, int, int]]], slot: int) -> list[Any]:
        cp = self.cp
        with cp.cuda.Device(self.dev_id):
            ev = self.h2d_done[slot]
            if ev is not None:
                ev.synchronize()  # the slot's previous upload has left the pinned buffer
            used = 0
            views = []
            for src, (r0, r1, c0, c1) in parts:
                n = (r1 - r0) * (c1 - c0)
                ring = self._slot(self.pin_in, slot, self.copies)
                pin = ring[used:used + n].reshape(r1 - r0, c1 - c0)
                self._host_read(src, (r0, r1, c0, c1), pin)
                views.append((pin, used, n))
                used += n
            c = self.consumed[slot]
            if c is not None:
                self.s_in.wait_event(c)  # the compute stream is done with the slot
            start = cp.cuda.Event()
            start.record(self.s_in)
            out = []
            for pin, off, n in views:
                dev = self.dev_in[slot][off:off + n].reshape(pin.shape)
                dev.set(pin, stream=self.s_in)
                out.append(dev)
            done = cp.cuda.Event()
            done.record(self.s_in)
            self.copy_events.append((start, done))
            self.h2d_done[slot] = done
            return out

    def stream_multi(self, items: list[list[tuple[Any, tuple[int, int, int, int]]]]):
        cp = self.cp
        items = list(items)
        depth = max(1, self.nbuf - 1)
        futs: dict[int, Any] = {}

        def submit(j: int) -> None:
            futs[j] = self.loader.submit(self._load, items[j], j % self.nbuf)
            self._loads.append(futs[j])

        try:
            for j in range(min(depth, len(items))):
                submit(j)
            for i in range(len(items)):
                devs = futs.pop(i).result()
                cur = cp.cuda.get_current_stream()
                cur.wait_event(self.h2d_done[i % self.nbuf])
                t0 = cp.cuda.Event()
                t0.record(cur)
                self.bytes_in += sum(d.nbytes for d in devs)
                self.pieces += 1
                try:
                    yield devs
                finally:
                    # the consumer is done with the slot once it asks for the next block
                    # or drops this generator (a loop ending early, an error): the slot's
                    # next upload waits for what it queued until then
                    t1 = cp.cuda.Event()
                    t1.record(cur)
                    self.compute_events.append((t0, t1))
                    self.consumed[i % self.nbuf] = t1
                if i + depth < len(items):
                    submit(i + depth)
        finally:
            for f in futs.values():
                f.cancel()
            for f in futs.values():
                if not f.cancelled():
                    try:
                        f.result()
                    except BaseException:  # the caller's error wins
                        pass

    def stream(self, src: Any, regions: Any):
        for devs in self.stream_multi([[(src, r)] for r in regions]):
            yield devs[0]

    def load(self, src: Any, region: tuple[int, int, int, int]) -> Any:
        for devs in self.stream_multi([[(src, region)]]):
            return devs[0].copy()
        raise AssertionError("unreachable")

    # --- downloads ----------------------------------------------------------------
    def _store(self, dst: Any, region: tuple[int, int, int, int], block: Any, ready: Any,
               slot: int, add: bool) -> None:
        cp = self.cp
        try:
            with cp.cuda.Device(self.dev_id):
                self.s_out.wait_event(ready)
                ring = self._slot(self.pin_out, slot, self.copies_out)
                pin = ring[:block.size].reshape(block.shape)
                start = cp.cuda.Event()
                start.record(self.s_out)
                block.get(stream=self.s_out, out=pin)
                done = cp.cuda.Event()
                done.record(self.s_out)
                self.copy_events.append((start, done))
                done.synchronize()
                self._host_write(dst, region, pin, add)
        finally:
            self.free_out.put(slot)

    def store(self, dst: Any, region: tuple[int, int, int, int], block: Any,
              add: bool = False) -> None:
        cp = self.cp
        r0, r1, c0, c1 = region
        if block.size > self.block_elems:
            # larger than a pinned slot: in row pieces that fit
            step = max(1, self.block_elems // max(1, c1 - c0))
            for a in range(0, r1 - r0, step):
                b = min(r1 - r0, a + step)
                self.store(dst, (r0 + a, r0 + b, c0, c1), block[a:b], add)
            return
        block = cp.ascontiguousarray(block)
        ready = cp.cuda.Event()
        ready.record(cp.cuda.get_current_stream())
        slot = self.free_out.get()
        self.pending = [f for f in self.pending if not f.done() or f.exception()]
        self.pending.append(self.writer.submit(self._store, dst, region, block, ready, slot,
                                               add))
        self.bytes_out += block.nbytes

    def flush(self) -> None:
        pending, self.pending = self.pending, []
        for f in pending:
            f.result()

    def close(self) -> None:
        """Wait for the copies in flight, then release threads, streams and buffers.
        Never raises: a failed store has raised from ``flush()`` on the normal path, and
        on an error path the caller's exception is the one to see."""
        if self.closed:
            return
        try:
            loads = getattr(self, "_loads", [])
            for f in loads:
                f.cancel()
            for f in [*loads, *getattr(self, "pending", [])]:
                if f.cancelled():
                    continue
                try:
                    f.result()
                except BaseException:  # reported by flush() where it matters
                    pass
            # the thread pools are the process's: this staging's loads ended with its
            # streams (stream_multi waits for them) and its stores just above
            for st in ("s_in", "s_out"):
                stream = getattr(self, st, None)
                if stream is not None:
                    stream.synchronize()
        finally:
            self.pin_in = self.pin_out = self.dev_in = []
            self._mems = []
            locked, self._locked = getattr(self, "_locked", []), []
            _give_locked(locked)
            self.h2d_done = self.consumed = []
            super().close()

    def summary(self) -> dict[str, Any]:
        self.cp.cuda.get_current_stream().synchronize()
        out = super().summary()
        out["host_copy_s"] = self.host_copy_s
        return out

    def _elapsed(self, pairs: list[tuple[Any, Any]]) -> float:
        s = 0.0
        for a, b in pairs:
            try:
                s += self.cp.cuda.get_elapsed_time(a, b) / 1e3
            except Exception:  # an unrecorded pair is skipped
                continue
        return s

    def overlap(self, wall: float) -> float | None:
        """How much of the pipeline's work ran concurrently: ``(sum - wall) / (sum -
        longest)`` over its stages (host memcpy, device copies, compute), clipped to
        [0, 1]: 1 when everything hid behind the longest stage, 0 when they ran one
        after the other."""
        copy = self._elapsed(self.copy_events)
        comp = self._elapsed(self.compute_events)
        self.copy_s, self.compute_s = copy, comp
        stages = [copy, comp, self.host_copy_s]
        total, longest = sum(stages), max(stages)
        if total - longest <= 0:
            return None
        return max(0.0, min(1.0, (total - wall) / (total - longest)))
