"""In one process, alternating rounds: the decode step under two attention tile settings. LLaDA-8B geometry,
random weights; each round drops the decode session (its layouts and captured graphs hold the tile table) and
measures like `bench decode` (bench_worker.measure).

    attn_tile_ab.py ROUNDS [CELLS]          64-row tiles everywhere against 128-row tiles everywhere (call1.sh)
    attn_tile_ab.py ROUNDS CELLS --rule     the engine's rule (packing.attention_tile_rows) against 64 everywhere

CELLS: comma-separated method:batch (e.g. flash-cache:8,flash-verify:8), or "all"."""
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
NEVER = 10**9  # more slots than any forward packs: attention_tile_rows never widens
# name: (default tile rows, slots from which the rule widens)
HEIGHTS = {"bm=64": (64, NEVER), "bm=128": (128, NEVER)}
RULE = {"all-64": (64, NEVER), "rule": (64, packing.WIDE_TILE_MIN_SLOTS)}


def set_tiles(engine, setting: tuple[int, int]) -> None:
    engine.release_decode_memory()
    engine._decode = None
    packing.ATTENTION_BLOCK_M, packing.WIDE_TILE_MIN_SLOTS = setting
    block_diffusion.ATTENTION_BLOCK_M = setting[0]  # imported by value there (fast-dllm's block steps)
    torch.cuda.empty_cache()


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    chosen = sys.argv[2] if len(sys.argv) > 2 else "all"
    cells = CELLS if chosen == "all" else [c for c in CELLS if f"{c[0]}:{c[1]}" in chosen.split(",")]
    variants = RULE if "--rule" in sys.argv else HEIGHTS
    (base, base_setting), (other, other_setting) = variants.items()
    engine = random_engine("llada-8b", "cuda")
    print(torch.cuda.get_device_name(0), torch.__version__, f"copy {copy_bandwidth_gbs(torch.device('cuda')):.0f} GB/s",
          flush=True)
    results = {name: {c: [] for c in cells} for name in variants}
    with torch.no_grad():
        for r in range(rounds):
            for name in (base, other) if r % 2 == 0 else (other, base):
                set_tiles(engine, variants[name])
                for cell in cells:
                    method, batch, iters = cell
                    args = SimpleNamespace(gen_length=512, prompt_length=800, iterations=iters)
                    row = measure(engine, method, batch, args)
                    results[name][cell].append(row["iter_ms_median"])
                    print(f"round {r} {name} {method} b{batch}: {row['iter_ms_median']:.3f} ms "
                          f"({row['iterations']} iterations, peak {row['peak_gb']:.1f} GB)", flush=True)
    for cell in cells:
        a, b = results[base][cell], results[other][cell]
        print(f"{cell[0]} b{cell[1]}: {base} median {statistics.median(a):.3f} (min {min(a):.3f} max {max(a):.3f}) | "
              f"{other} median {statistics.median(b):.3f} (min {min(b):.3f} max {max(b):.3f}) | "
              f"{other}/{base} {statistics.median(b) / statistics.median(a):.4f}", flush=True)


if __name__ == "__main__":
    main()
