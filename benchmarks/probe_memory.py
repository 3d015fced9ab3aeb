"""What is alive at a decode call's peak GPU memory, by the code that allocated it (CUDA only).

Runs the bench's own cell (random weights at --geometry, --batch prompts of --prompt-length, --gen-length
answers, --steps steps) with PyTorch's allocator history on, replays the history to the moment of the peak and
prints the live blocks there, grouped by the innermost frame of this project that allocated them (weights
and anything else allocated before the call count as "before the call").
Usage: python3 benchmarks/probe_memory.py [--geometry llada-8b] [--method flash-cache] [--batch 32]
"""
from __future__ import annotations

import argparse
import collections
import os
import sys

import torch

from flash_dllm.engine.bench_worker import random_prompts, run_generation
from flash_dllm.engine.geometry import random_engine
from flash_dllm.engine.settings import GenerationSettings


def site(frames: list[dict]) -> str:
    """The innermost frame in this project's code (else the innermost frame at all)."""
    for frame in frames:
        name = frame.get("filename", "")
        if "flash_dllm" in name or "/engine/" in name or "/kernels/" in name:
            return f"{os.path.basename(name)}:{frame.get('line')} {frame.get('name')}"
    return f"{frames[0].get('filename')}:{frames[0].get('line')}" if frames else "?"


def peak_blocks(snapshot: dict, device: int) -> tuple[int, list[tuple[int, str]]]:
    """Replay the allocation trace: the highest total of blocks allocated during it, and those blocks."""
    live: dict[int, tuple[int, str]] = {}
    total = best = 0
    best_live: dict[int, tuple[int, str]] = {}
    for entry in snapshot["device_traces"][device]:
        action, addr, size = entry["action"], entry["addr"], entry["size"]
        if action == "alloc":
            live[addr] = (size, site(entry.get("frames", [])))
            total += size
            if total > best:
                best, best_live = total, dict(live)
        elif action == "free_completed" and addr in live:
            total -= live.pop(addr)[0]
    return best, list(best_live.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--geometry", default="llada-8b")
    parser.add_argument("--method", default="flash-cache")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--prompt-length", type=int, default=800)
    parser.add_argument("--gen-length", type=int, default=512)
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("probe_memory.py needs a CUDA device")
    engine = random_engine(args.geometry, "cuda", None, True)
    settings = GenerationSettings(method=args.method, gen_length=args.gen_length, block_length=32, threshold=0.9,
                                  gamma=0.8, seed=0, use_chat_template=False)
    prompts = random_prompts(engine, args.batch, args.prompt_length, seed=args.batch)
    device = torch.cuda.current_device()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python", max_entries=1_000_000)
    with torch.no_grad():
        run_generation(engine, prompts, settings, args.steps)
    torch.cuda.synchronize()
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    peak = torch.cuda.max_memory_allocated()
    during, blocks = peak_blocks(snapshot, device)
    groups: dict[str, list[int]] = collections.defaultdict(list)
    for size, where in blocks:
        groups[where].append(size)
    print(f"{torch.cuda.get_device_name()}: {args.geometry} {args.method} batch {args.batch}, prompt "
          f"{args.prompt_length}, answer {args.gen_length}, {args.steps} steps")
    print(f"peak allocated {peak / 1e9:.2f} GB = before the call {before / 1e9:.2f} GB + at the peak of the call "
          f"{during / 1e9:.2f} GB (replayed {len(snapshot['device_traces'][device])} trace entries)")
    for where, sizes in sorted(groups.items(), key=lambda kv: -sum(kv[1]))[:20]:
        print(f"  {sum(sizes) / 1e9:7.3f} GB  {len(sizes):5d} blocks  {where}")


if __name__ == "__main__":
    main()
