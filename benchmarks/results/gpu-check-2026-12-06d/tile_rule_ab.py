"""In one process: the engine's tile-height rule (packing.attention_tile_rows: 128-row tiles for eight or more
full-budget sequences) against 64-row tiles everywhere. LLaDA-8B geometry, random weights; alternating rounds,
each dropping the decode session (its layouts hold the tile table) and measuring like `bench decode`."""
import statistics
import sys
from types import SimpleNamespace

import torch

import flash_dllm.engine.packing as packing
from flash_dllm.engine.bench_worker import copy_bandwidth_gbs, measure
from flash_dllm.engine.geometry import random_engine

CELLS = [("flash-cache", 8, 80), ("flash-verify", 8, 60), ("flash-cache", 32, 30)]
RULE_SLOTS = packing.WIDE_TILE_MIN_SLOTS


def set_mode(engine, mode: str) -> None:
    engine.release_decode_memory()
    engine._decode = None
    packing.WIDE_TILE_MIN_SLOTS = RULE_SLOTS if mode == "rule" else 10**9
    torch.cuda.empty_cache()


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    engine = random_engine("llada-8b", "cuda")
    print(torch.cuda.get_device_name(0), torch.__version__, f"copy {copy_bandwidth_gbs(torch.device('cuda')):.0f} GB/s",
          flush=True)
    results = {m: {c: [] for c in CELLS} for m in ("rule", "all-64")}
    with torch.no_grad():
        for r in range(rounds):
            for mode in ("rule", "all-64") if r % 2 == 0 else ("all-64", "rule"):
                set_mode(engine, mode)
                for cell in CELLS:
                    method, batch, iters = cell
                    row = measure(engine, method, batch, SimpleNamespace(gen_length=512, prompt_length=800,
                                                                         iterations=iters))
                    results[mode][cell].append(row["iter_ms_median"])
                    print(f"round {r} {mode} {method} b{batch}: {row['iter_ms_median']:.3f} ms "
                          f"({row['iterations']} iterations, peak {row['peak_gb']:.1f} GB)", flush=True)
    for cell in CELLS:
        a, b = results["all-64"][cell], results["rule"][cell]
        print(f"{cell[0]} b{cell[1]}: all-64 median {statistics.median(a):.3f} (min {min(a):.3f} max {max(a):.3f}) | "
              f"rule median {statistics.median(b):.3f} (min {min(b):.3f} max {max(b):.3f}) | "
              f"rule/all-64 {statistics.median(b) / statistics.median(a):.4f}", flush=True)


if __name__ == "__main__":
    main()
