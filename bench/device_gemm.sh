#!/usr/bin/env bash
# One device call: GPU tests of the GEMM layer, then the GEMM benchmark.
set -u
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee $OUT/gpu.txt
python3 -m pytest -q -x tests/test_engines.py tests/test_matmul.py tests/test_policy.py tests/test_backends.py -k "cupy or not numpy" 2>&1 | tail -25 | tee $OUT/pytest_gemm.log
python3 -m mpqr bench gemm --repeat 5 --slice-sweep ${SLICES:-256,512,2048,4096} --json $OUT/gemm.json 2>&1 | tee $OUT/bench_gemm.log
