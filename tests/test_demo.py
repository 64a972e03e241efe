"""``python -m mpqr demo``: the problem is built where the arrays live, every step is
announced before it runs, and the numbers it prints are right."""

from __future__ import annotations

import re

import numpy as np
import pytest

from mpqr.cli import demo


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


# -- the GPU kernel warm-up (its CPU-side parts; the compiles themselves run on a GPU) --

def test_warmup_stores_mpqr_kernels_by_file_and_reads_them_back_exactly():
    """A source that embeds one of mpqr's .cu files is stored by name with what CuPy put
    around it, so a warm-up always compiles the current file, byte for byte."""
    from pathlib import Path

    from mpqr.backends.cupy import warmup as w

    path = sorted(Path(w.__file__).parent.joinpath("kernels").glob("*.cu"))[0]
    source = "#include <cupy/carray.cuh>\n" + path.read_text() + "\n// tail"
    entry = w._source_entry(source)
    assert entry["file"] == path.name and "source" not in entry
    assert w._source_of(entry) == source
    other = "extern \"C\" __global__ void k() {}"
    assert w._source_entry(other) == {"source": other}
    assert w._source_of(w._source_entry(other)) == other


def test_warmup_stores_appended_kernel_files_by_name():
    """A kernel file with another appended to it (``modules.functions(after=...)``) is
    stored by both names, so that an edit of the appended file reaches the warm-up."""
    from pathlib import Path

    from mpqr.backends.cupy import warmup as w

    kernels = Path(w.__file__).parent / "kernels"
    first = (kernels / "panel_cholqr.cu").read_text()
    second = (kernels / "panel_fused.cu").read_text()
    source = "#include <cupy/carray.cuh>\n" + first + second + "\n// tail"
    entry = w._source_entry(source)
    assert (entry["file"], entry["after"]) == ("panel_cholqr.cu", ["panel_fused.cu"])
    assert entry["tail"] == "\n// tail" and second not in entry["head"] + entry["tail"]
    assert w._source_of(entry) == source


def test_warmup_skips_a_list_it_cannot_use(tmp_path):
    """A missing or unreadable kernel list is reported, never an exception; without CuPy
    there is nothing to compile."""
    from mpqr.backends.cupy import warmup as w

    bad = tmp_path / "k.json.gz"
    bad.write_bytes(b"not gzip")
    done = w.warm(bad)
    assert done["kernels"] == 0 and done["skipped"]
    try:
        import cupy  # noqa: F401
    except ImportError:
        assert done["skipped"] == "CuPy is not installed"
    else:
        assert done["skipped"].startswith("no usable kernel list (BadGzipFile")


def test_shipped_kernel_list_names_existing_sources():
    from mpqr.backends.cupy import warmup as w

    manifest = w.load()
    assert manifest["cupy"] and manifest["entries"]
    for e in manifest["entries"]:
        assert ("file" in e) != ("source" in e), e.keys()
        assert isinstance(e["options"], list) and isinstance(e["kwargs"], dict)
        assert w._source_of(e)  # a stored file name still exists


def test_warmup_command_without_a_gpu(capsys):
    from mpqr.cli import warmup

    try:
        import cupy  # noqa: F401
    except ImportError:
        assert warmup.main([]) == 0
        assert "no CuPy: nothing to compile" in capsys.readouterr().out
    else:
        pytest.skip("CuPy is installed: the warm-up compiles (GPU job)")


def test_every_package_directory_is_in_the_distribution():
    """pyproject's explicit package list names every directory of Python modules (a
    subpackage left out is missing from a non-editable install)."""
    from pathlib import Path

    import tomllib

    root = Path(__file__).resolve().parents[1]
    conf = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(conf["packages"])
    dirs = conf["package-dir"]
    found = set()
    for pkg, d in dirs.items():
        for init in (root / d).rglob("__init__.py"):
            rel = init.parent.relative_to(root / d)
            found.add(".".join([pkg, *rel.parts]) if rel.parts else pkg)
    assert found <= listed, sorted(found - listed)
