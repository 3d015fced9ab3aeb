#!/usr/bin/env bash
# The first answer after a process starts, three times against one fresh Triton cache: cold (compile and tune),
# stored (compiled; tuned choices read back from the disk) and retuned (compiled; tuned choices deleted first,
# as every app start was before the store). Usage: benchmarks/probe_first_answer.sh [probe_first_answer.py args]
cd "$(dirname "$0")/.."
source benchmarks/device_env.sh
export TRITON_CACHE_DIR=$(mktemp -d)
for label in cold stored retuned; do
  if [ "$label" = retuned ]; then
    rm -rf "$TRITON_CACHE_DIR/flash_dllm_tuning"; find "$TRITON_CACHE_DIR" -name '*.autotune.json' -delete
  fi
  timeout 240 python3 benchmarks/probe_first_answer.py --label "$label" "$@" 2>&1 | grep -v Warning | tail -3
done
