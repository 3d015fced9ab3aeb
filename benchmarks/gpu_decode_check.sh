#!/usr/bin/env bash
# On a CUDA machine: the decode step's GPU tests (graph replay == eager, tiny and full geometry), the kernels'
# GPU tests, `flash-dllm-chat bench decode` and a profile of a steady step. Works from a bare checkout.
# Usage: benchmarks/gpu_decode_check.sh [stage ...]   stages: decode-tests kernel-tests bench profile concurrent
# families memory (default all but concurrent, families and memory)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-benchmarks/results/gpu-check}
mkdir -p "$out"
source benchmarks/device_env.sh
stages=${*:-decode-tests bench profile kernel-tests}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$out/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$out/gpu.txt"
workers=(); python3 -c "import xdist" 2>/dev/null && workers=(-n 8)
for stage in $stages; do
  echo "=== $stage $(date +%T)"
  case $stage in
    decode-tests) timeout 480 python3 -m pytest -q --maxfail=4 -p no:cacheprovider tests/test_device_decoder.py -k cuda \
                    2>&1 | tail -25 | tee "$out/decode-tests.log" ;;
    kernel-tests) timeout 400 python3 -m pytest -q -p no:cacheprovider --noconftest "${workers[@]}" \
                    tests/test_kernel_small_ops.py tests/test_kernel_scheduled_attention.py \
                    tests/test_kernel_fused_qkv_rope_cache.py tests/test_kernel_moe_experts.py tests/test_kernel_split_k_linear.py \
                    -k "${KERNEL_TESTS:-graph or capture or cuda or full}" \
                    2>&1 | tail -30 | tee "$out/kernel-tests.log"
                  timeout 120 python3 -m pytest -q -p no:cacheprovider --noconftest tests/test_kernel_canvas_commit.py \
                    tests/test_kernel_threshold_select.py tests/test_kernel_greedy_predict.py \
                    2>&1 | tail -10 | tee -a "$out/kernel-tests.log" ;;
    bench) timeout 400 python3 -m flash_dllm.engine.bench decode --geometry "${GEOMETRY:-llada-8b}" \
             --methods "${METHODS:-flash-cache,flash-verify,fast-dllm}" --batch-sizes "${BATCHES:-1}" \
             --iterations "${ITERATIONS:-150}" --repeats "${REPEATS:-1}" --out "$out/bench" 2>&1 | tail -30 ;;
    concurrent) timeout 400 python3 benchmarks/bench_concurrent.py --geometry "${GEOMETRY:-llada-8b}" \
                  --requests "${REQUESTS:-16}" --gen-length "${GEN:-256}" --rounds "${ROUNDS:-1}" \
                  --method "${METHOD:-flash-cache}" 2>&1 | tail -8 | tee -a "$out/concurrent.log" ;;
    families) timeout 200 python3 -m pytest -q -p no:cacheprovider --noconftest tests/test_families_forward.py \
                tests/test_block_diffusion_gpu.py -k "(gpu or cuda or full) and not model_without_a_block_size" 2>&1 | tail -8 | tee "$out/families.log"
              timeout 200 python3 -m flash_dllm.engine.bench decode --geometry llada-moe --methods flash-cache,fast-dllm \
                --batch-sizes 1 --iterations "${ITERATIONS:-150}" --out "$out/bench-llada-moe" 2>&1 | tail -8
              timeout 200 python3 -m flash_dllm.engine.bench decode --geometry llada2-mini --methods block-diffusion \
                --batch-sizes 1 --iterations "${ITERATIONS:-150}" --out "$out/bench-llada2" 2>&1 | tail -8
              timeout 200 python3 benchmarks/bench_moe.py 2>&1 | tail -12 | tee "$out/moe.log" ;;
    memory) timeout 300 python3 benchmarks/probe_memory.py --geometry "${GEOMETRY:-llada-8b}" \
              --method "${PROFILE_METHOD:-flash-cache}" --batch "${MEMORY_BATCH:-32}" 2>&1 | tail -24 | tee "$out/memory.log" ;;
    profile) timeout 300 python3 benchmarks/profile_step.py --geometry "${GEOMETRY:-llada-8b}" \
               --method "${PROFILE_METHOD:-flash-cache}" 2>&1 | tail -32 | tee "$out/profile.log" ;;
  esac
done
