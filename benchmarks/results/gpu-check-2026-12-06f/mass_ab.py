"""In one process, alternating rounds: the decode step with the attention mass computed elementwise (the
default) or as a 16-row tensor-core dot (kernels/_scheduled_attention_launcher.MASS_BY_DOT). LLaDA-8B geometry,
random weights; each round drops the decode session (captured graphs) and the attention op's schedules, and
measures like `bench decode` (bench_worker.measure).

    mass_ab.py ROUNDS [CELLS]     CELLS: comma-separated method:batch, or "all"
"""
import statistics
import sys
from types import SimpleNamespace

import torch

from flash_dllm.engine.bench_worker import copy_bandwidth_gbs, measure
from flash_dllm.engine.geometry import random_engine
from flash_dllm.kernels import _scheduled_attention_launcher as launcher

CELLS = [("flash-cache", 1, 300), ("flash-verify", 1, 300), ("flash-cache", 8, 80)]
VARIANTS = {"elementwise": False, "by-dot": True}


def set_mass(engine, by_dot: bool) -> None:
    engine.release_decode_memory()
    engine._decode = None
    launcher.MASS_BY_DOT = by_dot
    engine.ops.attention.triton._buckets.clear()  # schedules carry the kernel's constants
    torch.cuda.empty_cache()


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    chosen = sys.argv[2] if len(sys.argv) > 2 else "all"
    cells = CELLS if chosen == "all" else [c for c in CELLS if f"{c[0]}:{c[1]}" in chosen.split(",")]
    (base, _), (other, _) = VARIANTS.items()
    engine = random_engine("llada-8b", "cuda")
    print(torch.cuda.get_device_name(0), torch.__version__, f"copy {copy_bandwidth_gbs(torch.device('cuda')):.0f} GB/s",
          flush=True)
    results = {name: {c: [] for c in cells} for name in VARIANTS}
    with torch.no_grad():
        for r in range(rounds):
            for name in (base, other) if r % 2 == 0 else (other, base):
                set_mass(engine, VARIANTS[name])
                for cell in cells:
                    method, batch, iters = cell
                    args = SimpleNamespace(gen_length=512, prompt_length=800, iterations=iters)
                    row = measure(engine, method, batch, args)
                    results[name][cell].append(row["iter_ms_median"])
                    print(f"round {r} {name} {method} b{batch}: {row['iter_ms_median']:.3f} ms "
                          f"({row['iterations']} iterations)", flush=True)
    for cell in cells:
        a, b = results[base][cell], results[other][cell]
        print(f"{cell[0]} b{cell[1]}: {base} median {statistics.median(a):.3f} (min {min(a):.3f} max {max(a):.3f}) | "
              f"{other} median {statistics.median(b):.3f} (min {min(b):.3f} max {max(b):.3f}) | "
              f"{other}/{base} {statistics.median(b) / statistics.median(a):.4f}", flush=True)


if __name__ == "__main__":
    main()
