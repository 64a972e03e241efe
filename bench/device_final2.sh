#!/usr/bin/env bash
set -u
export PYTHONUNBUFFERED=1
D=$(date +%F)
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_engines.py tests/test_matmul.py tests/test_qr_panels.py tests/test_qr_methods.py tests/test_cupy_tsqr.py -k "cupy or bitwise" > $OUT/pytest_gpu2.log 2>&1
timeout 60 python3 -m mpqr bench gemm --repeat 3 --shapes 1048576x512x512,512x512x1048576 --json $OUT/gemm_longk_H200_$D.json > $OUT/bench_gemm2.log 2>&1
timeout 150 python3 -m mpqr bench qr --repeat 3 --max-seconds 3 --shapes 10000x256x32,16777216x32,1048576x256,16384x16384 --precisions fp16,fp32,fp64 --modes reduced --json $OUT/qr_H200_$D.json --png $OUT/qr_H200_$D.png > $OUT/bench_qr2.log 2>&1
timeout 60 python3 -m mpqr bench lstsq --shapes 4194304x64 --json $OUT/lstsq_4Mx64_H200_$D.json > $OUT/bench_lstsq2.log 2>&1
tail -1 $OUT/pytest_gpu2.log; grep -E "^FAILED" $OUT/pytest_gpu2.log | head | cut -c1-200
grep -v "^\s" $OUT/bench_gemm2.log | cut -c1-190; cut -c1-190 $OUT/bench_qr2.log; tail -12 $OUT/bench_lstsq2.log | cut -c1-150
