"""The documentation stays true: examples, doctests, rendered tables, the site build.

* the scripts in ``docs/examples/`` run (small sizes, NumPy backend) and their
  numbers are checked against LAPACK references with tolerances derived from
  the precision;
* the docstring examples of the public modules pass as doctests;
* the Python blocks of the README, the quick start and the home page run, and the
  README's test command is the one ``.ci/run`` runs;
* ``docs/performance.md`` and ``docs/precision.md`` match a fresh render of
  ``bench/results/*.json``, and the explain-trace output on "How it works"
  matches what the code prints now;
* ``mkdocs build --strict`` passes (when the ``docs`` extra is installed).
"""

from __future__ import annotations

import doctest
import importlib
import json
import math
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import mpqr
from mpqr.bench import render_results as rr

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
EXAMPLES = DOCS / "examples"
U64 = 2.0**-53
U32 = 2.0**-24


def _example(name: str) -> dict:
    return runpy.run_path(str(EXAMPLES / f"{name}.py"), run_name=f"docs_example_{name}")


# --- examples -----------------------------------------------------------------------
def test_krylov_basis_svqr_vs_cholqr2():
    m = 400
    rows = _example("krylov_basis")["main"](m=m, sizes=(4, 8, 12, 16, 20), verbose=False)
    conds = [r["cond"] for r in rows]
    assert conds == sorted(conds) and conds[-1] > 1e12, conds  # the basis degrades
    for r in rows:
        k = r["k"]
        # a pass's floor is the Gram product's rounding: ~sqrt(m) u per entry, k^2 entries
        bound = k * math.sqrt(m) * U64
        assert r["svqr"] is not None and r["svqr"] <= bound, r
        assert r["svqr_backward"] <= bound, r
        if r["cond"] ** 2 * U64 < 1e-4:  # well inside CholQR2's reach: must work
            assert r["cholqr2"] is not None and r["cholqr2"] <= bound, r
        elif r["cond"] ** 2 * U64 > 1e4:  # far outside: must refuse, never a bad Q
            assert r["cholqr2"] is None and r["cholqr2_breakdown"] > 1 / math.sqrt(U64) / 10, r
        else:  # borderline: either outcome, but never a non-orthogonal Q
            assert r["cholqr2"] is None or r["cholqr2"] <= bound, r


def test_low_rank_matches_eckart_young():
    n = 40
    rows = _example("low_rank")["main"](m=800, n=n, ranks=(5, 10, 20), verbose=False)
    assert {r["precision"] for r in rows} == {"fp64", "fp32-emulated"}
    for r in rows:
        u_f = U64 if r["precision"] == "fp64" else U32
        # Householder QR backward error O(n u_f) ||A||, inherited by U, S, Vh
        tol = 10 * n * u_f * r["sigma_1"]
        assert abs(r["error"] - r["sigma_k+1"]) <= tol, r
        assert r["max_sv_error"] <= tol, r


def test_low_rank_svd_is_a_valid_svd():
    ns = _example("low_rank")
    a = ns["test_matrix"](300, 20, 0.7, np.random.default_rng(3))
    u, s, vh = mpqr.svd(a, precision="fp64")
    tol = 10 * 20 * U64
    assert np.all(np.diff(s) <= 0)
    assert np.linalg.norm(u.T @ u - np.eye(20)) <= tol
    assert np.linalg.norm(a - (u * s) @ vh) <= tol * np.linalg.norm(a)


def test_polynomial_regression():
    if not hasattr(mpqr, "lstsq"):
        pytest.skip("mpqr.lstsq is not available yet")
    pytest.importorskip("scipy.interpolate")
    small = _example("polynomial_regression")["main"](samples=1000, degree=12, knots=10,
                                                     verbose=False)
    out = _example("polynomial_regression")["main"](samples=8000, degree=12, knots=10,
                                                   verbose=False)
    assert set(out) == set(small) == {"chebyshev", "bspline", "monomial"}
    for name, r in [*out.items(), *small.items()]:
        a, y = r["a"], r["y"]
        n = a.shape[1]
        ref = r["ref"]
        s = np.linalg.svd(a, compute_uv=False)
        kappa = s[0] / s[-1]
        resid = np.linalg.norm(a @ ref - y)
        # least-squares forward-error bound (Wedin): kappa + kappa^2 ||r|| / (||A|| ||x||)
        tol = 10 * n * U64 * (kappa + kappa**2 * resid / (s[0] * np.linalg.norm(ref)))
        assert r["rank"] == n, (name, r["rank"])
        assert r["rel_diff"] <= tol, (name, r["rel_diff"], tol)
    # what the example's text says: tall-skinny, so fp16 is factored in float64 (traced),
    # and CGLS preconditioned by that R converges in a step or two for every basis; below
    # the small-input size LAPACK solves it directly in float64 (traced as such)
    for name, r in out.items():
        assert r["factored"] == "fp64" and r["path"] == "refine", (name, r["path"])
        assert 1 <= r["iterations"] <= 2, (name, r["iterations"])
    for name, r in small.items():
        assert r["factored"] == "fp64" and r["path"] == "direct", (name, r["path"])
        assert r["iterations"] == 0, (name, r["iterations"])


