#!/usr/bin/env bash
# Session 2 final device run: every GPU test (incl. the GPU-fault tests), the demo,
# then the GEMM (with tuning and break-even), QR, lstsq and accuracy benchmarks.
set -u
export PYTHONUNBUFFERED=1
D=$(date +%F)
DEV=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -oE "H100|H200|A100" || echo GPU)
L=$OUT/log_${DEV}_$D.txt
echo "== $(nvidia-smi --query-gpu=name --format=csv,noheader)" > $L
timeout 170 python3 -m pytest -q -p no:cacheprovider -k "cupy or bitwise or right_solve" tests/ > $OUT/pytest.txt 2>&1
timeout 40 python3 -m pytest -q -p no:cacheprovider -rs tests/test_reliability_gpu_faults.py >> $OUT/pytest.txt 2>&1
timeout 60 python3 -m mpqr demo >> $L 2>&1
timeout 100 python3 -m mpqr bench gemm --tune --repeat 3 --shapes 8192x8192x8192,16384x16384x16384 --json $OUT/gemm_${DEV}_$D.json >> $L 2>&1
timeout 220 python3 -m mpqr bench qr --repeat 3 --max-seconds 2 --json $OUT/qr_${DEV}_$D.json --png $OUT/qr_${DEV}_$D.png >> $L 2>&1
timeout 90 python3 -m mpqr bench lstsq --json $OUT/lstsq_${DEV}_$D.json >> $L 2>&1
grep -E "passed|failed" $OUT/pytest.txt; grep -E "^(FAILED|ERROR)" $OUT/pytest.txt | head -20 | cut -c1-200
grep -v "^\s\s\s\s" $L | cut -c1-200 | tail -120
