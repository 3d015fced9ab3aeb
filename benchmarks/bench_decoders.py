"""Per-iteration latency and peak memory of every decoding method at full model geometry (random weights).

    python benchmarks/bench_decoders.py --families llada dream --batches 1 8 --out results.csv

Random weights never reach a confidence threshold, so every method commits one token per iteration and
Flash-Verify never accepts a draft: these are worst-case iteration times, the numbers to compare with the
official code measured the same way (../shared/research/peer-flash-dllm-h200.md: 18.9 ms/iteration at
batch 1 without verify, 31.8 ms with verify). Iteration time is the gap between successive step events of
sequence 0 (each event follows a device->host copy, i.e. a synchronisation), median over the timed
iterations after warm-up. The weight-streaming floor is weight bytes / device copy bandwidth of this run.
"""
from __future__ import annotations

import argparse
import csv
import statistics
import sys
import threading
import time

import torch

from flash_dllm.engine.canvas import SequenceState
from flash_dllm.engine.config import ModelConfig
from flash_dllm.engine.decode_cached import run_cached
from flash_dllm.engine.decode_common import DecodeContext
from flash_dllm.engine.decode_full import run_full
from flash_dllm.engine.model import DiffusionLM, LayerWeights, rope_tables
from flash_dllm.engine.planners import planner_for
from flash_dllm.engine.settings import GenerationSettings
from flash_dllm.engine.strategies import LowConfidenceTopK
from flash_dllm.kernels import resolve_backend

GEOMETRY = {
    "llada": ModelConfig("llada", 4096, 32, 32, 32, 128, 12288, 126464, 5e5, 1e-5, 4096, False, False, 126336, 126081),
    "dream": ModelConfig("dream", 3584, 28, 28, 4, 128, 18944, 152064, 1e6, 1e-6, 4096, False, True, 151666, 151643),
}


