#!/usr/bin/env bash
# ad-hoc device run B: #21 (16 concurrent requests: throughput, first frame), #19's batch-32 memory at its peak,
# graph == eager at full geometry with the new attention, a profile of the new flash-cache step
d=$(mktemp -d); mkdir -p $d/flash_dllm; for x in app engine kernels assets; do ln -s $PWD/$x $d/flash_dllm/$x; done
export TRITON_INTERPRET=0 PYTHONUNBUFFERED=1 PYTHONPATH=$d
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s]"; }
echo "=== concurrent $(el)"; timeout 200 python3 benchmarks/bench_concurrent.py --geometry llada-8b --requests 16 --gen-length 256 --rounds 1 --method flash-cache 2>&1 | tail -12
echo "=== memory $(el)"; timeout 120 python3 benchmarks/probe_memory.py --batch 32 --method flash-cache 2>&1 | tail -24
echo "=== profile $(el)"; timeout 70 python3 benchmarks/profile_step.py --geometry llada-8b --method flash-cache 2>&1 | tail -22
echo "=== graph == eager, full geometry $(el)"; timeout 170 python3 -m pytest -q -p no:cacheprovider tests/test_device_decoder.py -k full_geometry 2>&1 | tail -2
el
