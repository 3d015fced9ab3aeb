"""Concurrent requests through the scheduler against the same requests one after another (CPU or GPU).

    python3 benchmarks/bench_concurrent.py [--model FOLDER|bundled] [--requests 8] [--gen-length 32]

Each round submits the requests one after another (each waits for the previous one's answer), then all at once,
and checks that every concurrent answer equals its one-at-a-time answer (greedy). Prints both wall times and
their ratio, the median over --rounds rounds.
"""
from __future__ import annotations

import argparse
import statistics
import time

from flash_dllm.engine import Engine, GenerationSettings, hub

PROMPTS = ["What is 7 + 5?", "List three colours.", "What is 12 * 3?", "Count from one to five.",
           "Tom has 4 apples and buys 3 more. How many does he have?", "What is 9 - 4?", "Name two animals.",
           "What is 18 / 3?", "Hello!", "What is 2 + 2?", "List four fruits.", "What is 6 * 7?",
           "What is 100 - 1?", "Count to three.", "What is 11 + 11?", "Name a colour."]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bundled")
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--gen-length", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()
    model = str(hub.bundled_model_path()) if args.model == "bundled" else args.model
    engine = Engine.load(model, device=args.device)
    s = GenerationSettings(gen_length=args.gen_length, block_length=args.gen_length)
    prompts = (PROMPTS * (args.requests // len(PROMPTS) + 1))[: args.requests]
    engine.submit(prompts[0], s).result()  # warm-up
    ratios, sequential_s, concurrent_s = [], [], []
    for _ in range(args.rounds):
        started = time.perf_counter()
        alone = [engine.submit(p, s).result().token_ids for p in prompts]
        sequential = time.perf_counter() - started
        started = time.perf_counter()
        requests = [engine.submit(p, s) for p in prompts]
        together = [r.result().token_ids for r in requests]
        concurrent = time.perf_counter() - started
        assert together == alone, "a concurrent answer differs from its one-at-a-time answer"
        sequential_s.append(sequential)
        concurrent_s.append(concurrent)
        ratios.append(concurrent / sequential)
    print(f"{model} on {engine.device}: {args.requests} requests, answer {args.gen_length}, {args.rounds} rounds: "
          f"one after another {statistics.median(sequential_s):.2f} s, together {statistics.median(concurrent_s):.2f} s, "
          f"ratio {statistics.median(ratios):.2f} (every answer equal to its solo answer)")


if __name__ == "__main__":
    main()
