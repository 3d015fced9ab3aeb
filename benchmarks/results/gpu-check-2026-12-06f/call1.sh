#!/bin/bash
# Batch-1 attention: where its time goes (probe), then the wide-tile GPU tests and the tile rule's A/B
# left from the previous session (gpu-check-2026-12-06d/call2.sh).
source benchmarks/device_env.sh
start=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
timeout 200 python3 benchmarks/probe_attention_batch1.py --csv $OUT/probe-attn-b1.csv 2>&1 | grep -v Warning | tee $OUT/probe-attn-b1.txt
echo "elapsed $((SECONDS - start)) s"
timeout 170 python3 -m pytest -q -p no:cacheprovider -x tests/test_device_decoder.py \
  tests/test_kernel_scheduled_attention.py -k "wide or test_full_shapes_bf16" 2>&1 | tail -15 | tee $OUT/tests.txt
echo "elapsed $((SECONDS - start)) s"
left=$((570 - SECONDS + start))
[ $left -gt 120 ] && timeout $left python3 benchmarks/results/gpu-check-2026-12-06d/attn_tile_ab.py 2 flash-cache:8,flash-verify:8,flash-cache:32 --rule 2>&1 | grep -v Warning | tee $OUT/tile-rule-ab.txt
echo "elapsed $((SECONDS - start)) s"
