#!/usr/bin/env bash
# GPU runs: `OUT=DIR bash bench/device.sh JOB [JOB ...]` after
# `python3 -m pip install -e ".[cuda13,test,plot]"` (or cuda12). The log, JSON and PNG
# files go to $OUT, named TOPIC_DEVICE_DATE; copy the ones to keep into bench/results/
# and run `python -m mpqr.bench.render_results`.
#   tests     the GPU tests of test files a-p (one device command each half), or of the
#             files in $TEST_FILES when set
#   tests2    the GPU tests of test files q-z, then the GPU-fault tests
#   demo      python -m mpqr demo, timed
#   warmup    re-record the kernel list (python -m mpqr warmup --record, into the package and
#             $OUT), then the demo in a fresh kernel cache: the first run on a new machine
#   gemm      bench gemm after mpqr.tune(), at 8192^3 and 16384^3 (the cost model's break-even)
#   qr        bench qr: the square shapes, then the tall ones at cond 1 ... 1e15, against cuSOLVER
#   pivot     QR with column pivoting on the GPU (bench/probes/pivot_sketch.py)
#   lstsq     bench lstsq: against the cuSOLVER routes
#   accuracy  bench accuracy at 1024^2 with the cond(A) sweep
#   dask      bench dask on every GPU of the machine (dask_cuda.LocalCUDACluster)
#   dasktests the dask tests (CuPy blocks included)
#   bridge    bench bridge: mpqr on torch/JAX arrays against the same call on CuPy
#   bridgetests the bridge tests (torch and JAX on the GPU and the CPU)
#   ooc       bench ooc (tall rows, the first calls in fresh processes, then the square rows
#             merged into the same JSON: three processes, each within a 10-minute command)
#   oocmid    bench ooc's tall 8 GB row against NumPy and dask on the CPU cores
#   oocsweep  bench ooc's staging sweep (host copy threads x largest piece)
#   cplxtests the GPU tests of the complex products, Gram calls and moduli choice
#   cplxgemm  bench gemm's complex (ZGEMM/CGEMM) and Gram rows
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-bench/out}
mkdir -p "$OUT"
D=$(date +%F)
DEV=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -oE "H100|H200|A100" || echo GPU)
L=$OUT/log_${DEV}_$D.txt
echo "== $(nvidia-smi --query-gpu=name --format=csv,noheader)" >> "$L"
for job in "$@"; do
  echo "== job $job" >> "$L"
  name="$OUT/${job}_${DEV}_$D"
  case $job in
    tests|tests2)
      # the GPU tests take longer than one device command: test files a-p, then q-z
      files=$(ls tests/test_*.py | grep -E "^tests/test_[a-p]")
      [ "$job" = tests2 ] && files=$(ls tests/test_*.py | grep -E "^tests/test_[q-z]")
      [ "$job" = tests ] && [ -n "${TEST_FILES:-}" ] && files=$TEST_FILES
      timeout 540 python3 -m pytest -q -n 0 -p no:cacheprovider -k "cupy or bitwise or right_solve" \
        $files > "$OUT/pytest_$job.txt" 2>&1
      [ "$job" = tests2 ] && timeout 40 python3 -m pytest -q -n 0 -p no:cacheprovider -rs \
        tests/test_reliability_gpu_faults.py >> "$OUT/pytest_$job.txt" 2>&1
      grep -E "passed|failed|^(FAILED|ERROR)" "$OUT/pytest_$job.txt" | cut -c1-200 >> "$L" ;;
    demo) ( time timeout 150 python3 -m mpqr demo ) >> "$L" 2>&1 ;;
    warmup)
      timeout 200 python3 -m mpqr warmup --record backends/cupy/data/cupy_kernels.json.gz >> "$L" 2>&1
      cp backends/cupy/data/cupy_kernels.json.gz "$OUT/"
      ( export CUPY_CACHE_DIR=$(mktemp -d); time timeout 150 python3 -m mpqr demo ) >> "$L" 2>&1 ;;
    gemm)
      timeout 150 python3 -m mpqr bench gemm --tune --repeat 5 \
        --shapes 8192x8192x8192,16384x16384x16384 --json "$name.json" --png "$name.png" \
        >> "$L" 2>&1 ;;
    qr)
      timeout 290 python3 -m mpqr bench qr --shapes square --repeat 2 --max-seconds 2 \
        --precisions fp16,fp32-emulated,fp64-emulated \
        --json "${name}_square.json" --png "${name}_square.png" >> "$L" 2>&1
      timeout 290 python3 -m mpqr bench qr --shapes tall --repeat 3 --max-seconds 2 \
        --conds 1,1e8,1e12,1e15 --json "${name}_tall.json" --png "${name}_tall.png" \
        >> "$L" 2>&1 ;;
    pivot)
      timeout 300 python3 bench/probes/pivot_sketch.py "$name.json" >> "$L" 2>&1 ;;
    lstsq)
      timeout 240 python3 -m mpqr bench lstsq --json "$name.json" --png "$name.png" \
        >> "$L" 2>&1 ;;
    accuracy)
      timeout 280 python3 -m mpqr bench accuracy --n 1024 --cond-sweep \
        --json "$name.json" --png "$name.png" >> "$L" 2>&1 ;;
    dask)
      G=$(nvidia-smi -L | wc -l)
      timeout 580 python3 -m mpqr bench dask --gpus "$G" --repeat 3 \
        --json "$OUT/dask_${DEV}x${G}_$D.json" --png "$OUT/dask_${DEV}x${G}_$D.png" >> "$L" 2>&1 ;;
    dasktests)
      timeout 300 python3 -m pytest -q -n 0 -p no:cacheprovider tests/test_dask_qr.py \
        tests/test_dask_lstsq.py tests/test_dask_cluster.py > "$OUT/pytest_dask.txt" 2>&1
      grep -E "passed|failed|^(FAILED|ERROR)" "$OUT/pytest_dask.txt" | cut -c1-300 >> "$L" ;;
    bridge)
      XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 500 python3 -m mpqr bench bridge --repeat 7 \
        --json "$OUT/bridge_${DEV}_$D.json" --png "$OUT/bridge_${DEV}_$D.png" >> "$L" 2>&1 ;;
    bridgetests)
      XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 300 python3 -m pytest -q -n 0 -p no:cacheprovider -rs \
        tests/test_bridge.py tests/test_bridge_torch.py tests/test_bridge_jax.py \
        > "$OUT/pytest_bridge.txt" 2>&1
      grep -E "passed|failed|^(FAILED|ERROR)|Error" "$OUT/pytest_bridge.txt" | cut -c1-300 >> "$L" ;;
    ooc)
      timeout 590 python3 -m mpqr bench ooc --rows tall_big --json "$name.part1.json" \
        >> "$L" 2>&1
      timeout 590 python3 -m mpqr bench ooc --rows first_call --merge "$name.part1.json" \
        --json "$name.part2.json" >> "$L" 2>&1
      timeout 590 python3 -m mpqr bench ooc --rows square --merge "$name.part2.json" \
        --json "$name.json" --png "$name.png" >> "$L" 2>&1 ;;
    oocmid)
      timeout 590 python3 -m mpqr bench ooc --rows tall_mid --json "$name.json" >> "$L" 2>&1 ;;
    oocsweep)
      timeout 590 python3 -m mpqr bench ooc --rows staging_sweep --repeat 1 --json "$name.json" \
        >> "$L" 2>&1 ;;
    cplxtests)
      timeout 500 python3 -m pytest -q -n 0 -p no:cacheprovider -k cupy tests/test_engines_complex.py \
        tests/test_gram_engine.py tests/test_ozaki_moduli.py tests/test_qr_complex.py \
        tests/test_cupy_int8_lt.py tests/test_ozaki.py tests/test_engines.py tests/test_matmul.py \
        tests/test_gram_blocked.py tests/test_lstsq_gram.py > "$OUT/pytest_cplx.txt" 2>&1
      grep -E "passed|failed|^(FAILED|ERROR)|Error" "$OUT/pytest_cplx.txt" | cut -c1-300 >> "$L" ;;
    cplxgemm)
      timeout 560 python3 -m mpqr bench gemm --tune --repeat 3 --kinds complex,gram \
        --json "$OUT/gemm_cplx_${DEV}_$D.json" --png "$OUT/gemm_cplx_${DEV}_$D.png" >> "$L" 2>&1 ;;
    *) echo "unknown job $job (tests, demo, warmup, gemm, qr, lstsq, accuracy, dask, dasktests, bridge, bridgetests, ooc, cplxtests, cplxgemm)" >> "$L" ;;
  esac
done
grep -v "^\s\s\s\s" "$L" | cut -c1-220 | tail -100
