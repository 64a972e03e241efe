#!/usr/bin/env bash
set -u
export PYTHONUNBUFFERED=1
timeout 330 python3 -m pytest -q -k "cupy" tests/ -p no:cacheprovider -x --ignore=tests/test_cupy_tsqr.py 2>&1 | grep -vE "^\s*$" | tail -40 | cut -c1-400 > $OUT/pytest_gpu.log
timeout 120 python3 -m pytest -q tests/test_cupy_tsqr.py 2>&1 | tail -5 | cut -c1-400 > $OUT/pytest_tsqr.log
timeout 60 python3 -c "import mpqr; print(mpqr.tune())" > $OUT/tune.log 2>&1
timeout 300 python3 -m mpqr bench gemm --repeat 5 --shapes 2048x2048x2048,4096x4096x4096,8192x8192x8192,16384x16384x16384,1048576x512x512,512x512x1048576 --slice-sweep 256,512 --ozaki-terms 15 --json $OUT/gemm.json > $OUT/bench_gemm.log 2>&1
cat $OUT/pytest_gpu.log $OUT/pytest_tsqr.log $OUT/tune.log; grep -v "^\s" $OUT/bench_gemm.log | cut -c1-200 | tail -45
