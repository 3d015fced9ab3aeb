#!/bin/bash
# Written in the eleventh session (2026-12-07), for the call right after call-skinny-gemm.sh (the machine is kept
# only 30 s between calls): the bookkeeping kernels against their tensor operations in the step, then where a
# batch-1 flash-cache step goes now (a torch.profiler trace of replayed steps).
source benchmarks/device_env.sh
start=$SECONDS; el() { echo "[elapsed $((SECONDS - start)) s]"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 330 python3 benchmarks/results/next-device/bookkeeping_ab.py 2 llada-8b flash-cache:1,flash-verify:1 \
  2>&1 | grep -v Warning | tee $OUT/bookkeeping-ab-llada.txt; el
timeout $((570 - SECONDS)) python3 benchmarks/profile_step.py --geometry llada-8b --method flash-cache \
  2>&1 | grep -v Warning | head -40 | tee $OUT/profile-flash-cache.txt; el
