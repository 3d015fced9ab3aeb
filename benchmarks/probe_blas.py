"""Probe: which BLAS library serves the decode step's linears best at a chat's row counts?

torch routes F.linear through cuBLAS by default; `torch.backends.cuda.preferred_blas_library("cublaslt")` sends
it through cuBLASLt, whose heuristics pick among more kernels (split-K among them). For LLaDA-8B's O, gate/up and
down projections (the GEMMs we leave to the library) and the LM head, at 16, 32 and 128 rows: a CUDA graph of
one call per layer-sized weight copy (copies rotated so that weights come from HBM, never L2), 200 replays
timed with CUDA events, median per call; GB/s of weight read and the fraction of the copy bandwidth measured
in the same run. Random bf16 weights.

Usage: python3 benchmarks/probe_blas.py [--rows 16 32 128]  (CUDA)
"""
from __future__ import annotations

import argparse
import math

import torch
import torch.nn.functional as F

from flash_dllm.engine.bench_worker import copy_bandwidth_gbs
from flash_dllm.kernels import graph_replay_ms

D, FFN, VOCAB = 4096, 12288, 126464
SHAPES = {"o_proj": (D, D), "gate_up": (2 * FFN, D), "down": (D, FFN), "lm_head": (VOCAB, D)}  # (N, K)


def us_per_call(rows: int, n: int, k: int, l2_bytes: int) -> float:
    weight_bytes = n * k * 2
    copies = max(2, min(16, math.ceil(3 * l2_bytes / weight_bytes)))
    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    outs = [F.linear(x, w) for w in weights]  # warm-up: library handles, workspaces
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for w, out in zip(weights, outs):
            torch.mm(x, w.t(), out=out)
    us = graph_replay_ms(graph, 200) * 1000 / copies
    del weights, outs, graph
    torch.cuda.empty_cache()
    return us


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[16, 32, 128])
    args = parser.parse_args()
    props = torch.cuda.get_device_properties(0)
    bandwidth = copy_bandwidth_gbs(torch.device("cuda"))  # the same measure as `bench decode`
    print(f"{torch.cuda.get_device_name(0)} | torch {torch.__version__} | copy {bandwidth:.0f} GB/s; "
          f"median of 200 graph replays per call", flush=True)
    for library in ("cublas", "cublaslt"):
        torch.backends.cuda.preferred_blas_library(library)
        for rows in args.rows:
            cells = []
            for name, (n, k) in SHAPES.items():
                us = us_per_call(rows, n, k, props.L2_cache_size)
                gbs = n * k * 2 / (us * 1e-6) / 1e9
                cells.append(f"{name} {us:7.1f} us {gbs / bandwidth:4.2f}")
            print(f"{library:<8} rows {rows:>3}: " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
