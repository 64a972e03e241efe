"""Host memory as both backends use it: host arrays and datasets read in pieces
(:mod:`mpqr.backends.host.arrays`), the staging of pieces between host and device
(:mod:`mpqr.backends.host.staging`) and the host BLAS's threads (:mod:`mpqr.backends.host.blas`)."""

from typing import Any


def __getattr__(name: str) -> Any:
    # the names of the earlier module mpqr.backends.host (now .arrays), looked up late
    from mpqr.backends.host import arrays

    return getattr(arrays, name)
