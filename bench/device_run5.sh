#!/usr/bin/env bash
set -u
export PYTHONUNBUFFERED=1
timeout 280 python3 -m pytest -q -k "cupy" tests/ -p no:cacheprovider --ignore=tests/test_cupy_tsqr.py --deselect "tests/test_lstsq.py" > $OUT/pytest_gpu.log 2>&1
timeout 100 python3 -m pytest -q tests/test_cupy_tsqr.py > $OUT/pytest_tsqr.log 2>&1
timeout 200 python3 -m mpqr bench qr --repeat 3 --max-seconds 6 --json $OUT/qr.json --png $OUT/qr.png > $OUT/bench_qr.log 2>&1
grep -E "passed|failed|FAILED|Error" $OUT/pytest_gpu.log | tail -30 | cut -c1-300; grep -E "passed|failed|FAILED" $OUT/pytest_tsqr.log | tail -5; cat $OUT/bench_qr.log | cut -c1-220 | tail -75
