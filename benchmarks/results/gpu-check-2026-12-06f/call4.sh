#!/bin/bash
# Ran with mass-by-dot.patch applied (the kernel option, its tests and the probe function; not adopted, since removed).
# The attention mass as a 16-row tensor-core dot: kernel probe, GPU attention tests with it, then the step A/B.
source benchmarks/device_env.sh
start=$SECONDS
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 120 python3 benchmarks/probe_attention_batch1.py --only-mass-by-dot --csv $OUT/probe-mass-by-dot.csv 2>&1 | grep -v Warning | tee $OUT/probe-mass-by-dot.txt
echo "elapsed $((SECONDS - start)) s"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_kernel_scheduled_attention.py 2>&1 | tail -4 | tee $OUT/attention-tests.txt
echo "elapsed $((SECONDS - start)) s"
left=$((580 - SECONDS + start))
[ $left -gt 120 ] && timeout $left python3 benchmarks/results/gpu-check-2026-12-06f/mass_ab.py 2 2>&1 | grep -v Warning | tee $OUT/mass-ab.txt
echo "elapsed $((SECONDS - start)) s"
