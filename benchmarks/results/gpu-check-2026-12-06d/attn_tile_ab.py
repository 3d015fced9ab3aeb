"""In one process: the decode step with 64-row attention tiles (the engine's ATTENTION_BLOCK_M) against 128-row
tiles. LLaDA-8B geometry, random weights; alternating rounds, each dropping the decode session (its plans and
captured graphs hold the tile table) and measuring like `bench decode` (bench_worker.measure)."""
import statistics
import sys
from types import SimpleNamespace

import torch

import flash_dllm.engine.block_diffusion as block_diffusion
import flash_dllm.engine.packing as packing
from flash_dllm.engine.bench_worker import copy_bandwidth_gbs, measure
from flash_dllm.engine.geometry import random_engine

CELLS = [("flash-cache", 1, 300), ("flash-verify", 1, 300), ("flash-cache", 8, 80), ("flash-verify", 8, 60),
         ("fast-dllm", 8, 80), ("flash-cache", 32, 30)]


def set_block(engine, block_m: int) -> None:
    engine.release_decode_memory()
    engine._decode = None
    packing.ATTENTION_BLOCK_M = block_m
    block_diffusion.ATTENTION_BLOCK_M = block_m  # imported by value there (fast-dllm's block steps)
    torch.cuda.empty_cache()


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    cells = CELLS if len(sys.argv) <= 2 else [c for c in CELLS if f"{c[0]}:{c[1]}" in sys.argv[2].split(",")]
    engine = random_engine("llada-8b", "cuda")
    print(torch.cuda.get_device_name(0), torch.__version__, f"copy {copy_bandwidth_gbs(torch.device('cuda')):.0f} GB/s",
          flush=True)
    results = {bm: {c: [] for c in cells} for bm in (64, 128)}
    with torch.no_grad():
        for r in range(rounds):
            for bm in (64, 128) if r % 2 == 0 else (128, 64):
                set_block(engine, bm)
                for cell in cells:
                    method, batch, iters = cell
                    args = SimpleNamespace(gen_length=512, prompt_length=800, iterations=iters)
                    row = measure(engine, method, batch, args)
                    results[bm][cell].append(row["iter_ms_median"])
                    print(f"round {r} bm={bm} {method} b{batch}: {row['iter_ms_median']:.3f} ms "
                          f"({row['iterations']} iterations, peak {row['peak_gb']:.1f} GB)", flush=True)
    for cell in cells:
        a, b = results[64][cell], results[128][cell]
        print(f"{cell[0]} b{cell[1]}: bm64 median {statistics.median(a):.3f} (min {min(a):.3f} max {max(a):.3f}) | "
              f"bm128 median {statistics.median(b):.3f} (min {min(b):.3f} max {max(b):.3f}) | "
              f"128/64 {statistics.median(b) / statistics.median(a):.4f}", flush=True)


if __name__ == "__main__":
    main()
