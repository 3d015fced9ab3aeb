"""GPU benchmark of MoEExperts (the routed experts of LLaDA-MoE-7B-A1B and LLaDA2.0-mini) against its torch reference.

For each model and token count (default 32, 128, 2048; top-8 routing drawn uniformly at random, bf16):
  hit        experts that got at least one token (the only ones whose weights must be read)
  floor      bytes of the hit experts' weights (gate, up, down) / the device-to-device copy bandwidth measured in
             the same run (bytes read + written per second): the time any kernel needs just to stream them once
  kernel     MoEExperts("triton"), median of single calls with L2 flushed and the host's launch cost hidden
  graph      the same call captured in a CUDA graph, median replay (no launch gaps: what a graph-replayed step sees)
  reference  moe_experts_reference (a loop over the hit experts with a host sync), median of single calls
--sweep also times each candidate tile set of --tiles (graph replays) and prints the fastest per shape, to tune
_moe_experts_triton.GPU_TILES.
Usage: python3 benchmarks/bench_moe.py [--tokens 32 128 2048] [--models llada-moe-7b-a1b llada2.0-mini] [--sweep]
(needs CUDA, TRITON_INTERPRET unset)
"""
from __future__ import annotations

import argparse
import itertools
import sys
from dataclasses import dataclass

import torch

MODELS = {  # experts, top-k, d_model, expert hidden F, MoE layers (LLaDA2.0-mini: its first layer is dense)
    "llada-moe-7b-a1b": (64, 8, 2048, 1024, 16),
    "llada2.0-mini": (256, 8, 2048, 512, 19),
}
DTYPE = torch.bfloat16


@dataclass
class Row:
    model: str
    tokens: int
    experts_hit: int
    weight_mb: float
    floor_ms: float
    kernel_ms: float
    graph_ms: float
    reference_ms: float
    error: float  # relative error vs the reference

    def line(self) -> str:
        return (f"{self.model:<18} {self.tokens:>6} {self.experts_hit:>5} {self.weight_mb:>9.1f} {self.floor_ms:>8.3f} "
                f"{self.kernel_ms:>8.3f} {self.graph_ms:>8.3f} {self.graph_ms / self.floor_ms:>6.2f}x "
                f"{self.reference_ms:>9.3f} {self.reference_ms / self.graph_ms:>7.1f}x {self.error:>8.1e}")


HEADER = (f"{'model':<18} {'tokens':>6} {'hit':>5} {'weight MB':>9} {'floor':>8} {'kernel':>8} {'graph':>8} "
          f"{'/floor':>7} {'reference':>9} {'speedup':>8} {'rel err':>8}   (ms)")


def copy_bandwidth_gbs() -> float:
    """Device-to-device copy of 1 GiB; bytes read plus written per second."""
    from flash_dllm.kernels import gpu_time_ms

    src = torch.empty(1 << 29, dtype=DTYPE, device="cuda").normal_()
    dst = torch.empty_like(src)
    ms = gpu_time_ms(lambda: dst.copy_(src), reps=20)
    return 2 * src.numel() * src.element_size() / ms / 1e6


def graph_ms(fn, reps: int = 100) -> float:
    from flash_dllm.kernels import graph_replay_ms

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):  # compiles outside the capture
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph_replay_ms(graph, reps)


def problem(model: str, n_tokens: int, seed: int = 0):
    n_experts, top_k, d_model, ffn, _ = MODELS[model]
    gen = torch.Generator(device="cuda").manual_seed(seed)
    w_gate_up = (torch.randn(n_experts, 2 * ffn, d_model, device="cuda", generator=gen) / d_model**0.5).to(DTYPE)
    w_down = (torch.randn(n_experts, d_model, ffn, device="cuda", generator=gen) / ffn**0.5).to(DTYPE)
    x = torch.randn(n_tokens, d_model, device="cuda", generator=gen).to(DTYPE)
    ids = torch.rand(n_tokens, n_experts, device="cuda", generator=gen).argsort(dim=1)[:, :top_k]
    weights = torch.rand(n_tokens, top_k, device="cuda", generator=gen).softmax(dim=1)
    return x, ids, weights, w_gate_up, w_down


