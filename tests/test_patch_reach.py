"""What ``mpqr.compat.scipy.patch()`` reaches, exactly as the quick start states it:
``scipy.linalg``'s attributes and module globals bound to SciPy's functions (imported
before or during the block), not function locals bound before the block began."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import mpqr.compat.scipy as ms
import numpy as np
import pytest
from mpqr.compat._patch import original

scipy_linalg = pytest.importorskip("scipy.linalg")
QUICKSTART = Path(__file__).resolve().parents[1] / "docs" / "quickstart.md"


def _module(name: str, source: str) -> types.ModuleType:
    mod = types.ModuleType(name)
    sys.modules[name] = mod
    exec(source, mod.__dict__)
    return mod


def _is_mpqr(f) -> bool:
    return f is not original("qr") and f.__module__.startswith("mpqr.")


def test_the_quickstart_says_what_is_reached():
    text = " ".join(QUICKSTART.read_text().split())
    assert "wherever the functions were imported from" not in text
    assert "the attributes of `scipy.linalg`" in text
    assert "every module global bound to them" in text
    assert "It does not reach a function's local variables bound before the block" in text


def test_reached_and_not_reached():
    before = _module("_mpqr_patch_reach_before", "from scipy.linalg import qr\n")

    def running():  # a function already running when the block begins
        from scipy.linalg import qr as local_qr

        yield local_qr
        yield local_qr

    gen = running()
    bound_before = next(gen)
    keep = {"qr": scipy_linalg.qr}  # a copy in a container
    try:
        with ms.patch():
            # reached: the attribute, a module global imported before, one imported now
            assert _is_mpqr(scipy_linalg.qr)
            assert _is_mpqr(before.qr)
            during = _module("_mpqr_patch_reach_during", "from scipy.linalg import qr\n")
            assert _is_mpqr(during.qr)

            def inside():
                from scipy.linalg import qr

                return qr

            assert _is_mpqr(inside())  # a local import run inside the block
            # not reached: a local bound before the block, a copy in a container
            assert next(gen) is bound_before is original("qr")
            assert keep["qr"] is original("qr")
            # and the reached names compute mpqr's factorization: diag(R) >= 0
            a = np.random.default_rng(0).standard_normal((6, 4))
            _, r = before.qr(a, mode="economic")
            assert np.all(np.diag(r) >= 0)
        # restored, for modules loaded before and during the block
        assert scipy_linalg.qr is original("qr")
        assert before.qr is original("qr") and during.qr is original("qr")
    finally:
        for name in ("_mpqr_patch_reach_before", "_mpqr_patch_reach_during"):
            sys.modules.pop(name, None)
