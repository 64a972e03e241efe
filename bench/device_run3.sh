#!/usr/bin/env bash
set -u
export PYTHONUNBUFFERED=1
timeout 300 python3 -m pytest -q -k "cupy" tests/ -p no:cacheprovider 2>&1 | grep -E "FAILED|ERROR|passed|failed|Error" | head -60 | tee $OUT/pytest_gpu.log
timeout 300 python3 -m pytest -q tests/test_cupy_tsqr.py 2>&1 | tail -15 | tee $OUT/pytest_tsqr.log
timeout 120 python3 -c "import mpqr; print(mpqr.tune())" 2>&1 | tail -5 | tee $OUT/tune.log
timeout 420 python3 -m mpqr bench gemm --repeat 5 --shapes 2048x2048x2048,4096x4096x4096,8192x8192x8192,16384x16384x16384,1048576x512x512,512x512x1048576 --slice-sweep 256,512 --ozaki-terms 15,16 --json $OUT/gemm.json 2>&1 | tee $OUT/bench_gemm.log | tail -60
