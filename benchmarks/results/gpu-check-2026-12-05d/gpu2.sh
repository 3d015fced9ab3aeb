#!/usr/bin/env bash
# ad-hoc device run (not committed): correctness of the new attention on the GPU, its speed, A/B of the step
d=$(mktemp -d); mkdir -p $d/flash_dllm; for x in app engine kernels assets; do ln -s $PWD/$x $d/flash_dllm/$x; done
b=$(mktemp -d); mkdir -p $b/flash_dllm; for x in app engine kernels assets; do ln -s $PWD/baseline_e77/$x $b/flash_dllm/$x; done
export TRITON_INTERPRET=0 PYTHONUNBUFFERED=1 PYTHONPATH=$d
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s]"; }
echo "=== attention tests $(el)"; timeout 150 python3 -m pytest -q -p no:cacheprovider --noconftest $(python3 -c "import xdist" 2>/dev/null && printf -- "-n 8") tests/test_kernel_scheduled_attention.py 2>&1 | tail -3
echo "=== bench attention $(el)"; timeout 110 python3 benchmarks/bench_attention.py --batches 1 --block-m 128 64 --mass on --models llada-8b 2>&1 | grep -v "^$" | tail -24
echo "=== blas $(el)"; timeout 60 python3 benchmarks/probe_blas.py 2>&1 | tail -8
for t in new old new; do
  echo "=== bench $t $(el)"; [ $t = new ] && p=$d || p=$b
  PYTHONPATH=$p timeout 90 python3 -m flash_dllm.engine.bench decode --geometry llada-8b --methods flash-cache,flash-verify,fast-dllm --batch-sizes 1 --iterations 150 --repeats 1 --out $OUT/$t-$(el | tr -dc 0-9) 2>&1 | grep -E "^(flash|fast)-|copy" | tail -4
done
echo "=== graph == eager, full geometry $(el)"; timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_device_decoder.py -k full_geometry 2>&1 | tail -2
echo "=== profile $(el)"; timeout 80 python3 benchmarks/profile_step.py --geometry llada-8b --method flash-cache 2>&1 | tail -24
echo "=== block diffusion $(el)"; timeout 100 python3 -m pytest -q -s -p no:cacheprovider --noconftest tests/test_block_diffusion_gpu.py -k full_geometry_block_path 2>&1 | grep -E "slot|passed|failed|Error|assert" | tail -6
el
