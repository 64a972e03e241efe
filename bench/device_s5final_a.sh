#!/usr/bin/env bash
# Session 5 final run, part a: every GPU test (incl. the GPU-fault tests) and the demo.
set -u
export PYTHONUNBUFFERED=1
D=$(date +%F)
DEV=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -oE "H100|H200|A100" || echo GPU)
L=$OUT/log_a_${DEV}_$D.txt
echo "== $(nvidia-smi --query-gpu=name --format=csv,noheader)" > $L
timeout 360 python3 -m pytest -q -p no:cacheprovider -k "cupy or bitwise or right_solve" tests/ > $OUT/pytest.txt 2>&1
timeout 40 python3 -m pytest -q -p no:cacheprovider -rs tests/test_reliability_gpu_faults.py >> $OUT/pytest.txt 2>&1
( time timeout 150 python3 -m mpqr demo ) >> $L 2>&1
grep -E "passed|failed" $OUT/pytest.txt; grep -E "^(FAILED|ERROR)" $OUT/pytest.txt | head -20 | cut -c1-200
grep -v "^\s\s\s\s" $L | cut -c1-220 | tail -60
