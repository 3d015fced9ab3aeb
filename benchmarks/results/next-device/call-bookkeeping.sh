#!/bin/bash
# Written in the tenth session (2026-12-07): the query-packing, Flash-Cache plan and attention-ranking kernels
# against the tensor operations they replace, in the step (one process, alternating), then their GPU tests.
source benchmarks/device_env.sh
start=$SECONDS; el() { echo "[elapsed $((SECONDS - start)) s]"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 300 python3 benchmarks/results/next-device/bookkeeping_ab.py 2 llada-8b flash-cache:1,flash-verify:1 \
  2>&1 | grep -v Warning | tee $OUT/bookkeeping-ab-llada.txt; el
timeout $((560 - SECONDS)) python3 -m pytest -q -p no:cacheprovider --noconftest tests/test_kernel_pack_queries.py \
  tests/test_kernel_rank_attended.py tests/test_kernel_flash_cache_plan.py 2>&1 | tail -6 | tee $OUT/bookkeeping-tests.txt; el