def _normalize_numbers(text: str) -> str:
    """Numbers (timings, residuals, iteration and GEMM counts) vary with BLAS builds;
    the methods, labels, engines and reasons must match exactly."""
    return re.sub(r"\d+(\.\d+)?(e[-+]\d+)?", "#", text)


def test_explain_trace_snippet_is_current():
    printed = _example("explain_trace")["main"]()
    committed = (DOCS / "snippets" / "explain_trace.txt").read_text()
    assert _normalize_numbers(printed) == _normalize_numbers(committed), (
        "docs/snippets/explain_trace.txt is out of date: run "
        "python docs/examples/explain_trace.py > docs/snippets/explain_trace.txt")


# --- doctests ---------------------------------------------------------------------------
DOCTEST_MODULES = [
    "mpqr.matmul",
    "mpqr.qr.api",
    "mpqr.qr.applications",
    "mpqr.lstsq.api",
    "mpqr.policy.policy",
    "mpqr.policy.precision",
    "mpqr.policy.options",
    "mpqr.policy.trace",
    "mpqr.tune",
    "mpqr.compat.scipy",
    "mpqr.compat.numpy",
    "mpqr.compat.torch",
    "mpqr.compat.cupy",
    "mpqr.backends",
]


@pytest.mark.parametrize("modname", DOCTEST_MODULES)
def test_doctests(modname):
    try:
        mod = importlib.import_module(modname)
    except ImportError as exc:  # an optional module not installed
        pytest.skip(f"{modname} not importable: {exc}")
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    saved = mpqr.get_precision()
    for test in finder.find(mod, modname):
        runner.run(test)
    assert mpqr.get_precision() == saved  # no doctest may leak a global setting
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} doctest example(s) failed in {modname}"


#: public callables whose docstrings must carry a runnable Examples section
WITH_EXAMPLES = ["qr", "lstsq", "svd", "orth", "matmul", "precision", "explain"]


@pytest.mark.parametrize("name", WITH_EXAMPLES)
def test_public_function_has_doctested_example(name):
    obj = getattr(mpqr, name)
    examples = doctest.DocTestFinder(recurse=False).find(obj, name)
    assert examples and examples[0].examples, f"mpqr.{name} has no doctest example"


# --- pages ---------------------------------------------------------------------------------
def _python_blocks(page: str) -> str:
    blocks = re.findall(r"```python\n(.*?)```", (DOCS / page).read_text(), re.S)
    # GPU blocks (they import cupy) cannot run in CPU CI, nor blocks that need a
    # dask.distributed cluster (tests/test_dask_collective.py runs that route)
    return "\n".join(b for b in blocks
                     if not re.search(r"^\s*import cupy", b, re.M) and "--8<--" not in b
                     and "with a dask.distributed cluster" not in b)


