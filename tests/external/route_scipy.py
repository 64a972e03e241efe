"""pytest plugin: the whole session under ``mpqr.compat.scipy.patch()``; at the end, the
number of calls that reached mpqr's front ends goes to ``$MPQR_ROUTED_CALLS``."""

from __future__ import annotations

import collections
import functools
import json
import os

import mpqr.compat.scipy as ms

_calls: collections.Counter[str] = collections.Counter()
_ctx = None


def _counted(name):
    f = getattr(ms, name)

    @functools.wraps(f)  # the suites inspect signatures
    def g(*args, **kwargs):
        _calls[name] += 1
        return f(*args, **kwargs)

    return g


def pytest_configure(config):
    global _ctx
    for name in ("qr", "rq", "qr_multiply", "lstsq"):
        setattr(ms, name, _counted(name))
    _ctx = ms.patch()
    _ctx.__enter__()


def pytest_unconfigure(config):
    _ctx.__exit__(None, None, None)
    with open(os.environ["MPQR_ROUTED_CALLS"], "w") as f:
        json.dump(dict(_calls), f)
