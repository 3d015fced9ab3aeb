#!/bin/bash
# Written in the ninth session, for a device call after call-skinny-gemm.sh: the kernel tables at a decode step's
# row counts. (1) Is the fused QKV tuner's stored choice the fastest path at 32/48/128 rows? Since choices are
# kept on disk, one unlucky timing is kept for every later process: a suspect for fast-dllm's 32-row step
# being 1.7 % slower on the H200 than on 2026-12-05. (2) The projections the engine may run split-K, against
# cuBLAS, each followed by its norm, with the selector's choice. (3, tenth session) Where a batch-1 flash-cache
# step goes now, with the split-K projections in it.
source benchmarks/device_env.sh
start=$SECONDS; el() { echo "[elapsed $((SECONDS - start)) s]"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 380 python3 -m flash_dllm.engine.bench_kernels --ops fused projections --tokens 32 48 128 \
  --csv $OUT/kernels-decode-rows.csv 2>&1 | grep -v Warning | tee $OUT/kernels-decode-rows.txt; el
timeout $((570 - SECONDS)) python3 benchmarks/profile_step.py --geometry llada-8b --method flash-cache \
  2>&1 | grep -v Warning | head -40 | tee $OUT/profile-flash-cache.txt; el
