"""``python -m mpqr bench arrayapi`` at a tiny size on the CPU: every case runs plugged and
native, the plugged runs reached mpqr, and their results agree with the native ones."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mpqr.__main__ import main as mpqr_main

pytest.importorskip("sklearn")


def test_bench_arrayapi_tiny(tmp_path):
    js = tmp_path / "aa.json"
    rc = mpqr_main(["bench", "arrayapi", "--cpu", "--rows", "600", "--cols", "12",
                    "--components", "4", "--repeat", "1", "--json", str(js)])
    assert rc == 0
    out = json.loads(js.read_text())
    assert out["environment"]["backend"] == "numpy"
    rows = {(r["case"], r["dtype"]): r for r in out["results"]}
    assert set(rows) == {(c, d) for c in ("pca-full", "pca-randomized", "ridge-svd",
                                          "randomized-svd") for d in ("float64", "float32")}
    for (case, dtype), r in rows.items():
        variants = {"mpqr"} | ({"mpqr-fp32-emulated"} if dtype == "float32" else set())
        assert set(r["speedup"]) == variants
        u = np.finfo(dtype).eps
        for v in variants:
            # the tall SVDs, and the randomized range finder's QRs (its last SVD, of a
            # 14 x 12 matrix, is no tall or wide shape: the namespace's own)
            want = "linalg.qr" if "randomized" in case else "linalg.svd"
            assert r["plugged_calls"][v].get(want, 0) >= 1, (case, v)
            # the leading subspaces are separated by a 10% gap (kappa ~ 10 x 0.9^-k)
            for key, val in r["agreement"][v].items():
                assert val <= 1e3 * 600 * u, (case, dtype, v, key, val)
        assert r["plugged_calls"]["native"] == {}
