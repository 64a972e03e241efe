#!/usr/bin/env bash
# Session 2, run 2: new kernels' GPU tests, tall-skinny QR/lstsq, Ozaki terms, 16384^2 breakdown.
set -u
export PYTHONUNBUFFERED=1
D=$(date +%F)
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_cupy_right_solve.py tests/test_reliability_gpu_faults.py tests/test_qr_tall_skinny.py tests/test_qr_methods.py tests/test_qr_api.py tests/test_lstsq.py -k "cupy or faults or right_solve" > $OUT/log_tests.txt 2>&1
timeout 200 python3 -m mpqr bench qr --repeat 3 --max-seconds 3 --shapes 16777216x32,4194304x64,1048576x256,10000x256x32 --precisions fp32,fp64 --modes reduced --json $OUT/qr_tall.json > $OUT/log_qr.txt 2>&1
timeout 150 python3 -m mpqr bench lstsq --shapes 4194304x64,1048576x256 --configs auto/auto/gelsd,auto/auto/gelsy,fp16/cgls/gelsy --json $OUT/lstsq.json > $OUT/log_lstsq.txt 2>&1
timeout 150 python3 bench/probe_s2.py $OUT/probe.json ozaki,square > $OUT/log_probe.txt 2>&1
tail -3 $OUT/log_tests.txt; grep -E "^(FAILED|ERROR)|^E " $OUT/log_tests.txt | head -20 | cut -c1-250
cut -c1-200 $OUT/log_qr.txt; tail -22 $OUT/log_lstsq.txt | cut -c1-150
cut -c1-220 $OUT/log_probe.txt | grep -v "^\s*$" | head -60
