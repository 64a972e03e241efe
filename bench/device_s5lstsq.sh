#!/usr/bin/env bash
# Session 5: lstsq phases (probe) and the least-squares benchmark against the cuSOLVER routes.
set -u
export PYTHONUNBUFFERED=1
D=$(date +%F)
DEV=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -oE "H100|H200|A100" || echo GPU)
L=$OUT/log_lstsq_${DEV}_$D.txt
echo "== $(nvidia-smi --query-gpu=name --format=csv,noheader)" > $L
(cd bench && timeout 150 python3 probe_s5.py $OUT/probe_s5_lstsq.json lstsq6) >> $L 2>&1
timeout 240 python3 -m mpqr bench lstsq --json $OUT/lstsq_${DEV}_$D.json >> $L 2>&1
grep -v "^\s\s\s\s" $L | cut -c1-250 | tail -90
