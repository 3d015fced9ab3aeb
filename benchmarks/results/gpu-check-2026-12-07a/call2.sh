#!/bin/bash
# For the next device: the code written after this session's device budget ran out, on a GPU for the first time.
# The new norm gather's kernel tests and graph == eager on tiny models (which run the float32 top-k and the
# gather inside a captured step), then both changes against the code before them in one process.
# The README's decode table after that: gpu-check-2026-12-06f/call2.sh llada-8b, then dream-7b (an H200 each).
source benchmarks/device_env.sh
start=$SECONDS
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_kernel_small_ops.py -k "gathered or full_shapes or graph" \
  2>&1 | tail -2 | tee $OUT/norm-tests.txt
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_device_decoder.py -k "tiny_models" 2>&1 | tail -2 \
  | tee $OUT/graph-tests.txt
echo "elapsed $((SECONDS - start)) s"
timeout 250 python3 benchmarks/results/gpu-check-2026-12-07a/small_kernels_ab.py 2 llada-8b 2>&1 | grep -v Warning \
  | tee $OUT/small-kernels-ab.txt
echo "elapsed $((SECONDS - start)) s"
