#!/bin/bash
# Written in the eleventh session (2026-12-07), run then on an H100 (gpu-check-2026-12-07e/), for the one
# device call a session may get: the new kernels' GPU tests (query packing, Flash-Cache plan and ranking, fused gate/up, split-K), then the step with and without
# everything built since the ninth session's table, and 32-row attention tiles at batch 1 (step_kernels_ab.py),
# then graph == eager on tiny models and at full geometry.
source benchmarks/device_env.sh
start=$SECONDS; el() { echo "[elapsed $((SECONDS - start)) s]"; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
timeout 150 python3 -m pytest -q -p no:cacheprovider --noconftest tests/test_kernel_pack_queries.py \
  tests/test_kernel_flash_cache_plan.py tests/test_kernel_rank_attended.py tests/test_kernel_gate_up_silu.py \
  tests/test_kernel_split_k_linear.py 2>&1 | tail -8 | tee $OUT/new-kernel-tests.txt; el
timeout 300 python3 benchmarks/results/next-device/step_kernels_ab.py 2 llada-8b \
  2>&1 | grep -v Warning | tee $OUT/step-kernels-ab-llada.txt; el
timeout $((575 - SECONDS)) python3 -m pytest -q -p no:cacheprovider --noconftest \
  "tests/test_device_decoder.py::test_cuda_graph_replay_equals_eager_on_tiny_models" \
  "tests/test_device_decoder.py::test_cuda_graph_replay_equals_eager_at_full_geometry" \
  2>&1 | tail -6 | tee $OUT/graph-tests.txt; el
