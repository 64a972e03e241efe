#!/usr/bin/env bash
# Session 3 run f: host-side profile of small qr / lstsq calls.
set -u
export PYTHONUNBUFFERED=1
for w in qr lstsq; do
  timeout 60 python3 bench/profile_host.py $w 16384x32 2>&1 | grep -v "^$" | head -32 | cut -c1-140
done
