#!/bin/bash
# Fifteenth session's device calls: call.sh STAGE [GEOMETRY]. On an H200 every stage but `batched` runs the README's
# batch-1 decode table instead (call2.sh's first stage; `batched`: its batch-8/32 stage), since the issue's targets
# need it. On an H100 (whose table is current): `profiles` (or `table`): where the steps the targets are furthest
# from go (flash-verify batch 1, fast-dllm and flash-cache batch 8); `diag`: fast-dllm batch 8 between refreshes,
# the fused QKV kernel against cuBLAS at 128 / 256 / 1024 rows, attention at batch 8 with forced key splits;
# `defer`: fast-dllm's events built after the next launch, A/B'd, then graph == eager at full geometry.
source benchmarks/device_env.sh
start=$SECONDS; el() { echo "[elapsed $((SECONDS - start)) s]"; }
gpu=$(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt)
echo "$gpu"
stage=${1:-table}; geometry=${2:-llada-8b}
if [[ "$gpu" == *H200* && $stage != batched && $stage != profiles && $stage != last ]]; then
  OUT=$OUT/$geometry-b1-5x400 GEOMETRY=$geometry BATCHES=1 ITERATIONS=400 REPEATS=5 bash benchmarks/gpu_decode_check.sh bench
elif [[ "$gpu" == *H200* && $stage == batched ]]; then
  OUT=$OUT/$geometry-batch-8-32 GEOMETRY=$geometry BATCHES=8,32 ITERATIONS=100 REPEATS=1 bash benchmarks/gpu_decode_check.sh bench
elif [[ $stage == last ]]; then
  # what the session's last ~200 s of device time allow, on any GPU: the new kernel's GPU tests, one A/B round
  timeout 60 python3 -m pytest -q -p no:cacheprovider --noconftest tests/test_kernel_rope_cache_write.py 2>&1 \
    | tail -3 | tee $OUT/rope-cache-write-tests.txt; el
  timeout $((${BUDGET_S:-190} - SECONDS + start)) python3 benchmarks/results/next-device/defer_events_ab.py 1 \
    $geometry 2>&1 | grep -v -i warn | tee $OUT/defer-events-ab-$geometry.txt; el
elif [[ $stage == next ]]; then
  # the cublas path's kernel on the GPU, then fast-dllm's deferred events A/B'd, then the fused QKV op's choice
  # among the four paths at 128 / 256 rows
  timeout 90 python3 -m pytest -q -p no:cacheprovider --noconftest tests/test_kernel_rope_cache_write.py 2>&1 \
    | tail -3 | tee $OUT/rope-cache-write-tests.txt; el
  timeout 150 python3 benchmarks/results/next-device/defer_events_ab.py 2 $geometry 2>&1 | grep -v -i warn \
    | tee $OUT/defer-events-ab-$geometry.txt; el
  left=$((${BUDGET_S:-355} - SECONDS + start)); ((left > 30)) && timeout $left python3 -m flash_dllm.engine.bench_kernels --ops fused --tokens 128 256 2>&1 \
    | grep -v -i warn | tee $OUT/kernels-fused-cublas-path.txt | grep -E "^fused_qkv|fused path|\[graph\]"; el
elif [[ $stage == defer ]]; then
  # fast-dllm's records: events built after the next launch (the new default on CUDA) against before it
  timeout 240 python3 benchmarks/results/next-device/defer_events_ab.py 2 $geometry 2>&1 | grep -v -i warn \
    | tee $OUT/defer-events-ab-$geometry.txt; el
  timeout 90 python3 benchmarks/profile_step.py --geometry $geometry --method fast-dllm --batch 8 --start 33 2>&1 \
    | grep -v Warning | tail -12 | tee $OUT/profile-fast-dllm-b8-deferred.txt; el
  left=$((${BUDGET_S:-585} - SECONDS + start))
  if ((left > 100)); then timeout $left python3 -m pytest -q -p no:cacheprovider --noconftest \
    "tests/test_device_decoder.py::test_cuda_graph_replay_equals_eager_at_full_geometry" 2>&1 | tail -4 \
    | tee $OUT/graph-full-geometry.txt; el; fi
elif [[ $stage == diag ]]; then
  # the batch-8 cells furthest from the target: a fast-dllm step between two cache refreshes, the fused QKV
  # kernel against a bare cuBLAS matmul at 128 / 256 / 1024 rows, attention at batch 8 with forced key splits
  timeout 150 python3 benchmarks/profile_step.py --geometry $geometry --method fast-dllm --batch 8 --start 33 2>&1 \
    | grep -v Warning | tail -28 | tee $OUT/profile-fast-dllm-b8-steady.txt; el
  timeout 220 python3 -m flash_dllm.engine.bench_kernels --ops fused --tokens 128 256 1024 2>&1 | grep -v -i warn \
    | tee $OUT/kernels-fused-rows.txt | grep -v dream | head -60; el
  timeout 100 python3 benchmarks/bench_attention.py --models $geometry --batches 8 --block-m 64 128 --mass both \
    --excluded 0 --splits 2 3 2>&1 | grep -v -i warn | tee $OUT/attention-b8.txt; el
  timeout $((580 - SECONDS + start)) python3 benchmarks/bench_attention.py --models $geometry --batches 8 --rows 32 \
    --block-m 32 64 --mass off --excluded 0 --splits 2 3 2>&1 | grep -v -i warn | tee $OUT/attention-b8-rows32.txt; el
else
  for run in "flash-verify 1" "fast-dllm 8" "flash-cache 8"; do
    set -- $run
    timeout 170 python3 benchmarks/profile_step.py --geometry $geometry --method $1 --batch $2 2>&1 | grep -v Warning \
      | tail -28 | tee $OUT/profile-$1-b$2.txt; el
  done
fi
