"""The look-ahead lane on CuPy: a second stream for trailing updates, with its own
cuBLAS handle.

:mod:`mpqr.qr.householder_tiled` gives the lane the update of the columns beyond the
next panel while the current stream factors that panel (cuSOLVER ``geqrf``, latency
bound: ~5 ms a 512-wide panel at 16384 rows on an H100, ~170 ms of a 16384^2 QR).
The lane's GEMMs use a handle of their own (cuBLAS resets a handle's workspace on
every ``setStream``, so one handle must not serve two streams at once); the backend
routes every GEMM issued on the lane through it (:meth:`CupyBackend._cublas_handle`).
Arrays the lane reads that were allocated on the main stream must stay referenced
until :meth:`CupyLane.main_waits` (the caller keeps the panels' reflectors).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import cupy as cp

__all__ = ["CupyLane", "lane_for_thread", "lane_handle"]

_local = threading.local()
#: the greatest stream priority CUDA offers (lower is higher; clamped to the device's)
_GREATEST = -5


class CupyLane:
    def __init__(self) -> None:
        from cupy.cuda import cublas

        self.stream = cp.cuda.Stream(non_blocking=True)
        # the panels' stream outranks the lane's: when both have blocks waiting, the
        # scheduler gives freed SMs to the latency-bound panel first. CUDA clamps a
        # priority to the device's range (Hopper: 0 least, -5 greatest)
        self.main = cp.cuda.Stream(non_blocking=True, priority=_GREATEST)
        self.handle = cublas.create()
        self._done: cp.cuda.Event | None = None

    @contextlib.contextmanager
    def main_stream(self) -> Iterator[None]:
        """The factorization's own work on a high-priority stream, ordered after what the
        caller's stream has issued, and the caller's stream after it."""
        caller = cp.cuda.get_current_stream()
        start = cp.cuda.Event(disable_timing=True)
        start.record(caller)
        self.main.wait_event(start)
        try:
            with self.main:
                yield
        finally:
            end = cp.cuda.Event(disable_timing=True)
            end.record(self.main)
            caller.wait_event(end)

    def mark(self) -> cp.cuda.Event:
        ev = cp.cuda.Event(disable_timing=True)
        ev.record()  # on the current (main) stream
        return ev

    @contextlib.contextmanager
    def run_after(self, mark: cp.cuda.Event) -> Iterator[None]:
        self.stream.wait_event(mark)
        _local.active = self.handle  # read by every GEMM issued in the block
        try:
            with self.stream:
                yield
        finally:
            _local.active = None
        self._done = cp.cuda.Event(disable_timing=True)
        self._done.record(self.stream)

    def main_waits(self) -> None:
        if self._done is not None:
            cp.cuda.get_current_stream().wait_event(self._done)


def lane_for_thread() -> CupyLane:
    """This thread's lane on the current device (cuBLAS handles are per thread)."""
    lanes = getattr(_local, "lanes", None)
    if lanes is None:
        lanes = _local.lanes = {}
    dev = cp.cuda.Device().id
    lane = lanes.get(dev)
    if lane is None:
        lane = lanes[dev] = CupyLane()
    return lane


def lane_handle() -> int | None:
    """The lane's cuBLAS handle inside :meth:`CupyLane.run_after` on this thread, else
    None (one attribute read: every GEMM asks)."""
    return getattr(_local, "active", None)
