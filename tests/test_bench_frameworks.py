"""``python -m mpqr bench frameworks`` at its tiny size on the CPU (CPU tensors routed):
every torch row is timed patched and unpatched, routed, and as accurate as stated."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from mpqr.__main__ import main as mpqr_main


def test_bench_frameworks_tiny(tmp_path, monkeypatch):
    monkeypatch.setattr("mpqr.bench.frameworks._gpu", lambda: False)
    path = tmp_path / "fw.json"
    assert mpqr_main(["bench", "frameworks", "--size", "tiny", "--repeat", "2",
                      "--json", str(path)]) == 0
    rows = json.loads(path.read_text())["results"]
    torch_rows = [r for r in rows if r["call"].startswith("torch")]
    assert [(r["call"], r["dtype"]) for r in torch_rows] == [
        ("torch.linalg.qr", "float32"), ("torch.linalg.qr", "bfloat16"),
        ("torch.linalg.lstsq", "float64")]
    for r in torch_rows:
        assert r["routed"] and r["patched (ms)"] > 0 and r["unpatched (ms)"] > 0
    f32, bf16, ls = torch_rows
    u32, u16 = 2.0**-24, 2.0**-8
    assert f32["patched errors"]["backward error"] <= 8 * 32 * u32
    assert f32["patched errors"]["orthogonality"] <= 8 * 32 * u32
    # bfloat16 results: the rounding of Q and R to bfloat16 dominates
    assert bf16["patched errors (bfloat16 Q, R)"]["backward error"] <= 8 * u16
    assert "not implemented for 'BFloat16'" in bf16["torch_bfloat16"]
    assert ls["relative difference of solutions"] <= 1e-12
    assert rows[-1] == {"call": "cupy.linalg.qr", "skipped": "no CuPy with a GPU"}
