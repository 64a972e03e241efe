#!/usr/bin/env bash
# Session 3 run a: where the time goes (blocking-launch profiles) for the tall shapes,
# lstsq and the Ozaki engine.
set -u
export PYTHONUNBUFFERED=1 CUDA_LAUNCH_BLOCKING=1
nvidia-smi --query-gpu=name --format=csv,noheader
for args in "qr 16777216x32 fp64" "qr 4194304x64 fp64" "qr 1048576x256 fp64" "lstsq 4194304x64 auto" "lstsq 1048576x256 auto" "matmul 16384x16384x16384 fp64-emulated" "matmul 8192x8192x8192 fp64-emulated"; do
  timeout 100 python3 bench/profile_call.py $args 2>&1 | grep -v "^$" | head -30 | cut -c1-160
done
