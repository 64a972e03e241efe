"""The prebuilt GPU kernels (``mpqr.backends.cupy.prebuilt``), their CPU-side logic: the
bundle's format, which recorded kernels it answers for, and its installation through
CuPy's own cache call, here against a stand-in for CuPy's compiler module (the real one
runs on a GPU machine: ``python -m mpqr warmup --pack``, then a cold demo)."""

from __future__ import annotations

import sys
import types

import pytest
from mpqr.backends.cupy import prebuilt
from mpqr.backends.cupy import warmup as cw


def _entry(src, phase="demo-qr"):
    return {"source": src, "text": src, "options": ["--std=c++17"],
            "kwargs": {"name_expressions": None}, "seconds": 1.0, "phase": phase}


@pytest.fixture
def fake_cupy(monkeypatch):
    """A CuPy whose compiler keeps a cache dict and fails if it is asked to compile."""
    comp = types.ModuleType("cupy.cuda.compiler")
    comp.cache = {}
    comp._get_nvrtc_version = lambda: (13, 0)
    comp._get_arch = lambda: "90"

    def nvrtc(source, options, *a, **k):
        raise AssertionError(f"compiled {source!r}")

    def with_cache(source, options, *, extra_source=None, **kw):
        key = (source, options, extra_source)
        if key not in comp.cache:  # CuPy: look up, else compile and store
            comp.cache[key] = comp._compile_using_nvrtc_no_warning(source, options)
        return comp.cache[key]

    comp._compile_using_nvrtc_no_warning = nvrtc
    comp._compile_module_with_cache = with_cache
    cuda = types.ModuleType("cupy.cuda")
    cuda.compiler = comp
    cupy = types.ModuleType("cupy")
    cupy.__version__ = "14.2.0"
    cupy.cuda = cuda
    for name, mod in (("cupy", cupy), ("cupy.cuda", cuda), ("cupy.cuda.compiler", comp)):
        monkeypatch.setitem(sys.modules, name, mod)
    core = types.SimpleNamespace(assemble_cupy_compiler_options=lambda o: ("-I/here", *o),
                                 _get_header_source=lambda: "// headers")
    monkeypatch.setattr(prebuilt, "_cupy_core", lambda: core)
    return comp


def test_bundle_round_trip(tmp_path):
    kernels = {"k1": (b"\x7fELF one", {"f<float>": "_Z1fIfEvv"}), "k2": (b"two", None)}
    prebuilt.write(tmp_path / "b.bin.gz", {"cupy": "14.2.0", "nvrtc": [13, 0], "arch": "90"},
                   kernels)
    header, back = prebuilt.read(tmp_path / "b.bin.gz")
    assert header == {"cupy": "14.2.0", "nvrtc": [13, 0], "arch": "90"}
    assert back == kernels
    (tmp_path / "bad.bin.gz").write_bytes(b"nope")
    with pytest.raises(OSError):
        prebuilt.read(tmp_path / "bad.bin.gz")


def test_entry_key_follows_source_options_and_arguments():
    e = _entry("__global__ void k() {}")
    assert prebuilt.entry_key(e) == prebuilt.entry_key(dict(e))
    assert prebuilt.entry_key(e) != prebuilt.entry_key({**e, "text": "__global__ void j() {}"})
    assert prebuilt.entry_key(e) != prebuilt.entry_key({**e, "options": ["--std=c++11"]})
    assert prebuilt.entry_key(e) != prebuilt.entry_key({**e, "kwargs": {"jitify": True}})
    assert prebuilt.entry_key(e) == prebuilt.entry_key({**e, "seconds": 9, "phase": None})