def random_model(cfg: ModelConfig, device: str = "cuda", dtype=torch.bfloat16) -> DiffusionLM:
    def w(*shape):
        return (torch.randn(shape, device=device, dtype=dtype) * 0.02)

    qkv = (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim
    layers = [
        LayerWeights(
            attn_norm=torch.ones(cfg.d_model, device=device, dtype=dtype),
            w_qkv=w(qkv, cfg.d_model),
            b_qkv=w(qkv) if cfg.qkv_bias else None,
            w_o=w(cfg.d_model, cfg.n_heads * cfg.head_dim),
            ffn_norm=torch.ones(cfg.d_model, device=device, dtype=dtype),
            w_gate_up=w(2 * cfg.mlp_hidden, cfg.d_model),
            w_down=w(cfg.d_model, cfg.mlp_hidden),
        )
        for _ in range(cfg.n_layers)
    ]
    cos, sin = rope_tables(cfg.head_dim, cfg.rope_theta, cfg.max_seq_len, device)
    embed = w(cfg.vocab_size, cfg.d_model)
    return DiffusionLM(cfg, embed, layers, torch.ones(cfg.d_model, device=device, dtype=dtype),
                       w(cfg.vocab_size, cfg.d_model), cos, sin)


def weight_bytes(model: DiffusionLM) -> int:
    tensors = [model.embed, model.lm_head] + [t for l in model.layers for t in vars(l).values() if t is not None]
    return sum(t.numel() * t.element_size() for t in tensors)


def copy_bandwidth() -> float:
    import triton.testing

    src = torch.empty(2 * 1024**3 // 2, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=25, rep=100, return_mode="median")
    return 2 * src.numel() * 2 / (ms * 1e-3)


def run_method(model, method: str, batch: int, prompt_len: int, gen_len: int, iterations: int, backend: str) -> dict:
    cfg = model.config
    settings = GenerationSettings(method=method, gen_length=gen_len, block_length=32, threshold=0.9, gamma=0.8)
    gen = torch.Generator().manual_seed(0)
    states = [SequenceState(i, torch.randint(0, min(120000, cfg.vocab_size - 64), (prompt_len,), generator=gen).tolist(), gen_len,
                            cfg.mask_id, cfg.eos_id, frozenset({cfg.eos_id})) for i in range(batch)]
    stamps, cancel = [], threading.Event()

    def on_event(event) -> None:
        if getattr(event, "kind", "") == "step" and event.seq == 0:
            stamps.append((time.perf_counter(), event.forward_passes))
            if len(stamps) >= iterations:
                cancel.set()

    ctx = DecodeContext(model, settings, backend, on_event, str, cancel)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    if method == "llada":
        run_full(ctx, states, LowConfidenceTopK(32, 32))
    else:
        run_cached(ctx, states, planner_for(settings, cfg))
    torch.cuda.synchronize()
    gaps = [b[0] - a[0] for a, b in zip(stamps[3:], stamps[4:])]  # skip prefill and warm-up iterations
    forwards = [b[1] - a[1] for a, b in zip(stamps[3:], stamps[4:])]
    iter_ms = statistics.median(gaps) * 1000 if gaps else float("nan")
    per_iter_fwd = statistics.median(forwards) if forwards else 1
    return {
        "method": method, "batch": batch, "prompt_len": prompt_len, "gen_len": gen_len, "kernels": backend,
        "iterations_timed": len(gaps), "first_iter_ms": round((stamps[0][0] - start) * 1000, 2) if stamps else None,
        "iter_ms_median": round(iter_ms, 3), "forwards_per_iter": per_iter_fwd,
        "ms_per_forward": round(iter_ms / per_iter_fwd, 3),
        "tok_per_s_at_1_per_iter": round(batch * 1000 / iter_ms, 2),
        "peak_alloc_gb": round(torch.cuda.max_memory_allocated() / 1e9, 2),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="+", default=["llada", "dream"])
    parser.add_argument("--methods", nargs="+", default=["llada", "fast-dllm", "flash-cache", "flash-verify"])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--prompt-len", type=int, default=800)
    parser.add_argument("--gen-len", type=int, default=512)
    parser.add_argument("--iterations", type=int, default=40)
    parser.add_argument("--kernels", default=None)
    parser.add_argument("--out", default="bench_decoders.csv")
    args = parser.parse_args(argv)
    import triton

    props = torch.cuda.get_device_properties(0)
    bandwidth = copy_bandwidth()
    print(f"GPU {props.name} ({props.multi_processor_count} SMs), torch {torch.__version__}, triton {triton.__version__}, "
          f"python {sys.version.split()[0]}; copy bandwidth {bandwidth / 1e9:.0f} GB/s (read+write)")
    print(f"settings: prompt {args.prompt_len} random tokens, gen {args.gen_len}, block 32, threshold 0.9, gamma 0.8, "
          f"window 16 / lookahead 48 / track 64; median of {args.iterations - 4} iterations after 4 warm-up; random weights")
    rows = []
    for family in args.families:
        model = random_model(GEOMETRY[family])
        floor_ms = weight_bytes(model) / bandwidth * 1000
        backend = resolve_backend(args.kernels, model.device)
        print(f"\n{family}: {weight_bytes(model) / 1e9:.2f} GB of weights -> floor {floor_ms:.2f} ms per forward")
        for batch in args.batches:
            for method in args.methods:
                try:
                    row = run_method(model, method, batch, args.prompt_len, args.gen_len, args.iterations, backend)
                except torch.cuda.OutOfMemoryError:
                    torch.cuda.empty_cache()
                    row = {"method": method, "batch": batch, "error": "out of memory"}
                row.update(family=family, gpu=props.name, torch=torch.__version__, floor_ms=round(floor_ms, 3))
                if "ms_per_forward" in row:
                    row["x_floor"] = round(row["ms_per_forward"] / floor_ms, 2)
                rows.append(row)
                print({k: row.get(k) for k in ("family", "batch", "method", "iter_ms_median", "ms_per_forward",
                                                "x_floor", "forwards_per_iter", "peak_alloc_gb", "error")}, flush=True)
        del model
        torch.cuda.empty_cache()
    keys = sorted({k for r in rows for k in r})
    with open(args.out, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
