#!/usr/bin/env bash
# Session 3 run b: the new right-solve kernel vs the old, tall QR and lstsq timings,
# the right-solve and lstsq GPU tests.
set -u
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 bench/probe_s3.py $OUT/probe_s3b.json ${SECTIONS:-solve,tall,lstsq,overhead} 2>&1 | tail -60
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_cupy_right_solve.py tests/test_qr_tall_skinny.py tests/test_lstsq_refine.py -k "cupy or right_solve or Cupy" 2>&1 | tail -8
