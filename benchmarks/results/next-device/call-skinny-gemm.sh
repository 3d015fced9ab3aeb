#!/bin/bash
# Written in the ninth session (2026-12-07), extended in the tenth: the new kernels' GPU tests first (split-K
# projections, fused gate/up activation, query packing, Flash-Cache plan: all on the engine's default path), then
# the skinny-GEMM kernels in the step (A/B/C against cuBLAS in one process, alternating), then graph == eager.
source benchmarks/device_env.sh
start=$SECONDS; el() { echo "[elapsed $((SECONDS - start)) s]"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 150 python3 -m pytest -q -p no:cacheprovider --noconftest tests/test_kernel_pack_queries.py \
  tests/test_kernel_flash_cache_plan.py tests/test_kernel_rank_attended.py tests/test_kernel_gate_up_silu.py tests/test_kernel_split_k_linear.py \
  2>&1 | tail -8 | tee $OUT/new-kernel-tests.txt; el
timeout 300 python3 benchmarks/results/next-device/skinny_gemm_ab.py 2 llada-8b flash-cache:1,flash-verify:1,fast-dllm:1 \
  2>&1 | grep -v Warning | tee $OUT/skinny-gemm-ab-llada.txt; el
timeout $((570 - SECONDS)) python3 -m pytest -q -p no:cacheprovider --noconftest \
  "tests/test_device_decoder.py::test_cuda_graph_replay_equals_eager_on_tiny_models" \
  "tests/test_device_decoder.py::test_cuda_graph_replay_equals_eager_at_full_geometry" \
  2>&1 | tail -6 | tee $OUT/graph-tests.txt; el
