#!/bin/bash
# For the next device (rewritten 2026-12-07, thirteenth session). Two calls:
# `call-next.sh merge` (about 560 s): the attention GPU tests with the parts merged in the split kernel (its new
#   bit-equality test against the combine kernel is the real check of the arrival counters' memory ordering),
#   then the step A/B of the merge against the combine kernel, LLaDA-8B then Dream-7B (one process each);
# `call-next.sh graph`: graph == eager on the tiny models (compiles and tunes every kernel afresh on a new machine:
#   give it 400 s) and at full geometry.
# Then, on an H200 only, the README's decode table on this code (a call of its own per model:
#    bash benchmarks/results/gpu-check-2026-12-06f/call2.sh llada-8b, then dream-7b).
source benchmarks/device_env.sh
export PYTHONUNBUFFERED=1
start=$SECONDS; el() { echo "[elapsed $((SECONDS - start)) s]"; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
if [ "${1:-merge}" = merge ]; then
timeout 150 python3 -m pytest -q -p no:cacheprovider --noconftest tests/test_kernel_scheduled_attention.py 2>&1 \
  | tee $OUT/attention-tests.txt | tail -4; el
timeout 200 python3 benchmarks/results/next-device/attention_merge_ab.py 2 llada-8b 2>&1 | grep -v -i warn \
  | tee $OUT/merge-ab-llada.txt; el
if [ "${2:-}" != short ]; then  # short: the tests and LLaDA only (about 350 s)
timeout $((585 - SECONDS + start)) python3 benchmarks/results/next-device/attention_merge_ab.py 2 dream-7b 2>&1 \
  | grep -v -i warn | tee $OUT/merge-ab-dream.txt; el
fi
else
timeout 400 python3 -m pytest -q -p no:cacheprovider --noconftest \
  "tests/test_device_decoder.py::test_cuda_graph_replay_equals_eager_on_tiny_models" 2>&1 | tee $OUT/graph-tiny.txt \
  | tail -3; el
timeout $((590 - SECONDS + start)) python3 -m pytest -q -p no:cacheprovider --noconftest tests/test_device_decoder.py \
  -k "full_geometry or wide_attention" 2>&1 | tee $OUT/graph-full.txt | tail -3; el
fi
