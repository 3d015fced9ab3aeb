#!/bin/bash
# Fourteenth session. `call.sh tests`: the split kernel's occupancy read on this GPU, the attention's full-shape
# GPU tests (with the new BLOCK_N 32 / 2-stage candidate) and graph == eager at full geometry (the first split
# call may now make its schedule again before capture). `call.sh table GEOMETRY`: the batch-1 decode table,
# 5 processes x 400 iterations, on this code.
source benchmarks/device_env.sh
start=$SECONDS; el() { echo "[elapsed $((SECONDS - start)) s]"; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $OUT/gpu-$1.txt
if [ "$1" = tests ]; then
timeout 200 python3 -m pytest -q -p no:cacheprovider --noconftest -s tests/test_kernel_scheduled_attention.py \
  -k "occupancy_on_the_gpu or full_shapes_bf16 or rewritten_plan" 2>&1 | grep -E "per SM|passed|failed|Error|assert" \
  | tail -20 | tee $OUT/attention-tests.txt; el
timeout $((560 - SECONDS + start)) python3 -m pytest -q -p no:cacheprovider --noconftest tests/test_device_decoder.py \
  -k "full_geometry or wide_attention" 2>&1 | tail -8 | tee $OUT/graph-full-geometry.txt; el
else
OUT=$OUT/$2-b1-5x400 GEOMETRY=$2 BATCHES=1 ITERATIONS=400 REPEATS=5 bash benchmarks/gpu_decode_check.sh bench; el
fi
