#!/bin/bash
# Key splits rounded down: the attention call of a 2-tile Dream-7B call (128 rows) at every forced count, then the
# step A/B at batch 1 (which, it turned out, has 3 tiles for Dream: 3 splits under either rule; see 2026-12-07a).
# Run it with PYTHONPATH holding benchmarks/ (set below) since splits_ab.py imports step_ab.
source benchmarks/device_env.sh
start=$SECONDS
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
# the canvas-commit kernel changed after the last device run (int32 row flags): its GPU tests first
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_kernel_canvas_commit.py 2>&1 | tail -2 | tee $OUT/commit-tests.txt
timeout 70 python3 benchmarks/bench_attention.py --models dream-7b --batches 1 --mass on 2>&1 | grep -v Warning | tee $OUT/attn-dream-b1.txt
echo "elapsed $((SECONDS - start)) s"
timeout 230 python3 benchmarks/results/gpu-check-2026-12-06f/splits_ab.py 2 dream-7b 2>&1 | grep -v Warning | tee $OUT/splits-ab-dream.txt
echo "elapsed $((SECONDS - start)) s"
