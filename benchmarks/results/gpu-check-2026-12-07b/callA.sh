#!/bin/bash
# Device call A (2026-12-07, eighth session): the first answer's one-time cost with and without the tuned-choice
# store (probe_first_answer.sh), then the GPU tests of what was written without a device: the store, the norm's
# row gather (seventh session) and graph == eager on tiny models (the float32 top-k and the gather in a step).
source benchmarks/device_env.sh
start=$SECONDS; el() { echo "[elapsed $((SECONDS - start)) s]"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a $OUT/gpu.txt
bash benchmarks/probe_first_answer.sh | tee $OUT/first-answer.txt; el
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_kernel_tuning_store.py \
  tests/test_kernel_fused_qkv_rope_cache.py -k "store or tuning or auto or later_process or forced" 2>&1 | tail -3 \
  | tee $OUT/store-tests.txt; el
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_kernel_small_ops.py -k "gathered or full_shapes or graph" \
  2>&1 | tail -2 | tee $OUT/norm-tests.txt; el
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_device_decoder.py -k "tiny_models" 2>&1 | tail -2 \
  | tee $OUT/graph-tests.txt; el
