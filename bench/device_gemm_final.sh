#!/usr/bin/env bash
set -u
export PYTHONUNBUFFERED=1
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_engines.py tests/test_matmul.py tests/test_ozaki.py tests/test_policy.py tests/test_backends.py -k "cupy" > $OUT/pytest_engines_gpu.log 2>&1
timeout 60 python3 -c "import mpqr; print(mpqr.tune())" > $OUT/tune.log 2>&1
timeout 330 python3 -m mpqr bench gemm --repeat 5 --ozaki-terms 15 --json $OUT/gemm.json > $OUT/bench_gemm.log 2>&1
tail -3 $OUT/pytest_engines_gpu.log; grep -E "^FAILED" $OUT/pytest_engines_gpu.log | head; cat $OUT/tune.log; grep -v "^\s" $OUT/bench_gemm.log | cut -c1-200
