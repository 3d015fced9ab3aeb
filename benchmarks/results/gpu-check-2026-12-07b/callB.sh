#!/bin/bash
# Device call B: the seventh session's two small-kernel cuts against the code before them (one process, alternating
# rounds), then the decode bench at batch 1 in 5 processes x 400 iterations on the current code.
source benchmarks/device_env.sh
start=$SECONDS; el() { echo "[elapsed $((SECONDS - start)) s]"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 230 python3 benchmarks/results/gpu-check-2026-12-07a/small_kernels_ab.py 2 llada-8b 2>&1 | grep -v Warning \
  | tee $OUT/small-kernels-ab.txt; el
timeout $((560 - SECONDS)) python3 -m flash_dllm.engine.bench decode --geometry llada-8b \
  --methods flash-cache,flash-verify,fast-dllm --batch-sizes 1 --iterations 400 --repeats 5 --out $OUT/llada-b1-5x400 \
  2>&1 | tail -14; el
