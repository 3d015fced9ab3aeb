"""GPU benchmark of scheduled attention at Flash-Cache decode shapes: split-KV (auto split count) vs one split.

Batch 1, 8 and 32; 128 query rows per sequence (`--rows`), the first 16 scored (attention mass on); 1,250..1,350 cached
keys per sequence (mean ~1,300) in 2,048-key slots of a static plan bounded at 1,352 keys (as the engine bounds
it by the slot length); 5% of cache rows excluded; LLaDA-8B (32 query / 32 KV heads) and Dream-7B (28 / 4)
geometry, head dim 128, bf16.

Timing: one CUDA graph holds `calls` back-to-back calls over rotating cache copies (like a step's layers; the
copies together exceed L2, so keys come from HBM as they would); 200 replays, each timed with CUDA events; the
median replay time divided by `calls` is printed as microseconds per call. "one-split" pins n_splits=1, the
(query tiles x heads) grid of the previous kernel; "auto" is the op's own choice; at batch 1 a sweep of
forced split counts (`--splits` at any batch) shows where the choice sits. `--mass both` times each shape with and without the
attention mass (the window logits' sum, added while the keys are walked), which is what the mass costs.
Usage: python3 benchmarks/bench_attention.py [--csv PATH] [--block-m 64 ...]  (CUDA; TRITON_INTERPRET unset)
"""
from __future__ import annotations

import argparse
import math
import os
import sys

import torch

from flash_dllm.kernels import graph_replay_ms
from flash_dllm.kernels.scheduled_attention import ScheduledAttention, scheduled_attention_reference, static_plan

MODELS = {"llada-8b": (32, 32), "dream-7b": (28, 4)}  # query heads, KV heads
HEAD_DIM, ROWS_PER_SEQ, SCORED_ROWS, SLOT = 128, 128, 16, 2048
MAX_KV = 1352  # the plan's static bound on kv_len, like the engine's slot length (prompt + answer): sets "auto"
REPLAYS = 200
ROWS: list[dict] = []


class DecodeStep:
    """Inputs of one attention call of a batched Flash-Cache step, with `copies` separate KV caches.
    kv_len: every sequence's key count (default: random in 1,250..1,350); excluded: the fraction of cache rows
    excluded at random (0: no kv_keep, as in a flash-cache step)."""

    def __init__(self, model: str, n_seqs: int, block_m: int, copies: int, seed: int = 0, kv_len: int | None = None,
                 excluded: float = 0.05, device: str = "cuda", rows: int = ROWS_PER_SEQ):
        gen = torch.Generator().manual_seed(seed)
        self.rows = rows
        self.n_heads, self.n_kv_heads = MODELS[model]
        width = self.n_kv_heads * HEAD_DIM
        self.kv_lens = ([kv_len] * n_seqs if kv_len is not None else
                        torch.randint(1250, 1351, (n_seqs,), generator=gen).tolist())
        self.q = torch.randn(n_seqs * rows, self.n_heads * HEAD_DIM, device=device, dtype=torch.bfloat16)
        self.caches = [(torch.randn(n_seqs * SLOT, width, device=device, dtype=torch.bfloat16),
                        torch.randn(n_seqs * SLOT, width, device=device, dtype=torch.bfloat16)) for _ in range(copies)]
        ints = lambda values: torch.tensor(values, dtype=torch.int32, device=device)  # noqa: E731
        keep = (torch.rand(n_seqs * SLOT, generator=gen) > excluded).to(device, torch.int8) if excluded else None
        score_query = (torch.arange(n_seqs * rows) % rows < SCORED_ROWS).to(device)
        self.plan = static_plan(n_seqs, rows, block_m, max(MAX_KV, max(self.kv_lens)),
                                ints([rows] * n_seqs), ints([b * SLOT for b in range(n_seqs)]),
                                ints(self.kv_lens), device, kv_keep=keep, score_query=score_query)
        self.score = torch.zeros(n_seqs * SLOT, device=device)

    def bytes_read(self) -> int:
        """K and V bytes one call must read (each visible cache row once)."""
        return 2 * sum(self.kv_lens) * self.n_kv_heads * HEAD_DIM * 2

    def flops(self) -> int:
        return 4 * HEAD_DIM * self.n_heads * self.rows * sum(self.kv_lens)


def graph_us(calls, n_calls: int) -> float:
    """Median over REPLAYS of one replay of a graph of calls(), per call, in microseconds (calls() runs eagerly
    first: schedules, workspaces, compiles and autotuning happen outside the graph)."""
    calls()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        calls()
    return graph_replay_ms(graph, REPLAYS) * 1000 / n_calls


