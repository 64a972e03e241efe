"""Host memory as both backends use it: host arrays and datasets read in pieces
(:mod:`mpqr.backends.host.arrays`), the staging of pieces between host and device
(:mod:`mpqr.backends.host.staging`) and the host BLAS's threads (:mod:`mpqr.backends.host.blas`)."""

import importlib
from typing import Any

_SUBMODULES = ("arrays", "blas", "pstrf", "staging")


def __getattr__(name: str) -> Any:
    # the names of the earlier module mpqr.backends.host (now .arrays), looked up late;
    # a submodule not yet imported is the import system's to find
    if name in _SUBMODULES or name.startswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.arrays"), name)
