#!/usr/bin/env bash
# Kernel tests compiled for the GPU (not the interpreter), then the kernel benchmark, on a CUDA machine.
# Usage: benchmarks/gpu_kernel_tests.sh [OUTPUT_DIR]   (default: $OUT, else benchmarks/results)
# Writes OUTPUT_DIR/kernel-tests.log, OUTPUT_DIR/bench.log and OUTPUT_DIR/kernels-h200.csv.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-benchmarks/results}}
mkdir -p "$out"
source benchmarks/device_env.sh

# Parallel workers overlap the Triton compiles and autotuning; --noconftest keeps a conftest that forces
# the interpreter out of this run (the test modules read TRITON_INTERPRET=0 from the environment).
workers=()
if python3 -c "import xdist" 2>/dev/null; then workers=(-n 8); fi
status=0
python3 -m pytest -q --noconftest -p no:cacheprovider "${workers[@]}" \
    tests/test_kernel_fused_qkv_rope_cache.py tests/test_kernel_scheduled_attention.py tests/test_kernel_moe_experts.py \
    tests/test_kernel_split_k_linear.py tests/test_kernel_small_ops.py \
    2>&1 | tee "$out/kernel-tests.log" || status=$?

TRITON_PRINT_AUTOTUNING=1 python3 benchmarks/bench_kernels.py --csv "$out/kernels-h200.csv" 2>&1 | tee "$out/bench.log"
exit $status
