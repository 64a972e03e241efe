#!/usr/bin/env bash
# Device runs: `bash bench/device.sh JOB [JOB ...]` (after the install prefix that
# ../shared/device/prepare.sh prints); logs, JSON and PNG go to $OUT.
#   tests           every GPU test, then the GPU-fault tests
#   demo            python -m mpqr demo, timed
#   gemm            bench gemm with tuning at 8192^3 and 16384^3 (the cost model's break-even)
#   qr              bench qr: every shape, precision and mode, against cuSOLVER
#   lstsq           bench lstsq: against the cuSOLVER routes
#   probe:SECTIONS  bench/probe_s7.py with comma-separated sections
#   probe9:SECTIONS bench/probe_s9.py with comma-separated sections
#   probe11:SECTIONS bench/probe_s11.py with comma-separated sections
#   probe12:SECTIONS bench/probe_s12.py with comma-separated sections
#   probe13:SECTIONS bench/probe_s13.py with comma-separated sections
#   probe14:SECTIONS bench/probe_s14.py with comma-separated sections
#   probe15:SECTIONS bench/probe_s15.py with comma-separated sections
#   stepstests      the CholQR device-steps tests and the other CholQR files (cholqrtests')
#   paneltests      the GPU tests of the leaf panels, TSQR and the recursive QR's methods
#   qrtests         the GPU tests of the QR and right-solve files only
#   cholqrtests     qrtests' files plus every other file that runs CholQR or its breakdowns
#   cplxtests       the GPU tests of the complex engines, Gram calls and moduli choice
#   cplxgemm        bench gemm's complex (ZGEMM/CGEMM vs 2M/4M/3M) and Gram rows (the real
#                   rows are the gemm job's)
#   benchgap        the probe's 2^20x256 / 2^22x64 timing around short bench qr runs (session 12:
#                   the bench read ~15% slower than the probes on these shapes)
set -u
export PYTHONUNBUFFERED=1
D=$(date +%F)
DEV=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -oE "H100|H200|A100" || echo GPU)
L=$OUT/log_${DEV}_$D.txt
echo "== $(nvidia-smi --query-gpu=name --format=csv,noheader)" >> "$L"
for job in "$@"; do
  echo "== job $job" >> "$L"
  case $job in
    tests)
      timeout 540 python3 -m pytest -q -p no:cacheprovider -k "cupy or bitwise or right_solve" \
        tests/ > "$OUT/pytest.txt" 2>&1
      timeout 40 python3 -m pytest -q -p no:cacheprovider -rs \
        tests/test_reliability_gpu_faults.py >> "$OUT/pytest.txt" 2>&1
      grep -E "passed|failed|^(FAILED|ERROR)" "$OUT/pytest.txt" | cut -c1-200 >> "$L" ;;
    demo) ( time timeout 150 python3 -m mpqr demo ) >> "$L" 2>&1 ;;
    gemm)
      timeout 150 python3 -m mpqr bench gemm --tune --repeat 5 \
        --shapes 8192x8192x8192,16384x16384x16384 --json "$OUT/gemm_${DEV}_$D.json" >> "$L" 2>&1 ;;
    qr)
      timeout 280 python3 -m mpqr bench qr --repeat 3 --max-seconds 2 \
        --json "$OUT/qr_${DEV}_$D.json" --png "$OUT/qr_${DEV}_$D.png" >> "$L" 2>&1 ;;
    lstsq) timeout 240 python3 -m mpqr bench lstsq --json "$OUT/lstsq_${DEV}_$D.json" >> "$L" 2>&1 ;;
    probe:*)
      (cd bench && timeout 500 python3 probe_s7.py "$OUT/probe_$D.json" "${job#probe:}") >> "$L" 2>&1 ;;
    probe11:*)
      (cd bench && timeout 500 python3 probe_s11.py "$OUT/probe11_$D.json" "${job#probe11:}") >> "$L" 2>&1 ;;
    probe13:*)
      (cd bench && timeout 500 python3 probe_s13.py "$OUT/probe13_$D.json" "${job#probe13:}") >> "$L" 2>&1 ;;
    probe14:*)
      (cd bench && timeout 300 python3 probe_s14.py "$OUT/probe14_$D.json" "${job#probe14:}") >> "$L" 2>&1 ;;
    probe15:*)
      (cd bench && timeout 300 python3 probe_s15.py "$OUT/probe15_$D.json" "${job#probe15:}") >> "$L" 2>&1 ;;
    stepstests)
      timeout 300 python3 -m pytest -q -p no:cacheprovider -k cupy tests/test_qr_cholqr_steps.py \
        tests/test_cupy_right_solve.py tests/test_qr_cholqr_fused.py tests/test_qr_tall_skinny.py \
        tests/test_qr_methods.py tests/test_lstsq_gram.py tests/test_reliability_values.py \
        > "$OUT/pytest_steps.txt" 2>&1
      grep -E "passed|failed|^(FAILED|ERROR)|Error" "$OUT/pytest_steps.txt" | cut -c1-300 >> "$L" ;;
    paneltests)
      timeout 300 python3 -m pytest -q -p no:cacheprovider -k cupy tests/test_qr_panels.py \
        tests/test_cupy_tsqr.py tests/test_qr_methods.py tests/test_qr_accuracy_fp16.py tests/test_policy.py \
        > "$OUT/pytest_panel.txt" 2>&1
      grep -E "passed|failed|^(FAILED|ERROR)|Error" "$OUT/pytest_panel.txt" | cut -c1-300 >> "$L" ;;
    probe12:*)
      (cd bench && timeout 500 python3 probe_s12.py "$OUT/probe12_$D.json" "${job#probe12:}") >> "$L" 2>&1 ;;
    qrtests)
      timeout 300 python3 -m pytest -q -p no:cacheprovider -k cupy tests/test_cupy_right_solve.py \
        tests/test_qr_cholqr_fused.py tests/test_qr_tall_skinny.py tests/test_qr_workspace.py \
        > "$OUT/pytest_qr.txt" 2>&1
      grep -E "passed|failed|^(FAILED|ERROR)|Error" "$OUT/pytest_qr.txt" | cut -c1-300 >> "$L" ;;
    cholqrtests)
      timeout 240 python3 -m pytest -q -p no:cacheprovider -k cupy tests/test_cupy_right_solve.py \
        tests/test_qr_cholqr_fused.py tests/test_qr_tall_skinny.py tests/test_qr_workspace.py \
        tests/test_qr_methods.py tests/test_lstsq_gram.py tests/test_reliability_values.py \
        tests/test_reliability_mutation.py tests/test_gram_blocked.py > "$OUT/pytest_cholqr.txt" 2>&1
      grep -E "passed|failed|^(FAILED|ERROR)|Error" "$OUT/pytest_cholqr.txt" | cut -c1-300 >> "$L" ;;
    benchgap)
      smi() { nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv,noheader >> "$L"; }
      tall="--shapes 1048576x256,4194304x64 --precisions fp64 --modes reduced --repeat 5"
      smi; (cd bench && timeout 100 python3 probe_s12.py "$OUT/gap1.json" w256) >> "$L" 2>&1
      smi; timeout 100 python3 -m mpqr bench qr $tall --json "$OUT/gap2.json" >> "$L" 2>&1
      smi; timeout 100 python3 -m mpqr bench qr --shapes 16384x16384 --precisions fp64,fp16 \
        --modes reduced --json "$OUT/gap3.json" >> "$L" 2>&1
      smi; timeout 100 python3 -m mpqr bench qr $tall --json "$OUT/gap4.json" >> "$L" 2>&1
      smi; (cd bench && timeout 100 python3 probe_s12.py "$OUT/gap5.json" w256) >> "$L" 2>&1
      smi ;;
    cplxtests)
      timeout 500 python3 -m pytest -q -p no:cacheprovider -k cupy tests/test_engines_complex.py \
        tests/test_gram_engine.py tests/test_ozaki_moduli.py tests/test_qr_complex.py \
        tests/test_cupy_int8_lt.py tests/test_ozaki.py tests/test_engines.py tests/test_matmul.py \
        tests/test_gram_blocked.py tests/test_lstsq_gram.py > "$OUT/pytest_cplx.txt" 2>&1
      grep -E "passed|failed|^(FAILED|ERROR)|Error" "$OUT/pytest_cplx.txt" | cut -c1-300 >> "$L" ;;
    cplxgemm)
      timeout 560 python3 -m mpqr bench gemm --tune --repeat 3 --kinds complex,gram \
        --json "$OUT/gemm_cplx_${DEV}_$D.json" >> "$L" 2>&1 ;;
    probe9:*)
      (cd bench && timeout 500 python3 probe_s9.py "$OUT/probe9_$D.json" "${job#probe9:}") >> "$L" 2>&1 ;;
    *) echo "unknown job $job" >> "$L" ;;
  esac
done
grep -v "^\s\s\s\s" "$L" | cut -c1-220 | tail -100
