#!/bin/bash
# The README's decode table again (the NN weight layout and the tile rule are in since the 2026-12-05 table):
# LLaDA-8B geometry, batch 1 in 5 processes x 400 iterations, then batch 8 and 32 in one process.
export TRITON_INTERPRET=0 PYTHONUNBUFFERED=1
start=$SECONDS
shim=$(mktemp -d); mkdir -p "$shim/flash_dllm"
for d in app engine kernels assets; do ln -s "$PWD/$d" "$shim/flash_dllm/$d"; done
export PYTHONPATH="$shim"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 340 python3 -m flash_dllm.engine.bench decode --geometry llada-8b --methods flash-cache,flash-verify,fast-dllm \
  --batch-sizes 1 --iterations 400 --repeats 5 --out $OUT/llada-b1-5x400 2>&1 | grep -v Warning | tail -14
echo "elapsed $((SECONDS - start)) s"
left=$((580 - SECONDS + start))
[ $left -gt 150 ] && timeout $left python3 -m flash_dllm.engine.bench decode --geometry llada-8b \
  --methods flash-cache,flash-verify,fast-dllm --batch-sizes 8,32 --iterations 100 --repeats 1 \
  --out $OUT/llada-batch-8-32 2>&1 | grep -v Warning | tail -12
echo "elapsed $((SECONDS - start)) s"
