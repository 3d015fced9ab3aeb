# Sourced by the scripts that run on a CUDA machine (from the repository root): compiled Triton kernels, unbuffered
# output, and, in a bare checkout (the package not installed), the top-level folders exposed as flash_dllm.*;
# benchmarks/ goes on the path too, for the helpers the experiment scripts import (step_ab, bench_attention).
# The device machine gets the working tree with a .git of some older commit: never run git there (a stash
# would take the whole newer tree away).
export TRITON_INTERPRET=0 PYTHONUNBUFFERED=1
if ! python3 -c "import flash_dllm.engine" 2>/dev/null; then
    _flash_dllm_shim=$(mktemp -d); mkdir -p "$_flash_dllm_shim/flash_dllm"
    for _d in app engine kernels assets; do ln -s "$PWD/$_d" "$_flash_dllm_shim/flash_dllm/$_d"; done
    export PYTHONPATH="$_flash_dllm_shim${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD/benchmarks"
