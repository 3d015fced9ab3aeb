#!/bin/bash
# The README's decode table again on the current code (the NN weight layout, the tile rule and the split rounding
# are in since the 2026-12-05 table), through gpu_decode_check.sh's bench stage: batch 1 in 5 processes x 400
# iterations, then batch 8 and 32 in one process. Usage: call2.sh [llada-8b | dream-7b]
geometry=${1:-llada-8b}
OUT=$OUT/$geometry-b1-5x400 GEOMETRY=$geometry BATCHES=1 ITERATIONS=400 REPEATS=5 bash benchmarks/gpu_decode_check.sh bench
OUT=$OUT/$geometry-batch-8-32 GEOMETRY=$geometry BATCHES=8,32 ITERATIONS=100 REPEATS=1 \
  bash benchmarks/gpu_decode_check.sh bench
