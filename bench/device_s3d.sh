#!/usr/bin/env bash
# Session 3 run d: right-solve kernel variants (form x rows per block x min blocks per SM).
set -u
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 300 python3 bench/probe_s3.py $OUT/probe_s3d.json variants 2>&1 | tail -80
