#!/usr/bin/env bash
set -u
export PYTHONUNBUFFERED=1
python3 -m pytest -q tests/test_engines.py tests/test_matmul.py tests/test_backends.py -k "cupy" 2>&1 | tail -25 | tee $OUT/pytest_gemm.log
timeout 200 python3 -m pytest -q -x tests/test_cupy_tsqr.py 2>&1 | tail -30 | tee $OUT/pytest_tsqr.log
python3 -m mpqr bench gemm --repeat 5 --shapes 32x32x1024,16x16x65536,8192x8192x8192,16384x16384x16384,1048576x512x512,512x512x1048576 --slice-sweep 128,256,512,1024 --json $OUT/gemm.json 2>&1 | grep -v "fp64" | tee $OUT/bench_gemm.log
timeout 120 python3 -m mpqr.tools.bench_tsqr 2>&1 | tail -20 | tee $OUT/bench_tsqr.log