def graph_us_per_call(op: ScheduledAttention, step: DecodeStep, scored: bool = True) -> float:
    """graph_us of len(step.caches) calls of op; scored=False leaves the attention mass out (no score output)."""
    score = step.score if scored else None

    def calls():
        for k_cache, v_cache in step.caches:
            op(step.q, k_cache, v_cache, step.plan, score)

    return graph_us(calls, len(step.caches))


def rel_err_vs_reference(op: ScheduledAttention, step: DecodeStep) -> float:
    k_cache, v_cache = step.caches[0]
    out = op(step.q, k_cache, v_cache, step.plan)
    ref = scheduled_attention_reference(step.q, k_cache, v_cache, step.plan, step.n_heads, step.n_kv_heads)
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


def bench(model: str, n_seqs: int, block_m: int, l2_bytes: int, scored: bool, rows: int = ROWS_PER_SEQ,
          sweep: tuple[int, ...] = (), excluded: float = 0.05) -> None:
    probe = DecodeStep(model, n_seqs, block_m, copies=1, rows=rows, excluded=excluded)
    copies = max(2, min(32, math.ceil(3 * l2_bytes / probe.bytes_read())))
    del probe
    step = DecodeStep(model, n_seqs, block_m, copies, rows=rows, excluded=excluded)
    shape = (f"B={n_seqs} rows={rows} kv~{sum(step.kv_lens) // n_seqs} bm={block_m} "
             f"{'mass on' if scored else 'mass off'}")
    print(f"\n{model} {shape} (graph of {copies} calls)", flush=True)
    auto = ScheduledAttention("triton", step.n_heads, step.n_kv_heads, HEAD_DIM)
    score = step.score.clone() if scored else None
    auto(step.q, *step.caches[0], step.plan, score)  # its first call settles the split count
    chosen = auto.key_splits(step.q, step.plan, score)
    variants = [("one-split", 1), (f"auto (n_splits={chosen})", None)]
    sweep = sweep or ((2, 3, 4, 5, 6, 8) if n_seqs == 1 else ())
    variants += [(f"forced n_splits={n}", n) for n in sweep if n not in (chosen, 1)]
    baseline = None
    for name, n_splits in variants:
        op = auto if name.startswith("auto (") else ScheduledAttention(
            "triton", step.n_heads, step.n_kv_heads, HEAD_DIM, n_splits=n_splits)
        us = graph_us_per_call(op, step, scored)
        baseline = baseline or us
        err = rel_err_vs_reference(op, step)
        row = {"op": "scheduled_attention", "model": model, "shape": shape, "variant": name, "us": round(us, 2),
               "vs_one_split": round(baseline / us, 3), "gbs": round(step.bytes_read() / us / 1e3, 1),
               "tflops": round(step.flops() / us / 1e6, 1), "rel_err": f"{err:.2e}"}
        ROWS.append(row)
        print(f"  {name:<24} {us:8.1f} us  x{row['vs_one_split']:<6} {row['gbs']:7.1f} GB/s "
              f"{row['tflops']:6.1f} TFLOP/s  rel_err {row['rel_err']}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", help="write all measurements here")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--block-m", type=int, nargs="+", default=[64])
    parser.add_argument("--mass", choices=("on", "off", "both"), default="on",
                        help="attention mass of the 16 scored rows (the step's tracked-token scores)")
    parser.add_argument("--models", nargs="+", choices=tuple(MODELS), default=list(MODELS))
    parser.add_argument("--rows", type=int, default=ROWS_PER_SEQ, help="query rows per sequence (fast-dllm: 32)")
    parser.add_argument("--splits", type=int, nargs="*", default=[],
                        help="forced key-split counts to time beside auto (default: 2-8 at batch 1 only)")
    parser.add_argument("--excluded", type=float, default=0.05,
                        help="fraction of cache rows excluded (0: no kv_keep, as in a flash-cache or fast-dllm step)")
    args = parser.parse_args()
    if not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET", "0") == "1":
        sys.exit("bench_attention.py needs a CUDA device and TRITON_INTERPRET unset")
    props = torch.cuda.get_device_properties(0)
    print(f"{torch.cuda.get_device_name(0)}: {props.multi_processor_count} SMs, L2 {props.L2_cache_size >> 20} MB; "
          f"median of {REPLAYS} graph replays", flush=True)
    mass = {"on": [True], "off": [False], "both": [True, False]}[args.mass]
    for model in args.models:
        for n_seqs in args.batches:
            for block_m in args.block_m:
                for scored in mass:
                    bench(model, n_seqs, block_m, props.L2_cache_size, scored, args.rows, tuple(args.splits),
                          args.excluded)
                torch.cuda.empty_cache()
    if args.csv:
        from bench_kernels import device_env, write_rows_csv  # the project's one CSV writer

        write_rows_csv(args.csv, ROWS, {**device_env(), "sms": props.multi_processor_count})


if __name__ == "__main__":
    main()
