#!/usr/bin/env bash
# Session 2, run 3: blocking-launch profiles of the tall-skinny QR, Ozaki and 16384^2 fp16 QR.
set -u
export PYTHONUNBUFFERED=1
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_cupy_right_solve.py > $OUT/log_tests.txt 2>&1
export CUDA_LAUNCH_BLOCKING=1
for spec in "qr 16777216x32 fp64" "qr 1048576x256 fp64" "matmul 16384x16384x16384 fp64-emulated" "qr 16384x16384 fp16"; do
  timeout 100 python3 bench/profile_call.py $spec >> $OUT/log_prof.txt 2>&1
done
tail -2 $OUT/log_tests.txt
grep -E "^==|^ +[0-9]" $OUT/log_prof.txt | cut -c1-170
