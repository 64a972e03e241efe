"""Feasibility of tc-sgemm's hi*hi slices summed in registers: CUTLASS's CuTe DSL
(``nvidia-cutlass-dsl``) on the image, its Hopper example with two accumulators (the MMAs'
partial sums promoted into a float32 register accumulator every ``interval`` MMAs) run
on fp16 operands, against cuBLAS's slices with ``beta = 1`` (mpqr's path), same data.

``python3 bench/probes/cutlass_dsl_promotion.py CUTLASS_EXAMPLE_DIR OUT.json``, where
``CUTLASS_EXAMPLE_DIR`` holds ``dense_gemm_fp8_2xacc.py`` from CUTLASS's
``examples/python/CuTeDSL/cute/hopper/kernel/dense_gemm/`` (not part of mpqr). Uniform
[0, 1) operands (same-sign sums, where truncation inside the tensor cores adds up); the
error is ``max |C - C64| / C64``; an interval of 64 MMAs of depth 16 is a slice of 1024.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
import traceback

import cuda.bindings.driver as cuda
import cupy as cp
import cutlass
import cutlass.cute as cute
import cutlass.torch as cutlass_torch
import torch
from mpqr.backends import get_backend

BE = get_backend(cp)


def _example(folder):
    path = os.path.join(folder, "dense_gemm_fp8_2xacc.py")
    spec = importlib.util.spec_from_file_location("dense_gemm_fp8_2xacc", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _ms(fn, stream, reps=5):
    ts = []
    for _ in range(reps):
        s = torch.cuda.Event(enable_timing=True)
        e = torch.cuda.Event(enable_timing=True)
        s.record(stream)
        fn()
        e.record(stream)
        e.synchronize()
        ts.append(s.elapsed_time(e))
    ts.sort()
    return ts[len(ts) // 2]


def _tensor(cpu, dtype):
    return cutlass_torch.cute_tensor_like(cpu, dtype, is_dynamic_layout=True, assumed_align=16)


def case(ex, m, n, k, intervals, tile=(128, 256), cluster=(1, 1), b_n_major=False,
         cublas=True):
    res = {"shape": [m, n, k]}
    f16, f32 = cutlass.Float16, cutlass.Float32
    a_t, a_g = _tensor(cutlass_torch.matrix(1, m, k, False, f16), f16)
    b_t, b_g = _tensor(cutlass_torch.matrix(1, n, k, b_n_major, f16), f16)
    d_t, d_g = _tensor(cutlass_torch.matrix(1, m, n, False, f32), f32)
    torch.manual_seed(0)
    a_g.copy_(torch.rand(a_g.shape, device="cuda").half())
    b_g.copy_(torch.rand(b_g.shape, device="cuda").half())
    s_t, _ = _tensor(torch.tensor([1.0], dtype=torch.float32, device="cuda"), f32)
    st = torch.cuda.Stream()
    stream = cuda.CUstream(st.cuda_stream)
    clusters = cutlass.utils.HardwareInfo().get_max_active_clusters(cluster[0] * cluster[1])
    r64 = torch.einsum("mkl,nkl->mnl", a_g.double(), b_g.double())[:, :, 0]
    flops = 2.0 * m * n * k
    for iv in intervals:
        gemm = ex.HopperFP8WarpSpecialized2xAccGemmKernel(tile, cluster, 1, True, iv)
        t0 = time.time()
        comp = cute.compile(gemm, a_t, b_t, d_t, s_t, s_t, clusters, stream)
        ctime = time.time() - t0

        def call(comp=comp):
            return comp(a_t, b_t, d_t, s_t, s_t, stream)

        call()
        torch.cuda.synchronize()
        ms = _ms(call, st)
        row = {"compile_s": round(ctime, 1), "ms": ms, "tflops": flops / ms / 1e9,
               "err": float(((d_g[:, :, 0].double() - r64).abs() / r64).max())}
        key = f"dsl_interval_{iv}_tile{tile[0]}x{tile[1]}_cl{cluster[0]}x{cluster[1]}"
        res[key + f"_bn{int(b_n_major)}"] = row
        print(m, n, k, iv, tile, cluster, b_n_major, row, flush=True)
    if not cublas:
        return res
    a2 = cp.asarray(a_g[:, :, 0])
    b2 = cp.asarray(b_g[:, :, 0]).T
    c = cp.empty((m, n), dtype=cp.float32)
    cs = cp.cuda.ExternalStream(st.cuda_stream)

    def sliced(width):
        with cs:
            for s0 in range(0, k, width):
                BE.gemm_fp16(a2[:, s0:s0 + width], b2[s0:s0 + width], out=c, alpha=1.0,
                             beta=0.0 if s0 == 0 else 1.0)

    for width in (1024, k):
        sliced(width)
        torch.cuda.synchronize()
        ms = _ms(lambda width=width: sliced(width), st)
        c64 = torch.as_tensor(c, device="cuda").double()
        row = {"ms": ms, "tflops": flops / ms / 1e9,
               "err": float(((c64 - r64).abs() / r64).max())}
        res[f"cublas_slices_{width}"] = row
        print(m, n, k, "cublas", width, row, flush=True)
    return res


def main(argv):
    ex = _example(argv[0])
    out = {"dsl": str(getattr(cutlass, "__version__", "?")), "rows": []}
    runs = [((4096, 4096, 32768), dict(intervals=(64, 2048))),
            ((16384, 16384, 16384), dict(intervals=(64, 1024))),
            ((16384, 16384, 16384), dict(intervals=(64,), tile=(128, 128))),
            ((16384, 16384, 16384), dict(intervals=(64,), tile=(128, 128), cluster=(1, 2),
                                         cublas=False)),
            ((16384, 16384, 16384), dict(intervals=(64,), tile=(128, 128), b_n_major=True,
                                         cublas=False))]
    for shape, kw in runs:
        try:
            out["rows"].append(case(ex, *shape, **kw))
        except Exception as exc:  # a configuration the example does not take: say which
            traceback.print_exc()
            out["rows"].append({"shape": list(shape), "kw": repr(kw), "error": repr(exc)[:800]})
    with open(argv[1], "w") as fh:
        json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
