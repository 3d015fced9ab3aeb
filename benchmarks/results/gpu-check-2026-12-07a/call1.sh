#!/bin/bash
# Key splits rounded down, where the rule changes a step on a 132-SM GPU (splits_ab.py's header lists the counts):
# Dream-7B at batch 2 (flash-cache's 6 tiles 2 -> 1 split; a 2-tile verify pass or fast-dllm block 5 -> 4) and
# LLaDA-8B at batch 3 (a verify pass's or fast-dllm block's 3 tiles: 3 -> 2). Batch 1 keeps its counts there.
source benchmarks/device_env.sh
start=$SECONDS
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
# first: Flash-Cache's tracked positions by an unsorted float32 top-k against the sorted int64 one
timeout 150 python3 benchmarks/results/gpu-check-2026-12-07a/topk_ab.py 2 llada-8b 2>&1 | grep -v Warning | tee $OUT/topk-ab.txt
echo "elapsed $((SECONDS - start)) s"
ab=benchmarks/results/gpu-check-2026-12-06f/splits_ab.py
timeout 180 python3 $ab 2 dream-7b flash-cache:2,flash-verify:2,fast-dllm:2 2>&1 | grep -v Warning | tee $OUT/splits-ab-dream-b2.txt
echo "elapsed $((SECONDS - start)) s"
timeout 150 python3 $ab 2 llada-8b flash-verify:3,fast-dllm:3 2>&1 | grep -v Warning | tee $OUT/splits-ab-llada-b3.txt
echo "elapsed $((SECONDS - start)) s"
