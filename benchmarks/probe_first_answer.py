"""How long a first answer waits after a process starts, and what of that is kernel tuning.

One process: a random-weight engine at full geometry, then the same short chat-sized generation twice (a
first message: compile, tune and capture happen here; then the same again, warm). Prints both wall times, their
difference (the first answer's one-time cost), the fused QKV tuner's counters (timed launches, choices read from
the disk store) and what the tuning store and Triton's autotune cache hold.

Run it three times against one fresh TRITON_CACHE_DIR (probe_first_answer.sh): cold (compile and tune), again
(compiled, tuned choices read back) and with the tuned choices deleted (compiled, tuned again: a later app start
before the store existed).

    python3 benchmarks/probe_first_answer.py [--geometry llada-8b] [--method flash-cache] [--label L]
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch

from flash_dllm.engine.geometry import random_engine
from flash_dllm.engine.settings import GenerationSettings
from flash_dllm.kernels.fused_qkv_rope_cache import fused_qkv_counters


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--geometry", default="llada-8b")
    parser.add_argument("--method", default="flash-cache")
    parser.add_argument("--prompt-length", type=int, default=60)
    parser.add_argument("--gen-length", type=int, default=128)
    parser.add_argument("--label", default="")
    args = parser.parse_args()
    started = time.perf_counter()
    engine = random_engine(args.geometry, "cuda")
    torch.cuda.synchronize()
    load_s = time.perf_counter() - started
    cfg = engine.model.config
    prompt = [[(7 + 31 * i) % 30000 + 100 for i in range(args.prompt_length)]]
    settings = GenerationSettings(method=args.method, gen_length=args.gen_length, block_length=32, seed=0,
                                  use_chat_template=False)
    assert cfg.mask_id not in prompt[0]
    walls = []
    for _ in range(2):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        engine.generate(prompt, settings)
        torch.cuda.synchronize()
        walls.append(time.perf_counter() - t0)
    counters = fused_qkv_counters()
    import triton

    cache = Path(triton.knobs.cache.dir)
    stored = len(list((cache / "flash_dllm_tuning").glob("*.json")))
    autotune = len(list(cache.rglob("*.autotune.json")))
    print(f"{args.label:8s} {torch.cuda.get_device_name()} {args.geometry} {args.method}: load {load_s:.1f} s, "
          f"first answer {walls[0]:.2f} s, second {walls[1]:.2f} s, one-time cost {walls[0] - walls[1]:.2f} s; "
          f"fused QKV timed launches {counters.measurements}, choices read back {counters.stored_choices_read}, "
          f"resolutions {counters.resolutions}; store files {stored}, autotune files {autotune} "
          f"(TRITON_CACHE_DIR={os.environ.get('TRITON_CACHE_DIR', '-')})", flush=True)


if __name__ == "__main__":
    main()