def measure(model: str, n_tokens: int, copy_gbs: float) -> Row:
    from flash_dllm.kernels import gpu_time_ms
    from flash_dllm.kernels.moe_experts import MoEExperts, moe_experts_reference

    x, ids, weights, w_gate_up, w_down = problem(model, n_tokens)
    _, _, d_model, ffn, _ = MODELS[model]
    hit = int(ids.unique().numel())
    weight_bytes = hit * 3 * ffn * d_model * DTYPE.itemsize
    op = MoEExperts("triton", "cuda")
    out = torch.empty_like(x)
    expected = moe_experts_reference(x, ids, weights, w_gate_up, w_down)
    got = op(x, ids, weights, w_gate_up, w_down, out=out)
    error = ((got.float() - expected.float()).norm() / expected.float().norm()).item()
    return Row(model, n_tokens, hit, weight_bytes / 1e6, weight_bytes / copy_gbs / 1e6,
               kernel_ms=gpu_time_ms(lambda: op(x, ids, weights, w_gate_up, w_down, out=out)),
               graph_ms=graph_ms(lambda: op(x, ids, weights, w_gate_up, w_down, out=out)),
               reference_ms=gpu_time_ms(lambda: moe_experts_reference(x, ids, weights, w_gate_up, w_down), reps=5),
               error=error)


def candidate_tiles():
    """18 tile sets around the defaults (each compiles its own kernels, so the list stays short)."""
    from flash_dllm.kernels._moe_experts_triton import MoETiles

    for block_m, (block_f, block_d), block_k in itertools.product((16, 32, 64), ((32, 128), (64, 128), (32, 64)),
                                                                 (64, 128)):
        yield MoETiles(block_m, block_f, block_d, block_k, warps=4, stages=3)


def sweep(model: str, n_tokens: int) -> None:
    from flash_dllm.kernels.moe_experts import MoEExperts

    x, ids, weights, w_gate_up, w_down = problem(model, n_tokens)
    out = torch.empty_like(x)
    timings = []
    for tiles in candidate_tiles():
        op = MoEExperts("triton", "cuda", tiles=tiles)
        try:
            timings.append((graph_ms(lambda: op(x, ids, weights, w_gate_up, w_down, out=out), reps=30), tiles))
        except Exception as error:  # e.g. out of shared memory for this tile set
            print(f"  {tiles}: {type(error).__name__}", flush=True)
    timings.sort(key=lambda pair: pair[0])
    print(f"sweep {model} T={n_tokens}: fastest of {len(timings)}", flush=True)
    for ms, tiles in timings[:3]:
        print(f"  {ms:8.3f} ms  {tiles}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[32, 128, 2048])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--sweep", action="store_true", help="also time every candidate tile set")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_moe needs a CUDA device", file=sys.stderr)
        return 2
    import triton

    props = torch.cuda.get_device_properties(0)
    print(f"GPU {props.name} ({props.multi_processor_count} SMs, {props.total_memory / 2**30:.0f} GiB), "
          f"torch {torch.__version__}, triton {triton.__version__}, CUDA {torch.version.cuda}")
    copy_gbs = copy_bandwidth_gbs()
    print(f"copy bandwidth {copy_gbs:.0f} GB/s (read + written)\n")
    print(HEADER)
    rows = []
    for model, n_tokens in itertools.product(args.models, args.tokens):
        rows.append(measure(model, n_tokens, copy_gbs))
        print(rows[-1].line(), flush=True)
    for model in args.models:
        layers = MODELS[model][4]
        for row in (r for r in rows if r.model == model):
            print(f"{model} T={row.tokens}: {layers} MoE layers x graph = {layers * row.graph_ms:.2f} ms per step "
                  f"(floor {layers * row.floor_ms:.2f} ms)")
    if args.sweep:
        for model, n_tokens in itertools.product(args.models, args.tokens):
            sweep(model, n_tokens)
    return 0


if __name__ == "__main__":
    sys.exit(main())
