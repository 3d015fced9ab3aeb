"""Wall time of the bundled tiny-chat model writing a 128-cell answer canvas on the CPU (issue target: < 2 s).

    python benchmarks/bench_tiny_cpu.py [--threads 2] [--items 8] [--method fast-dllm]

Batch 1, threshold decoding (τ 0.9, block 32), on the longest held-out word problems (5 steps, the longest
answers). Prints the machine, versions, settings, one warm-up excluded, and the median over items of the
wall time and of generated tokens/s (answer tokens only, EOS padding excluded).
"""
from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--items", type=int, default=8)
    parser.add_argument("--method", default="fast-dllm")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from flash_dllm.engine.engine import Engine
    from flash_dllm.engine.hub import bundled_model_path
    from flash_dllm.engine.settings import GenerationSettings
    from flash_dllm.engine.training import data

    items = sorted(data.test_set("word", 100), key=lambda e: -len(e.response))[: args.items]
    engine = Engine.load(str(bundled_model_path()), device="cpu")
    settings = GenerationSettings(method=args.method, gen_length=128, block_length=32, threshold=0.9)
    engine.generate([items[0].messages], settings)  # warm-up
    seconds, rates, tokens = [], [], []
    for example in items:
        started = time.perf_counter()
        result = engine.generate([example.messages], settings)[0]
        seconds.append(time.perf_counter() - started)
        rates.append(result.tokens_per_s)
        tokens.append(len(result.token_ids))
    print(f"{platform.processor() or platform.machine()}, {args.threads} threads, torch {torch.__version__}; "
          f"tiny-chat, {args.method} τ 0.9, gen length 128, block 32, batch 1, {len(items)} word problems")
    print(f"median wall time {statistics.median(seconds):.2f} s (max {max(seconds):.2f} s) for the 128-cell canvas; "
          f"median {statistics.median(tokens)} answer tokens at {statistics.median(rates):.1f} tok/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
