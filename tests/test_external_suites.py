"""SciPy's and NumPy's own QR and least-squares tests, run unmodified through mpqr's front
ends (``mpqr.compat.scipy.patch()``; ``mpqr.compat.numpy`` in place of ``numpy.linalg``'s
``qr``/``lstsq``), each in a pytest subprocess with a routing plugin from
``tests/external/``. Each must pass and must have reached mpqr."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent


def _tests_of(package: str) -> Path | None:
    mod = pytest.importorskip(package)
    path = Path(mod.__file__).parent / "linalg" / "tests"
    return path if path.is_dir() else None


def _run(tmp_path, plugin, files, select):
    calls = tmp_path / "calls.json"
    # An empty ini of its own: the nested run takes no configuration from any folder above
    # the files it runs (a venv inside a checkout puts them under this project's pyproject,
    # whose addopts -n/--dist need the xdist plugin switched off below).
    ini = tmp_path / "pytest.ini"
    ini.write_text("[pytest]\n")
    env = {**os.environ, "MPQR_ROUTED_CALLS": str(calls),
           "PYTHONPATH": os.pathsep.join([str(HERE / "external"),
                                          os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", plugin, "-p", "no:cacheprovider",
           "-p", "no:xdist", "-p", "no:randomly", "-W", "ignore::pytest.PytestUnknownMarkWarning",
           "-c", str(ini), "-o", "addopts=", "--rootdir", str(tmp_path), "-k", select, *map(str, files)]
    out = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=600)
    tail = (out.stdout + out.stderr)[-3000:]
    assert out.returncode == 0, tail
    return json.loads(calls.read_text()), tail


@pytest.mark.parametrize("files, select, routed", [
    (("test_decomp.py",), "QR or qr or RQ or rq", {"qr", "rq", "qr_multiply"}),
    (("test_basic.py", "test_batch.py"), "lstsq or Lstsq or qr or rq",
     {"lstsq", "qr", "rq", "qr_multiply"}),
])
def test_scipy_linalg_suites_under_the_patch(tmp_path, files, select, routed):
    tests = _tests_of("scipy")
    present = [tests / f for f in files if tests and (tests / f).exists()]
    if not present:
        pytest.skip("SciPy ships without its tests here")
    calls, tail = _run(tmp_path, "route_scipy", present, select)
    assert routed <= {k for k, v in calls.items() if v > 0}, (calls, tail)


def test_numpy_linalg_suite_through_compat_numpy(tmp_path):
    tests = _tests_of("numpy")
    present = [tests / f for f in ("test_linalg.py", "test_regression.py")
               if tests and (tests / f).exists()]
    if not present:
        pytest.skip("NumPy ships without its tests here")
    calls, tail = _run(tmp_path, "route_numpy", present, "qr or QR or lstsq or Lstsq")
    assert calls.get("qr", 0) > 0 and calls.get("lstsq", 0) > 0, (calls, tail)


def test_nested_run_ignores_the_configuration_above_its_files(tmp_path):
    """A venv inside a checkout: the test files sit below the project's pyproject.toml."""
    site = tmp_path / "checkout" / "venv" / "lib" / "site-packages" / "pkg" / "linalg" / "tests"
    site.mkdir(parents=True)
    (tmp_path / "checkout" / "pyproject.toml").write_text(
        (HERE.parent / "pyproject.toml").read_text())
    (site / "test_tiny.py").write_text(
        "import numpy as np, scipy.linalg\n\n"
        "def test_qr():\n"
        "    q, r = scipy.linalg.qr(np.eye(3))\n"
        "    assert np.allclose(q @ r, np.eye(3))\n")
    run = tmp_path / "run"
    run.mkdir()
    calls, tail = _run(run, "route_scipy", [site / "test_tiny.py"], "qr")
    assert calls.get("qr", 0) == 1, (calls, tail)
    assert "1 passed" in tail, tail
