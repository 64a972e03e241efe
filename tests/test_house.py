"""The layout keeps its shape: no import circle, the public fronts imported only by the
router and the package fronts, every public name and earlier module path importable, the
CuPy backend's CUDA sources and kernel list shipped where its modules look, the command
line unchanged."""

from __future__ import annotations

import ast
import gzip
import importlib
import json
import re
import subprocess
import sys
from importlib.metadata import entry_points
from importlib.resources import files
from pathlib import Path

import pytest

import mpqr

ROOT = Path(__file__).resolve().parents[1]
#: source folder -> the package it is imported as
ROOTS = {"mpqr": "mpqr", "backends": "mpqr.backends", "compat": "mpqr.compat"}


def _modules() -> dict[str, Path]:
    out = {}
    for folder, pkg in ROOTS.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([pkg, *parts])] = path
    return out


def _imports(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the project modules it imports, at module level and inside functions
    alike (a package front's own imports count; importing a package front does not tie
    a module to everything the front imports)."""
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, path in mods.items():
        pkg = m if path.name == "__init__.py" else m.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base
                           for a in node.names]
            else:
                continue
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != m and mods[t].name != "__init__.py":
                    graph[m].add(t)
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of two or more modules (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def test_the_walk_finds_a_circle_when_there_is_one():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _circles(graph) == [["a", "b", "c"]]


def test_no_import_circle_in_mpqr_backends_compat():
    mods = _modules()
    assert "mpqr._route" in mods and "mpqr.backends.cupy.backend" in mods
    assert _circles(_imports(mods)) == []


def test_only_the_router_and_the_package_fronts_import_the_public_api_modules():
    mods = _modules()
    graph = _imports(mods)
    fronts = {"mpqr.qr.api", "mpqr.lstsq.api"}
    allowed = {"mpqr", "mpqr.qr", "mpqr.lstsq", "mpqr._route"}
    offenders = {m: sorted(graph[m] & fronts) for m in graph
                 if graph[m] & fronts and m not in allowed}
    assert offenders == {}
    # the routes factor with the in-memory QR and lstsq
    assert "mpqr.qr.in_memory" in graph["mpqr.ooc.driver"]
    assert "mpqr.lstsq.in_memory" in graph["mpqr.ooc.lstsq"]
    assert "mpqr.lstsq.in_memory" in graph["mpqr.backends.dask.lstsq"]


def test_the_numerical_core_imports_no_tooling():
    graph = _imports(_modules())
    tooling = ("mpqr.bench", "mpqr.cli")
    core = [m for m in graph if not m.startswith(tooling) and m != "mpqr.__main__"]
    assert {m: sorted(t for t in graph[m] if t.startswith(tooling)) for m in core
            if any(t.startswith(tooling) for t in graph[m])} == {}


@pytest.mark.parametrize("module", ["mpqr", "mpqr.backends", "mpqr.compat.scipy",
                                    "mpqr.compat.numpy", "mpqr.backends.dask",
                                    "mpqr.backends.bridges.dispatch", "mpqr.qr.api",
                                    "mpqr.lstsq.api"])
def test_every_public_name_imports(module):
    mod = importlib.import_module(module)
    for name in mod.__all__:
        assert getattr(mod, name) is not None, (module, name)


def test_the_backend_entry_points_load_the_builtin_backends():
    from mpqr.backends.cupy.backend import CupyBackend
    from mpqr.backends.numpy.backend import NumpyBackend

    eps = {ep.name: ep for ep in entry_points(group="mpqr.backends")}
    assert eps["numpy"].load() is NumpyBackend
    assert eps["cupy"].load() is CupyBackend
    assert mpqr.backends.numpy_backend.NumpyBackend is NumpyBackend  # the earlier path
    assert mpqr.backends.NumpyBackend is NumpyBackend and mpqr.backends.CupyBackend is CupyBackend


def _optional_missing(exc: ImportError) -> bool:
    return (exc.name or "").partition(".")[0] in ("cupy", "cupyx", "triton", "torch", "jax")


@pytest.mark.parametrize("old", sorted(mpqr._aliases.ALIASES))
def test_earlier_module_paths_are_the_new_modules(old):
    new = mpqr._aliases.ALIASES[old]
    if new is None:  # a package of earlier paths only
        assert importlib.import_module(old).__path__ == []
        return
    try:
        mod = importlib.import_module(new)
    except ImportError as exc:
        if _optional_missing(exc):
            pytest.skip(f"{new} needs {exc.name}")
        raise
    assert importlib.import_module(old) is mod
    assert mod.__spec__.name == new  # the alias leaves the module its own spec
    parent, _, child = old.rpartition(".")
    assert getattr(importlib.import_module(parent), child) is mod


def test_earlier_names_of_the_host_module_still_resolve():
    from mpqr.backends import host
    from mpqr.backends.host import arrays

    assert host.HostArray is arrays.HostArray and host.is_host_array is arrays.is_host_array


def _cupy_sources() -> dict[str, str]:
    return {p.name: p.read_text() for p in (ROOT / "backends" / "cupy").glob("*.py")}


def test_every_cuda_source_the_cupy_modules_name_is_shipped():
    """Each ``functions("<file>.cu", ...)`` of the CuPy modules, the kernel folder and the
    warm-up list resolve in the installed package (the folder beside the modules)."""
    pkg = files("mpqr.backends.cupy")
    kernels = pkg / "kernels"
    named = set()
    for text in _cupy_sources().values():
        named |= set(re.findall(r'functions\(\s*"([\w.]+\.cu)"', text))
    assert len(named) >= 8
    missing = sorted(n for n in named if not (kernels / n).is_file())
    assert missing == []
    # the modules find both folders beside themselves
    src = _cupy_sources()
    assert 'Path(__file__).resolve().parent / "kernels"' in src["modules.py"]
    assert 'Path(__file__).resolve().parent / "kernels"' in src["warmup.py"]
    assert 'Path(__file__).resolve().parent / "data" / "cupy_kernels.json.gz"' in \
        src["warmup.py"]
    assert (pkg / "triton_kernels.py").is_file()  # triton_gemm reads it by its name
    from mpqr.backends.cupy import warmup

    assert warmup.MANIFEST.is_file() and warmup._KERNELS.is_dir()
    listed = json.loads(gzip.decompress(warmup.MANIFEST.read_bytes()))["entries"]
    by_file = {e["file"] for e in listed if "file" in e}
    assert by_file and sorted(f for f in by_file if not (kernels / f).is_file()) == []


def test_command_line_unchanged():
    run = [sys.executable, "-m", "mpqr"]
    helped = subprocess.run([*run, "--help"], capture_output=True, text=True, check=True)
    assert "{demo,warmup,bench}" in helped.stdout
    listed = subprocess.run([*run, "bench"], capture_output=True, text=True, check=True)
    topics = [line.split()[0] for line in listed.stdout.splitlines()[1:]]
    assert topics == ["gemm", "qr", "lstsq", "accuracy", "dask", "bridge", "ooc", "arrayapi",
                      "frameworks", "small", "memory"]
    one = subprocess.run([*run, "bench", "qr", "-h"], capture_output=True, text=True,
                         check=True)
    assert "--json" in one.stdout
