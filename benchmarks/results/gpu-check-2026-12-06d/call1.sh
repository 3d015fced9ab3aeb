#!/bin/bash
# Attention at decode shapes (64- vs 128-row tiles, batch 1/8/32), then the step with either tile height.
source benchmarks/device_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
timeout 200 python3 benchmarks/bench_attention.py --models llada-8b --batches 1 8 32 --block-m 64 128 --mass on --csv $OUT/attn-llada.csv 2>&1 | tee $OUT/attn-llada.txt
timeout 360 python3 benchmarks/results/gpu-check-2026-12-06d/attn_tile_ab.py 2 2>&1 | grep -v Warning | tee $OUT/tile-ab.txt
