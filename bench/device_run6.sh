#!/usr/bin/env bash
set -u
export PYTHONUNBUFFERED=1
timeout 100 python3 bench/profile_qr.py 8192x8192 fp16 > $OUT/prof_8192_fp16.txt 2>&1
timeout 60 python3 bench/profile_qr.py 4194304x64 fp64 > $OUT/prof_tall_fp64.txt 2>&1
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_ozaki.py tests/test_qr_applications.py tests/test_qr_methods.py tests/test_cupy_tsqr.py tests/test_lstsq.py tests/test_lstsq_refine.py tests/test_compat_scipy.py -k "cupy or bitwise" > $OUT/pytest_gpu.log 2>&1
for f in $OUT/prof_*.txt; do head -3 $f; grep -A22 "tottime" $f | cut -c1-160; done
grep -E "^FAILED|passed|failed" $OUT/pytest_gpu.log | tail -25 | cut -c1-250
