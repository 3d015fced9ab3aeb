#!/usr/bin/env bash
# ad-hoc device run C: attention mass as the column sum of the logit tile ("cols", this tree) against the dot of
# the summed window query with each key block ("keys", d75d69f)
d=$(mktemp -d); mkdir -p $d/flash_dllm; for x in app engine kernels assets; do ln -s $PWD/$x $d/flash_dllm/$x; done
b=$(mktemp -d); mkdir -p $b/flash_dllm; for x in app engine kernels assets; do ln -s $PWD/keys_tree/$x $b/flash_dllm/$x; done
export TRITON_INTERPRET=0 PYTHONUNBUFFERED=1 PYTHONPATH=$d
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s]"; }
for t in cols keys; do
  echo "=== bench attention $t $(el)"; [ $t = cols ] && p=$d || p=$b
  PYTHONPATH=$p timeout 60 python3 benchmarks/bench_attention.py --batches 1 8 --mass on --models llada-8b 2>&1 | grep -E "auto|B=" | tail -4
done
echo "=== attention GPU tests (cols) $(el)"; timeout 60 python3 -m pytest -q -p no:cacheprovider --noconftest $(python3 -c "import xdist" 2>/dev/null && printf -- "-n 8") tests/test_kernel_scheduled_attention.py -k "full or decode_step or graph or half or score" 2>&1 | tail -2
for t in cols keys cols; do
  echo "=== bench $t $(el)"; [ $t = cols ] && p=$d || p=$b
  PYTHONPATH=$p timeout 80 python3 -m flash_dllm.engine.bench decode --geometry llada-8b --methods flash-cache,flash-verify --batch-sizes 1 --iterations 150 --repeats 1 --out $OUT/$t-$(el | tr -dc 0-9) 2>&1 | grep -E "^(flash|fast)-|rror" | tail -3
done
el
