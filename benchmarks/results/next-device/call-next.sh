#!/bin/bash
# For the next device (rewritten 2026-12-07, twelfth session; what that session measured on an H100 is in
# benchmarks/README.md, "the decode table on an H100; Flash-Verify's pass kernels; 16-bit attention partials").
# Still open, in this order:
# 1. the bf16 attention partials on Dream-7B, and 6 key splits with them on both geometries (in one process each);
# 2. graph == eager on the tiny models with the partials (this test compiles and tunes every kernel afresh on a
#    new machine: give it 400 s; the twelfth session's 60 s and 380 s ran out after 9 cases, none failed);
# then, on an H200 only, the README's decode table on this code (a call of its own per model:
#    bash benchmarks/results/gpu-check-2026-12-06f/call2.sh llada-8b, then dream-7b),
# and call-kernels.sh, call.sh (the weight layout for fast-dllm on an H100 and for Dream).
# Two calls: `call-next.sh ab` (1, about 400 s), then `call-next.sh graph` (2).
# (Fifteenth session, 2026-12-08: two H100 calls, five failed starts; no H200. Built but not yet run on a GPU: the
# cublas fused-QKV path with its reference check, and fast-dllm's events after the next launch. First on the next
# device: `bash benchmarks/results/gpu-check-2026-12-07i/call.sh next llada-8b` (the new kernel's GPU tests, the A/B,
# the fused QKV op's choice among four paths), which on an H200 runs the README table instead; then the H200 table.)
# (The fourteenth session ran items 1 and 2 and the occupancy check on an H100 (results/gpu-check-2026-12-07h/):
# Dream's bf16 partials kept, 6 splits not adopted, every tiny-model graph case passed. What is left: the H200
# table (call2.sh llada-8b, then dream-7b), call-kernels.sh, call.sh.)
# (The thirteenth session had one call, after seven failed starts: the key splits merged inside the split kernel,
# slower and taken out again; benchmarks/README.md. Items 1 and 2 above are still open.)
source benchmarks/device_env.sh
export PYTHONUNBUFFERED=1
start=$SECONDS; el() { echo "[elapsed $((SECONDS - start)) s]"; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
if [ "${1:-ab}" = ab ]; then
# the split kernel's occupancy read on this GPU (fourteenth session): expect 2 programs per SM on Hopper
timeout 150 python3 -m pytest -q -p no:cacheprovider --noconftest -s \
  "tests/test_kernel_scheduled_attention.py::test_split_count_follows_the_tuned_configs_occupancy_on_the_gpu" \
  2>&1 | grep -E "per SM|passed|failed|Error" | tee $OUT/occupancy.txt; el
timeout 200 python3 benchmarks/results/next-device/attention_partials_ab.py 2 dream-7b fp32,input-dtype 2>&1 | grep -v -i warn \
  | tee $OUT/partials-ab-dream.txt; el
timeout 200 python3 benchmarks/results/next-device/attention_partials_ab.py 2 llada-8b input-dtype,input-dtype-6-splits \
  2>&1 | grep -v -i warn | tee $OUT/splits-ab-llada.txt; el
else
timeout $((590 - SECONDS + start)) python3 -m pytest -q -p no:cacheprovider --noconftest \
  "tests/test_device_decoder.py::test_cuda_graph_replay_equals_eager_on_tiny_models" 2>&1 | tee $OUT/graph-tiny.txt \
  | tail -3; el
fi
