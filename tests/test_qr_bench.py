"""The bench command line at tiny sizes: the accuracy table it writes is consistent, every
topic writes its JSON and its PNG chart (or says why not), and ``bench`` alone lists them."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from mpqr.__main__ import main as mpqr_main
from mpqr.bench import accuracy as bench_accuracy


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


# --- the bench command line: one registry, JSON and PNG from every topic --------------
# every row kind of ``bench gemm`` (real, complex, Gram with two split depths) at tiny
# sizes: its default complex and Gram shapes take a minute on the CPU
TINY = {"gemm": ["--cpu", "--shapes", "64x48x32", "--complex-shapes", "24x16x8",
                 "--gram-shapes", "64x16", "--gram-levels", "0,1", "--repeat", "1"],
        "qr": ["--cpu", "--shapes", "96x24", "--precisions", "fp64", "--modes", "reduced",
               "--repeat", "1"],
        "lstsq": ["--cpu", "--shapes", "120x10", "--configs", "auto/auto/gelsd",
                  "--repeat", "1"],
        "accuracy": ["--cpu", "--n", "16", "--m", "32", "--precisions", "fp64",
                     "--methods", "householder-tiled", "--kinds", "normal"]}


def test_bench_without_topic_lists_the_registry(capsys):
    assert mpqr_main(["bench"]) == 0
    out = capsys.readouterr().out
    for topic in TINY:
        assert f"\n  {topic} " in out, out


def test_bench_unknown_topic_names_the_choices(capsys):
    with pytest.raises(SystemExit):
        mpqr_main(["bench", "nope"])
    assert "bench needs one of gemm, qr, lstsq, accuracy" in capsys.readouterr().err


@pytest.mark.parametrize("with_matplotlib", [True, False])
@pytest.mark.parametrize("topic", sorted(TINY))
def test_bench_writes_json_and_png(topic, with_matplotlib, tmp_path, capsys, monkeypatch):
    if with_matplotlib:
        pytest.importorskip("matplotlib")
    else:
        monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails as if absent
    js, png = tmp_path / f"{topic}.json", tmp_path / f"{topic}.png"
    assert mpqr_main(["bench", topic, *TINY[topic], "--json", str(js), "--png", str(png)]) == 0
    assert json.loads(js.read_text())["environment"]["backend"] == "numpy"
    out = capsys.readouterr().out
    if with_matplotlib:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    else:
        assert not png.exists() and "matplotlib not installed" in out


def test_bench_qr_pivoting_rows(tmp_path):
    """``bench qr --pivoting``: unpivoted baselines, geqp3 on the host and the pivoted rows,
    with backward errors at the precisions' levels."""
    path = tmp_path / "piv.json"
    rc = mpqr_main(["bench", "qr", "--pivoting", "--cpu", "--shapes", "150x140",
                    "--repeat", "1", "--json", str(path)])
    assert rc == 0
    rows = json.loads(path.read_text())["results"]
    names = [r["precision"] for r in rows]
    assert names[:3] == ["unpivoted-float64", "unpivoted-float32", "scipy-geqp3-float64"]
    piv = {r["precision"]: r for r in rows if r.get("pivoting")}
    assert set(piv) == {"auto", "fp32-emulated", "fp16"}
    assert piv["auto"]["backward_error"] <= 10 * 150 * 2.0**-53
    assert piv["fp32-emulated"]["backward_error"] <= 10 * 150 * 2.0**-24
    assert piv["fp16"]["backward_error"] <= 10 * 150 * 2.0**-11
    assert "speedup_vs_geqp3" in piv["auto"] and "speedup_vs_geqp3" not in piv["fp16"]


@pytest.mark.parametrize("dd", [True, False])
def test_bench_orthogonality_against_a_long_double_reference(monkeypatch, dd):
    # with a double-double Gram kernel (CuPy's; here the NumPy backend's portable one,
    # switched on) ||Q^T Q - I||_F comes from a double-double Q^T Q, else from a GEMM
    from mpqr.backends.numpy.backend import NumpyBackend

    from mpqr.bench import qr as bench_qr

    monkeypatch.setattr(NumpyBackend, "gram_dd_max_n", 128 if dd else 0)
    rng = np.random.default_rng(3)
    q = np.linalg.qr(rng.standard_normal((4096, 16)))[0]
    q = q + 1e-13 * rng.standard_normal(q.shape)
    ql = q.astype(np.longdouble)
    ref = float(np.linalg.norm((ql.T @ ql - np.eye(16, dtype=np.longdouble)).astype(np.float64)))
    got = bench_qr.orthogonality(np, q, 16)
    assert abs(got - ref) <= (1e-6 if dd else 1e-2) * ref
