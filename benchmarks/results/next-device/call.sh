#!/bin/bash
# For the next device (written 2026-12-07, eighth session, when the budget had gone to failed starts):
# 1. fast-dllm's batch-1 step under each weight layout (see layout_fast_dllm_ab.py), LLaDA then Dream;
# 2. on an H200 only, the README's decode table again: gpu-check-2026-12-06f/call2.sh llada-8b, then dream-7b.
# Done on an H200 in the ninth session (gpu-check-2026-12-07c/): item 2, and item 1 for LLaDA. Still open: item 1
# on an H100 (where fast-dllm regressed) and for Dream. Run call-skinny-gemm.sh first: it measures new code.
source benchmarks/device_env.sh
start=$SECONDS; el() { echo "[elapsed $((SECONDS - start)) s]"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 270 python3 benchmarks/results/next-device/layout_fast_dllm_ab.py 2 llada-8b 2>&1 | grep -v Warning \
  | tee $OUT/layout-fast-dllm-llada.txt; el
timeout $((560 - SECONDS)) python3 benchmarks/results/next-device/layout_fast_dllm_ab.py 2 dream-7b 2>&1 \
  | grep -v Warning | tee $OUT/layout-fast-dllm-dream.txt; el
