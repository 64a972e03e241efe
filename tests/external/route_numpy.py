"""pytest plugin: the collected test modules' ``linalg.qr``/``linalg.lstsq`` (and bare
``qr``/``lstsq``) point at ``mpqr.compat.numpy``; ``numpy.linalg`` itself is left alone,
since mpqr's NumPy backend calls it. Call counts go to ``$MPQR_ROUTED_CALLS``."""

from __future__ import annotations

import collections
import functools
import json
import os
import types

import mpqr.compat.numpy as mn
import numpy.linalg as linalg

_calls: collections.Counter[str] = collections.Counter()


def _counted(name):
    f = getattr(mn, name)

    @functools.wraps(f)  # the suites inspect signatures
    def g(*args, **kwargs):
        _calls[name] += 1
        return f(*args, **kwargs)

    return g


class _Linalg(types.ModuleType):
    def __getattr__(self, name):
        return getattr(linalg, name)


_proxy = _Linalg("numpy.linalg (qr and lstsq by mpqr)")
_proxy.qr = _counted("qr")
_proxy.lstsq = _counted("lstsq")


def pytest_collection_modifyitems(session, config, items):
    for mod in {id(m): m for m in (getattr(i, "module", None) for i in items) if m}.values():
        if getattr(mod, "linalg", None) is linalg:
            mod.linalg = _proxy
        for name in ("qr", "lstsq"):
            if getattr(mod, name, None) is getattr(linalg, name):
                setattr(mod, name, getattr(_proxy, name))


def pytest_unconfigure(config):
    with open(os.environ["MPQR_ROUTED_CALLS"], "w") as f:
        json.dump(dict(_calls), f)
