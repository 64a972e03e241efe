"""The explain facility: every engine and method decision is recorded here.

``with mpqr.explain() as trace:`` collects the decisions made by the calls in
its body (nested and per-thread/task safe through a ContextVar); each decision
is also logged on the ``mpqr.policy`` logger at DEBUG level.
"""

from __future__ import annotations

import contextvars
import logging
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Event", "GemmDecision", "Trace", "explain", "record_event", "record_gemm"]

logger = logging.getLogger("mpqr.policy")

_active: contextvars.ContextVar[tuple[Trace, ...]] = contextvars.ContextVar(
    "mpqr_traces", default=()
)


@dataclass(frozen=True)
class GemmDecision:
    """Which engine ran one matrix product, and why."""

    label: str
    shape: tuple[int, int, int]  # (m, n, k)
    batch: int
    dtype: str
    precision: str
    precision_source: str
    engine: str
    params: dict[str, Any]
    reason: str
    predicted_s: dict[str, float] = field(default_factory=dict)

    def __str__(self) -> str:
        m, n, k = self.shape
        b = f"{self.batch}x" if self.batch > 1 else ""
        p = ", ".join(f"{k_}={v}" for k_, v in self.params.items())
        return (
            f"gemm {self.label or '-'} {b}({m}x{k})@({k}x{n}) {self.dtype} "
            f"precision={self.precision} [{self.precision_source}] -> {self.engine}"
            f"{' (' + p + ')' if p else ''}: {self.reason}"
        )


@dataclass(frozen=True)
class Event:
    """A non-GEMM decision: method choice, fallback, refinement step..."""

    kind: str
    message: str
    data: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"


class Trace:
    """An ordered record of decisions. ``str(trace)`` is a readable report."""

    def __init__(self) -> None:
        self.records: list[GemmDecision | Event] = []

    @property
    def gemms(self) -> list[GemmDecision]:
        return [r for r in self.records if isinstance(r, GemmDecision)]

    @property
    def events(self) -> list[Event]:
        return [r for r in self.records if isinstance(r, Event)]

    def engines(self) -> dict[str, int]:
        """How many GEMMs each engine ran."""
        out: dict[str, int] = {}
        for g in self.gemms:
            out[g.engine] = out.get(g.engine, 0) + 1
        return out

    def summary(self) -> str:
        """Events in full, GEMMs grouped by (label, engine) with counts."""
        lines = [str(e) for e in self.events]
        groups: dict[tuple[str, str, str], int] = {}
        first: dict[tuple[str, str, str], GemmDecision] = {}
        for g in self.gemms:
            key = (g.label, g.engine, g.reason)
            groups[key] = groups.get(key, 0) + 1
            first.setdefault(key, g)
        for key, count in groups.items():
            lines.append(f"{count} x {first[key]}")
        return "\n".join(lines)

    def __str__(self) -> str:
        """One line per record; a run of identical lines once, ``"35 x "`` before it."""
        lines: list[list] = []  # [count, text]
        for r in self.records:
            text = str(r)
            if lines and lines[-1][1] == text:
                lines[-1][0] += 1
            else:
                lines.append([1, text])
        return "\n".join(f"{c} x {t}" if c > 1 else t for c, t in lines)

    def __len__(self) -> int:
        return len(self.records)


class explain:
    """Collect the decisions of the calls in the ``with`` body.

    Examples
    --------
    >>> import numpy as np, mpqr
    >>> with mpqr.explain() as trace:
    ...     _ = mpqr.matmul(np.ones((4, 3)), np.ones((3, 2)), precision="fp64")
    >>> trace.gemms[0].engine
    'native-fp64'
    """

    def __init__(self) -> None:
        self.trace = Trace()
        self._token: contextvars.Token | None = None

    def __enter__(self) -> Trace:
        self._token = _active.set((*_active.get(), self.trace))
        return self.trace

    def __exit__(self, *exc: object) -> None:
        assert self._token is not None
        _active.reset(self._token)


def _emit(rec: GemmDecision | Event) -> None:
    for t in _active.get():
        t.records.append(rec)
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug("%s", rec)


def record_gemm(decision: GemmDecision) -> None:
    _emit(decision)


def record_event(kind: str, message: str, **data: Any) -> None:
    """Record a non-GEMM decision (method choice, fallback, iteration count...)."""
    _emit(Event(kind, message, data))


def tracing() -> bool:
    """True when some ``explain()`` is collecting (lets callers skip costly reasons)."""
    return bool(_active.get()) or logger.isEnabledFor(logging.DEBUG)
