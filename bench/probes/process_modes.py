"""Whether a whole process runs a QR at one of two speeds, and what goes with the slow calls.

(On the H200 machine the slow calls came in episodes within a process, with the same
summed kernel time: see ``gc_pauses.py`` and ``smi_sampled.py`` beside this probe.)

``python3 bench/probes/process_modes.py OUT.json [--procs 8] [--case 16384:fp16]`` starts
``--procs`` processes one after another, each with its own ``PYTHONHASHSEED``; each times
the case (``N:precision`` or ``MxN:precision`` as in ``flag_ab.py``, mode reduced, after a
warm call: the median of 5 calls to full device sync) and records beside it what could
differ between processes: the CPU it ran on, the SM clock before and after, the device
addresses of its first pool block and of the input, the CUDA graphs kept, their memory and
any capture that failed, and the GPU time of the call (CUDA events) against its host time
(how long the call took to return). ``--env K=V`` sets a variable in every process
(``MPQR_GRAPHS=0``: no replays; ``PROBE_KERNELS=1``: each process also profiles one
call, GPU milliseconds per kernel name). A
bimodal time that follows one of these points at the cause; one that follows none of them
points at the device.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys


def child(case: str) -> dict:
    import time

    import cupy as cp
    from flag_ab import case_matrix  # the probe beside this one

    import mpqr

    def clock() -> int:
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm", "--format=csv,noheader,"
                                  "nounits", f"--id={cp.cuda.Device().id}"],
                                 capture_output=True, text=True, timeout=10).stdout
            return int(out.split()[0])
        except Exception:
            return -1

    first = cp.empty(1, dtype=cp.uint8)
    _, prec, a = case_matrix(case)

    def call():
        return mpqr.qr(a, precision=prec, method="householder-recursive")

    clock0 = clock()
    call()
    cp.cuda.Device().synchronize()
    gpu, host = [], []
    for _ in range(5):
        s, e = cp.cuda.Event(), cp.cuda.Event()
        t0 = time.perf_counter()
        s.record()
        call()
        e.record()
        t1 = time.perf_counter()
        e.synchronize()
        gpu.append(cp.cuda.get_elapsed_time(s, e))
        host.append((t1 - t0) * 1e3)
    gpu.sort()
    host.sort()
    from mpqr.backends.cupy import graphs

    kernels = _kernel_table(call) if os.environ.get("PROBE_KERNELS") == "1" else None

    return {"case": case, "ms": gpu[2], "all_ms": [round(t, 2) for t in gpu],
            "host_return_ms": round(host[2], 2), "cpu": _cpu(), "clock_before": clock0,
            "clock_after": clock(), "first_block": hex(first.data.ptr),
            "input": hex(a.data.ptr), "graph_bytes": graphs.held_bytes(),
            # a capture that failed in this process (another thread's call during a
            # global-mode capture, say) leaves its calls launched from Python: slower
            "graphs_kept": len(graphs._GRAPHS), "graph_failures": dict(graphs.FAILED),
            "hash_seed": os.environ.get("PYTHONHASHSEED"), "kernels": kernels}


def _kernel_table(call, top: int = 25) -> dict:
    """GPU milliseconds and launches per kernel name of one call (PyTorch's profiler,
    CUPTI): which kernels a slow process spends its extra time in."""
    from collections import defaultdict

    import cupy as cp
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        cp.cuda.Device().synchronize()
    table: dict = defaultdict(lambda: [0.0, 0])
    for ev in prof.events():
        if ev.device_type.name == "CUDA":
            table[ev.name[:90]][0] += ev.time_range.elapsed_us() / 1e3
            table[ev.name[:90]][1] += 1
    rows = sorted(table.items(), key=lambda kv: -kv[1][0])[:top]
    return {"total_ms": round(sum(v[0] for v in table.values()), 2),
            "top": [[k, round(v[0], 3), v[1]] for k, v in rows]}


def _cpu() -> int:
    """The CPU this process last ran on (field 39 of /proc/self/stat)."""
    with open("/proc/self/stat") as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[36])


def main(argv: list[str]) -> None:
    if argv and argv[0] == "--child":
        print(json.dumps(child(argv[1])), flush=True)
        return
    out = argv[0]
    procs = int(argv[argv.index("--procs") + 1]) if "--procs" in argv else 8
    case = argv[argv.index("--case") + 1] if "--case" in argv else "16384:fp16"
    extra = dict(v.split("=", 1) for i, v in enumerate(argv) if i and argv[i - 1] == "--env")
    rows = []
    for i in range(procs):
        env = {**os.environ, **extra, "PYTHONHASHSEED": str(i)}
        res = subprocess.run([sys.executable, __file__, "--child", case], env=env,
                             capture_output=True, text=True, timeout=300,
                             cwd=os.path.dirname(os.path.abspath(__file__)))
        line = next((ln for ln in res.stdout.splitlines() if ln.startswith("{")), None)
        row = json.loads(line) if line else {"error": res.stderr[-2000:]}
        rows.append(row)
        print(json.dumps(row), flush=True)
    with open(out, "w") as fh:
        json.dump({"case": case, "env": extra, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
