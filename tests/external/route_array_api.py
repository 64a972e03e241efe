"""pytest plugin: every test under ``mpqr.compat.array_api.patch()`` (the patch entered
per test, after the suite's own imports, so the namespaces it loads on the way are
plugged by the import hook too); the plugged calls that reached mpqr, counted from the
``mpqr.explain()`` trace as ``<namespace>.<function>``, go to ``$MPQR_ROUTED_CALLS``."""

from __future__ import annotations

import pytest
from counting import calls, dump
from mpqr.compat.array_api import patch

import mpqr


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    with mpqr.explain() as trace, patch():
        try:
            return (yield)
        finally:
            for e in trace.events:
                if e.kind == "array-api" and e.data.get("route") != "native":
                    calls[f"{e.data['namespace']}.{e.data['function']}"] += 1


def pytest_unconfigure(config):
    dump()
