"""The demo's GPU warm-up in phases (the CPU-visible logic; the compiles run on a GPU):
the recorder tags each kernel with the demo table (or route) that first compiled it;
``warm(first=DEMO_FIRST)`` waits only for the first table's kernels and leaves the rest
compiling in the background, which the demo drops when it ends."""

from __future__ import annotations

import concurrent.futures as cf
import threading

import pytest
from mpqr.backends.cupy import warmup as cw
from mpqr.backends.cupy.warmup import describe

from mpqr.cli import demo


def _entry(phase, seconds, name):
    return {"source": name, "options": [], "kwargs": {}, "seconds": seconds, "phase": phase}


def test_recorder_tags_kernels_with_the_current_phase(monkeypatch):
    monkeypatch.setattr(cw, "_split_options", lambda options: tuple(options))
    rec = cw.Recorder()
    headers = "// headers"
    args = {"source": "k1", "options": ("--std=c++17",), "extra_source": headers,
            "log_stream": None, "arch": None}
    try:
        cw.mark("demo-qr")
        rec._add(dict(args), 0.5, headers)
        cw.mark("routes")
        rec._add({**args, "source": "k2"}, 0.25, headers)
        rec._add(dict(args), 0.5, headers)  # compiled again later: one entry, first phase
    finally:
        cw.mark(None)
    assert [(e["source"], e["phase"]) for e in rec.entries] == [("k1", "demo-qr"),
                                                                ("k2", "routes")]


def test_split_first_phase_now_rest_later_costliest_first():
    entries = [_entry("demo-qr", 0.1, "a"), _entry("demo-lstsq", 3.0, "b"),
               _entry("demo-qr", 2.0, "c"), _entry("routes", 1.0, "d"),
               _entry(None, 0.5, "e")]  # untagged (an older list): never left for later
    now, later = cw.split(entries, cw.DEMO_FIRST)
    assert [e["source"] for e in now] == ["c", "e", "a"]
    assert [e["source"] for e in later] == ["b", "d"]
    now, later = cw.split(entries, None)  # `python -m mpqr warmup`: everything, waited for
    assert [e["source"] for e in now] == ["b", "c", "d", "e", "a"] and later == []


def test_run_phases_returns_once_the_first_phase_is_compiled():
    gate = threading.Event()
    done = []

    def compile_one(entry):
        if entry["phase"] != "demo-qr":
            gate.wait(10)  # the background ones are still running when run_phases returns
        done.append(entry["source"])
        return entry["seconds"]

    now, later = cw.split([_entry("demo-qr", 1.0, "a"), _entry("demo-qr", 2.0, "b"),
                           _entry("demo-lstsq", 1.0, "c"), _entry("routes", 1.0, "d"),
                           _entry("routes", 1.0, "e")], cw.DEMO_FIRST)
    out = {"kernels": 0, "compile_seconds": 0.0, "failed": 0, "skipped": None,
           "seconds": 0.1, "processes": 1}
    pool = cf.ThreadPoolExecutor(1)
    bg = cw.run_phases(now, later, pool, compile_one, out)
    assert sorted(done) == ["a", "b"] and out["kernels"] == 2
    assert out["compile_seconds"] == pytest.approx(3.0)
    assert len(bg) == 3 and bg.pending() >= 2
    out["background"] = bg
    assert describe(out).endswith("; 3 more compiling in the background")
    bg.cancel()  # the demo's end: what has not started is dropped
    gate.set()
    pool.shutdown(wait=True)
    assert len(done) < 5 and {"a", "b"} <= set(done)


def test_run_phases_without_later_shuts_the_pool():
    pool = cf.ThreadPoolExecutor(1)
    out = {"kernels": 0, "compile_seconds": 0.0, "failed": 0}
    assert cw.run_phases([_entry(None, 1.0, "a")], [], pool, lambda e: 1.0, out) is None
    assert out["kernels"] == 1
    with pytest.raises(RuntimeError):
        pool.submit(lambda: None)


def test_demo_marks_its_tables_in_order(monkeypatch, capsys):
    marks = []
    monkeypatch.setattr(cw, "mark", marks.append)
    assert demo.main(["--cpu", "--m", "200", "--n", "8"]) == 0
    assert marks == [cw.DEMO_FIRST[0], "demo-lstsq", None]
    out = capsys.readouterr().out
    # the first phase tag is set before the first table's header
    assert out.index("QR factorization") < out.index("Least squares")
