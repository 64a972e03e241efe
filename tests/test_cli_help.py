"""The command line explains itself: ``python -m mpqr --help`` names its arguments, the
bench list is plain text, ``python -m mpqr demo --help`` gives every option's meaning and
default."""

from __future__ import annotations

import re

import pytest

from mpqr.__main__ import main


def _help(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 0
    return capsys.readouterr().out


def test_top_level_help_explains_every_argument(capsys):
    out = _help(["--help"], capsys)
    assert "rest" not in out, out
    assert re.search(r"^  ARGS +the command's own arguments", out, re.M), out
    for command in ("demo:", "warmup:", "bench:"):
        assert command in out, out


def test_bench_list_is_plain_text(capsys):
    assert main(["bench"]) == 0
    out = capsys.readouterr().out
    assert "``" not in out and "qr " in out, out
    assert "mpqr.qr against cuSOLVER (cupy.linalg.qr)" in out


def test_demo_help_gives_meaning_and_default_of_each_option(capsys):
    out = _help(["demo", "--help"], capsys)
    assert "``" not in out
    flat = " ".join(out.split())
    assert "--m M rows of A (default: 1048576 on a GPU, 6000 on the CPU)" in flat, flat
    assert "--n N columns of A (default: 256 on a GPU, 100 on the CPU)" in flat, flat
    assert re.search(r"--cond COND condition number of A: .*\(default: 10000\)", flat), flat


def test_demo_defaults_are_the_ones_the_help_states(monkeypatch, capsys):
    """The help's defaults are the demo's: read back from its header line on the CPU."""
    import mpqr.cli.demo as demo

    seen = {}

    def fake_problem(xp, m, n, cond, seed=0):
        seen.update(m=m, n=n, cond=cond)
        raise KeyboardInterrupt  # stop before any factorization

    monkeypatch.setattr(demo, "_problem", fake_problem)
    with pytest.raises(KeyboardInterrupt):
        demo.main(["--cpu"])
    assert seen == {"m": 6000, "n": 100, "cond": 1e4}
