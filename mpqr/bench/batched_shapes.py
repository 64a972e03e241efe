"""``python -m mpqr bench qr --shapes batched``: stacks of small square and near-square
matrices (``(m, n, batch)``), the targets of the batched small-matrix route and a sweep
``n = 8 .. 512``, ``m / n = 1 .. 16`` at about 2^21 elements a stack (4 to 256 matrices)."""

from __future__ import annotations

__all__ = ["BATCHED_SHAPES"]

_TARGETS = [(64, 64, 8192), (128, 128, 4096), (32, 32, 65536), (256, 32, 10000)]
_SWEEP = [(n * k, n, int(min(256, max(4, 2**21 // (n * k * n)))))
          for n in (8, 16, 32, 64, 128, 256, 512) for k in (1, 2, 4, 8, 16)]
#: the targets, then the sweep
BATCHED_SHAPES = _TARGETS + _SWEEP
