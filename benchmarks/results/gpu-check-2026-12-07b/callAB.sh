#!/bin/bash
# One device call instead of A and B (start failures left too little device time for two): graph == eager on tiny
# models with the seventh session's small-kernel cuts, the first-answer probe of the tuned-choice store, the store's
# and the norm gather's GPU tests, then the two small-kernel cuts against the code before them in what time is left.
source benchmarks/device_env.sh
start=$SECONDS; el() { echo "[elapsed $((SECONDS - start)) s]"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a $OUT/gpu.txt
timeout 170 python3 -m pytest -q -p no:cacheprovider tests/test_device_decoder.py -k "tiny_models" 2>&1 | tail -2 \
  | tee $OUT/graph-tests.txt; el
bash benchmarks/probe_first_answer.sh | tee $OUT/first-answer.txt; el
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_kernel_tuning_store.py tests/test_kernel_small_ops.py \
  -k "store or later_process or forced_measure or gathered or full_shapes or graph" 2>&1 | tail -2 | tee $OUT/tests.txt; el
timeout $((${LIMIT:-565} - SECONDS)) python3 benchmarks/results/gpu-check-2026-12-07a/small_kernels_ab.py 2 llada-8b 2>&1 \
  | grep -v Warning | tee $OUT/small-kernels-ab.txt; el
