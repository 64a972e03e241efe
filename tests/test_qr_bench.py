"""The accuracy bench script at a tiny size: the table it writes is consistent."""

from __future__ import annotations

import json

import numpy as np

from mpqr.tools import bench_accuracy


def test_bench_accuracy_small(tmp_path, capsys):
    path = tmp_path / "acc.json"
    rc = bench_accuracy.main(["--n", "48", "--m", "96", "--cpu", "--precisions", "fp64,fp16",
                              "--methods", "householder-tiled", str(path)])
    assert rc == 0
    out = json.loads(path.read_text())
    assert len(out["rows"]) == 4 * 2
    for row in out["rows"]:
        u = 2.0**-53 if row["precision"] == "fp64" else 2.0**-11
        assert row["backward_error"] <= 2 * np.sqrt(48) * u
        assert row["orthogonality"] <= np.sqrt(48) * u
    assert "householder-tiled" in capsys.readouterr().out


def test_matrix_kinds_have_the_requested_condition():
    rng = np.random.default_rng(0)
    for kind in ("arithmetic", "geometric"):
        a = bench_accuracy.make_matrix(kind, 80, 40, 1e4, rng)
        assert abs(np.linalg.cond(a) / 1e4 - 1) < 1e-8
