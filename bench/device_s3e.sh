#!/usr/bin/env bash
# Session 3 run e: chosen right-solve kernel, host-side small steps; tall QR, lstsq,
# host-bound overhead; GPU tests of the touched paths.
set -u
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 bench/probe_s3.py $OUT/probe_s3e.json solve,tall,lstsq,overhead 2>&1 | grep -v "^gram" | tail -60
timeout 200 python3 -m pytest -q -p no:cacheprovider -x tests/test_cupy_right_solve.py tests/test_qr_tall_skinny.py tests/test_lstsq_refine.py tests/test_lstsq.py tests/test_qr_methods.py -k "cupy or right_solve or Cupy" 2>&1 | tail -8
