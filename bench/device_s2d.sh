#!/usr/bin/env bash
# Session 2, run 4: GPU tests of the new kernels/engine paths; tall-skinny QR, lstsq, Ozaki GEMM.
set -u
export PYTHONUNBUFFERED=1
D=$(date +%F)
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_cupy_right_solve.py tests/test_reliability_gpu_faults.py tests/test_qr_tall_skinny.py tests/test_ozaki.py tests/test_qr_api.py tests/test_lstsq.py tests/test_lstsq_refine.py tests/test_matmul.py -k "cupy or faults or right_solve or bitwise" > $OUT/log_tests.txt 2>&1
timeout 150 python3 -m mpqr bench gemm --tune --repeat 3 --shapes 8192x8192x8192,16384x16384x16384 --json $OUT/gemm.json > $OUT/log_gemm.txt 2>&1
timeout 120 python3 -m mpqr bench qr --repeat 3 --max-seconds 3 --shapes 16777216x32,4194304x64,1048576x256 --precisions fp64 --modes reduced,r --json $OUT/qr_tall.json > $OUT/log_qr.txt 2>&1
timeout 150 python3 -m mpqr bench lstsq --shapes 4194304x64,1048576x256,65536x2048 --configs auto/auto/gelsd,auto/auto/gelsy,fp32-emulated/cgls/gelsy --json $OUT/lstsq.json > $OUT/log_lstsq.txt 2>&1
tail -3 $OUT/log_tests.txt; grep -E "^(FAILED|ERROR)" $OUT/log_tests.txt | head -20 | cut -c1-250
grep -v "^\s" $OUT/log_gemm.txt | cut -c1-200 | tail -22
cut -c1-200 $OUT/log_qr.txt; tail -26 $OUT/log_lstsq.txt | cut -c1-150
