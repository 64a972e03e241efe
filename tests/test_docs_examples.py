"""The examples page shows what the scripts print: each script in ``docs/examples/`` runs
at its default sizes (the page's outputs are from those) and its output matches the
committed ``docs/snippets/*.txt``: the words exactly, every number within an order of
magnitude (BLAS builds and cores change the last digits and the roundings, not the size of
an error). The page's own claims about the numbers are checked against the same run.
(tests/test_docs.py checks the scripts' numbers against references at smaller sizes.)"""

from __future__ import annotations

import math
import re
import runpy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?")
EXAMPLES = ("low_rank", "krylov_basis", "polynomial_regression")


def _printed(name: str, capsys) -> str:
    ns = runpy.run_path(str(DOCS / "examples" / f"{name}.py"), run_name=f"docs_ex_{name}")
    capsys.readouterr()
    ns["main"]()
    return capsys.readouterr().out


def _same_within_a_decade(printed: str, committed: str) -> list[str]:
    """Where the two outputs differ beyond the tolerance (empty: they match)."""
    diffs = []
    for i, (p, c) in enumerate(zip(printed.splitlines(), committed.splitlines(), strict=True)):
        if NUMBER.sub("#", p).split() != NUMBER.sub("#", c).split():
            diffs.append(f"line {i + 1} words: {p!r} != {c!r}")
            continue
        for x, y in zip(map(float, NUMBER.findall(p)), map(float, NUMBER.findall(c)),
                        strict=True):
            if (x == 0) != (y == 0) or (x and abs(math.log10(abs(x) / abs(y))) > 1):
                diffs.append(f"line {i + 1}: {x:g} against {y:g}: {p!r} != {c!r}")
    return diffs


def test_compare_helper_fails_on_a_wrong_order_of_magnitude():
    assert _same_within_a_decade("a 1.0e-15 b 3", "a 2.9e-15 b 3") == []
    assert _same_within_a_decade("a 6.8e-16", "a 2.9e-08")
    assert _same_within_a_decade("a 1.0 b", "a 1.0 c")
    with pytest.raises(ValueError):
        _same_within_a_decade("one line", "one line\ntwo lines")


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_prints_what_the_page_shows(name, capsys):
    printed = _printed(name, capsys)
    committed = (DOCS / "snippets" / f"{name}.txt").read_text()
    assert _same_within_a_decade(printed, committed) == [], (
        f"docs/snippets/{name}.txt differs from what docs/examples/{name}.py prints:\n"
        f"{printed}")


def test_low_rank_claim_on_the_page(capsys):
    """The page says how closely the singular values agree with LAPACK's."""
    page = (DOCS / "examples.md").read_text()
    section = page.split("## Low-rank approximation")[1].split("\n## ")[0]
    claimed = float(re.search(r"agree\s+with\s+LAPACK's\s+to\s+≈\s+([\d.e+-]+)", section).group(1))
    rows = [ln.split() for ln in _printed("low_rank", capsys).splitlines()[1:]]
    for precision in ("fp64", "fp32-emulated"):
        worst = max(float(r[-1]) for r in rows if r[0] == precision)
        assert claimed / 10 <= worst <= claimed * 10, (precision, worst, claimed)
