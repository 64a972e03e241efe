"""Render the committed benchmark JSON (``bench/results/*.json``) into the docs.

``python -m mpqr.bench.render_results`` rewrites the generated blocks of the
documentation pages, each between a pair of marker comments, so the prose
around them stays as written:

* ``docs/performance.md``, block ``bench-results``: per benchmark topic one
  chart and one table of the latest run per device, with the device, library
  versions and date it was measured on, and links to every run's JSON (the
  JSON and PNG files are copied to ``docs/assets/bench/``).
* ``docs/precision.md``, block ``gemm-summary``: the GEMM files
  (``python -m mpqr bench gemm``) as precision x shape tables of rate and
  error; block ``accuracy-table``: the QR accuracy files
  (``python -m mpqr bench accuracy``) pivoted into method x precision tables.
* ``docs/frameworks.md``, block ``bridge-table``: the bridge files
  (``python -m mpqr bench bridge``), one table each.

The known shapes (``gemm``, ``accuracy``, ``qr``, ``lstsq``, ``bridge``) get their columns
in a sensible order; keys this module does not know are appended as extra
columns, nested values shown compactly, so a new benchmark field shows up
instead of being dropped. ``--check`` exits with 1 when a page or a chart copy
is out of date (the CI test does the same in-process).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import sys
from pathlib import Path
from typing import Any

from mpqr.bench.render_topics import render_topics

__all__ = [
    "BLOCKS",
    "main",
    "render_accuracy_tables",
    "render_all",
    "render_file",
    "replace_block",
    "updated_pages",
]

ROOT = Path(__file__).resolve().parents[2]

#: page (relative to the docs dir) -> the generated blocks it holds
#: subfolders of bench/results beside the benchmarks' files (``python -m mpqr bench``),
#: by what they hold; the pages render them after the benchmarks
SUBFOLDERS = {"probes": "Probe outputs (bench/probes, demo timings)",
              "ab": "A/B comparisons of variants"}
BLOCKS = {"performance.md": ("bench-results",),
          "precision.md": ("gemm-summary", "accuracy-table"),
          "frameworks.md": ("bridge-table",)}
CHART_DIR = Path("assets") / "bench"

_ENV_ORDER = ("device", "backend", "date", "mpqr", "python", "numpy", "cupy", "cuda_runtime",
              "cublas")

#: preferred column order per benchmark kind; other keys follow in file order
_COLUMNS = {
    "gemm": ("shape", "config", "precision", "engine", "dtype", "time_ms", "tflops",
             "err_vs_absAB", "speedup_vs_native", "err_ratio_vs_native", "error"),
    "qr": ("shape", "precision", "mode", "dtype", "method", "time_ms", "tflops",
           "speedup_vs_cusolver", "memory_floor_ms", "floor_fraction", "engine_rate_fraction",
           "backward_error", "orthogonality", "engines", "error"),
    "lstsq": ("shape", "precision", "refine", "dtype", "time_ms", "speedup", "iterations",
              "forward_error", "backward_error", "residual", "engines", "error"),
    "accuracy": ("kind", "cond", "method", "precision", "backward_error", "orthogonality",
                 "seconds", "engines", "error"),
    "bridge": ("call", "shape", "dtype", "mpqr-native (ms)", "mpqr-torch (ms)", "torch / native",
               "mpqr-jax (ms)", "jax / native", "torch.linalg (ms)", "speed-up vs torch.linalg",
               "jax.numpy.linalg (ms)", "speed-up vs jax.numpy.linalg", "method"),
}

_HEADERS = {
    "time_ms": "time (ms)", "tflops": "TFLOP/s", "err_vs_absAB": "max err / (|A||B|)",
    "speedup_vs_native": "speed-up vs native", "err_ratio_vs_native": "err / native err",
    "speedup_vs_cusolver": "speed-up vs cuSOLVER", "memory_floor_ms": "memory floor (ms)",
    "floor_fraction": "of memory floor", "engine_rate_fraction": "of engine rate",
    "backward_error": "‖A−QR‖/‖A‖", "orthogonality": "‖I−QᵀQ‖/n", "seconds": "time (s)",
}


# --- formatting ----------------------------------------------------------------
def _fmt(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return str(value)
        if value == 0.0:
            return "0"
        if abs(value) >= 1e5 or abs(value) < 1e-2:
            return f"{value:.2e}"
        return f"{value:.3g}"
    if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
        return "×".join(map(str, value))
    if isinstance(value, dict):
        return ", ".join(f"{k} {_fmt(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return ", ".join(_fmt(v) for v in value)
    return str(value)


def _cell(text: str) -> str:
    """Escape what would break a Markdown table cell."""
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def _short_error(text: str) -> str:
    """``"Type: first clause"`` of an error message (the JSON keeps it whole)."""
    head, _, rest = str(text).partition(": ")
    if not rest:
        return head[:80]
    clause = re.split(r"[:;(]", rest, maxsplit=1)[0].strip()
    return f"{head}: {clause}"[:100]


def _table(rows: list[dict[str, Any]], preferred: tuple[str, ...]) -> str:
    keys: list[str] = [k for k in preferred if any(k in r for r in rows)]
    for r in rows:
        keys.extend(k for k in r if k not in keys)
    lines = ["| " + " | ".join(_cell(_HEADERS.get(k, k)) for k in keys) + " |",
             "|" + "|".join("---" for _ in keys) + "|"]
    for r in rows:
        cells = []
        for k in keys:
            v = r.get(k)
            cells.append(_short_error(v) if k == "error" and v is not None else _fmt(v))
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines)


def _environment_line(env: dict[str, Any]) -> str:
    keys = [k for k in _ENV_ORDER if k in env] + [k for k in env if k not in _ENV_ORDER]
    if not keys:
        return "Measured on: environment not recorded."
    device = env.get("device", "unknown device")
    date = env.get("date", "unknown date")
    rest = ", ".join(f"{k} {_fmt(env[k])}" for k in keys if k not in ("device", "date"))
    return f"Measured on **{_cell(str(device))}**, {_cell(str(date))}" + \
        (f" ({_cell(rest)})." if rest else ".")


# --- the benchmark shapes --------------------------------------------------------
def kind_of(name: str, payload: dict[str, Any]) -> str:
    """``gemm``/``accuracy``/``qr``/``lstsq``/``bridge`` from the file name, else from the
    keys."""
    stem = Path(name).stem.lower()
    for kind in ("gemm", "accuracy", "qr", "lstsq", "bridge"):
        if stem.startswith(kind):
            return kind
    if "rows" in payload and "cond_sweep" in payload:
        return "accuracy"
    results = payload.get("results")
    if isinstance(results, list) and results and isinstance(results[0], dict):
        if "err_vs_absAB" in results[0]:
            return "gemm"
        if "orthogonality" in results[0]:
            return "qr"
    return "generic"


def _accuracy_header(payload: dict[str, Any]) -> str:
    m, n = payload.get("m"), payload.get("n")
    cond = payload.get("cond")
    parts = []
    if m is not None and n is not None:
        parts.append(f"{m} × {n} {payload.get('dtype', '')}".rstrip())
    if cond is not None:
        parts.append(f"cond(A) = {_cond(cond)} for the arithmetic/geometric kinds")
    if payload.get("seed") is not None:
        parts.append(f"seed {payload['seed']}")
    return ", ".join(parts)


def _cond(c: Any) -> str:
    return f"{float(c):.0e}" if isinstance(c, (int, float)) else _fmt(c)


def _pivot(rows: list[dict[str, Any]], row_keys: tuple[str, ...], col_key: str,
           cell, col_fmt=_fmt) -> str:
    """Rows grouped by ``row_keys``, one column per distinct ``col_key`` value."""
    cols: list[Any] = []
    groups: dict[tuple[Any, ...], dict[Any, dict[str, Any]]] = {}
    for r in rows:
        c = r.get(col_key)
        if c not in cols:
            cols.append(c)
        groups.setdefault(tuple(r.get(k) for k in row_keys), {})[c] = r
    head = [*row_keys, *(col_fmt(c) if not isinstance(c, str) else c for c in cols)]
    lines = ["| " + " | ".join(_cell(str(h)) for h in head) + " |",
             "|" + "|".join("---" for _ in head) + "|"]
    for key, by_col in groups.items():
        cells = [_fmt(v) for v in key] + [cell(by_col[c]) if c in by_col else "–" for c in cols]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines)


def _acc_cell(r: dict[str, Any]) -> str:
    if "error" in r:
        return _short_error(r["error"]).split(":")[0]
    return f"{_fmt(r.get('backward_error'))} / {_fmt(r.get('orthogonality'))}"


def _orth_cell(r: dict[str, Any]) -> str:
    if "error" in r:
        return _short_error(r["error"]).split(":")[0]
    return _fmt(r.get("orthogonality"))


def render_accuracy_tables(name: str, payload: dict[str, Any]) -> str:
    """Compact pivots of one accuracy file: method x precision by matrix kind,
    and orthogonality against cond(A) when the sweep is present."""
    out = [f"#### `{name}`", "", _environment_line(payload.get("environment", {})), ""]
    rows = [r for r in payload.get("rows", []) if isinstance(r, dict)]
    if rows:
        out += [f"QR of {_accuracy_header(payload)}. Each cell: backward error "
                "‖A − QR‖_F / ‖A‖_F / orthogonality ‖I − QᵀQ‖_F / n.", ""]
        for r in rows:
            r.setdefault("kind", "?")
        labelled = [{**r, "matrix": r["kind"] if r.get("cond") is None
                     else f"{r['kind']} (cond {_cond(r['cond'])})"} for r in rows]
        out += [_pivot(labelled, ("method", "precision"), "matrix", _acc_cell), ""]
    sweep = [r for r in payload.get("cond_sweep", []) if isinstance(r, dict)]
    if sweep:
        precs = sorted({str(r.get("precision")) for r in sweep})
        out += [f"Orthogonality ‖I − QᵀQ‖_F / n against cond(A) (geometric singular values, "
                f"precision {', '.join(precs)}):", "",
                _pivot(sweep, ("method", "precision"), "cond", _orth_cell, _cond), ""]
    return "\n".join(out).rstrip() + "\n"


def render_file(name: str, payload: Any) -> str:
    """One JSON file as a Markdown section (heading, environment line, tables)."""
    out = [f"### `{name}`", ""]
    if not isinstance(payload, dict):
        return "\n".join([*out, "Not a JSON object; nothing to show.", ""])
    out += [_environment_line(payload.get("environment") or {}), ""]
    kind = kind_of(name, payload)
    if kind == "accuracy":
        body = render_accuracy_tables(name, payload).split("\n", 3)[3]  # drop heading/env
        out.append(body.rstrip())
        detail = [r for r in [*payload.get("rows", []), *payload.get("cond_sweep", [])]
                  if isinstance(r, dict)]
        if detail:
            out += ["", "<details><summary>All rows (with time and engines)</summary>", "",
                    _table(detail, _COLUMNS["accuracy"]), "", "</details>"]
    else:
        scalars = {k: v for k, v in payload.items()
                   if k not in ("environment", "results") and not isinstance(v, (list, dict))}
        if scalars:
            out += ["Parameters: " + ", ".join(f"{k} = {_fmt(v)}" for k, v in scalars.items())
                    + ".", ""]
        results = payload.get("results")
        if isinstance(results, list) and results:
            rows = [r if isinstance(r, dict) else {"value": r} for r in results]
            out.append(_table(rows, _COLUMNS.get(kind, ())))
        for key, val in payload.items():
            if key in ("environment", "results") or not isinstance(val, list) or not val:
                continue
            rows = [r if isinstance(r, dict) else {"value": r} for r in val]
            out += ["", f"`{key}`:", "", _table(rows, ())]
        if not (isinstance(results, list) and results) and not any(
                isinstance(v, list) and v for k, v in payload.items() if k != "environment"):
            out.append("No results recorded.")
    return "\n".join(out).rstrip() + "\n"


def _load(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return {"environment": {}, "results": [{"error": f"unreadable JSON: {exc}"}]}


def _files(results_dir: Path, pattern: str) -> list[Path]:
    return sorted(results_dir.glob(pattern)) if results_dir.is_dir() else []


def render_all(results_dir: Path) -> str:
    """The ``bench-results`` block: per topic, one chart and the latest run per device;
    every file linked as JSON (``mpqr.bench.render_topics``)."""
    files = _files(results_dir, "*.json")
    if not files:
        return "_No benchmark results are committed yet._\n"
    return render_topics([(p.name, _load(p)) for p in files],
                         [p.name for p in _files(results_dir, "*.png")],
                         CHART_DIR.as_posix(), table=_table,
                         environment_line=_environment_line,
                         accuracy_tables=render_accuracy_tables, columns=_COLUMNS,
                         kind_of=kind_of)


def render_accuracy(results_dir: Path) -> str:
    """The ``accuracy-table`` block: the accuracy files only."""
    loaded = [(p.name, _load(p)) for p in _files(results_dir, "*.json")]
    acc = [(name, d) for name, d in loaded
           if isinstance(d, dict) and kind_of(name, d) == "accuracy"]
    if not acc:
        return "_No accuracy results are committed yet (`python -m mpqr bench accuracy`)._\n"
    return "\n".join(render_accuracy_tables(name, d) for name, d in acc)


def _gemm_cell(r: dict[str, Any]) -> str:
    if "error" in r:
        return "not run"
    out = f"{_fmt(r.get('tflops'))} TFLOP/s, err {_fmt(r.get('err_vs_absAB'))}"
    if r.get("engine"):
        out += f" ({r['engine']})"
    return out


def render_gemm_summary(results_dir: Path) -> str:
    """The ``gemm-summary`` block: default configurations (no forced knobs) per shape."""
    loaded = [(p.name, _load(p)) for p in _files(results_dir, "*.json")]
    gemm = [(name, d) for name, d in loaded if isinstance(d, dict) and kind_of(name, d) == "gemm"]
    if not gemm:
        return "_No GEMM results are committed yet (`python -m mpqr bench gemm`)._\n"
    out = []
    for name, d in gemm:
        rows = [{**r, "shape (m×n×k)": _fmt(r.get("shape"))} for r in d.get("results", [])
                if isinstance(r, dict) and "=" not in str(r.get("config", ""))]
        out += [f"#### `{name}`", "", _environment_line(d.get("environment") or {}), "",
                "Rate and max error relative to (|A||B|)_ij of each precision setting "
                "(default engine knobs), engine chosen in parentheses:", "",
                _pivot(rows, ("config",), "shape (m×n×k)", _gemm_cell), ""]
    return "\n".join(out)


def render_bridge(results_dir: Path) -> str:
    """The ``bridge-table`` block: the bridge files (``python -m mpqr bench bridge``)."""
    loaded = [(p.name, _load(p)) for p in _files(results_dir, "*.json")]
    files = [(name, d) for name, d in loaded
             if isinstance(d, dict) and kind_of(name, d) == "bridge"]
    if not files:
        return ("_No bridge results are committed yet: run `python -m mpqr bench bridge` on a "
                "GPU with PyTorch and JAX installed._\n")
    out = []
    for name, d in files:
        rows = [r for r in d.get("results", []) if isinstance(r, dict)]
        out += [f"#### `{name}`", "", _environment_line(d.get("environment") or {}), "",
                _table(rows, _COLUMNS["bridge"]) if rows else "No results recorded.", ""]
    return "\n".join(out)


def _markers(block: str) -> tuple[str, str]:
    return (f"<!-- BEGIN {block}: generated by `python -m mpqr.bench.render_results`; "
            "do not edit by hand -->", f"<!-- END {block} -->")


def replace_block(text: str, block: str, content: str) -> str:
    """``text`` with the part between the ``block`` markers replaced by ``content``."""
    begin, end = _markers(block)
    i, j = text.find(begin), text.find(end)
    if i < 0 or j < i:
        raise ValueError(f"page has no `{begin}` ... `{end}` marker pair")
    return text[: i + len(begin)] + "\n\n" + content.strip() + "\n\n" + text[j:]


def updated_pages(docs_dir: Path, results_dir: Path) -> dict[Path, str]:
    """Each page that holds a block, as it should read after rendering."""
    content = {"bench-results": render_all(results_dir),
               "accuracy-table": render_accuracy(results_dir),
               "gemm-summary": render_gemm_summary(results_dir),
               "bridge-table": render_bridge(results_dir)}
    out = {}
    for page, blocks in BLOCKS.items():
        path = docs_dir / page
        text = path.read_text()
        for block in blocks:
            text = replace_block(text, block, content[block])
        out[path] = text
    return out


def _chart_copies(docs_dir: Path, results_dir: Path) -> list[tuple[Path, Path]]:
    """The charts and the JSON files the performance page links to, copied into the site."""
    return [(p, docs_dir / CHART_DIR / p.name)
            for p in [*_files(results_dir, "*.png"), *_files(results_dir, "*.json")]]


def main(argv: list[str] | None = None) -> int:
    """Render ``bench/results`` into the docs; with ``--check`` only report staleness.

    Returns 0, or 1 when ``--check`` finds a page or chart copy out of date.
    """
    p = argparse.ArgumentParser(prog="python -m mpqr.bench.render_results",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--results", default=str(ROOT / "bench" / "results"),
                   help="folder of benchmark JSON/PNG files")
    p.add_argument("--docs", default=str(ROOT / "docs"), help="the docs folder")
    p.add_argument("--check", action="store_true",
                   help="exit 1 if the committed pages differ from a fresh render")
    args = p.parse_args(argv)
    docs_dir, results_dir = Path(args.docs), Path(args.results)
    pages = updated_pages(docs_dir, results_dir)
    charts = _chart_copies(docs_dir, results_dir)
    stale = [str(path) for path, text in pages.items() if path.read_text() != text]
    stale += [str(dst) for src, dst in charts
              if not dst.is_file() or dst.read_bytes() != src.read_bytes()]
    if args.check:
        for s in stale:
            print(f"out of date: {s} (run python -m mpqr.bench.render_results)")
        return 1 if stale else 0
    for path, text in pages.items():
        path.write_text(text)
    for src, dst in charts:
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
    print(f"rendered {len(_files(results_dir, '*.json'))} result files into "
          f"{', '.join(BLOCKS)}; {len(charts)} charts copied")
    return 0


if __name__ == "__main__":
    sys.exit(main())
