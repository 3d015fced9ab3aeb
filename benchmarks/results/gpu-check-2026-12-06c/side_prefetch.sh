#!/usr/bin/env bash
# One device call: the output projection's L2 prefetch on a side stream ("side") against none ("0"),
# alternating processes of `bench decode` (LLaDA-8B geometry, batch 1, 400 iterations), then the GPU tests with
# the side stream on (the prefetch's own tests; graph replay == eager for every method, tiny and full geometry).
set -uo pipefail
cd "$(dirname "$0")/../../.."
out=${OUT:-/tmp/out}; mkdir -p "$out"
export TRITON_INTERPRET=0 PYTHONUNBUFFERED=1
shim=$(mktemp -d); mkdir -p "$shim/flash_dllm"
for d in app engine kernels assets; do ln -s "$PWD/$d" "$shim/flash_dllm/$d"; done
export PYTHONPATH="$shim"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
for round in 1 2 3; do
  for mode in 0 side; do
    echo "=== round $round prefetch=$mode $(date +%T)"
    FLASH_DLLM_L2_PREFETCH=$mode timeout 150 python3 -m flash_dllm.engine.bench decode --geometry llada-8b \
      --methods flash-cache,flash-verify --batch-sizes 1 --iterations 400 --repeats 1 \
      --out "$out/bench-$mode-$round" 2>&1 | grep -E "^\| ?flash|flash-(cache|verify) " | tail -2
  done
done
echo "=== tests $(date +%T)"
timeout 120 python3 -m pytest -q -p no:cacheprovider --noconftest tests/test_kernel_l2_prefetch.py 2>&1 | tail -3
FLASH_DLLM_L2_PREFETCH=side timeout 300 python3 -m pytest -q -x -p no:cacheprovider tests/test_device_decoder.py -k cuda 2>&1 | tail -4
