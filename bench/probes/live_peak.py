"""Where a QR call's device memory peaks: the live allocations at the peak of live bytes
and at the pool's high-water, by the library frames that asked for them.

``python3 bench/probes/live_peak.py OUT.json CASE [CASE ...] [--set MODULE.NAME=V ...]``
(cases ``N:precision`` or ``MxN:precision``, as ``flag_ab.py``'s; ``--set`` a module
constant for every case, a Python literal; ``--trace``: each row also lists the measured
call's pool events of at least 1 MiB in order, ``["m", ptr, bytes]`` a request,
``["f", ptr]`` its release, ``["b", bytes]`` a new block from the device, ``["g", label]``
a matrix product decided, for a replay against a model of the pool): one warm-up call
and one measured call (the memory plan as it chooses), the allocations of at least 16
MiB alive at each peak (multiples of the input's bytes, with their origin), and the
label of the last matrix product the policy ran before each peak.
"""

from __future__ import annotations

import ast
import json
import sys

import cupy as cp
from cupy.cuda import memory_hook
from flag_ab import case_matrix, owner  # the probe beside this one

import mpqr
from mpqr.bench._timing import environment, write_json
from mpqr.bench.memory import _origin, calls_as_they_run
from mpqr.policy import policy as ptrace  # where gemm records its decisions

MIN_BYTES = 16 << 20
TRACE_BYTES = 1 << 20


def where(prec, a, trace=False):
    pool = cp.get_default_memory_pool()

    def call():
        return mpqr.qr(a, precision=prec, method="householder-recursive")

    with calls_as_they_run():
        del_ = call()
        del del_
        cp.cuda.Device().synchronize()
        pool.free_all_blocks()
        base = pool.total_bytes()
        last = {"label": ""}
        record = ptrace.record_gemm

        events = []

        def spy(d):  # the policy's last product, by label
            last["label"] = d.label
            if trace:
                events.append(["g", d.label])
            return record(d)

        class Log(memory_hook.MemoryHook):
            name = "mpqr-live-peak"

            def __init__(self):
                self.live, self.now, self.peak, self.high = {}, 0, 0, base
                self.at_peak, self.at_high = {}, {}

            def snap(self):
                return {"label": last["label"], "live": sorted(
                    ((sz / a.nbytes, org) for sz, org in self.live.values()
                     if sz >= MIN_BYTES), reverse=True)}

            def alloc_postprocess(self, device_id, mem_size, mem_ptr):
                if trace:
                    events.append(["b", int(mem_size)])
                if pool.total_bytes() > self.high:
                    self.high = pool.total_bytes()
                    self.at_high = {"pool": (self.high - base) / a.nbytes, **self.snap()}

            def malloc_postprocess(self, device_id, size, mem_size, mem_ptr, pmem_id):
                self.live[mem_ptr] = (mem_size, _origin() if mem_size >= MIN_BYTES else "")
                if trace and mem_size >= TRACE_BYTES:
                    events.append(["m", int(mem_ptr), int(mem_size)])
                self.now += mem_size
                if self.now > self.peak:
                    self.peak = self.now
                    self.at_peak = {"live": self.now / a.nbytes, **self.snap()}

            def free_postprocess(self, device_id, mem_size, mem_ptr, pmem_id):
                sz, _ = self.live.pop(mem_ptr, (mem_size, ""))
                if trace and sz >= TRACE_BYTES:
                    events.append(["f", int(mem_ptr)])
                self.now -= sz

        ptrace.record_gemm = spy
        log = Log()
        try:
            with mpqr.explain(), log:
                res = call()
                cp.cuda.Device().synchronize()
        finally:
            ptrace.record_gemm = record
        del res
        pool.free_all_blocks()
    return {"pool_multiple": (log.high - base) / a.nbytes,
            "live_peak_multiple": log.peak / a.nbytes, "at_live_peak": log.at_peak,
            "at_pool_high": log.at_high, "input_bytes": int(a.nbytes),
            **({"events": events} if trace else {})}


def main(argv):
    sets = {}
    while "--set" in argv:
        i = argv.index("--set")
        target, _, value = argv[i + 1].partition("=")
        sets[target] = ast.literal_eval(value)
        argv = argv[:i] + argv[i + 2:]
    for target, value in sets.items():
        obj, name = owner(target)
        setattr(obj, name, value)
    trace = "--trace" in argv
    argv = [x for x in argv if x != "--trace"]
    out, cases = argv[0], argv[1:]
    rows = []
    for case in cases:
        _, prec, a = case_matrix(case)
        rows.append({"case": case, "set": sets, **where(prec, a, trace)})
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "events"},
                         default=str)[:3000], flush=True)
        del a
    write_json(out, {"environment": environment(cp), "rows": rows})


if __name__ == "__main__":
    main(sys.argv[1:])
