#!/usr/bin/env bash
# Session 5 final run, part b: the QR benchmark (every shape and precision, both
# modes, against cuSOLVER in the same process).
set -u
export PYTHONUNBUFFERED=1
D=$(date +%F)
DEV=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -oE "H100|H200|A100" || echo GPU)
L=$OUT/log_b_${DEV}_$D.txt
echo "== $(nvidia-smi --query-gpu=name --format=csv,noheader)" > $L
timeout 60 python3 -m pytest -q -p no:cacheprovider -k "cupy" tests/test_qr_tall_skinny.py tests/test_qr_methods.py 2>&1 | tail -2 >> $L
timeout 280 python3 -m mpqr bench qr --repeat 3 --max-seconds 2 --json $OUT/qr_${DEV}_$D.json --png $OUT/qr_${DEV}_$D.png >> $L 2>&1
grep -v "^\s\s\s\s" $L | cut -c1-220 | tail -90