@pytest.mark.parametrize("page", ["index.md", "quickstart.md", "precision.md", "dask.md"])
def test_page_code_runs(page):
    if page == "dask.md":
        pytest.importorskip("dask")  # an optional extra: its page runs where it is installed
    code = _python_blocks(page)
    assert code.strip(), f"{page} has no Python block to run"
    env = {k: v for k, v in os.environ.items() if k != "MPQR_PRECISION"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_readme_quick_start_runs():
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert blocks, "README.md has no Python block"
    env = {k: v for k, v in os.environ.items() if k != "MPQR_PRECISION"}
    proc = subprocess.run([sys.executable, "-c", "\n".join(blocks)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_readme_test_command_is_what_ci_runs():
    """The README's test command and .ci/run's are the same line, byte for byte."""
    readme = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    ci = [ln for ln in (ROOT / ".ci" / "run").read_text().splitlines()
          if "pytest" in ln and not ln.startswith("#")]
    assert len(ci) == 1, ci
    assert any(block.strip() == ci[0] for block in readme), (
        f"README.md's test command differs from .ci/run's: {ci[0]!r}")


def test_rendered_results_are_current():
    pages = rr.updated_pages(DOCS, ROOT / "bench" / "results")
    for path, text in pages.items():
        assert path.read_text() == text, (
            f"{path.name} is out of date with bench/results: run "
            "python -m mpqr.bench.render_results")
    for src, dst in rr._chart_copies(DOCS, ROOT / "bench" / "results"):
        assert dst.is_file() and dst.read_bytes() == src.read_bytes(), f"{dst} is stale"
    assert rr.main(["--check"]) == 0


# --- the renderer on synthetic files -----------------------------------------------------
def _page(tmp_path: Path) -> tuple[Path, Path]:
    docs, results = tmp_path / "docs", tmp_path / "results"
    docs.mkdir()
    results.mkdir()
    for page, blocks in rr.BLOCKS.items():
        body = "\n".join(f"{rr._markers(b)[0]}\nstale\n{rr._markers(b)[1]}" for b in blocks)
        (docs / page).write_text(f"# Title\n\nProse before.\n\n{body}\n\nProse after.\n")
    return docs, results


def test_renderer_known_and_unknown_shapes(tmp_path):
    docs, results = _page(tmp_path)
    env = {"device": "Test GPU", "date": "2026-01-02", "mpqr": "0.1.0", "cupy": "14.2.0"}
    (results / "gemm_test.json").write_text(json.dumps({"environment": env, "results": [
        {"shape": [64, 32, 16], "config": "fp16", "precision": "fp16", "engine": "tc-fp16",
         "time_ms": 0.5, "tflops": 1.25, "err_vs_absAB": 1.5e-5, "brand_new_key": "xyz"},
        {"shape": [64, 32, 16], "config": "fp32-emulated slice_k=256", "error": "boom"}]}))
    (results / "lstsq_test.json").write_text(json.dumps({"environment": env, "n": 7,
                                                         "results": [{"nested": {"a": 1}}]}))
    (results / "mystery.json").write_text(json.dumps({"environment": {}, "weird": [1, 2]}))
    (results / "broken.json").write_text("{not json")
    (results / "chart.png").write_bytes(b"\x89PNG fake")
    assert rr.main(["--docs", str(docs), "--results", str(results), "--check"]) == 1
    assert rr.main(["--docs", str(docs), "--results", str(results)]) == 0
    assert rr.main(["--docs", str(docs), "--results", str(results), "--check"]) == 0
    perf = (docs / "performance.md").read_text()
    assert perf.startswith("# Title\n\nProse before.") and perf.endswith("Prose after.\n")
    assert "stale" not in perf
    assert "Measured on **Test GPU**, 2026-01-02" in perf and "cupy 14.2.0" in perf
    assert "64×32×16" in perf and "1.50e-05" in perf
    assert "brand_new_key" in perf and "xyz" in perf  # unknown keys are not dropped
    assert "a 1" in perf
    assert "unreadable JSON" in perf
    assert "![chart](assets/bench/chart.png)" in perf
    assert (docs / "assets" / "bench" / "chart.png").read_bytes() == b"\x89PNG fake"
    # every file is linked as JSON, copied next to the charts
    for name in ("gemm_test.json", "lstsq_test.json", "mystery.json", "broken.json"):
        assert f"[`{name}`](assets/bench/{name})" in perf, name
        assert (docs / "assets" / "bench" / name).read_bytes() == (results / name).read_bytes()
    prec = (docs / "precision.md").read_text()
    # the summary shows default configurations only, not the knob sweeps
    assert "tc-fp16" in prec and "slice_k=256" not in prec
    assert "No accuracy results" in prec


def test_renderer_accuracy_pivot(tmp_path):
    docs, results = _page(tmp_path)
    (results / "accuracy_x.json").write_text(json.dumps({
        "environment": {"device": "cpu", "date": "2026-01-02"}, "m": 8, "n": 8,
        "dtype": "float64", "cond": 1e4, "seed": 0,
        "rows": [{"kind": "normal", "cond": None, "method": "svqr", "precision": "fp64",
                  "backward_error": 1.5e-16, "orthogonality": 2.5e-17, "seconds": 0.1,
                  "engines": {"native-fp64": 3}},
                 {"kind": "geometric", "cond": 1e4, "method": "cholqr2", "precision": "fp16",
                  "error": "BreakdownError: cholqr2 broke down: details (cond 1e5)"}],
        "cond_sweep": [{"kind": "geometric", "cond": 1e6, "method": "svqr",
                        "precision": "fp64", "backward_error": 1e-16,
                        "orthogonality": 3e-17}]}))
    rr.main(["--docs", str(docs), "--results", str(results)])
    prec = (docs / "precision.md").read_text()
    assert "| svqr | fp64 | 1.50e-16 / 2.50e-17 | – |" in prec
    assert "| cholqr2 | fp16 | – | BreakdownError |" in prec
    assert "| method | precision | 1e+06 |" in prec and "3.00e-17" in prec
    perf = (docs / "performance.md").read_text()
    assert "| svqr | fp64 | 1.50e-16 / 2.50e-17 | – |" in perf  # the pivot leads the topic
    assert "[`accuracy_x.json`](assets/bench/accuracy_x.json)" in perf  # details in the JSON


def test_renderer_one_chart_and_table_per_topic_latest_per_device(tmp_path):
    docs, results = _page(tmp_path)

    def put(name, device, date, value):
        (results / name).write_text(json.dumps({
            "environment": {"device": device, "date": date},
            "results": [{"shape": [8, 8], "precision": "fp64", "time_ms": value}]}))

    put("qr_H100_2026-01-01.json", "GPU A", "2026-01-01", 1.5)
    put("qr_H100_2026-01-02.json", "GPU A", "2026-01-02", 2.5)  # latest H100
    put("qr_H200_2026-01-01.json", "GPU B", "2026-01-01", 3.5)
    put("qr_H200_2026-01-01_pm.json", "GPU B", "2026-01-01", 4.5)  # later that day
    put("qr_cpu-2core_2026-01-01.json", "cpu", "2026-01-01", 5.5)
    put("lstsq_H100_2026-01-01.json", "GPU A", "2026-01-01", 6.5)
    for stem in ("qr_H100_2026-01-01", "qr_H200_2026-01-01_pm"):
        (results / f"{stem}.png").write_bytes(b"png")
    rr.main(["--docs", str(docs), "--results", str(results)])
    perf = (docs / "performance.md").read_text()
    assert perf.count("### qr\n") == 1 and perf.count("### lstsq\n") == 1
    qr = perf.split("### qr\n")[1].split("### ")[0]
    # one chart (the latest run that has one), one table with one row per device
    assert qr.count("![") == 1 and "![qr_H200_2026-01-01_pm]" in qr, qr
    assert qr.count("| fp64 |") == 3, qr
    for shown in ("| H100 | 8×8 | fp64 | 2.5 |", "| H200 | 8×8 | fp64 | 4.5 |",
                  "| cpu-2core | 8×8 | fp64 | 5.5 |"):
        assert shown in qr, qr
    assert "1.5 |" not in qr and "3.5 |" not in qr
    # every run behind a link to its JSON, latest first
    links = re.findall(r"\[`(qr_[^`]+)`\]", qr)
    assert links[:2] == ["qr_H100_2026-01-02.json", "qr_H200_2026-01-01_pm.json"], links
    assert sorted(links) == sorted(p.name for p in results.glob("qr_*.json"))


def test_performance_page_is_short():
    """Per topic one chart and one table; the per-run detail is in the linked JSON."""
    text = (DOCS / "performance.md").read_text()
    block = text.split("BEGIN bench-results")[1].split("END bench-results")[0]
    topics = re.findall(r"^### (\S+)$", block, re.M)
    assert len(topics) == len(set(topics)) and "qr" in topics
    for part in block.split("\n### ")[1:]:
        assert part.count("![") <= 1 and part.count("\n|---") <= 3, part[:200]
    assert len(text.splitlines()) < 1200


def test_renderer_refuses_page_without_markers(tmp_path):
    with pytest.raises(ValueError, match="page has no .*BEGIN bench-results"):
        rr.replace_block("# no markers here\n", "bench-results", "x")


# --- the site -------------------------------------------------------------------------------
def test_mkdocs_build_strict(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings_handlers.python")
    pytest.importorskip("material")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(tmp_path / "site")], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-5000:]
    assert (tmp_path / "site" / "api" / "mpqr" / "index.html").is_file()
