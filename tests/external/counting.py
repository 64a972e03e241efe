"""What the routing plugins share: mpqr front ends that count their calls, and the counts
written to ``$MPQR_ROUTED_CALLS`` at the end of the session."""

from __future__ import annotations

import collections
import functools
import json
import os
from typing import Any

calls: collections.Counter[str] = collections.Counter()


def counted(module: Any, name: str) -> Any:
    """``module.name`` counting its calls (signature kept: the suites inspect it)."""
    f = getattr(module, name)

    @functools.wraps(f)
    def g(*args, **kwargs):
        calls[name] += 1
        return f(*args, **kwargs)

    return g


def dump() -> None:
    with open(os.environ["MPQR_ROUTED_CALLS"], "w") as f:
        json.dump(dict(calls), f)
