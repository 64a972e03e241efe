"""The device-memory budget and how the out-of-core driver cuts a matrix into pieces.

The budget is, in order: the ``memory_budget=`` keyword, the ``MPQR_MEMORY_BUDGET``
environment variable, or :data:`DEFAULT_FRACTION` of the device's free memory (a
backend whose "device" is host memory, NumPy, has no default: it runs in core unless
a budget is given). Sizes are bytes or strings such as ``"2GB"`` (powers of ten) or
``"512MiB"`` (powers of two).
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from typing import Any

__all__ = ["DEFAULT_FRACTION", "ENV", "MAX_BLOCK_BYTES", "BudgetTooSmall", "TallPlan",
           "format_bytes", "parse_budget", "resolve_budget", "staging_rows", "tall_plan"]

ENV = "MPQR_MEMORY_BUDGET"
#: share of the free device memory taken by default (the rest: the library's own
#: workspace, cuBLAS handles and fragmentation)
DEFAULT_FRACTION = 0.8
#: largest staged block: beyond it a block only delays the first compute and the last
#: copy (512 MiB crosses an H100's link in ~10 ms, far above the per-copy latency)
MAX_BLOCK_BYTES = 512 * 2**20
#: device blocks per staged row: upload ring (3), pending downloads (2), and the
#: piece's own temporaries (product, Q piece, workspace)
RING, DOWNLOADS, WORK = 3, 2, 3

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9,
          "gb": 10**9, "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20,
          "gib": 2**30, "tib": 2**40}


class BudgetTooSmall(ValueError):
    """The memory budget cannot hold even one piece; ``needed`` is the smallest that can."""

    def __init__(self, message: str, needed: int):
        super().__init__(message)
        self.needed = needed


def format_bytes(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{int(n)} B"


def parse_budget(value: Any, name: str = "memory_budget") -> int:
    """Bytes from an integer or a string like ``"2GB"``, ``"1.5 GiB"``, ``"300KB"``."""
    if isinstance(value, bool):
        raise TypeError(f"`{name}` must be a number of bytes or a string like '2GB', "
                        f"got {value!r}")
    if isinstance(value, (int, float)):
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"`{name}` must be a positive number of bytes, got {value!r}")
        return int(value)
    if isinstance(value, str):
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*", value)
        unit = m.group(2).lower() if m else None
        if m is None or unit not in _UNITS:
            raise ValueError(f"`{name}` must be a number of bytes or a size like '2GB', "
                             f"'512MiB', '300KB'; got {value!r}")
        n = float(m.group(1)) * _UNITS[unit]
        if n < 1:
            raise ValueError(f"`{name}` must be positive, got {value!r}")
        return int(n)
    raise TypeError(f"`{name}` must be a number of bytes or a string like '2GB', got "
                    f"{type(value).__name__} {value!r}")


def resolve_budget(value: Any, backend: Any) -> tuple[int | None, str]:
    """``(bytes or None, where it came from)``; None: no limit (run in core)."""
    if value is not None:
        return parse_budget(value), "memory_budget="
    env = os.environ.get(ENV)
    if env:
        return parse_budget(env, ENV), ENV
    free = backend.device_memory_free()
    if free is None:
        return None, "no device-memory limit (host backend)"
    return int(DEFAULT_FRACTION * free), f"{DEFAULT_FRACTION:.0%} of the free device memory"


@dataclass(frozen=True)
class TallPlan:
    """Row pieces of an ``m x cols`` matrix streamed through the device."""

    m: int
    cols: int
    rows: int  # rows per piece (the last one may be shorter)
    itemsize: int
    budget: int

    @property
    def regions(self) -> list[tuple[int, int, int, int]]:
        """Row ranges; a ragged last piece with fewer rows than columns joins the one
        before it (each piece's in-core QR then has a full ``R``)."""
        starts = list(range(0, self.m, self.rows))
        if len(starts) > 1 and self.m - starts[-1] < self.cols:
            starts.pop()
        ends = [*starts[1:], self.m]
        return [(r0, r1, 0, self.cols) for r0, r1 in zip(starts, ends)]

    @property
    def pieces(self) -> int:
        return len(self.regions)

    @property
    def piece_bytes(self) -> int:
        return self.rows * self.cols * self.itemsize

    @property
    def block_elems(self) -> int:
        """Staging slot size: a piece, with room for a joined ragged tail."""
        return (self.rows + self.cols) * self.cols


def tall_plan(m: int, cols: int, itemsize: int, budget: int, *, min_rows: int = 1,
              what: str = "a row piece") -> TallPlan:
    """The largest row pieces whose device working set fits ``budget``.

    Device bytes: ``(RING + DOWNLOADS + WORK)`` blocks of ``rows x cols`` plus the small
    ``cols x cols`` matrices (Gram, R, inverse and the stacked factors, ~8 of them).
    Raises :class:`BudgetTooSmall` naming the smallest budget that works."""
    per_row = cols * itemsize * (RING + DOWNLOADS + WORK)
    fixed = 8 * cols * cols * itemsize
    min_rows = max(1, min(min_rows, m))
    needed = fixed + min_rows * per_row
    if budget < needed:
        raise BudgetTooSmall(
            f"`memory_budget` of {format_bytes(budget)} cannot hold {what} of a "
            f"{m} x {cols} matrix ({min_rows} rows need {format_bytes(needed)} on the device "
            f"with the staging buffers); the smallest budget that works is {needed} bytes "
            f"({format_bytes(needed)})", needed)
    rows = (budget - fixed) // per_row
    rows = min(rows, max(min_rows, MAX_BLOCK_BYTES // max(1, cols * itemsize)), m)
    return TallPlan(m, cols, max(min_rows, int(rows)), itemsize, budget)


def staging_rows(m: int, cols: int, itemsize: int, budget: int | None) -> int:
    """Rows per piece that stage a whole ``m x cols`` matrix into device memory for the
    in-core route (whose working set already fits ``budget``): at most
    :data:`MAX_BLOCK_BYTES` and a 16th of the budget, so the ring's slots take under a
    fifth of it; no ``cols x cols`` terms (nothing is factored by pieces)."""
    cap = MAX_BLOCK_BYTES if budget is None else min(MAX_BLOCK_BYTES, budget // 16)
    return max(1, min(m, cap // max(1, cols * itemsize)))
