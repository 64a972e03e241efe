"""pytest plugin: the collected test modules' ``linalg.qr``/``linalg.lstsq`` (and bare
``qr``/``lstsq``) point at ``mpqr.compat.numpy``; ``numpy.linalg`` itself is left alone,
since mpqr's NumPy backend calls it. Call counts go to ``$MPQR_ROUTED_CALLS``."""

from __future__ import annotations

import types

import mpqr.compat.numpy as mn
import numpy.linalg as linalg
from counting import counted, dump


class _Linalg(types.ModuleType):
    def __getattr__(self, name):
        return getattr(linalg, name)


_proxy = _Linalg("numpy.linalg (qr and lstsq by mpqr)")
_proxy.qr = counted(mn, "qr")
_proxy.lstsq = counted(mn, "lstsq")


def pytest_collection_modifyitems(session, config, items):
    for mod in {id(m): m for m in (getattr(i, "module", None) for i in items) if m}.values():
        if getattr(mod, "linalg", None) is linalg:
            mod.linalg = _proxy
        for name in ("qr", "lstsq"):
            if getattr(mod, name, None) is getattr(linalg, name):
                setattr(mod, name, getattr(_proxy, name))


def pytest_unconfigure(config):
    dump()
