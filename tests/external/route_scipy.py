"""pytest plugin: the whole session under ``mpqr.compat.scipy.patch()``; at the end, the
number of calls that reached mpqr's front ends goes to ``$MPQR_ROUTED_CALLS``."""

from __future__ import annotations

import mpqr.compat.scipy as ms
from counting import counted, dump

_ctx = None


def pytest_configure(config):
    global _ctx
    for name in ("qr", "rq", "qr_multiply", "lstsq"):
        setattr(ms, name, counted(ms, name))
    _ctx = ms.patch()
    _ctx.__enter__()


def pytest_unconfigure(config):
    _ctx.__exit__(None, None, None)
    dump()
