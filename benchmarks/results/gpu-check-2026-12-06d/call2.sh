#!/bin/bash
# The tile-height rule adopted: GPU tests (kernel at both heights, graph == eager with wide tiles at full
# geometry), then the rule against 64-row tiles everywhere in one process.
source benchmarks/device_env.sh
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 170 python3 -m pytest -q -p no:cacheprovider -x tests/test_device_decoder.py \
  tests/test_kernel_scheduled_attention.py -k "wide or test_full_shapes_bf16" 2>&1 | tail -15 | tee $OUT/tests.txt
timeout 210 python3 benchmarks/results/gpu-check-2026-12-06d/attn_tile_ab.py 2 flash-cache:8,flash-verify:8,flash-cache:32 --rule 2>&1 | grep -v Warning | tee $OUT/tile-rule-ab.txt
