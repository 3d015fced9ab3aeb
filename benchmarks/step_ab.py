"""The decode step under two engine settings, in one process, alternating: the A/B the experiments in
benchmarks/README.md use (a setting is anything switched in process: a kernel rule, a tile height, a layout).

Each round applies each setting in turn (the order flips every round), drops the decode session (its layouts and
captured graphs) and the attention op's schedules, and measures every cell like `bench decode`
(bench_worker.measure). Random weights at a named geometry; CUDA only.

    from step_ab import run_ab
    run_ab("dream-7b", {"old": apply_old, "new": apply_new}, [("flash-cache", 1, 300)], rounds=2)
"""
from __future__ import annotations

import statistics
from collections.abc import Callable
from types import SimpleNamespace

import torch

from flash_dllm.engine.bench_worker import copy_bandwidth_gbs, measure
from flash_dllm.engine.geometry import random_engine

Cell = tuple[str, int, int]  # method, batch, iterations


def pick_cells(cells: list[Cell], chosen: str) -> list[Cell]:
    """The cells named "method:batch,..." ("all": every one)."""
    return cells if chosen == "all" else [c for c in cells if f"{c[0]}:{c[1]}" in chosen.split(",")]


def fresh_session(engine) -> None:
    """Forget everything a setting may have been baked into: the decode session and the attention schedules."""
    engine.release_decode_memory()
    engine._decode = None
    if engine.ops.attention.triton is not None:
        engine.ops.attention.triton._buckets.clear()
    torch.cuda.empty_cache()


def run_ab(geometry: str, settings: dict[str, Callable], cells: list[Cell], rounds: int = 2,
           header: Callable | None = None) -> dict:
    """settings: two or more names -> a function(engine) that applies the setting, run in turn, the order
    reversed every other round. Prints every measurement and, per cell, the median (min-max) over rounds of each
    setting and its ratio to the first; returns the medians."""
    names = list(settings)
    engine = random_engine(geometry, "cuda")
    print(torch.cuda.get_device_name(0), torch.__version__, geometry,
          f"copy {copy_bandwidth_gbs(torch.device('cuda')):.0f} GB/s", header(engine) if header else "", flush=True)
    results = {name: {cell: [] for cell in cells} for name in settings}
    with torch.no_grad():
        for r in range(rounds):
            for name in names if r % 2 == 0 else names[::-1]:
                fresh_session(engine)
                settings[name](engine)
                for cell in cells:
                    method, batch, iterations = cell
                    row = measure(engine, method, batch, SimpleNamespace(gen_length=512, prompt_length=800,
                                                                         iterations=iterations))
                    results[name][cell].append(row["iter_ms_median"])
                    print(f"round {r} {name} {method} b{batch}: {row['iter_ms_median']:.3f} ms "
                          f"({row['iterations']} iterations, peak {row['peak_gb']:.1f} GB)", flush=True)
    fresh_session(engine)
    first = names[0]
    for cell in cells:
        base = statistics.median(results[first][cell])
        parts = []
        for name in names:
            v = results[name][cell]
            ratio = "" if name == first else f", {name}/{first} {statistics.median(v) / base:.4f}"
            parts.append(f"{name} median {statistics.median(v):.3f} (min {min(v):.3f} max {max(v):.3f}){ratio}")
        print(f"{cell[0]} b{cell[1]}: " + " | ".join(parts), flush=True)
    return {name: {cell: statistics.median(v) for cell, v in per.items()} for name, per in results.items()}
