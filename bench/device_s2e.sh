#!/usr/bin/env bash
# Session 2, run 5: strided-GEMM check, profiles of 2^20x256 QR and lstsq, Ozaki after its changes.
set -u
export PYTHONUNBUFFERED=1
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_cupy_right_solve.py tests/test_qr_tall_skinny.py -k "cupy or right_solve" > $OUT/log_tests.txt 2>&1
timeout 150 python3 -m mpqr bench gemm --tune --repeat 3 --shapes 8192x8192x8192,16384x16384x16384 --json $OUT/gemm.json > $OUT/log_gemm.txt 2>&1
timeout 60 python3 -m mpqr bench qr --repeat 3 --shapes 1048576x256 --precisions fp64 --modes reduced,r > $OUT/log_qr.txt 2>&1
for spec in "qr 1048576x256 fp64" "lstsq 4194304x64 auto" "lstsq 1048576x256 auto"; do
  CUDA_LAUNCH_BLOCKING=1 timeout 60 python3 bench/profile_call.py $spec >> $OUT/log_prof.txt 2>&1
done
tail -2 $OUT/log_tests.txt; grep -E "^(FAILED|ERROR)" $OUT/log_tests.txt | head
grep -v "^\s" $OUT/log_gemm.txt | cut -c1-200 | tail -12
cut -c1-200 $OUT/log_qr.txt
grep -E "^==|^ +[0-9]" $OUT/log_prof.txt | cut -c1-160 | head -60
