#!/usr/bin/env bash
# Session 5 probe: lstsq breakdown and singular-value candidates.
set -u
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
nproc
cd bench && timeout 500 python3 probe_s5.py $OUT/probe_s5.json ${1:-} 2>&1 | tail -80
