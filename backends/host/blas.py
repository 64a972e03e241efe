"""The host BLAS's thread count around LAPACK calls that are too small for it.

OpenBLAS wakes its threads for every call; on the skinny, BLAS-2 bound LAPACK calls of
mpqr's host steps (a panel's ``geqrf``, a sketch's ``geqp3``, the ``n x n`` steps of a
GPU factorization) the wake-ups cost more than the work, so those calls run on one
thread. The limit is process-wide while it holds, as threadpoolctl's limits are.
"""

from __future__ import annotations

import contextlib
from typing import Any

__all__ = ["ONE_THREAD_MAX_ELEMENTS", "OneThread", "one_thread", "small_lapack"]

#: LAPACK calls on at most this many elements run on one thread: 2-core CPU, OpenBLAS
#: 0.3.31: geqrf 2000 x 128 16 -> 8 ms, geqp3 136 x 2000 22 -> 10 ms, 136 x 4000 35 ->
#: 29 ms; from ~1M elements two threads win (geqrf 8000 x 128: 44 against 56 ms)
#: (`python bench/probes/host_lapack_threads.py`)
ONE_THREAD_MAX_ELEMENTS = 600_000

_controller: list[Any] = []


def one_thread() -> Any:
    """A context limiting the host BLAS to one thread (a no-op without threadpoolctl)."""
    if not _controller:
        try:
            from threadpoolctl import ThreadpoolController

            _controller.append(ThreadpoolController())
        except Exception:  # not installed (it is a dependency) or no BLAS found: no limit
            _controller.append(None)
    ctl = _controller[0]
    return ctl.limit(limits=1, user_api="blas") if ctl is not None else contextlib.nullcontext()


def small_lapack(elements: int) -> Any:
    """:func:`one_thread` for a call on at most :data:`ONE_THREAD_MAX_ELEMENTS` elements,
    else no limit."""
    return one_thread() if elements <= ONE_THREAD_MAX_ELEMENTS else contextlib.nullcontext()


class OneThread:
    """:func:`one_thread` for calls of a few microseconds' work: the BLAS libraries'
    controllers are looked up once and set directly (~4 us a call against threadpoolctl's
    ``limit`` ~35 us on the 2-core host). Re-entrant use restores what it found."""

    _libs: list[Any] | None = None

    def __init__(self) -> None:
        self._saved: list[tuple[Any, int]] = []

    @classmethod
    def _controllers(cls) -> list[Any]:
        if cls._libs is None:
            try:
                from threadpoolctl import ThreadpoolController

                cls._libs = [c for c in ThreadpoolController().lib_controllers
                             if c.user_api == "blas"]
            except Exception:  # no threadpoolctl or no BLAS found: no limit
                cls._libs = []
        return cls._libs

    def __enter__(self) -> OneThread:
        saved = []
        for c in self._controllers():
            t = c.get_num_threads()
            if t != 1:
                c.set_num_threads(1)
                saved.append((c, t))
        self._saved = saved
        return self

    def __exit__(self, *exc: Any) -> None:
        for c, t in self._saved:
            c.set_num_threads(t)
        self._saved = []
