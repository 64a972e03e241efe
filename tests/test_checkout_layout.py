"""A virtual environment created inside the checkout (``python3 -m venv venv``, ``env``,
``.venv``...) is left alone by the README's test command: ruff does not lint it and pytest
does not collect from it. (The nested pytest runs over NumPy's/SciPy's own test files
inside such a venv: tests/test_external_suites.py.)"""

from __future__ import annotations

import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
VENV_NAMES = ("venv", ".venv", "env", "venv-3.11")


def _checkout_with_venvs(tmp_path: Path) -> Path:
    """The project's configuration and one real (pip-less) venv per usual name, each
    holding Python files that fail lint and a test that fails."""
    co = tmp_path / "checkout"
    co.mkdir()
    shutil.copy(ROOT / "pyproject.toml", co)
    (co / "tests").mkdir()
    (co / "tests" / "test_ok.py").write_text("def test_ok():\n    assert True\n")
    bad = "import os\n\n\ndef test_bad():\n    assert False\n"
    for name in VENV_NAMES:
        venv.EnvBuilder(system_site_packages=True, with_pip=False).create(co / name)
        site = next((co / name / "lib").glob("python*/site-packages"), co / name / "Lib")
        for where in (co / name / "bin", site):
            where.mkdir(parents=True, exist_ok=True)
            (where / "test_tool.py").write_text(bad)
    return co


def test_ruff_skips_a_venv_inside_the_checkout(tmp_path):
    pytest.importorskip("ruff")
    co = _checkout_with_venvs(tmp_path)
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=co,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    # the check does lint what is not a venv
    (co / "tests" / "test_lint.py").write_text("import os\n")
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=co,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "tests/test_lint.py" in out.stdout, out.stdout


def test_pytest_collects_nothing_from_a_venv_inside_the_checkout(tmp_path):
    co = _checkout_with_venvs(tmp_path)
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                          "-o", "addopts=", "-p", "no:cacheprovider"], cwd=co,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "tests/test_ok.py::test_ok" in out.stdout and "test_bad" not in out.stdout, out.stdout
