"""GPU benchmark of the decode step's fused small ops against the torch sequences they replace.

Per layer the engine norms the hidden stream twice, adds into it twice and applies silu(gate) * up once.
At LLaDA-8B and Dream-7B widths, bf16, for each row count (default 128 = batch 1, and 1024):
  add+norm   torch: `h += u; F.rms_norm(h)` (today's CUDA path, 2 kernels) and the fp32 formula (the
             reference, 8 kernels) vs add_rms_norm (in place, into an out= buffer: 1 kernel)
  norm       torch: F.rms_norm vs add_rms_norm with update=None (the first layer's and the final norm)
  silu*mul   torch: `F.silu(gate) * up` (2 kernels) vs silu_mul into an out= buffer (1 kernel)
Timing: each variant is captured in a CUDA graph 32 times back to back, as a graph-replayed decode step runs
it (no launch gaps, inputs L2-resident after the first call); the graph is replayed --reps times between CUDA
events and the table gives the median per call in microseconds, and the fused kernel's effective bandwidth.
The step line sums one decode step's worth: 2 * layers add+norm and layers silu*mul.
Usage: python3 benchmarks/bench_small_ops.py [--rows 128 1024] [--reps 50]  (needs CUDA, TRITON_INTERPRET unset)
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass

import torch
import torch.nn.functional as F

MODELS = {"llada-8b": (4096, 12288, 32), "dream-7b": (3584, 18944, 28)}  # d_model, MLP width F, layers
CALLS_PER_GRAPH = 32
EPS = 1e-5
DTYPE = torch.bfloat16


@dataclass
class Timing:
    model: str
    rows: int
    op: str
    torch_us: float  # today's engine path on CUDA
    formula_us: float | None  # the fp32 reference formula (norms only)
    fused_us: float
    fused_bytes: int  # bytes the fused kernel must move

    @property
    def speedup(self) -> float:
        return self.torch_us / self.fused_us

    @property
    def fused_gb_per_s(self) -> float:
        return self.fused_bytes / (self.fused_us * 1e3)


def graph_us(fn, reps: int) -> float:
    """Median time of one fn() call, from CUDA-graph replays of CALLS_PER_GRAPH calls in a row."""
    from flash_dllm.kernels import graph_replay_ms

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # compile, autotune caches, allocator warm-up outside the capture
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS_PER_GRAPH):
            fn()
    return graph_replay_ms(graph, reps) * 1e3 / CALLS_PER_GRAPH


def time_model(model: str, rows: int, reps: int) -> list[Timing]:
    from flash_dllm.kernels.add_rms_norm import AddRMSNorm, rms_norm_reference
    from flash_dllm.kernels.silu_mul import SiluMul

    d, f, _ = MODELS[model]
    gen = torch.Generator(device="cuda").manual_seed(0)
    # small updates: the in-place adds repeat thousands of times on the same buffer
    h = torch.randn(rows, d, device="cuda", generator=gen).to(DTYPE)
    update = (torch.randn(rows, d, device="cuda", generator=gen) * 1e-3).to(DTYPE)
    weight = (torch.rand(d, device="cuda", generator=gen) + 0.5).to(DTYPE)
    gate_up = torch.randn(rows, 2 * f, device="cuda", generator=gen).to(DTYPE)
    normed, act = torch.empty_like(h), torch.empty(rows, f, device="cuda", dtype=DTYPE)
    add_norm, silu_mul = AddRMSNorm("triton"), SiluMul("triton")
    size = DTYPE.itemsize

    def torch_add_norm():
        h.add_(update)
        return F.rms_norm(h, (d,), weight, EPS)

    def formula_add_norm():
        h.add_(update)
        return rms_norm_reference(h, weight, EPS)

    def torch_silu_mul():
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up

    return [
        Timing(model, rows, "add+norm", graph_us(torch_add_norm, reps), graph_us(formula_add_norm, reps),
               graph_us(lambda: add_norm(h, update, weight, EPS, out=normed, inplace=True), reps),
               fused_bytes=(4 * rows * d + d) * size),
        Timing(model, rows, "norm", graph_us(lambda: F.rms_norm(h, (d,), weight, EPS), reps),
               graph_us(lambda: rms_norm_reference(h, weight, EPS), reps),
               graph_us(lambda: add_norm(h, None, weight, EPS, out=normed), reps),
               fused_bytes=(2 * rows * d + d) * size),
        Timing(model, rows, "silu*mul", graph_us(torch_silu_mul, reps), None,
               graph_us(lambda: silu_mul(gate_up, out=act), reps), fused_bytes=3 * rows * f * size),
    ]


def print_table(timings: list[Timing]) -> None:
    print(f"{'model':<10} {'rows':>5} {'op':<9} {'torch us':>9} {'formula us':>10} {'fused us':>9} "
          f"{'speedup':>8} {'fused GB/s':>10}")
    for t in timings:
        formula = f"{t.formula_us:10.2f}" if t.formula_us is not None else f"{'-':>10}"
        print(f"{t.model:<10} {t.rows:>5} {t.op:<9} {t.torch_us:9.2f} {formula} {t.fused_us:9.2f} "
              f"{t.speedup:7.2f}x {t.fused_gb_per_s:10.0f}")
    print()
    for (model, rows) in dict.fromkeys((t.model, t.rows) for t in timings):
        by_op = {t.op: t for t in timings if (t.model, t.rows) == (model, rows)}
        layers = MODELS[model][2]
        torch_step = layers * (2 * by_op["add+norm"].torch_us + by_op["silu*mul"].torch_us)
        fused_step = layers * (2 * by_op["add+norm"].fused_us + by_op["silu*mul"].fused_us)
        print(f"{model} {rows} rows, one step's {2 * layers} add+norm + {layers} silu*mul: "
              f"torch {torch_step:.0f} us, fused {fused_step:.0f} us")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[128, 1024], help="token rows per call")
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--reps", type=int, default=50, help="graph replays per measurement")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET", "0") == "1":
        print("bench_small_ops needs a CUDA device and TRITON_INTERPRET unset", file=sys.stderr)
        return 2
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {DTYPE}, {CALLS_PER_GRAPH} calls per graph")
    timings = [t for model in args.models for rows in args.rows for t in time_model(model, rows, args.reps)]
    print_table(timings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
