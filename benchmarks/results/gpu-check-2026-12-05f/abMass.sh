#!/usr/bin/env bash
# ad-hoc device run (#19): attention mass kept per query head ([Hq, R], this tree, "new": no two heads' programs
# add into one address) against one row for every head (1f9ebcf, "old"), alternating, batch 1 and 8
d=$(mktemp -d); mkdir -p $d/flash_dllm; for x in app engine kernels assets; do ln -s $PWD/$x $d/flash_dllm/$x; done
b=$(mktemp -d); mkdir -p $b/flash_dllm; for x in app engine kernels assets; do ln -s $PWD/baseline_head/$x $b/flash_dllm/$x; done
export TRITON_INTERPRET=0 PYTHONUNBUFFERED=1 PYTHONPATH=$d
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s]"; }
echo "=== attention tests $(el)"; timeout 100 python3 -m pytest -q -p no:cacheprovider --noconftest tests/test_kernel_scheduled_attention.py -k "score or mass or static or full" 2>&1 | tail -3
for t in new old new old; do
  echo "=== bench $t $(el)"; case $t in new) p=$d;; old) p=$b;; esac
  PYTHONPATH=$p timeout 110 python3 -m flash_dllm.engine.bench decode --geometry llada-8b --methods flash-cache,flash-verify --batch-sizes 1,8 --iterations 150 --repeats 1 --out $OUT/$t-$(el | tr -dc 0-9) 2>&1 | grep -E "^(flash|fast)-|copy|rror" | tail -6
done
el
