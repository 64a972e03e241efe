"""``python -m mpqr demo``: the problem is built where the arrays live, every step is
announced before it runs, and the numbers it prints are right."""

from __future__ import annotations

import re

import numpy as np
import pytest

from mpqr.tools import demo


def test_demo_announces_each_step_and_reports_accurate_rows(capsys):
    assert demo.main(["--cpu", "--m", "400", "--n", "12", "--cond", "1e3"]) == 0
    out = capsys.readouterr().out
    assert "building A and b ..." in out
    assert re.search(r"demo done in \d+\.\d s", out)
    # float64 routes at working precision: backward error and orthogonality ~ u * size
    for label in ("numpy.linalg.qr (LAPACK)", "mpqr.qr precision=auto"):
        line = next(ln for ln in out.splitlines() if ln.startswith(label))
        back, orth = (float(v) for v in line.split()[-2:])
        assert back < 400 * 2.0**-53 and orth < 400 * 2.0**-53, line
    line = next(ln for ln in out.splitlines() if ln.startswith("mpqr.lstsq auto"))
    assert float(line.split()[-1]) < 1e3 * 400 * 2.0**-53, line


def test_demo_problem_is_built_on_the_arrays_namespace(monkeypatch):
    """No host factorization: every draw and QR goes through the namespace handed in (a
    2^20 x 256 host QR was what made the demo slow on a GPU machine)."""
    host_qr, used = np.linalg.qr, []

    def no_host_qr(*args, **kwargs):
        raise AssertionError("the demo factored on the host")

    class Linalg:
        def __getattr__(self, name):
            return getattr(np.linalg, name)

        def qr(self, x):
            used.append("qr")
            return host_qr(x)

    class Device:
        """NumPy seen as another namespace, which records what the demo asks of it."""

        linalg = Linalg()

        def __getattr__(self, name):
            used.append(name)
            return getattr(np, name)

    monkeypatch.setattr(np.linalg, "qr", no_host_qr)
    a, b, anorm = demo._problem(Device(), 300, 10, 1e4)
    assert used.count("qr") == 2 and "random" in used
    s = np.linalg.svd(a, compute_uv=False)
    assert s[0] == pytest.approx(anorm, rel=1e-12)
    assert s[0] / s[-1] == pytest.approx(1e4, rel=1e-8)
    assert b.shape == (300,)
