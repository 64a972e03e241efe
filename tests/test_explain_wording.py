"""The explain trace speaks of the backend that ran: on the CPU no GPU figures justify a
choice, the out-of-core account says the pieces stayed on the host, and a run of identical
lines is printed once with its count."""

from __future__ import annotations

import re

import numpy as np
import pytest

import mpqr
from mpqr.policy.trace import Event, Trace


@pytest.mark.parametrize("shape", [(400, 100), (2048, 64)])
def test_cpu_choice_is_justified_without_gpu_figures(shape):
    a = np.random.default_rng(0).standard_normal(shape)
    with mpqr.explain() as trace:
        mpqr.qr(a)
    method = [e.message for e in trace.events if e.kind == "method"]
    assert method and "geqrf" in method[0], method
    text = str(trace)
    assert not re.search(r"H100|H200|cuSOLVER", text), text
    assert "LAPACK geqrf" in text and "on the host" in text, text


def test_gpu_backend_keeps_its_figures():
    from mpqr.qr.choice import _figure

    class GPU:
        capabilities = frozenset({"tensor-cores"})

    class CPU:
        capabilities = frozenset({"fp16", "int8"})

    assert _figure(GPU, "H100, x: 1 ms", "host") == "(H100, x: 1 ms)"
    assert _figure(CPU, "H100, x: 1 ms", "host") == "(host)"


def test_out_of_core_on_numpy_says_host_and_counts_repeats():
    a = np.random.default_rng(0).standard_normal((4000, 200))
    with mpqr.explain() as trace:
        mpqr.qr(a, mode="r", memory_budget="4MB")
    text = str(trace)
    assert "to the device" not in text and "into host working pieces" in text, text
    lines = text.splitlines()
    assert len(lines) == len(set(lines)), text  # no line printed twice in a row or at all
    counted = [ln for ln in lines if re.match(r"\d+ x gemm ", ln)]
    assert counted, text
    n = sum(int(ln.split(" x ", 1)[0]) for ln in counted)
    n += sum(1 for ln in lines if ln.startswith("gemm "))
    assert n == len(trace.gemms)  # the counts account for every record


def test_trace_str_collapses_only_consecutive_repeats():
    t = Trace()
    for kind in ("a", "a", "a", "b", "a"):
        t.records.append(Event("x", kind))
    assert str(t) == "3 x x: a\nx: b\nx: a"
    assert len(t) == 5
