#!/usr/bin/env bash
# ad-hoc device run A: attention mass as the window logits' sum (this tree, "new") against 97117fd ("old": softmax
# mass recomputed in the combine) and this tree with the split merge folded into the split kernel ("fold");
# then #23's LLaDA2.0-mini block step and MoE kernel on this GPU
d=$(mktemp -d); mkdir -p $d/flash_dllm; for x in app engine kernels assets; do ln -s $PWD/$x $d/flash_dllm/$x; done
b=$(mktemp -d); mkdir -p $b/flash_dllm; for x in app engine kernels assets; do ln -s $PWD/baseline_head/$x $b/flash_dllm/$x; done
f=$(mktemp -d); mkdir -p $f/flash_dllm; for x in app engine kernels assets; do ln -s $PWD/ab_fold/$x $f/flash_dllm/$x; done
export TRITON_INTERPRET=0 PYTHONUNBUFFERED=1 PYTHONPATH=$d
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s]"; }
echo "=== attention tests $(el)"; timeout 90 python3 -m pytest -q -p no:cacheprovider --noconftest $(python3 -c "import xdist" 2>/dev/null && printf -- "-n 8") tests/test_kernel_scheduled_attention.py 2>&1 | tail -3
echo "=== bench attention $(el)"; timeout 60 python3 benchmarks/bench_attention.py --batches 1 --mass both --models llada-8b 2>&1 | grep -v "^$" | grep -v forced | tail -12
for t in new old fold; do
  echo "=== bench $t $(el)"; case $t in new) p=$d;; old) p=$b;; fold) p=$f;; esac
  PYTHONPATH=$p timeout 100 python3 -m flash_dllm.engine.bench decode --geometry llada-8b --methods flash-cache,flash-verify,fast-dllm --batch-sizes 1 --iterations 150 --repeats 1 --out $OUT/$t-$(el | tr -dc 0-9) 2>&1 | grep -E "^(flash|fast)-|copy|rror" | tail -4
done
echo "=== llada2-mini $(el)"; timeout 130 python3 -m flash_dllm.engine.bench decode --geometry llada2-mini --methods block-diffusion --batch-sizes 1 --iterations 150 --repeats 2 --out $OUT/bench-llada2 2>&1 | tail -6
echo "=== moe $(el)"; timeout 70 python3 benchmarks/bench_moe.py 2>&1 | tail -12
el