def test_install_answers_matching_kernels_through_the_cache_call(fake_cupy, tmp_path):
    a, b, edited = _entry("kernel a"), _entry("kernel b"), _entry("kernel c")
    bundle = tmp_path / "b.bin.gz"
    prebuilt.write(bundle, {"cupy": "14.2.0", "nvrtc": [13, 0], "arch": "90"},
                   {prebuilt.entry_key(a): (b"bin a", {"f<double>": "_Z1fIdEvv"}),
                    prebuilt.entry_key(b): (b"bin b", None),
                    prebuilt.entry_key({**edited, "text": "kernel c, older text"}): (b"stale", None)})
    got = prebuilt.install([a, b, edited], bundle)
    assert got["skipped"] is None and got["installed"] == {0, 1}
    assert got["platform"] == "CuPy 14.2.0, NVRTC 13.0, sm_90"
    cached = {k[0]: v for k, v in fake_cupy.cache.items()}
    assert cached == {"kernel a": (b"bin a", {"f<double>": "_Z1fIdEvv"}),
                      "kernel b": (b"bin b", None)}
    assert all(k[1] == ("-I/here", "--std=c++17") and k[2] == "// headers"
               for k in fake_cupy.cache)
    # the compiler step is CuPy's own again afterwards
    with pytest.raises(AssertionError, match="compiled 'kernel c'"):
        fake_cupy._compile_module_with_cache("kernel c", ())


@pytest.mark.parametrize("field, value", [("cupy", "14.1.0"), ("nvrtc", [12, 9]),
                                          ("arch", "100")])
def test_install_skips_a_bundle_for_another_platform(fake_cupy, tmp_path, field, value):
    a = _entry("kernel a")
    header = {"cupy": "14.2.0", "nvrtc": [13, 0], "arch": "90", field: value}
    prebuilt.write(tmp_path / "b.bin.gz", header, {prebuilt.entry_key(a): (b"x", None)})
    got = prebuilt.install([a], tmp_path / "b.bin.gz")
    assert got["installed"] == set() and not fake_cupy.cache
    assert got["skipped"].startswith("the prebuilt kernels are for ")
    assert got["skipped"].endswith("this is CuPy 14.2.0, NVRTC 13.0, sm_90")


def test_install_without_a_bundle_or_cupy(tmp_path, monkeypatch):
    got = prebuilt.install([_entry("k")], tmp_path / "missing.bin.gz")
    assert got["installed"] == set() and got["skipped"] == "no prebuilt kernels (FileNotFoundError)"
    prebuilt.write(tmp_path / "b.bin.gz", {"cupy": "14.2.0"}, {})
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy raises ImportError
    got = prebuilt.install([_entry("k")], tmp_path / "b.bin.gz")
    assert got["skipped"] == "CuPy is not installed"


def test_describe_names_the_prebuilt_set():
    done = {"skipped": None, "prebuilt": 176, "prebuilt_seconds": 0.41,
            "prebuilt_platform": "CuPy 14.2.0, NVRTC 13.0, sm_90", "processes": 0,
            "kernels": 0, "seconds": 0.5, "compile_seconds": 0.0, "failed": 0,
            "background": None}
    assert cw.describe(done) == ("176 GPU kernels installed from mpqr's prebuilt set "
                                 "(CuPy 14.2.0, NVRTC 13.0, sm_90) in 0.4 s")
    more = cw.describe({**done, "processes": 4, "kernels": 3, "compile_seconds": 2.0})
    assert more.startswith("176 GPU kernels installed") and "3 GPU kernels ready" in more


def test_split_leaves_the_next_table_first():
    entries = [_entry("q", "demo-qr"), {**_entry("l", "demo-lstsq"), "seconds": 0.1},
               {**_entry("r", "routes"), "seconds": 5.0}]
    now, later = cw.split(entries, cw.DEMO_FIRST)
    assert [e["source"] for e in now] == ["q"]
    assert [e["source"] for e in later] == ["l", "r"]  # the cheap lstsq kernel first


def test_shipped_bundle_covers_the_demo_kernels_as_they_read_now():
    """Every kernel the demo compiles has its binary in the shipped bundle, for today's
    sources (an edited .cu file the demo uses needs `python -m mpqr warmup --pack` on
    the bundle's platform), and the bundle names that platform."""
    header, kernels = prebuilt.read()
    assert set(header) == {"cupy", "nvrtc", "arch"}
    entries = [e for e in cw.load()["entries"] if e.get("phase") in (None, *cw.DEMO_FIRST,
                                                                      "demo-lstsq")]
    assert entries
    missing = [e.get("file") or e["source"][:60] for e in entries
               if prebuilt.entry_key({**e, "text": cw._source_of(e)}) not in kernels]
    assert not missing, missing
