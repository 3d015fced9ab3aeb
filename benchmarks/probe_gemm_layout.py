"""Probe: does cuBLAS stream a decode step's weights faster from another layout or with other reduction flags?

F.linear(x, W) with W stored [N, K] (what the engine does: cuBLAS sees a "TN" problem) against x @ Wt with the
weight stored transposed, [K, N] contiguous ("NN"), and against the same TN call with bf16 reduced-precision
split-K reductions disallowed (`torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False`,
which changes the kernels cuBLAS may pick). For LLaDA-8B's O, gate/up and down projections and the LM head at
16, 48 (a Flash-Verify pass) and 128 rows (a Flash-Cache step): one CUDA graph of one call per weight copy
(copies rotated so that weights come from HBM, never L2), 200 replays timed with CUDA events, median per call;
the fraction of the copy bandwidth measured in the same run. Random bf16 weights.

Usage: python3 benchmarks/probe_gemm_layout.py [--rows 16 48 128]  (CUDA)
"""
from __future__ import annotations

import argparse
import math

import torch

from flash_dllm.engine.bench_worker import copy_bandwidth_gbs
from flash_dllm.kernels import graph_replay_ms

D, FFN, VOCAB = 4096, 12288, 126464
SHAPES = {"o_proj": (D, D), "gate_up": (2 * FFN, D), "down": (D, FFN), "lm_head": (VOCAB, D)}  # (N, K)
VARIANTS = ("tn", "nn", "tn-no-reduced-precision")


def us_per_call(variant: str, rows: int, n: int, k: int, l2_bytes: int) -> float:
    weight_bytes = n * k * 2
    copies = max(2, min(16, math.ceil(3 * l2_bytes / weight_bytes)))
    shape = (k, n) if variant == "nn" else (n, k)
    weights = [torch.randn(*shape, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = variant != "tn-no-reduced-precision"

    def call(w, out=None):
        operand = w if variant == "nn" else w.t()
        return torch.mm(x, operand) if out is None else torch.mm(x, operand, out=out)

    outs = [call(w) for w in weights]  # warm-up: library handles, workspaces
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for w, out in zip(weights, outs):
            call(w, out)
    us = graph_replay_ms(graph, 200) * 1000 / copies
    del weights, outs, graph
    torch.cuda.empty_cache()
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True
    return us


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[16, 48, 128])
    args = parser.parse_args()
    props = torch.cuda.get_device_properties(0)
    bandwidth = copy_bandwidth_gbs(torch.device("cuda"))  # the same measure as `bench decode`
    print(f"{torch.cuda.get_device_name(0)} | torch {torch.__version__} | copy {bandwidth:.0f} GB/s; "
          f"median of 200 graph replays per call; cells: us per call, fraction of copy bandwidth", flush=True)
    for rows in args.rows:
        for variant in VARIANTS:
            cells = []
            for name, (n, k) in SHAPES.items():
                us = us_per_call(variant, rows, n, k, props.L2_cache_size)
                gbs = n * k * 2 / (us * 1e-6) / 1e9
                cells.append(f"{name} {us:7.1f} {gbs / bandwidth:4.2f}")
            print(f"rows {rows:>3} {variant:<24}: " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
