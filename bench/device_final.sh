#!/usr/bin/env bash
# Final device run: every GPU test, then the QR, lstsq and accuracy benchmarks.
set -u
export PYTHONUNBUFFERED=1
D=$(date +%F)
timeout 170 python3 -m pytest -q -p no:cacheprovider -k "cupy or bitwise" tests/ > $OUT/pytest_gpu.log 2>&1
timeout 190 python3 -m mpqr bench qr --repeat 3 --max-seconds 4 --json $OUT/qr_H200_$D.json --png $OUT/qr_H200_$D.png > $OUT/bench_qr.log 2>&1
timeout 90 python3 -m mpqr bench lstsq --json $OUT/lstsq_H200_$D.json > $OUT/bench_lstsq.log 2>&1
timeout 80 python3 -m mpqr bench accuracy --n 1024 --cond-sweep --json $OUT/accuracy_H200_n1024_$D.json > $OUT/bench_acc.log 2>&1
tail -1 $OUT/pytest_gpu.log; grep -E "^FAILED" $OUT/pytest_gpu.log | head -20 | cut -c1-200
cut -c1-190 $OUT/bench_qr.log | tail -70; tail -25 $OUT/bench_lstsq.log | cut -c1-200; tail -5 $OUT/bench_acc.log
