"""Thin caller of `flash-dllm-chat bench kernels` (engine/bench_kernels.py), kept for the probes and scripts that
import its helpers from here."""
import sys

from flash_dllm.engine.bench_kernels import *  # noqa: F401,F403 - MODELS, device_env, graph_ms, write_rows_csv, ...
from flash_dllm.engine.bench_kernels import main

if __name__ == "__main__":
    sys.exit(main())
