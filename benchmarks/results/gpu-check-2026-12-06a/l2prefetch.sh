#!/usr/bin/env bash
# ad-hoc device run (#19): the output projection's weight prefetched into L2 before attention
# (FLASH_DLLM_L2_PREFETCH=1) against no prefetch, alternating, batch 1, LLaDA-8B geometry, random weights
d=$(mktemp -d); mkdir -p $d/flash_dllm; for x in app engine kernels assets; do ln -s $PWD/$x $d/flash_dllm/$x; done
export TRITON_INTERPRET=0 PYTHONUNBUFFERED=1 PYTHONPATH=$d
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s]"; }
echo "=== tests $(el)"; timeout 120 python3 -m pytest -q -p no:cacheprovider --noconftest tests/test_kernel_l2_prefetch.py 2>&1 | tail -3
echo "=== probe $(el)"; timeout 90 python3 benchmarks/probe_l2_prefetch.py 2>&1 | tail -12
for t in on off on off; do
  echo "=== bench $t $(el)"; case $t in on) p=1;; off) p=0;; esac
  FLASH_DLLM_L2_PREFETCH=$p timeout 150 python3 -m flash_dllm.engine.bench decode --geometry llada-8b --methods flash-cache,flash-verify --batch-sizes 1 --iterations 400 --repeats 1 --out $OUT/$t-$(el | tr -dc 0-9) 2>&1 | grep -E "^(flash|fast)-|copy|rror" | tail -4
done
echo "=== profile on $(el)"; FLASH_DLLM_L2_PREFETCH=1 timeout 100 python3 benchmarks/profile_step.py --geometry llada-8b 2>&1 | head -30
el
