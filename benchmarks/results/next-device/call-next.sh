#!/bin/bash
# For the next device (written 2026-12-07, eleventh session). What that session measured on an H100 is in
# benchmarks/README.md ("the skinny-GEMM selectors and the bookkeeping kernels in the step"); still open:
# 1. Flash-Verify's verify-pass kernels (kernels/verify_batch.py, built after that lease): their GPU tests, the
#    step against their tensor operations, graph == eager on tiny models;
# 2. graph == eager at full geometry with them and with Fast-dLLM's block-schedule kernels;
# 3. where a batch-1 flash-cache step goes now (profile), to update the README's breakdown;
# then, on an H200 only, the README's decode table on this code (a call of its own per model:
#    bash benchmarks/results/gpu-check-2026-12-06f/call2.sh llada-8b, then dream-7b),
# and call-kernels.sh, call.sh (the weight layout for fast-dllm on an H100 and for Dream).
source benchmarks/device_env.sh
start=$SECONDS; el() { echo "[elapsed $((SECONDS - start)) s]"; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
timeout 60 python3 -m pytest -q -p no:cacheprovider --noconftest tests/test_kernel_verify_batch.py \
  2>&1 | tail -4 | tee $OUT/verify-batch-tests.txt; el
timeout 90 python3 benchmarks/results/next-device/verify_batch_ab.py 2 llada-8b 2>&1 | grep -v Warning \
  | tee $OUT/verify-batch-ab.txt; el
timeout 60 python3 -m pytest -q -p no:cacheprovider --noconftest \
  "tests/test_device_decoder.py::test_cuda_graph_replay_equals_eager_on_tiny_models" \
  2>&1 | tail -3 | tee $OUT/graph-tiny.txt; el
timeout 300 python3 -m pytest -q -p no:cacheprovider --noconftest \
  "tests/test_device_decoder.py::test_cuda_graph_replay_equals_eager_at_full_geometry" \
  2>&1 | tail -4 | tee $OUT/graph-full-geometry.txt; el
timeout $((575 - SECONDS)) python3 benchmarks/profile_step.py --geometry llada-8b --method flash-cache \
  2>&1 | grep -v Warning | head -40 | tee $OUT/profile-flash-cache.txt; el
