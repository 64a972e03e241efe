#!/usr/bin/env bash
# Session 2, run 1: GPU tests (incl. the GPU-fault tests), the CuPy demo, diagnostics.
set -u
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader > $OUT/log_tests.txt
timeout 240 python3 -m pytest -q -p no:cacheprovider -x -k "cupy or bitwise" tests/ >> $OUT/log_tests.txt 2>&1
timeout 60 python3 -m pytest -q -p no:cacheprovider -rs tests/test_reliability_gpu_faults.py >> $OUT/log_tests.txt 2>&1
timeout 60 python3 -m mpqr demo > $OUT/log_demo.txt 2>&1
timeout 200 python3 bench/probe_s2.py $OUT/probe.json int8,tall,ozaki > $OUT/log_probe.txt 2>&1
timeout 120 python3 bench/probe_s2.py $OUT/probe_sq.json square > $OUT/log_probe_sq.txt 2>&1
tail -3 $OUT/log_tests.txt; grep -E "^(FAILED|ERROR)" $OUT/log_tests.txt | head -20 | cut -c1-250
tail -25 $OUT/log_demo.txt | cut -c1-200
cut -c1-230 $OUT/log_probe.txt | grep -v "^\s*$" | head -90
cut -c1-200 $OUT/log_probe_sq.txt | head -40
