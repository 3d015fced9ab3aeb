#!/bin/bash
# Ninth session (2026-12-07): the split-K skinny GEMM probe for O and down (benchmarks/probe_skinny_gemm.py),
# then fast-dllm's batch-1 step under each weight layout on LLaDA (call.sh's first half).
source benchmarks/device_env.sh
start=$SECONDS; el() { echo "[elapsed $((SECONDS - start)) s]"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 300 python3 benchmarks/probe_skinny_gemm.py --csv $OUT/probe-skinny-gemm.csv 2>&1 | grep -v Warning \
  | tee $OUT/probe-skinny-gemm.txt; el
timeout $((570 - SECONDS)) python3 benchmarks/results/next-device/layout_fast_dllm_ab.py 2 llada-8b 2>&1 \
  | grep -v Warning | tee $OUT/layout-fast-dllm-llada.txt; el
