"""In one process, alternating rounds: the decode step with the key-split count rounded (the previous rule,
round(WAVES * SMs / programs)) or rounded down (the new one, which never asks for more programs than the SMs
hold at once). Only Dream-7B at batch 1 changes (56 programs: 5 splits -> 4). Random weights; each round drops
the decode session and the attention op's schedules, and measures like `bench decode` (bench_worker.measure).

    splits_ab.py ROUNDS GEOMETRY
"""
import statistics
import sys
from types import SimpleNamespace

import torch

from flash_dllm.engine.bench_worker import copy_bandwidth_gbs, measure
from flash_dllm.engine.geometry import random_engine
from flash_dllm.kernels import _scheduled_attention_launcher as launcher

CELLS = [("flash-cache", 1, 300), ("flash-verify", 1, 300), ("fast-dllm", 1, 300)]
FLOOR = launcher.choose_splits


def rounded(n_tiles, n_heads, max_kv_len, n_sms):
    programs = n_tiles * n_heads
    if programs == 0:
        return 1
    return max(1, min(round(launcher.WAVES * n_sms / programs), max_kv_len // launcher.MIN_KEYS_PER_SPLIT))


VARIANTS = {"round": rounded, "floor": FLOOR}


def set_rule(engine, rule) -> None:
    engine.release_decode_memory()
    engine._decode = None
    launcher.choose_splits = rule
    engine.ops.attention.triton._buckets.clear()
    torch.cuda.empty_cache()


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    geometry = sys.argv[2] if len(sys.argv) > 2 else "dream-7b"
    engine = random_engine(geometry, "cuda")
    cfg = engine.model.config
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(torch.cuda.get_device_name(0), torch.__version__, geometry,
          f"copy {copy_bandwidth_gbs(torch.device('cuda')):.0f} GB/s; batch-1 splits (2 tiles): round "
          f"{rounded(2, cfg.n_heads, 1312, sms)}, floor {FLOOR(2, cfg.n_heads, 1312, sms)}", flush=True)
    results = {name: {c: [] for c in CELLS} for name in VARIANTS}
    with torch.no_grad():
        for r in range(rounds):
            for name in (("round", "floor") if r % 2 == 0 else ("floor", "round")):
                set_rule(engine, VARIANTS[name])
                for cell in CELLS:
                    method, batch, iters = cell
                    row = measure(engine, method, batch, SimpleNamespace(gen_length=512, prompt_length=800,
                                                                         iterations=iters))
                    results[name][cell].append(row["iter_ms_median"])
                    print(f"round {r} {name} {method} b{batch}: {row['iter_ms_median']:.3f} ms", flush=True)
    for cell in CELLS:
        a, b = results["round"][cell], results["floor"][cell]
        print(f"{cell[0]} b{cell[1]}: round median {statistics.median(a):.3f} (min {min(a):.3f} max {max(a):.3f}) | "
              f"floor median {statistics.median(b):.3f} (min {min(b):.3f} max {max(b):.3f}) | "
              f"floor/round {statistics.median(b) / statistics.median(a):.4f}", flush=True)


if __name__ == "__main__":
    main()
